"""Shared fixtures: quiet TF logs, and EPL state never leaks between tests."""
import os

import pytest

import isolation

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.x turns on oneDNN's custom CPU ops on CPUs with AVX-512 and newer; with them the
# first step of a ResNet pipeline with gradient checkpointing and offload never ended on
# TF 2.15.1 (no graph cycle, every thread idle; with this set it trains: docs/tf2.md,
# "Known problems"). TF reads it when it loads, so it is set before any test imports it.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# epl.init gives CPU jobs TF's BFC allocator unless the user chose (epl.cluster.cpu_allocator,
# tested in own processes by test_cpu_allocator_in_use). The suite keeps TF's default (malloc):
# its memory tests compare bytes per tensor, and under BFC those are the chunks the process's
# allocator happened to have free, which depend on every test the xdist worker ran before
# (a stage-functions vs unrolled peak comparison failed that way in CI; docs/design.md).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "0")


def pytest_configure(config):
    """The suite is TF1-style graph code, as a user's TF 2.x program converted with
    `import tensorflow.compat.v1 as tf; tf.disable_v2_behavior()` (docs/tf2.md): on
    TensorFlow 2.x that call comes first; on 1.15 it changes nothing."""
    import tensorflow.compat.v1 as tf
    tf.disable_v2_behavior()


def pytest_collection_modifyitems(items):
    isolation.mark_isolated(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Tests that start in-process servers run in a process of their own (tests/isolation.py)."""
    if not isolation.isolated(item):
        return None
    isolation.run_isolated(item)
    # The parent ran no setup for ``item``, but an earlier item of its module may have
    # left the module (and its fixtures) set up: tear down what ``nextitem`` does not
    # share, as pytest's own protocol would, or the next module's first test errors with
    # "previous item was not torn down properly".
    item.session._setupstate.teardown_exact(nextitem)  # pylint: disable=protected-access
    return True


@pytest.fixture(autouse=True)
def _epl_clean_state(monkeypatch):
    """Each test starts without EPL env overrides or a cluster engine's variables (a
    suite run inside srun or mpirun must not make epl.init join that job), and ends
    with hooks removed."""
    from epl.cluster.discovery import engine_variables
    engine = set(engine_variables(os.environ))
    for name in list(os.environ):
        if name.startswith("EPL_") or name in engine:
            monkeypatch.delenv(name, raising=False)
    # A hang in a test should fail well inside pytest-timeout's limit.
    monkeypatch.setenv("EPL_COMMUNICATION_TIMEOUT", "90")
    yield
    import sys
    if "epl.env" in sys.modules:
        sys.modules["epl.env"].reset()


@pytest.fixture(scope="module")
def corpus_reference():
    """``corpusutil.serial_reference(model, arrays, slices, stats=stats)``, trained once per
    model class and settings, data, slices and (for a model with moving statistics, the
    only ones where it changes the reference) ``stats`` in a test module's process: the
    modes of one model compare against the same serial run instead of training it again
    per test (tests/graph/test_corpus.py trained BERT's five times). The serial run is
    deterministic; tests only read the curve and values it returns."""
    import numpy as np
    import corpusutil
    memo = {}

    def reference(model, arrays, slices, stats="all"):
        key = (type(model), tuple(sorted(vars(model).items())),
               tuple(np.asarray(a).tobytes() for a in arrays), slices,
               stats if model.moving_stats else None)
        if key not in memo:
            memo[key] = corpusutil.serial_reference(model, arrays, slices, stats=stats)
        return memo[key]
    return reference


def _timeout_of(item):
    """The pytest-timeout limit of ``item`` (its marker, else setup.cfg's), or None."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    value = item.config.getini("timeout")
    return float(value) if value else None


@pytest.fixture(autouse=True)
def _test_deadline(request):
    """Tell eplutil's waiting helpers when this test must have ended."""
    import sys
    import time
    eplutil = sys.modules.get("eplutil")
    limit = _timeout_of(request.node)
    if eplutil is None or not limit:
        yield
        return
    eplutil.TEST_DEADLINE[0] = time.time() + limit - eplutil.DEADLINE_MARGIN
    yield
    eplutil.TEST_DEADLINE[0] = None


_EQUIVALENCE = []   # (test, max difference) from every test report, xdist workers' too
_TIMINGS = []       # (what, seconds) from every test report (eplutil.TIMINGS)
_TAKEN = {"equivalence": 0, "timing": 0}  # this process's entries reported so far


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the equivalence differences and timings a test measured to its teardown
    report, so that they reach the summary from whichever process ran the test
    (pytest-xdist)."""
    outcome = yield
    import sys
    eplutil = sys.modules.get("eplutil")
    if call.when == "teardown" and eplutil is not None:
        for name, entries in (("equivalence", eplutil.MEASURED), ("timing", eplutil.TIMINGS)):
            new = entries[_TAKEN[name]:]
            _TAKEN[name] = len(entries)
            outcome.get_result().user_properties.extend((name, list(m)) for m in new)
    isolation.record_report(item.config, outcome.get_result())


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "equivalence":
            _EQUIVALENCE.append(tuple(value))
        elif name == "timing":
            _TIMINGS.append(tuple(value))


def pytest_terminal_summary(terminalreporter):
    """Print the timings tests recorded and the largest weight difference each
    equivalence test measured."""
    if _TIMINGS:
        terminalreporter.section("timings measured by tests (seconds)")
        for what, seconds in _TIMINGS:
            terminalreporter.write_line("%6.2f  %s" % (seconds, what))
    if not _EQUIVALENCE:
        return
    worst = {}
    for test, value in _EQUIVALENCE:
        worst[test] = max(value, worst.get(test, 0.0))
    terminalreporter.section("equivalence: max |weight - serial weight| per test")
    for test in sorted(worst):
        terminalreporter.write_line("%.3g  %s" % (worst[test], test))
