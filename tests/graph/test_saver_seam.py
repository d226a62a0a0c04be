"""The build-time seam of memory savers (epl/runtime/build_time.py) and per-graph feature state.

Savers receive the IR's records (GradientCall, ApplyCall) and a BuildContext, and return
records; only the seam maps them to and from TensorFlow's call arguments. Feature state
lives in one table on the IR view, reached through FeatureSlots.
"""
import ast
import glob
import inspect
import os

import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.ir.features import FeatureSlot
from epl.ir.graph import Graph
from epl.ir.records import ApplyCall, GradientCall
from epl.runtime import build_time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the seam alone maps records to TF's call arguments
BOUND_ARGUMENT_MODULES = ("build_time.py",)


class _Saver(object):
    """A fake saver module: records what it receives, optionally changes it."""

    def __init__(self, change=None):
        self.received = []
        self.change = change or (lambda record: record)
        self.__name__ = "fake_saver"

    def wrap_apply(self, call, build):
        def apply(record):
            self.received.append((record, build))
            return call(self.change(record))
        return apply

    def wrap_gradients(self, compute, build):
        def gradients(record):
            self.received.append((record, build))
            result = compute(self.change(record))
            return result._replace(grads=[g * 2.0 for g in result.grads])
        return gradients


def _build(config=None):
    return build_time.BuildContext(None, epl.Config(config or {"optimizer.num_apply_group": 2}),
                                   Cluster(devices_per_worker=2), lambda view: "the plan")


def _optimizer_call():
    """An apply_gradients-like function whose pairs come second, and its arguments."""
    applied = []

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        applied.append((self, list(grads_and_vars), global_step, name))
        return "train_op"
    return apply_gradients, applied


def test_apply_savers_receive_an_apply_record(monkeypatch):
    saver = _Saver(change=lambda record: record._replace(grads_and_vars=record.grads_and_vars[:1]))
    monkeypatch.setattr(build_time, "_active", lambda names, config, attribute: [saver])
    original, applied = _optimizer_call()
    optimizer = object()
    pairs = [("g0", "v0"), (None, "v1"), ("g2", "v2")]
    bound = inspect.signature(original).bind(optimizer, pairs, global_step="step")
    build = _build()
    assert build_time.apply(build, original, bound, "grads_and_vars") == "train_op"
    (record, seen_build), = saver.received
    assert record == ApplyCall(optimizer, [("g0", "v0"), ("g2", "v2")], "step", None,
                               [(None, "v1")])
    assert seen_build is build and build.plan == "the plan"
    # what the saver kept reaches the optimizer, with the pairs that have no gradient
    assert applied == [(optimizer, [("g0", "v0"), (None, "v1")], "step", None)]


def test_a_saver_cannot_swap_the_optimizer(monkeypatch):
    saver = _Saver(change=lambda record: record._replace(optimizer=object()))
    monkeypatch.setattr(build_time, "_active", lambda names, config, attribute: [saver])
    original, _ = _optimizer_call()
    bound = inspect.signature(original).bind(object(), [("g", "v")])
    with pytest.raises(RuntimeError, match="changed the optimizer"):
        build_time.apply(_build(), original, bound, "grads_and_vars")


def test_gradient_savers_receive_a_gradient_record(monkeypatch):
    saver = _Saver(change=lambda record: record._replace(grad_ys=[3.0]))
    monkeypatch.setattr(build_time, "_active", lambda names, config, attribute: [saver])
    calls = []

    def gradients(ys, xs, grad_ys=None, name="gradients", stop_gradients=None):
        calls.append((ys, xs, grad_ys, name, stop_gradients))
        return [1.0 for _ in xs]
    bound = inspect.signature(gradients).bind("loss", ["w", "b"], stop_gradients="s")
    grads = build_time.gradients(_build({"amp.level": "O1"}), gradients, bound)
    (record, _), = saver.received
    assert record == GradientCall(["loss"], ["w", "b"], [], None, ["s"])
    assert calls == [(["loss"], ["w", "b"], [3.0], "gradients", ["s"])]
    assert grads == [2.0, 2.0]


def test_every_apply_saver_takes_records():
    """One seam: every apply saver's hook is ``wrap_apply(call, build)`` (ZeRO too, which
    took TF's bound arguments and the cluster through a bridge)."""
    import importlib
    assert not hasattr(build_time, "_BOUND_SAVERS")
    for name in build_time.APPLY_SAVERS:
        module = importlib.import_module(name)
        assert list(inspect.signature(module.wrap_apply).parameters) == ["call", "build"], name


