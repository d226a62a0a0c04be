"""A small rendezvous where the tasks of one job exchange their addresses.

MPI and torchrun-style launchers give every task its rank but not where the other
tasks' servers will listen. Before its TensorFlow server starts, each task picks
a free port, and rank 0 listens at the rendezvous address; the other ranks
connect (retrying until rank 0 is up), say who they are, and wait. When every
rank has arrived, rank 0 answers each with the whole list: rank r at the address
rank 0 saw its connection come from, rank 0 at the address the others reached.
If some ranks never arrive within the timeout, rank 0 fails, and tells the ranks
that did arrive, naming the missing ones; a rank that cannot reach rank 0 fails
naming the address it tried.

One line of JSON each way, tagged and with a job token, so a stray connection
(a port scanner, another job on the same port, torch's own store) is refused,
never mistaken for a rank.

Example (rank 1 of 2; rank 0 runs the same call with rank=0)::

    hosts = exchange(("10.0.0.1", 29500), rank=1, size=2, port=free_port(),
                     token="torchrun/2", timeout=300)
    # ['10.0.0.1:41234', '10.0.0.2:38121']
"""
import json
import select
import socket
import time

from epl.cluster.common import ClusterError

TAG = "epl-rendezvous/1"
RETRY_SECONDS = 0.2
ANSWER_GRACE = 5.0   # seconds a connected rank waits past rank 0's own timeout
MAX_LINE = 1 << 16


class RendezvousError(ClusterError):
    """The tasks of a job could not exchange their addresses."""


def free_port():
    """A TCP port that is free on every interface now (a server started soon after
    binds it; the launcher picks its workers' ports the same way)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", 0))
        return sock.getsockname()[1]
    finally:
        sock.close()


def exchange(address, rank, size, port, token, timeout):
    """``host:port`` of every rank (rank order) once all ``size`` ranks met at
    ``address`` = (host, port); this rank's server will listen on ``port``."""
    if size == 1:
        return ["127.0.0.1:%d" % port]
    if rank == 0:
        return _serve(address, size, port, token, timeout)
    return _join(address, rank, size, port, token, timeout)


# ---------------------------------------------------------------------------- rank 0
def _serve(address, size, port, token, timeout):
    where = "%s:%d" % address
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", address[1]))
    except OSError as err:
        listener.close()
        raise RendezvousError("rank 0 cannot hold the rendezvous on port %d (%s): another "
                              "process uses it; give every rank a free MASTER_PORT (and "
                              "MASTER_ADDR)" % (address[1], err))
    listener.listen(size + 8)
    arrived = {}   # rank -> (connection, host, port)
    deadline = time.time() + timeout
    try:
        while len(arrived) < size - 1 and time.time() < deadline:
            _accept_one(listener, arrived, size, token, deadline)
        missing = [r for r in range(1, size) if r not in arrived]
        if missing:
            message = "rank(s) %s of %d never arrived within %s s" % (missing, size, timeout)
            _answer_all(arrived, {"error": message})
            raise RendezvousError("EPL rendezvous at %s (rank 0): %s; no server started"
                                  % (where, message))
        own = next(iter(arrived.values()))[0].getsockname()[0]
        hosts = ["%s:%d" % (own, port)] + ["%s:%d" % arrived[r][1:] for r in range(1, size)]
        _answer_all(arrived, {"hosts": hosts})
        _refuse_latecomers(listener, arrived, size, token)
        return hosts
    finally:
        for connection, _, _ in arrived.values():
            connection.close()
        listener.close()


def _accept_one(listener, arrived, size, token, deadline):
    """Wait for one connection; keep it if it is a rank of this job we lack."""
    ready, _, _ = select.select([listener], [], [], max(0.0, deadline - time.time()))
    if not ready:
        return
    connection, peer = listener.accept()
    try:
        hello = json.loads(_read_line(connection, min(deadline, time.time() + 10)))
    except (ValueError, OSError):
        connection.close()   # not one of ours
        return
    problem = _check_hello(hello, arrived, size, token)
    if problem:
        _send(connection, {"error": problem})
        connection.close()
        return
    arrived[hello["rank"]] = (connection, peer[0], int(hello["port"]))


