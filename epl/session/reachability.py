"""Is a worker's server up? (TCP connect to its host:port, no TF involved)."""
import socket
import time


def reachable(host_port, timeout=1.0):
    host, port = host_port.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until_reachable(hosts, deadline_seconds, poll=0.5, probe=reachable):
    """Hosts still unreachable when ``deadline_seconds`` have passed (empty if all up)."""
    deadline = time.time() + deadline_seconds
    missing = [h for h in hosts if not probe(h)]
    while missing and time.time() < deadline:
        time.sleep(poll)
        missing = [h for h in missing if not probe(h)]
    return missing
