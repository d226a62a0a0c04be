"""Which TensorFlow line runs, decided once: ``impl`` is the module of what differs.

``epl/tf_adapter_tf1.py`` (TensorFlow 1.15) and ``epl/tf_adapter_tf2.py`` (2.x through
``tf.compat.v1``, docs/tf2.md) hold the same names; the one matching the installed
TensorFlow is chosen here, at import, and every module of the adapter
(:mod:`epl.tf_adapter` and the concern modules behind it) reads it from here. Nothing
else in EPL asks which TensorFlow it runs on.
"""
import tensorflow.compat.v1 as tf

if tf.version.VERSION.startswith("1."):
    from epl import tf_adapter_tf1 as impl  # noqa: F401
else:  # pragma: no cover - exercised by the TF 2.x leg (make test-tf2)
    from epl import tf_adapter_tf2 as impl  # noqa: F401
