"""What :mod:`epl.tf_adapter` needs that is particular to TensorFlow 1.15.

Imported only by ``epl/tf_adapter.py``, once, when the installed TensorFlow is 1.x;
``epl/tf_adapter_tf2.py`` holds the same names for TensorFlow 2.x.
"""

# The op library built against TF 1.15 stays in epl/lib/ (tools/build_ops.sh).
OP_LIBRARY_SUBDIR = ""


def c_api():
    """TF 1.15's C API module (graph import with results)."""
    from tensorflow.python import pywrap_tensorflow as c_api
    return c_api