def _refuse_latecomers(listener, arrived, size, token):
    """Answer connections already waiting when the job is complete (a duplicate rank, a
    rank outside the world) with why, instead of a reset when the listener closes."""
    while select.select([listener], [], [], 0)[0]:
        connection, _ = listener.accept()
        try:
            hello = json.loads(_read_line(connection, time.time() + 1))
            _send(connection, {"error": _check_hello(hello, arrived, size, token) or
                               "all %d ranks have arrived already" % size})
        except (ValueError, OSError):
            pass
        finally:
            connection.close()


def _check_hello(hello, arrived, size, token):
    if not isinstance(hello, dict) or hello.get("tag") != TAG:
        return "not an EPL rendezvous message"
    rank = hello.get("rank")
    if hello.get("token") != token or hello.get("size") != size:
        return ("rank 0 runs a job of %d rank(s) (%s), this rank says %s ranks (%s): are two "
                "jobs using the same MASTER_ADDR:MASTER_PORT?"
                % (size, token, hello.get("size"), hello.get("token")))
    if not isinstance(rank, int) or not 1 <= rank < size:
        return "rank %r is outside the world of %d ranks" % (rank, size)
    if rank in arrived:
        return "rank %d has already arrived from %s: two processes have rank %d" % (
            rank, arrived[rank][1], rank)
    return None


def _answer_all(arrived, message):
    for connection, _, _ in arrived.values():
        try:
            _send(connection, message)
        except OSError:
            pass   # that rank is gone; it learns nothing more from us


# ---------------------------------------------------------------------------- other ranks
def _join(address, rank, size, port, token, timeout):
    where = "%s:%d" % address
    deadline = time.time() + timeout
    connection = _connect(address, deadline)
    if connection is None:
        raise RendezvousError(
            "EPL rendezvous: rank %d could not reach rank 0 at %s within %s s. Is rank 0 "
            "running, and are MASTER_ADDR/MASTER_PORT rank 0's host and port?"
            % (rank, where, timeout))
    # Rank 0 answers within ``timeout`` of its own start, which came before this
    # connection: waiting that long from now (and a little more) always hears its
    # answer, or its list of the ranks that never came.
    answer_deadline = time.time() + timeout + ANSWER_GRACE
    try:
        _send(connection, {"tag": TAG, "token": token, "rank": rank, "size": size,
                           "port": port})
        line = _read_line(connection, answer_deadline)
    except socket.timeout:
        raise RendezvousError("EPL rendezvous at %s: rank 0 did not answer rank %d within %s s"
                              % (where, rank, timeout))
    except OSError as err:
        raise RendezvousError("EPL rendezvous at %s: rank %d lost the connection to rank 0 "
                              "(%s)" % (where, rank, err))
    finally:
        connection.close()
    return _answer(line, where, rank, size)


def _answer(line, where, rank, size):
    if not line:
        raise RendezvousError("EPL rendezvous at %s: rank 0 closed the connection to rank %d "
                              "without an answer (it failed or stopped: see its log)"
                              % (where, rank))
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("error"):
        raise RendezvousError("EPL rendezvous at %s (rank %d): rank 0 answered: %s"
                              % (where, rank, answer["error"]))
    hosts = answer.get("hosts") if isinstance(answer, dict) else None
    if not isinstance(hosts, list) or len(hosts) != size:
        raise RendezvousError("%s answered rank %d, but not as EPL's rendezvous (%r): is "
                              "another service using that port?" % (where, rank, line[:120]))
    return [str(h) for h in hosts]


def _connect(address, deadline):
    """A connection to rank 0, retrying while nothing listens yet; None at the deadline."""
    while True:
        try:
            return socket.create_connection(address, timeout=max(0.1, deadline - time.time()))
        except OSError:
            if time.time() + RETRY_SECONDS >= deadline:
                return None
            time.sleep(RETRY_SECONDS)


# ---------------------------------------------------------------------------- wire
def _send(connection, message):
    connection.sendall((json.dumps(message, sort_keys=True) + "\n").encode("utf-8"))


def _read_line(connection, deadline):
    """One line from ``connection`` before ``deadline`` (socket.timeout after it)."""
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.time()
        if remaining <= 0:
            raise socket.timeout("no complete line before the deadline")
        connection.settimeout(remaining)
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_LINE:
            raise ValueError("line too long")
    return data.decode("utf-8", "replace").strip()