def test_savers_never_read_call_arguments():
    """No saver guesses which argument holds the pairs: only the seam touches
    ``BoundArguments``."""
    offenders = []
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "epl", "runtime", "*.py"))):
        if os.path.basename(path) in BOUND_ARGUMENT_MODULES:
            continue
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("arguments", "signature"):
                offenders.append("%s:%d" % (os.path.basename(path), node.lineno))
    assert not offenders, "BoundArguments read outside the seam: %s" % offenders


def test_feature_state_lives_on_the_view():
    first, second = tf.Graph(), tf.Graph()
    slot = FeatureSlot("test_feature", list)
    view = Graph.get(first)
    assert slot.get(view) is None and slot.for_graph(first) is None
    record = slot.of(view)
    assert slot.of(view) is record and slot.for_graph(first) is record
    assert view.feature_state("test_feature") is record
    assert slot.get(Graph.get(second)) is None
    Graph.forget(first)
    assert slot.for_graph(first) is None  # records go with their view


def test_the_ir_graph_names_no_feature():
    """Feature records live in the view's feature table, not in attributes named after
    the layers above the IR; ``auto_partition`` is a read-only spelling of its slot
    (public API)."""
    view = Graph(tf.Graph())
    for name in ("zero", "sharded_variables", "layer_collectives", "auto_partition", "amp"):
        assert name not in vars(view), name
    assert not hasattr(view, "zero")
    view.set_feature_state("auto_partition", "cut")
    assert view.auto_partition == "cut"


def test_amp_records_live_in_the_feature_table():
    from epl.runtime import amp
    epl.init(epl.Config({"amp.level": "O1"}), cluster=Cluster(devices_per_worker=1))
    epl.set_default_strategy(epl.replicate(1))
    x = tf.placeholder(tf.float32, [4, 8])
    w = tf.get_variable("w", [8, 2])
    loss = tf.reduce_mean(tf.matmul(x, w))
    tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert amp.state() is epl.Graph.get().feature_state("amp")
    assert amp.state().loss_scales


def test_zero_records_live_in_the_feature_table():
    """ZeRO's build record is its FeatureSlot's, made through the record seam: the saver
    gets an ApplyCall and a BuildContext and never reads the Env or TF's arguments."""
    from epl.runtime import zero
    epl.init(epl.Config({"zero.level": "v1"}), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x = tf.placeholder(tf.float32, [4, 8])
    w = tf.get_variable("w", [8, 2])
    b = tf.get_variable("b", [2])
    loss = tf.reduce_mean(tf.matmul(x, w) + b)
    tf.train.AdamOptimizer(0.1).minimize(loss)
    record = zero.build_record(epl.Graph.get())
    assert record is epl.Graph.get().feature_state("zero")
    assert record.variables == ("w", "b") and record.nbytes == {"w": 64, "b": 8}
    assert sorted(variable for variable, _ in record.slots.values()) == ["b", "b", "w", "w"]


def test_zero_shared_state_updates_belong_to_no_variable():
    """Grouped apply's last group can hold one variable (here w), after which Adam's
    _finish updates the beta powers and the step advances: those updates are shared,
    never w's part, or w's non-owner drops them (worker 1 of the ResNet corpus run kept
    beta1_power at 0.9: 0.0129 off serial training)."""
    from epl import tf_adapter
    from epl.runtime import zero
    epl.init(epl.Config({"zero.level": "v1", "optimizer.num_apply_group": 2}),
             cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x = tf.placeholder(tf.float32, [4, 8])
    w = tf.get_variable("w", [8, 2])
    b = tf.get_variable("b", [2])
    step = tf.train.get_or_create_global_step()
    tf.train.AdamOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, w) + b), step)
    record = zero.build_record(epl.Graph.get())
    written = dict((op.name, [v.name for v in tf_adapter.written_variables(op)])
                   for ops in record.parts.values() for op in ops)
    assert sorted(record.parts) == ["b", "w"]
    assert not [n for n, names in written.items()
                if set(names) & {"beta1_power", "beta2_power", "global_step"}], written


def test_zero_refuses_a_second_apply_call():
    """The owners and the exchange cover one training step; a second optimizer call
    would be overwritten (silently unpartitioned) or dragged into the first's step."""
    from epl.runtime import zero_error
    epl.init(epl.Config({"zero.level": "v0"}), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x = tf.placeholder(tf.float32, [4, 8])
    w = tf.get_variable("w", [8, 2])
    v = tf.get_variable("v", [8, 2])
    tf.train.AdamOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, w)), var_list=[w])
    with pytest.raises(zero_error.ZeroError, match="zero.level='v0'.*second"):
        tf.train.AdamOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, v)), var_list=[v])
