"""The schedule command line's PNG check, shared by the tests of each schedule: each
schedule's test says only which arguments draw it."""
import os

import pytest

from epl.strategies.schedule.picture import main


def assert_draws_png(tmp_path, name, args):
    """``python -m epl.strategies.schedule <args> --png FILE`` exits 0 and writes a
    non-empty picture (skipped where matplotlib, an optional dependency, is missing)."""
    pytest.importorskip("matplotlib")
    path = str(tmp_path / name)
    assert main(list(args) + ["--png", path]) == 0
    assert os.path.getsize(path) > 0
