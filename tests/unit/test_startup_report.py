"""benchmarks/startup.py's ``--snapshots off`` rows (issue 41): the child gets
``checkpoint.snapshot_steps=0``, a row whose snapshot directory disagrees with its
label fails instead of being tabulated, and such rows are labelled."""
import importlib.util
import os
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "startup.py")
_SPEC = importlib.util.spec_from_file_location("startup", SCRIPT)
startup = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(startup)


def _run(**extra):
    phase = dict(build=1.0, session=2.0, first_run=1.0)
    run = dict(wall=dict(phase), cpu=dict(phase), main=dict(phase), steady=0.5,
               ops_before=10, ops_after=20, functions=0, function_nodes=0, run_signatures=5)
    run.update(extra)
    return run


def test_a_row_with_snapshots_off_that_wrote_one_fails():
    with pytest.raises(startup.common.BenchmarkError, match="snapshots off"):
        startup.check_snapshots(dict(snapshot_steps=[0]), "off", "resnet dp")
    with pytest.raises(startup.common.BenchmarkError, match="no step-0 snapshot"):
        startup.check_snapshots(dict(snapshot_steps=[]), "on", "resnet dp")
    startup.check_snapshots(dict(snapshot_steps=[]), "off", "resnet dp")
    startup.check_snapshots(dict(snapshot_steps=[0]), "on", "resnet dp")
    startup.check_snapshots(dict(snapshot_steps=None), "off", "resnet plain")


def test_the_child_of_a_row_with_snapshots_off_gets_snapshot_steps_zero(monkeypatch):
    seen = {}

    def launched(script_args, devices, env, drop, what):
        seen.update(env=env, drop=drop)
        return _run(snapshot_steps=[])
    monkeypatch.setattr(startup, "_launched", launched)
    monkeypatch.setattr(startup, "shapes_devices", lambda mode: 2)
    args = types.SimpleNamespace(micro_batches=4, steady_steps=1, allocator="default",
                                 in_process=False, snapshots="off")
    startup.run_row(args, "resnet", "dp/stage_functions")
    assert seen["env"][startup.SNAPSHOT_STEPS_VARIABLE] == "0"
    args.snapshots = "on"
    with pytest.raises(startup.common.BenchmarkError, match="no step-0 snapshot"):
        startup.run_row(args, "resnet", "dp/stage_functions")
    assert startup.SNAPSHOT_STEPS_VARIABLE in seen["drop"]
    assert startup.SNAPSHOT_STEPS_VARIABLE not in seen["env"]


def test_rows_without_snapshots_are_labelled():
    plain = _run()
    records = [dict(shape="resnet", row="plain", run=plain, snapshots="off", launched=False),
               dict(shape="resnet", row="dp/stage_functions", run=_run(), plain=plain,
                    snapshots="off", launched=True),
               dict(shape="resnet", row="dp/stage_functions", run=_run(), plain=plain,
                    snapshots="on", launched=True)]
    modes = [row[1] for row in startup.table_rows(records)]
    assert modes == ["plain", "dp (no snapshots)", "dp"]
