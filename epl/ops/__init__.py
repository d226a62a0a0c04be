"""Split-mode layers: operator (tensor) parallelism inside ``epl.split`` scopes.

Inside an ``epl.split(device_count=N)`` scope, the layers users already call
(``tf.layers.dense``, the sparse softmax cross-entropy losses, ``tf.argmax``,
``tf.math.top_k``, ``tf.equal``, ``tf.einsum`` for MoE) are built sharded over
the N devices of a model replica. See docs/split.md.
"""
