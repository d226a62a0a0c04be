"""epl-launch --max_restarts with real processes: tiny worker scripts (no TensorFlow).

Workers read EPL_RESTART_COUNT to act differently per attempt; nothing waits on a clock
to pass (workers wait for files).
"""
import io
import os
import textwrap

import pytest

from epl import launcher

PRELUDE = """\
import json, os, signal, sys, time
INDEX = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
ATTEMPT = int(os.environ["EPL_RESTART_COUNT"])
"""


def _specs(tmp_path, body, workers=2):
    path = tmp_path / "worker.py"
    path.write_text(PRELUDE + textwrap.dedent(body))
    settings = launcher.parse_args(["--num_workers", str(workers), "--gpu_per_worker", "1",
                                    "--log_dir", str(tmp_path / "logs"), str(path),
                                    str(tmp_path)])
    hosts = ["127.0.0.1:%d" % p for p in launcher.pick_free_ports(workers)]
    return launcher.plan_workers(settings, hosts, [], dict(os.environ))


def _run(specs, max_restarts):
    out, err = io.StringIO(), io.StringIO()
    code = launcher.execute_with_restarts(specs, max_restarts, grace_period=2.0,
                                          stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.timeout(60)
def test_a_killed_worker_restarts_the_job_which_then_succeeds(tmp_path):
    code, out, err = _run(_specs(tmp_path, """
        print("attempt", ATTEMPT, "worker", INDEX)
        if INDEX == 1 and ATTEMPT < 2:
            os.kill(os.getpid(), signal.SIGKILL)
        if INDEX == 0:   # wait for worker 1 of this attempt: never finish before its kill
            while not os.path.exists(os.path.join(sys.argv[1], "never")) and ATTEMPT < 2:
                time.sleep(0.02)
    """), max_restarts=2)
    assert code == 0, err
    assert "restart 1 of 2: worker 1 exited with code 137 (killed by SIGKILL)" in err
    assert "restart 2 of 2: worker 1 exited with code 137" in err
    assert "job finished after 2 restart(s)" in err
    assert "restart 1 after: worker 1 exited with code 137" in err
    for attempt in range(3):
        assert "[worker 0] attempt %d worker 0" % attempt in out


@pytest.mark.timeout(60)
def test_an_error_in_the_program_is_not_retried(tmp_path):
    code, out, err = _run(_specs(tmp_path, """
        print("attempt", ATTEMPT)
        if INDEX == 1:
            raise ValueError("a bug")
        time.sleep(1000)
    """), max_restarts=3)
    assert code == 1
    assert "giving up after 0 restart(s) of 3: worker 1 exited with code 1" in err
    assert "an error in the program, not retried" in err
    assert "attempt 1" not in out


@pytest.mark.timeout(60)
def test_restarts_used_up_end_with_the_faults_exit_code(tmp_path):
    code, out, err = _run(_specs(tmp_path, """
        if INDEX == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1000)
    """), max_restarts=1)
    assert code == 143
    assert "restart 1 of 1: worker 0 exited with code 143 (terminated by SIGTERM)" in err
    assert "giving up after 1 restart(s) of 1" in err and "no restarts left" in err
    assert "restart 1 after: worker 0 exited with code 143" in err


@pytest.mark.timeout(60)
def test_a_peer_lost_exit_is_retried_but_the_signal_is_the_cause(tmp_path):
    """Worker 1 is killed; worker 0 notices and exits 138 (EPL's fault exit). Whichever
    the launcher sees, the attempt is restarted; the second attempt succeeds."""
    code, out, err = _run(_specs(tmp_path, """
        flag = os.path.join(sys.argv[1], "killed")
        if ATTEMPT == 0 and INDEX == 1:
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if ATTEMPT == 0 and INDEX == 0:
            while not os.path.exists(flag):
                time.sleep(0.02)
            sys.exit(138)
    """), max_restarts=1)
    assert code == 0, err
    assert "restart 1 of 1: worker 1 exited with code 137" in err or \
        "restart 1 of 1: worker 0 exited with code 138" in err


@pytest.mark.timeout(60)
def test_max_restarts_zero_keeps_fail_fast(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = tmp_path / "worker.py"
    path.write_text(PRELUDE + "if INDEX == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
                    "time.sleep(1000)\n")
    code = launcher.main(["--log_dir", str(tmp_path / "logs"), "--num_workers", "2",
                          "--gpu_per_worker", "1", str(path)], detect_gpus=lambda: 0)
    assert code == 137
    err = capsys.readouterr().err
    assert "worker 1 failed with exit code 137 (killed by SIGKILL)" in err
    assert "restart 1" not in err and "giving up" not in err
