"""A Saver whose restore ops are built when first needed (EPL's snapshot Savers).

A healthy run never restores a snapshot, so the snapshot Savers make only their save
ops at the rewrite; a resume builds the restore ops in the finalized graph of a live
session (``tf_adapter.restore_op_name``). Exactness on every layout, with the
adapters of split layers and ZeRO: tests/graph/test_resume.py.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from epl import tf_adapter


def _restore_ops(graph):
    return [op for op in graph.get_operations() if op.type == "RestoreV2"]


def test_a_deferred_restore_is_built_in_a_finalized_graph_and_restores_exactly(tmp_path):
    path = str(tmp_path / "state")
    with tf.Graph().as_default() as graph:
        with tf.device("/cpu:0"), tf.name_scope("outer"):
            weights = tf.get_variable("w", initializer=np.arange(6.0).reshape(2, 3))
            saver = tf_adapter.saver_with_deferred_restore([weights], "EPL_SNAPSHOT_test")
        change = tf.assign(weights, tf.zeros_like(weights))
        assert _restore_ops(graph) == []
        graph.finalize()
        with tf.Session() as sess:
            sess.run(weights.initializer)
            sess.run(saver.saver_def.save_tensor_name,
                     {saver.saver_def.filename_tensor_name: path})
            sess.run(change)
            # the SaverDef's op before the build is a guard that fails loudly
            with pytest.raises(tf.errors.InvalidArgumentError, match="deferred"):
                sess.run(saver.saver_def.restore_op_name,
                         {saver.saver_def.filename_tensor_name: path})
            restore = tf_adapter.restore_op_name(saver)
            # in the Saver's own name scope (and devices), as TF would have built it
            scope = saver.saver_def.save_tensor_name.rsplit("/", 1)[0]
            assert graph.finalized and scope == "outer/EPL_SNAPSHOT_test"
            assert restore.rsplit("/", 1)[0] == scope
            assert [op.device for op in _restore_ops(graph)] == ["/device:CPU:0"]
            sess.run(restore, {saver.saver_def.filename_tensor_name: path})
            np.testing.assert_array_equal(sess.run(weights), np.arange(6.0).reshape(2, 3))
            assert tf_adapter.restore_op_name(saver) == restore  # built once
            assert len(_restore_ops(graph)) == 1
