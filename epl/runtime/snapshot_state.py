"""What a snapshot holds on this worker, built once with the rewrite.

The pass gives the session layer (:mod:`epl.session.resume`) a
:class:`~epl.session.resume.SnapshotRecord`:

* **the model state** (worker 0, which writes every checkpoint): a ``tf.train.Saver``
  over what a Saver without a ``var_list`` saves (global variables: weights, optimizer
  slots, the AMP loss scale and its counters, the global step) plus the saveable
  objects of the collection. It is made here, so the adapters of split layers and ZeRO
  (``epl.ops.checkpoint.add_saver_adapter``) complete it like the user's savers: every
  shard, every owner's slots, restored on their workers after the broadcast;
* **the data position** (every worker that drives a replica): one Saver per ``tf.data``
  iterator of the graph (one-shot and initializable), saving the iterator's state
  (``SerializeIterator``: the position, shuffle buffers and their random state). One per
  iterator, so an input whose state cannot be saved (a ``py_func`` or generator dataset)
  is left out alone, with a warning;
* **which runs are training steps**: the names of the step's updates (a run that
  reaches one trains) and how many runs make one global step (``num_micro_batch`` under
  gradient accumulation);
* **what cannot be resumed exactly**, found here: queue runners, and stateful random
  ops in the step (dropout: TF 1 keeps their state in the kernel, it restarts).

None of these savers is in a collection: the user's own checkpoints are unchanged. Their
restore ops (a read and an assign per saved tensor, most of a Saver's construction) are
built only when a resume restores (``tf_adapter.saver_with_deferred_restore``): a
healthy run never builds them.
"""
import logging

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import ancestor_ops
from epl.protocols.passes import END_OF_INPUT_STOP, LOWER, Pass
from epl.session import roles
from epl.session.resume import InputState, SnapshotRecord, SnapshotSettings
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
ITERATOR_TYPES = frozenset(["IteratorV2", "Iterator", "OneShotIterator"])
RANDOM_TYPES = frozenset(["RandomUniform", "RandomUniformInt", "RandomStandardNormal",
                          "TruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
                          "RandomPoisson", "RandomPoissonV2"])


def settings_of(config):
    """SnapshotSettings of ``config`` when it asks for snapshots, else None."""
    section = config.checkpoint
    if not section.snapshot_steps or not section.snapshot_dir:
        return None
    return SnapshotSettings(section.snapshot_dir, section.snapshot_steps,
                            section.snapshot_keep)


class SnapshotState(Pass):
    """Savers of the model state and of every input position; the step's signature."""

    name = "snapshot_state"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "worker", "roles")
    writes = ("graph", "program.snapshot")

    def applies(self, ctx):
        return settings_of(ctx.config) is not None

    def run(self, ctx):
        apply_ops = _updates(ctx)
        model = _model_saver() if roles.writes_checkpoints(ctx.cluster) else None
        ctx.program.snapshot = SnapshotRecord(
            settings=settings_of(ctx.config), worker=ctx.worker,
            writers=tuple(w for w in range(ctx.plan.worker_num) if ctx.plan.copies_of(w)),
            global_step=tf_adapter.global_step_tensor(ctx.tf_graph),
            apply_ops=frozenset(op.name for op in apply_ops),
            runs_per_step=ctx.plan.num_micro_batch if ctx.plan.gradient_accumulation else 1,
            model_saver=model, inputs=tuple(_input_savers(ctx.tf_graph)),
            not_exact=tuple(_not_exact(ctx.tf_graph, apply_ops, ctx.roles.init_only)))


def _updates(ctx):
    """The step's updates: ops of the apply phase that write a variable and are not a
    variable's initializer (a run that reaches one trains; a saver that reads the
    optimizer's slots, or the initializer of a slot, does not)."""
    graph = ctx.tf_graph
    initializers = set(v.initializer.name for key in (tf.GraphKeys.GLOBAL_VARIABLES,
                                                      tf.GraphKeys.LOCAL_VARIABLES)
                       for v in graph.get_collection(key))
    skip = initializers | ctx.roles.init_only
    return [op for op in ctx.view.ops(phases=(Phase.APPLY,))
            if tf_adapter.writes_variable(op) and op.name not in skip]


def _model_saver():
    return tf_adapter.saver_with_deferred_restore(tf_adapter.all_saveable_objects(),
                                                  "EPL_SNAPSHOT_model")


class IteratorState(tf_adapter.SaveableObject):
    """The state of one ``tf.data`` iterator (what TF's make_saveable_from_iterator
    saves), from the iterator op itself: EPL finds iterators in the graph, it never
    sees the user's Iterator objects."""

    def __init__(self, iterator_op):
        resource = iterator_op.outputs[0]
        with tf.device(iterator_op.device):
            state = tf_adapter.serialize_iterator(resource)
        self.state = state
        super(IteratorState, self).__init__(
            resource, [tf_adapter.SaveSpec(state, "", iterator_op.name + "/EPL_STATE")],
            iterator_op.name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        with tf.device(self.op.device):
            return tf.raw_ops.DeserializeIterator(resource_handle=self.op,
                                                  serialized=restored_tensors[0])


def _input_savers(tf_graph):
    """[InputState] of the graph's tf.data iterators, but the end-of-input agreement's
    own (an empty dataset: no position to save; each input costs the first snapshot a
    TF run, and that iterator is first initialized by the first training run)."""
    found = []
    for op in tf_graph.get_operations():
        if op.type in ITERATOR_TYPES and "/%s/" % END_OF_INPUT_STOP not in "/" + op.name:
            saveable = IteratorState(op)
            saver = tf_adapter.saver_with_deferred_restore(
                [saveable], "EPL_SNAPSHOT_input_%d" % len(found))
            found.append(InputState(op.name, saver, saveable.state))
    return found


def _not_exact(tf_graph, apply_ops, init_only):
    """Warnings (text) for state of the step that no snapshot holds (random ops that only
    draw initial values do not count)."""
    problems = []
    runners = tf_graph.get_collection(tf.GraphKeys.QUEUE_RUNNERS)
    if runners:
        problems.append("the input comes from queue runners (%s), whose position EPL cannot "
                        "save: after a resume they start again" % ", ".join(
                            sorted(r.name for r in runners)[:3]))
    random = sorted(op.name for op in ancestor_ops(apply_ops)
                    if op.type in RANDOM_TYPES and op.name not in init_only)
    if random:
        problems.append("the step draws from stateful random ops (%s%s), whose sequence "
                        "TensorFlow 1 keeps inside the kernel: after a resume they draw "
                        "from the start of their sequence again" % (
                            ", ".join(random[:3]), ", ..." if len(random) > 3 else ""))
    return problems
