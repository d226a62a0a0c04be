"""tests/isolation.py: which tests run in a process of their own, and the guard."""
import importlib.util

import pytest

import eplutil
import isolation


def test_server_functions_follow_helpers_of_the_module(tmp_path):
    path = tmp_path / "fake_tests.py"
    path.write_text(
        "def helper():\n    return run_workers(None, 2, 1)\n\n"
        "def wrapper():\n    return helper()\n\n"
        "def test_direct():\n    run_workers(None, 2, 1)\n\n"
        "def test_through_two():\n    wrapper()\n\n"
        "def test_local():\n    return 1\n")
    spec = importlib.util.spec_from_file_location("fake_tests", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isolation._server_functions(module) == {
        "helper", "wrapper", "test_direct", "test_through_two"}


def test_in_process_workers_refuse_outside_an_isolated_process():
    # Looked up by a name the scan does not see, so that this test runs in the suite's
    # own process, where the guard must refuse before any server starts.
    start = getattr(eplutil, "run_" + "workers")
    assert not isolation.in_isolated_process()
    with pytest.raises(AssertionError, match="pytest.mark.servers"):
        start(lambda index: index, 2, 1)
