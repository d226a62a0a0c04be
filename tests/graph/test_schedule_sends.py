"""The schedule lowering's sends (epl/parallel/passes/pipeline.py ``_Sends``): the
ancestors it remembers between walks build the same Identities in the same places as
walking every entrance afresh, and a walk that stops at its limit says so, once."""
import logging

import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from epl.parallel import rewriter
from epl.parallel.passes import pipeline
from eplutil import dataset_input, initial_weights, make_data, staged_mlp, train_step
from realmodels import Bert


def _build(model, strategy, micro_batches=4):
    """Build ``model`` ("mlp" or a corpus model) in 2 stages with stage functions and
    rewrite it (no session); returns the send structure the lowering built."""
    tf.reset_default_graph()
    settings = {"pipeline.num_micro_batch": micro_batches, "pipeline.strategy": strategy,
                "pipeline.micro_batching": "stage_functions"}
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=2))
    if model == "mlp":
        x, y = make_data(micro_batches * 4 * 2)
        train_step(staged_mlp(*dataset_input(x, y, 4), weights=initial_weights()))
    else:
        loss = model.loss(corpusutil.dataset(model.data(2 * model.batch * micro_batches),
                                             model.batch),
                          lambda index: epl.replicate(1, name="stage_%d" % index))
        model.train_op(loss)
    env = epl.Env.get()
    rewriter.parallelize(epl.Graph.get(), env.config, env.cluster)
    return _sends(tf.get_default_graph())


def _sends(graph):
    """[(Identity, what it reads, what it waits for, its readers)] of every send."""
    found = []
    for op in graph.get_operations():
        if op.type == "Identity" and op.name.startswith("EPL_SCHEDULE") and "/send_" in op.name:
            readers = sorted("%s:%d" % (c.name, [t.op for t in c.inputs].index(op))
                             for c in op.outputs[0].consumers())
            found.append((op.name, op.inputs[0].name,
                          sorted(c.name for c in op.control_inputs), readers))
    return sorted(found)


def _count_walks(monkeypatch):
    """The list every fresh walk (``_waits_for_all``) is appended to from now on."""
    walked = []
    fresh = pipeline._waits_for_all  # pylint: disable=protected-access

    def counted(op, exits, limit=4096):
        walked.append(op)
        return fresh(op, exits, limit)
    monkeypatch.setattr(pipeline, "_waits_for_all", counted)
    return walked


def _assert_fresh_walks_build_the_same(monkeypatch, build, remembered, walked):
    """``remembered`` was built without a fresh walk; with the reuse off (every question
    a fresh walk) ``build`` builds it again."""
    assert remembered and not walked, walked  # every answer came from what was remembered
    monkeypatch.setattr(pipeline._Sends, "_ancestors", lambda self, op, entering, depth=0: None)
    assert build() == remembered
    assert walked


def test_remembered_ancestors_build_the_sends_fresh_walks_build(monkeypatch):
    """The lowering walks each entrance's ancestors once and reuses them; with the
    reuse off (every question a fresh walk, the lowering before issue 40f) the graph
    gets exactly the same send Identities, reading the same tensors, after the same
    barriers, read by the same inputs. (ZeroBubble on the MLP here; PreferBackward on
    BERT in the test below, which shares its costly builds.)"""
    walked = _count_walks(monkeypatch)
    build = lambda: _build("mlp", "ZeroBubble")
    _assert_fresh_walks_build_the_same(monkeypatch, build, build(), walked)


def test_bert_sends_from_remembered_ancestors_fresh_walks_and_a_limited_walk(
        monkeypatch, caplog):
    """On BERT with PreferBackward: the remembered ancestors build the sends fresh walks
    build (as above), and past its limit a walk cannot tell whether an entrance waits
    for every exit; the tensor is then not sent through an Identity (speed, not
    results), and the graph's rewrite logs it once, naming the limit and the entrance.
    One test: BERT's builds are this file's cost, and the full-limit build is the
    baseline of both checks."""
    walked = _count_walks(monkeypatch)
    build = lambda: _build(Bert(), "PreferBackward")
    everything = build()
    assert everything and not walked, walked  # every answer came from what was remembered
    readers = lambda sends: sum(len(send[3]) for send in sends)
    original = pipeline._Sends.__init__

    def small(self, graph, limit=4096):
        original(self, graph, limit=1)
    with monkeypatch.context() as limited:
        limited.setattr(pipeline._Sends, "__init__", small)
        with caplog.at_level(logging.WARNING, logger="epl"):
            some = readers(build())
    warnings = [r.getMessage() for r in caplog.records
                if "stopped after walking 1 ops above" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "speed, never results" in warnings[0]
    assert some < readers(everything)
    del walked[:]  # the limited build's own walks, not the full-limit build's
    _assert_fresh_walks_build_the_same(monkeypatch, build, everything, walked)
