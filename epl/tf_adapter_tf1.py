"""What :mod:`epl.tf_adapter` needs that is particular to TensorFlow 1.15.

Imported only by ``epl/tf_adapter_version.py``, once, when the installed TensorFlow is 1.x;
``epl/tf_adapter_tf2.py`` holds the same names for TensorFlow 2.x.
"""
from tensorflow.python import pywrap_tensorflow as _c_api
from tensorflow.python.framework import errors as _errors

# The op library built against TF 1.15 stays in epl/lib/ (tools/build_ops.sh).
OP_LIBRARY_SUBDIR = ""
# AMP-listed op types without a float16 CPU kernel in TF 1.15.5 (tests/graph/test_amp.py
# checks this against the kernel registry).
LISTED_OPS_WITHOUT_CPU_HALF_KERNEL = frozenset([
    "AvgPool3D", "CudnnRNN", "CudnnRNNV2", "CudnnRNNV3", "Einsum", "GRUBlockCell", "MaxPool3D"])


# function_def_to_graph's defaults are what tf_functions.called_function_body needs on 1.15:
# the caller's function library is copied along, the body keeps its devices.
FUNCTION_BODY_OPTIONS = {}

# TF 1.15's op wrappers build every op through Graph.create_op, past its deprecation
# decorator (tf_adapter_graph.undecorated_op_creation).
OPS_BUILT_PAST_CREATE_OP = False


def seed_position(graph):
    """TF 1.15 seeds an unseeded random op with the id of the last op created."""
    return graph._last_id  # pylint: disable=protected-access


def seeds_at(get_seed, graph, position):
    return get_seed(position)  # the op count advances by itself


def collective_rank_order(devices):
    """TF 1.15 ranks collective members by their device names as strings."""
    return sorted(devices)


def c_api():
    """TF 1.15's C API module (graph import with results)."""
    from tensorflow.python import pywrap_tensorflow as c_api
    return c_api


def list_input(tensors):
    """The inputs of an op with one list input (``Tin``), as TF 1.15's ``_create_c_op``
    takes them: one entry per OpDef input, a list for a list input."""
    return [tensors]


def serialize_iterator(tf, resource):
    """The state of a tf.data iterator (fails for inputs with state TF cannot save)."""
    return tf.raw_ops.SerializeIterator(resource_handle=resource)


def colocation_groups(op):
    """``op``'s ``_class`` attribute (its colocation groups), or None without one. Most
    ops have none: asking TF 1.15 for the attribute's metadata first costs about 5 us
    for them, against 9 us for ``get_attr``'s error (a pass over every op of a
    BERT-base graph asks 14k times)."""
    try:
        _c_api.TF_OperationGetAttrMetadata(op._c_op, "_class")  # pylint: disable=protected-access
    except _errors.InvalidArgumentError:
        return None
    return op.get_attr("_class")
