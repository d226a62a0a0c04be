"""What :mod:`epl.tf_adapter` needs that is particular to TensorFlow 2.x (run through
``tf.compat.v1`` in graph mode, docs/tf2.md).

Imported only by ``epl/tf_adapter.py``, once, when the installed TensorFlow is 2.x;
``epl/tf_adapter_tf1.py`` holds the same names for TensorFlow 1.15.
"""

# A source tree can hold a TF1 and a TF2 build side by side (tools/build_ops.sh).
OP_LIBRARY_SUBDIR = "tf2"


def c_api():
    """TF 2.x's C API module (graph import with results)."""
    from tensorflow.python.client import pywrap_tf_session as c_api
    return c_api
