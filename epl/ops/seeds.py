"""Plain TF's seeds for random ops built after split layers.

Under a graph-level seed (``tf.set_random_seed``) TensorFlow seeds every random
op that has no seed of its own with the number of ops created before it (TF 1.15;
TF 2.x counts the seeds drawn: :func:`epl.tf_adapter.seed_position`). Split
layers build other ops than plain TF (collective stand-ins, a sharded loss), so
every random op after them, the initializers of later layers' variables
included, would draw other values than the same program without EPL.

Each split implementation therefore reports how many ops it made beyond plain
TF's (:func:`extra` around purely additional ops, :func:`replacing` with the
count plain TF's function builds, measured by :func:`plain_op_count` on
placeholders in a scratch graph), and EPL's ``get_seed`` subtracts the running
difference from the op count: random ops get plain TF's seeds. Sharded
variables draw their unsplit value where plain TF would (epl.ops.shards), so
their own seeds need no correction.

Not covered: ops EPL builds while ``tf.gradients`` runs (AMP, gradient
checkpointing, split layers' backward) shift the seeds of random ops created
after the training step's gradients (rare: optimizers' slots start at zero).
"""
import contextlib
import functools
import weakref

from epl import tf_adapter
from epl.tf_adapter import tf

_OFFSETS = weakref.WeakKeyDictionary()   # tf.Graph -> ops made beyond plain TF's


def offset(graph):
    """Ops EPL has made in ``graph`` beyond what plain TF would have made."""
    return _OFFSETS.get(graph, 0)


@contextlib.contextmanager
def replacing(graph, plain_count):
    """The ops created inside stand for ``plain_count`` ops of plain TF."""
    start = tf_adapter.seed_position(graph)
    try:
        yield
    finally:
        made = tf_adapter.seed_position(graph) - start
        if made != plain_count:
            _OFFSETS[graph] = offset(graph) + made - plain_count


def extra(graph):
    """The ops created inside have no counterpart in plain TF."""
    return replacing(graph, 0)


def plain_op_count(function, arguments, shapes):
    """How many ops ``function(**arguments)`` builds in plain TF, where ``shapes``
    ({argument name: static shape}) give the unsplit shapes of tensor arguments.
    Built on placeholders in a scratch graph that is thrown away."""
    with tf.Graph().as_default() as scratch:
        tf.set_random_seed(0)  # TF 2.x counts seeds drawn only under a graph-level seed
        replaced = dict(arguments)
        for name, value in arguments.items():
            if isinstance(value, tf.Tensor):
                replaced[name] = tf.placeholder(value.dtype, shapes.get(name, value.shape))
        start = tf_adapter.seed_position(scratch)
        function(**replaced)
        return tf_adapter.seed_position(scratch) - start


def wrap_get_seed(original):
    """TF's ``get_seed`` with the op count corrected by :func:`offset`."""
    @functools.wraps(original)
    def get_seed(op_seed):
        if op_seed is None and not tf_adapter.executing_eagerly():
            graph = tf_adapter.get_default_graph()
            if graph.seed is not None and offset(graph):
                return tf_adapter.seeds_at(original, graph,
                                           tf_adapter.seed_position(graph) - offset(graph))
        return original(op_seed)
    return get_seed
