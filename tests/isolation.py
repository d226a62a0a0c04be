"""Tests that start in-process tf.train.Servers run in a process of their own.

TensorFlow cannot stop a server (TF 1.15 and 2.x alike: no shutdown), so every
in-process server keeps its threads until the process ends: about 40 per server on
TF 1.15 and 80 on TF 2.15, 100-300 per two-worker test. In a pytest-xdist worker
that runs a hundred such tests the threads add up to tens of thousands, and the
machine's pid space (kernel.pid_max, 32768 here; threads take pids) ran out at the
end of the TF 2.x leg: "Thread GrpcWorkerEnvPool creation via pthread_create()
failed" aborted the last tests' workers. So such a test runs in a fresh
``python -m pytest <nodeid>``; its reports come back serialized (as pytest-xdist
sends them), with their captured output and user properties, and its threads end
with it.

Which tests: those marked ``servers``, and those whose function, or a function of
their module it calls, names ``run_workers`` (eplutil's in-process workers; the
only way the suite starts servers). ``eplutil.run_workers`` refuses to start
servers outside such a process, so a test the scan misses fails saying so.
"""
import functools
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

import pytest

# Set in the child: the file its reports go to. Not an EPL_ name: tests clear those, and
# epl.init reads them as configuration overrides. Read once, when conftest imports this.
ISOLATED = "PYTEST_ISOLATED_REPORTS"
_REPORTS = os.environ.get(ISOLATED)
_MARGIN = 90  # seconds the parent waits beyond the test's own timeout (child start-up)
_NAME = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def in_isolated_process():
    """True in a process that runs one isolated test (run_workers may start servers)."""
    return bool(_REPORTS)


def _source(obj):
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


@functools.lru_cache(maxsize=None)
def _server_functions(module):
    """Names of the module's functions that start servers, directly or through another.

    Cached per module: collection asks once per test item, and reading a module's source
    for each of its items cost 20 of the 24 seconds of a collection."""
    functions = {name: _source(obj) for name, obj in vars(module).items()
                 if inspect.isfunction(obj) and obj.__module__ == module.__name__}
    found = {name for name, text in functions.items() if "run_workers" in text}
    grew = True
    while grew:
        grew = False
        for name, text in functions.items():
            if name not in found and found & set(_NAME.findall(text)):
                found.add(name)
                grew = True
    return frozenset(found)


def starts_servers(item):
    """Whether ``item`` starts in-process servers (see the module docstring)."""
    if item.get_closest_marker("servers") is not None:
        return True
    module = getattr(item, "module", None)
    name = getattr(item, "originalname", None)
    return module is not None and name in _server_functions(module)


def _timeout_of(item):
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    value = item.config.getini("timeout")
    return float(value) if value else 300.0


_CHILD_TIMEOUT = pytest.StashKey()


def mark_isolated(items):
    """Choose the tests to isolate. The child keeps the test's timeout; the parent's
    pytest-timeout limit grows by the child's start-up, and the parent kills a child
    that outlives its own limit by half that margin."""
    if in_isolated_process():
        return
    for item in items:
        if starts_servers(item):
            limit = _timeout_of(item)
            item.stash[_CHILD_TIMEOUT] = limit + _MARGIN / 2
            item.add_marker(pytest.mark.timeout(limit + _MARGIN), append=False)


def isolated(item):
    """Whether the parent runs ``item`` in a child process."""
    return _CHILD_TIMEOUT in item.stash


def _child_command(item):
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--rootdir", str(item.config.rootdir), "-o", "addopts=", item.nodeid]


def _run_child(item, reports_file):
    """Run the test in its own process; returns (exit code or None on timeout, output)."""
    env = dict(os.environ, **{ISOLATED: reports_file})
    child = subprocess.Popen(_child_command(item), cwd=str(item.config.rootdir), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        output, _ = child.communicate(timeout=item.stash[_CHILD_TIMEOUT])
        return child.returncode, output.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        return None, output.decode("utf-8", "replace")


def _read_reports(item, reports_file):
    reports = []
    with open(reports_file) as handle:
        for line in handle:
            report = item.config.hook.pytest_report_from_serializable(
                config=item.config, data=json.loads(line))
            if isinstance(report.longrepr, list):  # a skip's (path, line, reason): JSON
                report.longrepr = tuple(report.longrepr)  # has no tuples
            reports.append(report)
    return reports


def _failure(item, code, output):
    """A failed call report for a child that ended without reporting the call."""
    from _pytest.reports import TestReport
    why = "timed out" if code is None else "exited with code %s" % code
    text = "the isolated process of %s %s before reporting; its output:\n%s" % (
        item.nodeid, why, output[-6000:])
    return TestReport(item.nodeid, item.location, {}, "failed", text, "call")


def run_isolated(item):
    """Run ``item`` in a child pytest and log the child's reports as the item's own."""
    handle, reports_file = tempfile.mkstemp(prefix="epl-isolated-", suffix=".jsonl")
    os.close(handle)
    try:
        code, output = _run_child(item, reports_file)
        reports = _read_reports(item, reports_file)
    finally:
        os.unlink(reports_file)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    if not any(r.when == "call" or r.outcome != "passed" for r in reports):
        reports.append(_failure(item, code, output))
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def record_report(config, report):
    """In the child: append each report to the parent's file as it is made (a child that
    is killed mid-test still leaves its setup report)."""
    if not _REPORTS:
        return
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    with open(_REPORTS, "a") as handle:
        handle.write(json.dumps(data) + "\n")
