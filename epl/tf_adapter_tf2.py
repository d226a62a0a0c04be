"""What :mod:`epl.tf_adapter` needs that is particular to TensorFlow 2.x (run through
``tf.compat.v1`` in graph mode, docs/tf2.md).

Imported only by ``epl/tf_adapter_version.py``, once, when the installed TensorFlow is 2.x;
``epl/tf_adapter_tf1.py`` holds the same names for TensorFlow 1.15.
"""

# A source tree can hold a TF1 and a TF2 build side by side (tools/build_ops.sh).
OP_LIBRARY_SUBDIR = "tf2"
# AMP-listed op types without a float16 CPU kernel in TF 2.15 (Einsum has one there;
# tests/graph/test_amp.py checks this against the kernel registry).
LISTED_OPS_WITHOUT_CPU_HALF_KERNEL = frozenset([
    "AvgPool3D", "CudnnRNN", "CudnnRNNV2", "CudnnRNNV3", "GRUBlockCell", "MaxPool3D"])


# What tf_functions.called_function_body passes to function_def_to_graph on TF 2.x, where the
# defaults changed: nested calls find their functions in the caller's library, and the body
# keeps its devices, as on 1.15. (Its second positional argument is no longer the input
# shapes: passed that way, the shapes were dropped and no op of a body had known shapes.)
FUNCTION_BODY_OPTIONS = {"include_library_functions": True, "propagate_device_spec": True}

# TF 2.x's op wrappers build ops through Graph._create_op_internal, never through
# create_op's deprecation decorator (tf_adapter_graph.undecorated_op_creation).
OPS_BUILT_PAST_CREATE_OP = True


def seed_position(graph):
    """TF 2.x seeds an unseeded random op with the count of seeds drawn in its graph."""
    from tensorflow.python.framework import random_seed
    return random_seed._graph_to_seed_dict.get(graph, 0)  # pylint: disable=protected-access


def seeds_at(get_seed, graph, position):
    """``get_seed(position)``; an explicit op seed does not count as a draw in TF 2.x, so
    the count advances here, as it would have for an unseeded op."""
    from tensorflow.python.framework import random_seed
    seeds = get_seed(position)
    random_seed._graph_to_seed_dict[graph] = seed_position(graph) + 1  # noqa (protected)
    return seeds


def collective_rank_order(devices):
    """TF 2.x ranks collective members by task, then device index (numerically)."""
    import tensorflow.compat.v1 as tf

    def key(device):
        spec = tf.DeviceSpec.from_string(device)
        return (spec.job or "", spec.replica or 0, spec.task or 0, spec.device_type or "",
                spec.device_index or 0, device)
    return sorted(devices, key=key)


def c_api():
    """TF 2.x's C API module (graph import with results)."""
    from tensorflow.python.client import pywrap_tf_session as c_api
    return c_api


def list_input(tensors):
    """The inputs of an op with one list input (``Tin``), as TF 2.x's ``_create_c_op``
    takes them: flat (it regroups them by the OpDef)."""
    return tensors


def serialize_iterator(tf, resource):
    """The state of a tf.data iterator. TF 2.x would only warn about state it cannot save
    (a py_func's) and drop it; policy 2 (fail) makes that an error EPL reports."""
    return tf.raw_ops.SerializeIterator(resource_handle=resource, external_state_policy=2)


def colocation_groups(op):
    """``op``'s ``_class`` attribute (its colocation groups), or None without one."""
    try:
        return op.get_attr("_class")
    except ValueError:
        return None
