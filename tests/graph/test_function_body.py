"""FunctionBody: a function made of a graph's ops, and its first-call variant."""
import numpy as np

from epl import tf_functions
from epl.parallel.repeat.function_body import FunctionBody, first_call_variant
from epl.tf_adapter import tf


def _body():
    """y = x * 3 and g = y + x, built from ops that exist in the graph."""
    x = tf.placeholder(tf.float32, [2], name="x")
    before = set(op.name for op in tf.get_default_graph().get_operations())
    y = tf.multiply(x, 3.0, name="y")
    g = tf.add(y, x, name="g")
    ops = [op for op in tf.get_default_graph().get_operations() if op.name not in before]
    return x, FunctionBody(ops, outputs=[y], accumulate=[g])


def test_first_call_variant_returns_the_accumulated_tensor_itself():
    x, body = _body()
    graph = tf.get_default_graph()
    fdef = body.function_def("body_sum")
    first = first_call_variant(fdef, "body_first")
    assert [a.name for a in first.signature.input_arg] == ["in0"]
    assert [a.name for a in fdef.signature.input_arg] == ["in0", "acc0"]
    assert not [n for n in first.node_def if n.name.startswith("EPL_ACCUMULATE_")]
    assert len(first.node_def) == len(fdef.node_def) - 1
    assert fdef.signature.name == "body_sum"  # the source is left as it was
    summing = tf_functions.define_function(graph, fdef)
    starting = tf_functions.define_function(graph, first)
    _, (y0, sum0) = tf_functions.call_function(starting, [x], "first", "/cpu:0")
    _, (y1, sum1) = tf_functions.call_function(summing, [x, sum0], "second", "/cpu:0")
    with tf.Session() as sess:
        values = sess.run([y0, sum0, y1, sum1], {x: np.array([1.0, 2.0], np.float32)})
    np.testing.assert_allclose(values[0], [3.0, 6.0])
    np.testing.assert_allclose(values[1], [4.0, 8.0])  # g, not 0 + g
    np.testing.assert_allclose(values[2], [3.0, 6.0])
    np.testing.assert_allclose(values[3], [8.0, 16.0])  # sum0 + g


def test_sum_only_outputs_come_from_the_first_call_alone():
    """A gradient that only its update reads besides its sum: the summing calls do
    not return it (so their add may reuse its buffer), the first call returns it
    after the sums."""
    x = tf.placeholder(tf.float32, [2], name="x")
    before = set(op.name for op in tf.get_default_graph().get_operations())
    g = tf.multiply(x, 3.0, name="g")
    ops = [op for op in tf.get_default_graph().get_operations() if op.name not in before]
    body = FunctionBody(ops, outputs=[g], accumulate=[g], sum_only=[g.name])
    assert body.results() == [("sum", g)]
    assert body.results(first=True) == [("sum", g), ("out", g)]
    fdef = body.function_def("sums")
    first = first_call_variant(fdef, "sums_first", body.returned_sums())
    assert [a.name for a in fdef.signature.output_arg] == ["sum0"]
    assert [a.name for a in first.signature.output_arg] == ["sum0", "first_out0"]
    graph = tf.get_default_graph()
    starting = tf_functions.define_function(graph, first)
    summing = tf_functions.define_function(graph, fdef)
    _, (sum0, out0) = tf_functions.call_function(starting, [x], "first", "/cpu:0")
    _, (sum1,) = tf_functions.call_function(summing, [x, sum0], "second", "/cpu:0")
    with tf.Session() as sess:
        values = sess.run([sum0, out0, sum1], {x: np.array([1.0, 2.0], np.float32)})
    np.testing.assert_allclose(values[0], [3.0, 6.0])
    np.testing.assert_allclose(values[1], [3.0, 6.0])
    np.testing.assert_allclose(values[2], [6.0, 12.0])
