"""epl.launcher.failure: the error a failed worker printed, found as its output streams.

The texts below are what TF 1.15 and Python print (a failed tf.Assert under
session.run, abbreviated frames); tests/multiworker/test_launcher_exec.py checks the
summary of a real failing TensorFlow worker."""
import textwrap

from epl.launcher.failure import OutputRecord, error_lines

ERROR = ("tensorflow.python.framework.errors_impl.InvalidArgumentError: assertion failed: "
         "[x must be positive] [1 -1]")
SITE = "/venv/lib/python3.7/site-packages/tensorflow_core/python"
TF_ASSERT = textwrap.dedent("""\
    WARNING:tensorflow:From train.py:2: The name tf.placeholder is deprecated.
    Traceback (most recent call last):
      File "{site}/client/session.py", line 1365, in _do_call
        return fn(*args)
    {error}
    \t [[{{{{node check_positive/AssertGuard/Assert}}}}]]

    During handling of the above exception, another exception occurred:

    Traceback (most recent call last):
      File "train.py", line 7, in <module>
        s.run(y, {{x: [1., -1.]}})
      File "{site}/client/session.py", line 1384, in _do_call
        raise type(e)(node_def, op, message)
    {error}
    \t [[node check_positive/AssertGuard/Assert (defined at {site}/framework/ops.py:1748) ]]

    Original stack trace for 'check_positive/AssertGuard/Assert':
      File "train.py", line 3, in <module>
        a = tf.Assert(tf.reduce_all(x > 0), ["x must be positive", x], name="check_positive")
      File "/home/me/model.py", line 40, in build
        return make()
      File "{site}/ops/control_flow_ops.py", line 173, in Assert
        guarded_assert = cond(condition, no_op, true_assert, name="AssertGuard")
      File "{site}/framework/ops.py", line 1748, in __init__
        self._traceback = tf_stack.extract_stack()
    """).format(site=SITE, error=ERROR)


def _record(text, limit=20):
    record = OutputRecord(limit)
    record.extend(text.split("\n"))
    return record


def test_a_tensorflow_error_gives_its_message_node_and_the_users_line():
    record = _record(TF_ASSERT)
    error = record.error()
    assert error.lines == (
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: assertion failed: "
        "[x must be positive] [1 -1]",
        "\t [[node check_positive/AssertGuard/Assert (defined at %s/framework/ops.py:1748) ]]"
        % SITE)
    assert error.node == "check_positive/AssertGuard/Assert"
    assert error.origin == "/home/me/model.py:40"   # innermost frame outside TensorFlow
    lead = error_lines(error)
    assert lead[0].startswith("tensorflow.python.framework.errors_impl.InvalidArgumentError")
    assert lead[-1] == ("failing node: check_positive/AssertGuard/Assert "
                        "(created at /home/me/model.py:40)")
    # the tail alone (what the summary showed before) holds only the stack frames
    assert not any("InvalidArgumentError" in line for line in list(_record(TF_ASSERT, 10)))


def test_a_python_error_gives_its_type_and_message_lines():
    record = _record("step 1\nTraceback (most recent call last):\n  File \"t.py\", line 1, in "
                     "<module>\n    raise ValueError('a\\nb')\nValueError: a\nb")
    assert record.error().lines == ("ValueError: a", "b")
    assert record.error().node is None
    assert error_lines(record.error()) == ["ValueError: a", "b"]


def test_the_last_error_wins_and_output_without_one_has_none():
    record = _record("Traceback (most recent call last):\n  File \"t.py\", line 1\n"
                     "KeyError: 'first'\n\nmore output\nTraceback (most recent call last):\n"
                     "  File \"t.py\", line 9\nRuntimeError: second\n")
    assert record.error().lines == ("RuntimeError: second",)
    assert _record("step 1\nstep 2\nkilled").error() is None
    assert error_lines(None) == []


def test_a_tensorflow_2_error_gives_the_message_after_its_heading_and_the_function_node():
    """TF 2.x: "Graph execution error:", a blank line, then the message; a node inside a
    function (cond_v2) is named with its function."""
    record = _record("Traceback (most recent call last):\n  File \"t.py\", line 8\n"
                     "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph "
                     "execution error:\n\nassertion failed: [x must be positive] [1 -1]\n"
                     "\t [[{{function_node positive_AssertGuard_false_8}}{{node Assert}}]]\n\n")
    error = record.error()
    assert error.lines[1:] == ("assertion failed: [x must be positive] [1 -1]",
                               "\t [[{{function_node positive_AssertGuard_false_8}}"
                               "{{node Assert}}]]")
    assert error.node == "Assert in function positive_AssertGuard_false_8"


def test_a_tensorflow_fatal_log_line_is_an_error():
    record = _record("2026-11-28 08:35:53.374982: F tensorflow/core/framework/tensor.cc:681] "
                     "Check failed: IsAligned()\nAborted")
    assert record.error().lines == (
        "Check failed: IsAligned() (tensorflow/core/framework/tensor.cc:681)",)


def test_a_long_message_is_cut_and_the_tail_is_kept():
    lines = ["Traceback (most recent call last):", "  File \"t.py\", line 1",
             "RuntimeError: " + "x"] + ["more %d" % i for i in range(30)]
    record = _record("\n".join(lines), limit=3)
    assert len(record.error().lines) == 8
    assert list(record) == ["more 27", "more 28", "more 29"] and len(record) == 3
