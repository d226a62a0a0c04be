"""No silent hangs: missing or stalled workers end in a clear error, within the timeout."""
import json
import os
import subprocess
import sys
import time

import pytest

from epl.session.watchdog import TIMEOUT_EXIT_CODE, Watchdog
from eplutil import free_ports, run_launcher

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "stall_train.py")


def test_watchdog_fires_only_for_runs_past_their_deadline():
    fired = []
    watchdog = Watchdog(on_timeout=fired.append, poll=0.05)
    with watchdog.guard(5.0, lambda elapsed: "slow"):
        pass
    with watchdog.guard(0.2, lambda elapsed: "stuck after %.1f" % elapsed):
        time.sleep(0.6)
    time.sleep(0.2)
    assert len(fired) == 1 and fired[0].startswith("stuck after")


@pytest.mark.timeout(120)
def test_worker_that_never_joins_is_named():
    hosts = ["127.0.0.1:%d" % p for p in free_ports(2)]
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": hosts},
                                                 "task": {"type": "worker", "index": 0}}),
               EPL_COMMUNICATION_TIMEOUT="4", EPL_NUM_VIRTUAL_DEVICES="1")
    start = time.time()
    proc = subprocess.run([sys.executable, SCRIPT, "solo"], env=env, timeout=100,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = proc.stdout.decode(errors="replace")
    assert proc.returncode != 0
    assert "worker(s) at %s did not come up within communication.timeout=4" % hosts[1] \
        in output, output[-2000:]
    assert "a worker that failed before its first step" in output  # where to look first
    assert time.time() - start < 60


def _start_worker(index, hosts, extra_env, mode):
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": hosts},
                                                 "task": {"type": "worker", "index": index}}),
               EPL_NUM_VIRTUAL_DEVICES="1", **extra_env)
    return subprocess.Popen([sys.executable, SCRIPT, mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("shared_memory", ["1", "0"])
def test_peer_process_exit_fails_the_ring_fast(shared_memory):
    """A peer that exits mid-training is reported long before the 60 s timeout, on
    shared-memory links (watched through their TCP socket) as on TCP ones."""
    hosts = ["127.0.0.1:%d" % p for p in free_ports(2)]
    extra = {"EPL_COMMUNICATION_TIMEOUT": "60", "EPL_RING_SHARED_MEMORY": shared_memory}
    start = time.time()
    procs = [_start_worker(i, hosts, extra, "die") for i in range(2)]
    try:
        outputs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 3, outputs[1][-2000:]
    assert procs[0].returncode != 0, outputs[0][-2000:]
    assert "rank 1 (127.0.0.1:" in outputs[0] and "closed the connection" in outputs[0], \
        outputs[0][-3000:]
    assert time.time() - start < 55


@pytest.mark.timeout(150)
def test_stalled_collective_stops_the_job_with_the_group_named(tmp_path, monkeypatch):
    monkeypatch.setenv("EPL_COMMUNICATION_TIMEOUT", "5")
    start = time.time()
    code, output = run_launcher(["--num_workers", "2", "--gpu_per_worker", "1",
                                 "--log_dir", str(tmp_path), SCRIPT, "stall"], timeout=120)
    assert code == TIMEOUT_EXIT_CODE, output[-3000:]
    assert "worker 0 failed with exit code %d" % TIMEOUT_EXIT_CODE in output
    assert "EPL collective timeout: a session.run on worker 0 (127.0.0.1:" in output
    assert "broadcast/taskgraph_0: 2 devices" in output or "grads/taskgraph_0" in output
    assert time.time() - start < 90
