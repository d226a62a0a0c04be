"""Stage functions' calls run on TF's single-threaded executor where TF accepts it
(issue 41, item 3; epl/parallel/repeat/executors.py).

The rule is checked against TensorFlow itself: every case is a tiny function called on
CPU:1 (or CPU:0), given the executor the rule picks, and run; no run may fail, and the
cases TF 1.15 refuses single-threaded (a node or argument on another device, v1 control
flow) must keep the default. Training: tests/graph/test_corpus.py's pipeline rows (the
ResNet-style model with batch norm, the BERT-style encoder, the embedding model with
sparse gradients, odd sizes) run with the pass on and check that calls ran
single-threaded and that the weights match serial training, with
``pipeline.call_executor: auto``; here a pipeline with the default key runs every call
on TF's default executor and matches serial training too.
"""
import numpy as np
import pytest

import corpusutil
import epl
from epl import tf_adapter, tf_functions
from epl.parallel.repeat import executors
from epl.tf_adapter import tf
from realmodels import WideDeep

D0 = "/job:localhost/replica:0/task:0/device:CPU:0"
D1 = "/job:localhost/replica:0/task:0/device:CPU:1"
TOL = 2e-5


def _float_arg():
    return tf.TensorSpec([2], tf.float32)


def _case_plain():
    return [tf.constant([1.0, 2.0])], [_float_arg()], lambda a: a * 2.0 + 1.0


def _case_node_elsewhere():
    def body(a):
        with tf.device(D0):
            b = a + 1.0
        return b * 2.0
    return [tf.constant([1.0, 2.0])], [_float_arg()], body


def _case_int32_argument():  # the MoE pipeline's stage-1 forward: labels are int32
    return ([tf.constant([1, 2])], [tf.TensorSpec([2], tf.int32)],
            lambda a: tf.cast(a, tf.float32) * 2.0)


def _case_int32_inside():
    return [tf.constant([1.0, 2.0])], [_float_arg()], lambda a: a * tf.cast(
        tf.size(a), tf.float32)


def _case_resource_elsewhere():
    with tf.device(D0):
        variable = tf.get_variable("v", [2], use_resource=True)
    return ([variable.handle], [tf.TensorSpec([], tf.resource)],
            lambda h: tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32) * 2.0)


def _case_control_flow():
    def body(a):
        low, high = tf.raw_ops.Switch(data=a, pred=tf.reduce_sum(a) > 0.0)
        return tf.raw_ops.Merge(inputs=[low * 2.0, high + 1.0])[0]
    return [tf.constant([1.0, 2.0])], [_float_arg()], body


def _case_nested_call():
    inner = tf.function(lambda a: a + 1.0)
    return [tf.constant([1.0, 2.0])], [_float_arg()], lambda a: inner(a) * 2.0


CASES = {
    # case: (builder, device, single-threaded expected, words of the reason)
    "plain": (_case_plain, D1, True, None),
    "plain_cpu0": (_case_plain, D0, True, None),
    "int32_inside": (_case_int32_inside, D1, True, None),
    "int32_argument_cpu0": (_case_int32_argument, D0, True, None),
    "int32_argument": (_case_int32_argument, D1, False, "host memory"),
    "node_elsewhere": (_case_node_elsewhere, D1, False, "placed on"),
    "resource_elsewhere": (_case_resource_elsewhere, D1, False, "resource argument"),
    "control_flow": (_case_control_flow, D1, False, "control flow"),
    "nested_call": (_case_nested_call, D1, False, "calls a function"),
}


def _call(graph, case, device):
    """One call of the case's function on ``device``: (call op, its results)."""
    inputs, signature, body = CASES[case][0]()
    concrete = tf.function(body, input_signature=signature).get_concrete_function()
    concrete.add_to_graph(graph)
    name = tf.compat.as_str(concrete.name)
    fdef = tf_functions.function_definition(graph, name)
    defined = tf_functions.DefinedFunction(name, [a.type for a in fdef.signature.output_arg])
    return tf_functions.call_function(defined, inputs, "call", device)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_what_tensorflow_runs(case):
    """The pass picks the single-threaded executor exactly where expected, and the call
    then runs: no Unimplemented error at the first run, and the same result as TF's
    default executor."""
    _, device, single, words = CASES[case]
    graph = tf.Graph()
    with graph.as_default():
        call, results = _call(graph, case, device)
        chosen = executors.choose(graph, [call])
        with tf.Session(config=tf.ConfigProto(device_count={"CPU": 2})) as sess:
            sess.run(tf.global_variables_initializer())
            picked = sess.run(results)
            tf_functions.set_call_executor(call, "")
            default = sess.run(results)
    reason = chosen[(tf_functions.called_name(call), call.device)]
    assert (reason is None) == single, reason
    if words:
        assert words in reason
    np.testing.assert_allclose(picked[0], default[0])


def test_gpu_call_keeps_the_default_executor():
    graph = tf.Graph()
    with graph.as_default():
        call, _ = _call(graph, "plain", "/job:localhost/replica:0/task:0/device:GPU:0")
        reason = executors.refusal(call, tf_functions.function_definition(
            graph, tf_functions.called_name(call)), tf_adapter.function_names(graph))
    assert "GPU" in reason


def _executor_types(graph):
    return [op.get_attr("executor_type") for op in graph.get_operations()
            if op.type in tf_functions.CALL_OPS]


def single_threaded_calls(graph):
    """How many calls of ``graph`` run on TF's single-threaded executor."""
    return _executor_types(graph).count(tf.compat.as_bytes(executors.SINGLE_THREADED))


def test_default_leaves_every_call_on_the_default_executor():
    model = WideDeep()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpusutil.serial_reference(model, arrays, 2, stats="all")
    curve, copies = corpusutil.run_pipeline(model, arrays, micro_batches=2)  # the default
    kinds = _executor_types(tf.get_default_graph())
    assert kinds and set(kinds) == {b""}, kinds
    worst, where = corpusutil.max_difference(reference, copies, "all")
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


def test_config_key_is_checked():
    with pytest.raises(ValueError, match="call_executor"):
        epl.Config({"pipeline.call_executor": "single"})


def test_memory_profiler_warns_that_single_threaded_bodies_are_not_traced(caplog):
    """TF's traced step lists no node of a single-threaded body: the memory profile says
    that it leaves their allocations out instead of reporting a smaller peak silently."""
    from epl.cluster import Cluster
    from epl.profiler import MemoryProfilerHook
    model = WideDeep()
    epl.init(epl.Config({"pipeline.num_micro_batch": 2, "pipeline.call_executor": "auto"}),
             cluster=Cluster(devices_per_worker=2))
    stage = lambda index: epl.replicate(1, name="stage_%d" % index)
    loss = model.loss(corpusutil.dataset(model.data(4 * model.batch), model.batch), stage)
    train = model.train_op(loss)
    hook = MemoryProfilerHook(save_steps=1, max_steps=1, output_dir=None)
    with caplog.at_level("WARNING", logger="epl.profiler"):
        with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            sess.run(train)
    assert "single-threaded executor" in caplog.text
    assert "pipeline.call_executor=default" in caplog.text
