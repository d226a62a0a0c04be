"""Ports for the workers of a one-host job, chosen where nothing else will take them.

A port the kernel hands out with ``bind(0)`` and takes back is in its ephemeral range,
the range it also gives to outgoing connections as their local port: on a host busy with
connections (gRPC clients of other jobs, a test suite), one of them may take the port in
the seconds between the launcher's pick and the worker's server binding it, and that
worker fails with "Could not start gRPC server". TensorFlow's server refuses
SO_REUSEPORT, so the launcher cannot hold the port for the worker; it picks ports just
below the ephemeral range instead, which only an explicit bind can take, and checks that
each binds now. The same ports serve a restart (``--max_restarts``): nothing but another
explicit bind can have taken them meanwhile."""
import random
import socket

SPAN = 8192              # how many ports below the ephemeral range are candidates
DEFAULT_EPHEMERAL_LOW = 32768
RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_low(path=RANGE_FILE):
    """The lowest port the kernel gives outgoing connections (32768 where unknown)."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def candidate_range(low):
    """Ports to pick from: the SPAN ports below ``low``, never the privileged ones; empty
    when the ephemeral range starts too low to leave room (then the kernel picks)."""
    start = max(1024, low - SPAN)
    return range(start, low) if low - start >= 64 else range(0)


def _binds(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_ports(count, host):
    """``count`` distinct ports from ``bind(0)``, all bound until every one is read."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def pick_free_ports(count, host="127.0.0.1", low=None):
    """``count`` distinct ports that bind on ``host`` now, below the ephemeral range
    (``low``: its first port, read from the kernel by default); random, so that two jobs
    started together rarely try the same ones."""
    candidates = candidate_range(ephemeral_low() if low is None else low)
    ports = []
    for port in random.sample(candidates, len(candidates)):
        if len(ports) == count:
            break
        if _binds(host, port):
            ports.append(port)
    if len(ports) < count:
        return _kernel_ports(count, host)
    return ports
