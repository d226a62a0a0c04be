"""The rendezvous where MPI and torchrun-style tasks exchange addresses
(epl.cluster.rendezvous), with one thread per rank: no TensorFlow."""
import socket
import threading
import time

import pytest

from epl.cluster import rendezvous
from epl.cluster.rendezvous import RendezvousError, exchange, free_port


def _meet(ranks, size, timeout=10, address=None, token="torchrun/%d", delays=None):
    """Run ``exchange`` for each rank in ``ranks`` in its own thread; {rank: result}."""
    address = address or ("127.0.0.1", free_port())
    results = {}

    def run(rank):
        time.sleep((delays or {}).get(rank, 0))
        try:
            results[rank] = exchange(address, rank, size, 40000 + rank,
                                     token % size if "%" in token else token, timeout)
        except Exception as err:  # reported to the test
            results[rank] = err

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 20)
    assert not any(t.is_alive() for t in threads), "a rank did not return"
    return results


@pytest.mark.timeout(60)
def test_every_rank_learns_every_address_in_rank_order():
    """Ranks start in any order; the late rank 0 is waited for."""
    results = _meet([3, 1, 2, 0], 4, delays={0: 1.0})
    expected = ["127.0.0.1:%d" % (40000 + r) for r in range(4)]
    assert results == dict((r, expected) for r in range(4))


@pytest.mark.timeout(60)
def test_ranks_that_never_arrive_are_named_on_every_rank_that_did():
    start = time.time()
    results = _meet([0, 2], 4, timeout=2)
    assert time.time() - start < 15
    assert isinstance(results[0], RendezvousError)
    assert "rank(s) [1, 3] of 4 never arrived within 2 s" in str(results[0])
    assert "(rank 0)" in str(results[0])
    assert isinstance(results[2], RendezvousError)
    assert "(rank 2): rank 0 answered: rank(s) [1, 3] of 4 never arrived" in str(results[2])


@pytest.mark.timeout(60)
def test_a_rank_that_came_before_rank_zero_still_hears_who_is_missing():
    """Rank 0 starts its clock late; a rank waiting on it must not give up first."""
    results = _meet([0, 1], 3, timeout=3, delays={0: 2.0})
    assert "rank(s) [2] of 3 never arrived within 3 s" in str(results[1])
    assert "rank 0 answered" in str(results[1])


@pytest.mark.timeout(60)
def test_rank_zero_that_never_comes_is_named():
    address = ("127.0.0.1", free_port())
    results = _meet([1], 2, timeout=1, address=address)
    assert isinstance(results[1], RendezvousError)
    assert "rank 1 could not reach rank 0 at 127.0.0.1:%d within 1 s" % address[1] \
        in str(results[1])


@pytest.mark.timeout(60)
def test_a_rank_outside_the_world_and_a_duplicate_are_refused():
    address = ("127.0.0.1", free_port())
    results = {}

    def bad(rank, key, timeout=5):
        try:
            exchange(address, rank, 2, 1, "torchrun/2", timeout)
        except RendezvousError as err:
            results[key] = str(err)

    threads = [threading.Thread(target=bad, args=(7, "outside")),
               threading.Thread(target=bad, args=(1, "late duplicate", 1))]
    threads[0].start()                     # before the job is complete
    good = _meet([0, 1], 2, address=address, delays={0: 0.2, 1: 1.5})
    threads[1].start()                     # after it: rank 0's listener is closed
    for thread in threads:
        thread.join(15)
    assert good[0] == good[1] and len(good[0]) == 2
    assert "rank 7 is outside the world of 2 ranks" in results["outside"]
    assert "could not reach rank 0" in results["late duplicate"]


@pytest.mark.timeout(60)
def test_two_jobs_on_one_port_are_told_apart():
    address = ("127.0.0.1", free_port())
    results = {}

    def other_job():
        try:
            exchange(address, 1, 3, 1, "MPI/3", 5)
        except RendezvousError as err:
            results["other"] = str(err)

    thread = threading.Thread(target=other_job)
    thread.start()
    good = _meet([0, 1], 2, address=address, delays={0: 0.5, 1: 1.0})
    thread.join(10)
    assert len(good[1]) == 2
    assert "rank 0 runs a job of 2 rank(s) (torchrun/2), this rank says 3 ranks (MPI/3)" \
        in results["other"]


@pytest.mark.timeout(60)
def test_a_port_that_is_not_an_epl_rendezvous_is_named():
    """Another service (torch's own store, say) on the port: refused, not hung."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    address = server.getsockname()

    def answer_garbage():
        connection, _ = server.accept()
        connection.recv(1000)
        connection.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
        connection.close()

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    with pytest.raises(RendezvousError, match="not as EPL's rendezvous"):
        exchange(address, 1, 2, 1, "torchrun/2", 5)
    server.close()


@pytest.mark.timeout(60)
def test_rank_zero_cannot_hold_a_busy_port():
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen(1)
    try:
        with pytest.raises(RendezvousError, match="rank 0 cannot hold the rendezvous on port"):
            exchange(("127.0.0.1", busy.getsockname()[1]), 0, 2, 1, "t", 1)
    finally:
        busy.close()


def test_a_world_of_one_meets_nobody():
    assert exchange(("nowhere.invalid", 1), 0, 1, 1234, "t", 1) == ["127.0.0.1:1234"]
    assert 0 < rendezvous.free_port() < 65536
