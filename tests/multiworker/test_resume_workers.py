"""Self-healing with real processes: epl-launch --max_restarts, kills at seeded random
steps, and the final weights of an uninterrupted run (max |diff| <= 1e-6).

Each job is tests/multiworker/scripts/resume_train.py (Adam, shuffled tf.data shards,
MonitoredTrainingSession writing the user's checkpoints every 3 steps; EPL snapshots
every 2 steps). Faults strike after a number of training runs, counted by a hook, so no
test depends on timing: SIGKILL of a worker, SIGKILL of worker 0 between a snapshot's
files and its manifest, a worker that stops (SIGSTOP) and is turned into a restart by
the collective timeout. The kill steps are printed with their seed.
"""
import os
import random
import sys

import numpy as np
import pytest

from eplutil import MEASURED, run_launcher

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "resume_train.py")
LAST_STEP = 12
TOL = 1e-6


def _launch(tmp_path, name, layout, faults="", restarts=0, env=None):
    out = tmp_path / name
    out.mkdir()
    args = ["--num_workers", "2", "--gpu_per_worker", "1", "--log_dir", str(out / "logs")]
    if restarts:
        args += ["--max_restarts", str(restarts)]
    saved = dict(os.environ)
    os.environ.update(env or {})
    os.environ["EPL_CHECKPOINT_SNAPSHOT_STEPS"] = "2"
    try:
        code, output = run_launcher(args + [SCRIPT, str(out), layout, str(LAST_STEP), faults],
                                    timeout=400)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, output, out


def _weights(out, worker):
    with np.load(str(out / ("worker_%d.npz" % worker))) as data:
        return dict(data.items())


def _compare(reference, resumed):
    assert sorted(reference) == sorted(resumed)
    worst = max(float(np.abs(reference[k] - resumed[k]).max()) for k in reference)
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    return worst


def _runs(label, low=4, high=LAST_STEP - 2):
    value = random.Random(label).randint(low, high)
    print("%s: %d runs (seed %r)" % (label, value, label))
    return value


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs of each layout, computed once."""
    found = {}
    for layout in ("dp", "pipeline"):
        code, output, out = _launch(tmp_path_factory.mktemp("ref"), layout, layout)
        assert code == 0, output[-3000:]
        found[layout] = _weights(out, 0)
    return found


@pytest.mark.timeout(900)
def test_kills_of_another_worker_and_of_worker_0_during_a_write(tmp_path, references):
    """Attempt 0: worker 1 is killed. Attempt 1: worker 0 is killed while it writes a
    snapshot (after its files, before its manifest). The third attempt finishes."""
    first = _runs("dp other worker")
    write_step = 2 * random.Random("dp write").randint(first // 2 + 1, LAST_STEP // 2 - 1)
    print("worker 0 killed while writing the snapshot of step %d" % write_step)
    faults = "0:1:%d:kill,1:0:%d:write" % (first, write_step)
    code, output, out = _launch(tmp_path, "job", "dp", faults, restarts=2)
    assert code == 0, output[-4000:]
    assert "restart 1 of 2: worker 1 exited with code 137 (killed by SIGKILL)" in output
    assert "restart 2 of 2: worker 0 exited with code 137" in output
    assert "FAULT write: while writing the snapshot of step %d" % write_step in output
    assert "job finished after 2 restart(s)" in output
    assert "resuming from the snapshot of step" in output
    for worker in (0, 1):
        assert _compare(references["dp"], _weights(out, worker)) <= TOL


@pytest.mark.timeout(900)
def test_a_hanging_worker_becomes_a_restart(tmp_path, references):
    """Worker 1 stops (SIGSTOP): worker 0's collective times out, it exits 138, the
    launcher restarts the job (stopping worker 1 with SIGTERM and SIGCONT)."""
    runs = _runs("dp hang")
    code, output, out = _launch(tmp_path, "job", "dp", "0:1:%d:hang" % runs, restarts=1,
                                env={"EPL_COMMUNICATION_TIMEOUT": "8"})
    assert code == 0, output[-4000:]
    assert "restart 1 of 1: worker 0 exited with code 138" in output
    assert _compare(references["dp"], _weights(out, 0)) <= TOL


@pytest.mark.timeout(900)
def test_a_pipeline_across_workers_resumes_after_a_kill_of_its_driver(tmp_path, references):
    runs = _runs("pipeline driver")
    code, output, out = _launch(tmp_path, "job", "pipeline", "0:0:%d:kill" % runs,
                                restarts=1)
    assert code == 0, output[-4000:]
    assert "restart 1 of 1: worker 0 exited with code 137" in output
    assert _compare(references["pipeline"], _weights(out, 0)) <= TOL


def test_fault_specs_pick_the_attempt_and_worker():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import resume_train
    assert resume_train.faults_of("0:1:5:kill,1:0:6:write", 1, 0) == [(6, "write")]
