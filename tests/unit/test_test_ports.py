"""eplutil.free_ports: ports outside the ephemeral range, held against other test processes."""
import os
import tempfile

import eplutil


def test_free_ports_are_below_the_ephemeral_range_and_stay_reserved():
    ports = eplutil.free_ports(3)
    assert len(set(ports)) == 3
    assert all(eplutil._TEST_PORTS[0] <= p < eplutil._TEST_PORTS[1] for p in ports)
    assert all(p < eplutil.ephemeral_low() for p in ports)
    lock_dir = os.path.join(tempfile.gettempdir(), "epl-test-ports")
    # another reservation of the same port (a new lock on the file) is refused
    assert not any(eplutil._reserve(p, lock_dir) for p in ports)
