"""Interleaved stages (pipeline.num_virtual_stages): four replicate(1) TaskGraphs on two
devices (TaskGraph t on device t mod 2), each device's chunks run in the order of its
row of Megatron's interleaved 1F1B. The same weights as serial training and as
PreferBackward's 1F1B over four devices, under both lowerings of the repeated step."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.strategies.schedule import interleaved
from eplutil import MEASURED, copy_values, dataset_input, make_data, max_diff, train_step
from interleavedutil import K, NAMES, TOL, Bert4, WideDeep4, model, serial
import corpusutil

B = 4
CORPUS_TOL = 2e-5  # tests/graph/test_zero_bubble.py's


def _pipeline(devices, micro_batches, chunks, lowering, replicas=1, extra=None):
    tf.reset_default_graph()
    x, y = make_data(micro_batches * B * replicas * (K + 1))
    settings = {"pipeline.num_micro_batch": micro_batches, "pipeline.num_virtual_stages": chunks,
                "pipeline.micro_batching": lowering}
    settings.update(extra or {})
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
    train = train_step(model(*dataset_input(x, y, B), staged=True))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(K):
            sess.run(train)
        values = dict((name, copy_values(sess, name)) for name in NAMES)
    return x, y, values


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
@pytest.mark.parametrize("micro_batches", [4, 3])
def test_matches_serial_and_prefer_backward(micro_batches, lowering):
    x, y, values = _pipeline(2, micro_batches, 2, lowering)
    program = epl.Graph.get().parallel
    assert program.schedule == interleaved(2, micro_batches, 2)
    devices = [program.plan.device_of(t, 0, 0) for t in range(4)]
    assert devices[0] == devices[2] != devices[1] == devices[3]
    _assert_rows_ordered(program)
    reference = serial(x, y, micro_batches * B)
    for name in NAMES:
        assert max_diff(reference[name], values[name]) < TOL, name
    _, _, one_f_one_b = _pipeline(4, micro_batches, 1, lowering)
    for name in NAMES:
        # every gradient is summed over the micro-batches in micro-batch order
        np.testing.assert_array_equal(values[name], one_f_one_b[name], err_msg=name)


def _assert_rows_ordered(program):
    """For consecutive actions a, b of device d's row (0F0 0F1 2F0 2F1 ... for device 0:
    both chunks in one chain), every op where b starts waits for a barrier on device d
    that waits for a's end."""
    entrances, exits = program.boundaries[0]
    for row in range(2):
        actions = program.schedule.stage(row)
        assert set(a.stage % 2 for a in actions) == {row}
        assert len(actions) == 4 * program.schedule.num_micro_batch
        for before, after in zip(actions, actions[1:]):
            name = "after_%s_copy0" % (before,)
            starts = entrances[(after.stage, after.kind, after.micro_batch)]
            assert starts, after
            for op in starts:
                barriers = [b for b in op.control_inputs if b.name.split("/")[-1] == name]
                assert len(barriers) == 1, (op.name, name)
                assert barriers[0].device == program.plan.device_of(row, 0, 0)
                ends = exits[(before.stage, before.kind, before.micro_batch)]
                # (later passes may swap some exit ops, e.g. the input pull's)
                assert set(ends) & set(barriers[0].control_inputs), name


@pytest.mark.timeout(300)
def test_data_parallel_over_interleaved_pipelines():
    x, y, values = _pipeline(4, 4, 2, "stage_functions", replicas=2)
    plan = epl.Graph.get().parallel.plan
    assert plan.num_replicas == 2
    reference = serial(x, y, 2 * 4 * B)
    for name in NAMES:
        assert len(values[name]) == 2 and max_diff(reference[name], values[name]) < TOL, name


# The runtime's savers and grouped apply act per TaskGraph; two TaskGraphs on one device
# change none of their numbers.
FEATURES_ON = {"gradient_checkpoint.type": "auto", "amp.level": "O1", "offload.level": "v0",
               "optimizer.num_apply_group": 2}


@pytest.mark.timeout(300)
def test_memory_savers_amp_and_grouped_apply_match_prefer_backward():
    _, _, values = _pipeline(2, 4, 2, "stage_functions", extra=FEATURES_ON)
    _, _, one_f_one_b = _pipeline(4, 4, 1, "stage_functions", extra=FEATURES_ON)
    for name in NAMES:
        np.testing.assert_array_equal(values[name], one_f_one_b[name], err_msg=name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model_class,micro_batches", [(Bert4, 2), (WideDeep4, 3)])
def test_corpus_models_in_four_stages_match_serial(model_class, micro_batches):
    """Layer norm, attention and Adam (BERT-style); odd-sized embedding tables with sparse
    gradients, Momentum (the tables' chunk shares device 0 with a dense chunk). Two steps
    (BERT's graph is the costly part of this file)."""
    model_ = model_class()
    arrays = model_.data(micro_batches * model_.batch * 2)
    _, reference = corpusutil.serial_reference(model_, arrays, micro_batches, steps=2)
    _, copies = corpusutil.run_pipeline(model_, arrays, micro_batches, devices=2, steps=2,
                                        config={"pipeline.num_virtual_stages": 2})
    assert epl.Graph.get().parallel.schedule == interleaved(2, micro_batches, 2)
    worst, where = corpusutil.max_difference(reference, copies)
    _record(worst)
    assert worst < CORPUS_TOL, "%s differs from serial training by %.3g" % (where, worst)


def _record(value):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))
