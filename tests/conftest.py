"""Shared fixtures: quiet TF logs, and EPL state never leaks between tests."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(autouse=True)
def _epl_clean_state(monkeypatch):
    """Each test starts without EPL env overrides and ends with hooks removed."""
    for name in list(os.environ):
        if name.startswith("EPL_") or name == "TF_CONFIG":
            monkeypatch.delenv(name, raising=False)
    # A hang in a test should fail well inside pytest-timeout's limit.
    monkeypatch.setenv("EPL_COMMUNICATION_TIMEOUT", "90")
    yield
    import sys
    if "epl.env" in sys.modules:
        sys.modules["epl.env"].reset()


def pytest_terminal_summary(terminalreporter):
    """Print the largest weight difference each equivalence test measured."""
    import sys
    eplutil = sys.modules.get("eplutil")
    if eplutil is None or not eplutil.MEASURED:
        return
    worst = {}
    for test, value in eplutil.MEASURED:
        worst[test] = max(value, worst.get(test, 0.0))
    terminalreporter.section("equivalence: max |weight - serial weight| per test")
    for test in sorted(worst):
        terminalreporter.write_line("%.3g  %s" % (worst[test], test))
