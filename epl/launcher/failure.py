"""What a failed worker said: its last lines and the error it raised.

A TensorFlow run-time error (a failed ``tf.Assert``, a batch that does not divide
among the devices, EPL's ring giving up on a silent peer) reaches the worker's
output as a Python traceback whose exception line is followed by TF's "Original
stack trace" of the failing node: 20-60 lines of frames. The last lines of the
output are those frames, so a summary of the last lines alone hides the error.

:class:`OutputRecord` keeps both, line by line as the output streams by, in
constant memory: the last ``limit`` lines, and the last error the worker printed
(the exception line and its message; for TF errors the failing node, and where
the user's code created it, read from the original stack trace). The launcher's
failure summary leads with the error, then shows the tail (:func:`error_lines`).

Example::

    record = OutputRecord(20)
    for line in worker_output:
        record.append(line)
    record.error().node           # 'check_positive/Assert', or None
"""
import collections
import re

TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
ORIGIN = re.compile(r"^Original stack trace for '(.+)':$")
# TF 1.15: "[[node a/b (defined at f.py:3) ]]" or "[[{{node a/b}}]]"; TF 2.x also
# "[[{{function_node f_8}}{{node Assert}}]]" for a node inside a function.
NODE = re.compile(r"(?:\[\[|\{\{)node ([^\s}\]]+)")
FUNCTION = re.compile(r"\{\{function_node ([^}]+)\}\}")
FRAME = re.compile(r'^\s+File "(.+)", line (\d+)')
# A frame inside TensorFlow's own code: the origin we report is the user's frame below it.
TF_FRAME = re.compile(r"[/\\](tensorflow|tensorflow_core|tensorflow_estimator)[/\\]")
# TensorFlow's C++ fatal log line (the process aborts right after it, without a traceback).
FATAL = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: F (\S+)\] (.+)$")
MESSAGE_LINES = 8

WorkerError = collections.namedtuple("WorkerError", ["lines", "node", "origin"])
WorkerError.__doc__ = """The last error a worker printed: ``lines`` (the exception line
and the rest of its message's first paragraph), ``node`` (the failing TF node, or None)
and ``origin`` ("file:line" where the user's code created the node, or None)."""


class OutputRecord(object):
    """A worker's last ``limit`` lines (iterate, ``len``) and the last error it printed.

    Fed by the launcher's output readers with ``append`` / ``extend``, like the
    ``collections.deque`` it replaces."""

    def __init__(self, limit):
        self._tail = collections.deque(maxlen=limit)
        self._state = _IDLE
        self._message = None      # lines of the exception being read
        self._error = None        # the last complete WorkerError
        self._origin_of = None    # node whose original stack trace is being read

    def __iter__(self):
        return iter(list(self._tail))

    def __len__(self):
        return len(self._tail)

    def extend(self, lines):
        for line in lines:
            self.append(line)

    def append(self, line):
        """Add one line (without its newline) of the worker's output."""
        self._tail.append(line)
        self._state(self, line)

    def error(self):
        """The last error the worker printed, or None (killed, or exited without one)."""
        if self._message:
            return _error_of(self._message)
        return self._error

    # ---- the reader's states: each takes (record, line) -------------------------------
    def _start_traceback(self):
        self._finish_message()
        self._origin_of = None
        self._state = _FRAMES

    def _finish_message(self):
        if self._message:
            self._error = _error_of(self._message)
        self._message = None

    def _set_origin(self, origin):
        if self._error is not None and self._error.node == self._origin_of:
            self._error = self._error._replace(origin=origin)


def _error_of(lines):
    node = None
    for line in lines:
        match = NODE.search(line)
        if match:
            function = FUNCTION.search(line)
            node = match.group(1) + (" in function %s" % function.group(1) if function else "")
    return WorkerError(tuple(lines), node, None)


def _idle(record, line):
    """Between errors: a traceback starts, TF's original stack trace of the last error's
    node starts (after the message's blank line), or TF logs a fatal error."""
    stripped = line.rstrip()
    if stripped == TRACEBACK:
        record._start_traceback()
        return
    origin = ORIGIN.match(stripped)
    if origin:
        record._origin_of = origin.group(1)
        record._state = _ORIGIN
        return
    fatal = FATAL.match(line)
    if fatal:
        record._error = WorkerError(("%s (%s)" % (fatal.group(2), fatal.group(1)),), None, None)


def _frames(record, line):
    """Inside a traceback: indented frames until the exception line at column 0."""
    if line.startswith((" ", "\t")) or not line.strip():
        return
    if line.rstrip() == TRACEBACK:
        record._start_traceback()
        return
    record._message = [line]
    record._state = _MESSAGE


def _message(record, line):
    """The exception's message: up to its first blank line (TF errors: the node line).
    A first line that only announces the message (TF 2.x: "...Error: Graph execution
    error:") is followed by a blank line and then the message itself."""
    stripped = line.rstrip()
    if not stripped and len(record._message) == 1 and record._message[0].rstrip().endswith(":"):
        return
    if not stripped or ORIGIN.match(stripped) or stripped == TRACEBACK \
            or stripped.startswith(CHAINED) or len(record._message) >= MESSAGE_LINES:
        record._finish_message()
        record._state = _IDLE
        _idle(record, line)
        return
    record._message.append(line)


def _origin(record, line):
    """TF's original stack trace of the failing node: keep its innermost frame outside
    TensorFlow (the user's line that created the node)."""
    frame = FRAME.match(line)
    if frame:
        if not TF_FRAME.search(frame.group(1)):
            record._set_origin("%s:%s" % (frame.group(1), frame.group(2)))
        return
    if line.startswith((" ", "\t")):
        return
    record._state = _IDLE
    _idle(record, line)


_IDLE, _FRAMES, _MESSAGE, _ORIGIN = _idle, _frames, _message, _origin


def error_lines(error):
    """The failure summary's lead: the error's lines, then its node and origin."""
    if error is None:
        return []
    lines = list(error.lines)
    if error.node:
        lines.append("failing node: %s%s" % (
            error.node, " (created at %s)" % error.origin if error.origin else ""))
    return lines
