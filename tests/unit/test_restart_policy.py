"""epl-launch --max_restarts: the pure restart policy and the flag. No process starts."""
import os
import subprocess
import sys

import pytest

from epl.launcher import parse_args, plan_workers
from epl.launcher.restart import (FAULT_EXIT_CODE, REPEATS_WITHOUT_PROGRESS, Attempt, Failure,
                                  cause_of, decide, describe, is_retryable, summary)

BASE = ["--num_workers", "2", "--gpu_per_worker", "1"]


@pytest.mark.parametrize("code,retryable", [(130, True), (137, True), (138, True), (143, True),
                                            (1, False), (2, False), (124, False),
                                            (126, False), (127, False), (139, False),
                                            (134, False)])
def test_exit_codes_follow_kubeflows_exit_code_policy(code, retryable):
    assert is_retryable(code) is retryable


def test_a_killed_worker_is_restarted_while_restarts_remain():
    attempts = [Attempt([Failure(1, 137)], progress=None)]
    decision = decide(attempts, max_restarts=1)
    assert decision.restart and decision.cause == Failure(1, 137)
    assert "worker 1 exited with code 137 (killed by SIGKILL)" in decision.reason
    attempts.append(Attempt([Failure(0, 143)], progress=None))
    decision = decide(attempts, max_restarts=1)
    assert not decision.restart and decision.exit_code == 143
    assert "no restarts left (--max_restarts 1)" in decision.reason


def test_an_error_in_the_program_is_never_retried():
    decision = decide([Attempt([Failure(0, 1)], progress=10)], max_restarts=5)
    assert not decision.restart and decision.exit_code == 1
    assert "an error in the program, not retried" in decision.reason
    assert "130/137/138/143" in decision.reason


def test_the_root_cause_is_the_signal_not_the_peer_that_lost_it():
    """Workers noticed together: a kill is the cause, 138 (lost a peer) only a consequence,
    and an exception beats a consequence."""
    assert cause_of([Failure(0, FAULT_EXIT_CODE), Failure(1, 137)]) == Failure(1, 137)
    assert cause_of([Failure(0, FAULT_EXIT_CODE), Failure(1, 1)]) == Failure(1, 1)
    assert cause_of([Failure(0, 1), Failure(1, 143)]) == Failure(1, 143)
    assert cause_of([Failure(1, FAULT_EXIT_CODE)]) == Failure(1, FAULT_EXIT_CODE)
    assert not decide([Attempt([Failure(0, FAULT_EXIT_CODE), Failure(1, 1)], None)],
                      3).restart


def test_a_fault_repeating_without_progress_is_given_up():
    same = [Attempt([Failure(1, 137)], progress=20) for _ in range(REPEATS_WITHOUT_PROGRESS)]
    decision = decide(same, max_restarts=10)
    assert not decision.restart and decision.exit_code == 137
    assert "without a new snapshot (step 20)" in decision.reason
    # progress in between, another worker, or no snapshots at all: still restarted
    moving = same[:-1] + [Attempt([Failure(1, 137)], progress=30)]
    assert decide(moving, 10).restart
    other = same[:-1] + [Attempt([Failure(0, 137)], progress=20)]
    assert decide(other, 10).restart
    unknown = [Attempt([Failure(1, 137)], progress=None)] * REPEATS_WITHOUT_PROGRESS
    assert decide(unknown, 10).restart


def test_describe_and_summary_name_each_cause():
    assert describe(Failure(2, 1)) == ("worker 2 exited with code 1 (an uncaught error in "
                                       "the program)")
    assert describe(Failure(0, 139)) == "worker 0 exited with code 139 (killed by SIGSEGV)"
    assert summary([Attempt([Failure(1, 137)], 4), Attempt([Failure(0, 138)], 8)]) == [
        "restart 1 after: worker 1 exited with code 137 (killed by SIGKILL)",
        "restart 2 after: worker 0 exited with code 138 (EPL fault exit: a peer was lost "
        "or a collective timed out)"]


def test_max_restarts_flag():
    assert parse_args(BASE + ["train.py"]).max_restarts == 0
    assert parse_args(BASE + ["--max_restarts", "3", "train.py"]).max_restarts == 3


@pytest.mark.parametrize("value,message", [("-1", "must be >= 0, got '-1'"),
                                           ("two", "invalid int value: 'two'"),
                                           ("1.5", "invalid int value: '1.5'")])
def test_bad_max_restarts_names_flag_and_value(capsys, value, message):
    with pytest.raises(SystemExit) as info:
        parse_args(BASE + ["--max_restarts", value, "train.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --max_restarts" in err and message in err


def test_workers_get_the_restart_count_and_the_snapshot_dir():
    settings = parse_args(BASE + ["train.py"])._replace(log_dir="/job")
    specs = plan_workers(settings, ["127.0.0.1:1", "127.0.0.1:2"], [], {})
    for spec in specs:
        assert spec.env["EPL_RESTART_COUNT"] == "0"
        assert spec.env["EPL_CHECKPOINT_SNAPSHOT_DIR"] == "/job/epl_snapshots"
    mine = plan_workers(settings, ["127.0.0.1:1", "127.0.0.1:2"], [],
                        {"EPL_CHECKPOINT_SNAPSHOT_DIR": "/shared/snaps"})
    assert mine[1].env["EPL_CHECKPOINT_SNAPSHOT_DIR"] == "/shared/snaps"


def test_the_launcher_still_imports_no_tensorflow():
    """It reads epl.session's exit code and snapshot layout, both TF-free modules."""
    code = ("import sys, epl.launcher; "
            "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('tensorflow')))")
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__)))))
    assert out.stdout.decode().strip() == "[]"
