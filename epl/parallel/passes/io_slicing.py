"""IO slicing (``io.slicing``): each worker reads its own share of every file list.

Data parallelism averages gradients over workers, so if every worker reads
every file, an "epoch" repeats each example once per worker. With
``io.slicing`` EPL rewrites each file list that a reader dataset opens
(found by :mod:`epl.parallel.file_lists`) so that this worker reads only its
share (dealt by :mod:`epl.parallel.file_shards`):

* a constant list (``TFRecordDataset([names])``, ``from_tensor_slices([names])``)
  is replaced, at rewrite time, by a constant holding this worker's names;
  a count that cannot be shared is an error now, before anything runs;
* a run-time list (``Dataset.list_files(pattern)``, a fed or computed list)
  gets a shard step right before its ``TensorSliceDataset``, which deals the
  (sorted) matches at run time and asserts the same rules, with the same
  messages, on the first pull;
* pipelines of ``make_one_shot_iterator`` live in the iterator's
  ``dataset_factory`` function: EPL rewrites a copy of that function and
  points the iterator at it.

Shares are per *worker* among the plan's drivers (the workers that build
model copies and so read input), in proportion to the model replicas each
drives: the copies on one worker pull from one shared iterator (see
:func:`epl.ir.roles.input_pipeline_ops`), so they share the worker's
files. Workers that only serve devices of another worker's pipeline read
nothing and get no share.
"""
import collections
import logging

from epl import tf_adapter
from epl.parallel.file_lists import find_file_lists
from epl.parallel.file_shards import (IOSlicingError, SLICING, check_options, empty_message,
                                      share_of, too_few_message, uneven_message,
                                      worker_files)
from epl.parallel.passes import MODEL, Pass
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
SCOPE = "EPL_IO_SLICING"
RUNTIME_COUNT = "N (printed below)"

Options = collections.namedtuple("Options", ["drop_last", "unbalanced"])


class IOSlicing(Pass):
    """Rewrite every file list of the input pipelines to this worker's share."""

    name = "io_slicing"
    phase = MODEL
    reads = ("config", "plan", "worker")
    writes = ("graph",)

    def applies(self, ctx):
        # The two flags alone are refused in run(), never ignored.
        io = ctx.config.io
        return bool(io.slicing or io.drop_last_files or io.unbalanced_io_slicing)

    def run(self, ctx):
        io = ctx.config.io
        check_options(io.slicing, io.drop_last_files, io.unbalanced_io_slicing)
        options = Options(io.drop_last_files, io.unbalanced_io_slicing)
        share = reading_share(ctx.plan, ctx.worker)
        main, factories = find_file_lists(ctx.tf_graph.as_graph_def())
        lists = list(main) + [fl for factory in factories for fl in factory.file_lists]
        check_found(lists)
        if share.slots == 1:
            LOG.info("EPL %s: one reading worker, it reads every file", SLICING)
            return
        for file_list in main:
            _slice_in_graph(ctx, file_list, share, options)
        for factory in factories:
            _slice_factory(ctx, factory, share, options)


def reading_share(plan, worker):
    """This worker's Share: its rank among the plan's drivers, weighted by the model
    replicas each driver builds (each replica pulls its own batches)."""
    drivers = plan.drivers
    if worker not in drivers:
        raise IOSlicingError("%s: worker %d builds no model copy, so it reads no input and "
                             "has no share of the files (drivers: %s)"
                             % (SLICING, worker, drivers))
    weights = [len(plan.replicas_of(w)) for w in drivers]
    return share_of(drivers.index(worker), weights)


def check_found(lists):
    """Refuse a graph with nothing to slice, or with lists the user already shards."""
    if not lists:
        raise IOSlicingError(
            "%s=True, but this graph has no file-based input pipeline EPL can slice. EPL "
            "slices the file lists of TFRecordDataset, TextLineDataset and "
            "FixedLengthRecordDataset: a list of file names, Dataset.list_files(pattern), or "
            "from_tensor_slices(names) interleaved with a reader. In-memory data "
            "(from_tensor_slices of arrays), generators and queue-based readers are not "
            "sliced, so every worker would read the same data. Set %s=False, or shard the "
            "input yourself (Dataset.shard(num_workers, worker_index))." % (SLICING, SLICING))
    for file_list in lists:
        if file_list.user_shards:
            raise IOSlicingError(
                "%s=True, but %s is already sharded by Dataset.shard (op %s): EPL would share "
                "the files among workers and the pipeline would shard them again, so each "
                "worker would read too little. Remove the .shard() call or set %s=False."
                % (SLICING, file_list.source, ", ".join(file_list.user_shards), SLICING))


def _files_text(files):
    return ", ".join(f.decode("utf-8", "replace") for f in files)


def _static_share(file_list, share, options):
    files = worker_files(file_list.files, share, options.drop_last, options.unbalanced,
                         file_list.source)
    LOG.info("EPL %s: worker %d of %d reads %d of the %d files of %s: %s", SLICING,
             share.rank, share.workers, len(files), len(file_list.files), file_list.source,
             _files_text(files))
    return files


# ---- main graph -------------------------------------------------------------------------
def _slice_in_graph(ctx, file_list, share, options):
    """Rewire the list's consumer in the main graph to this worker's share."""
    graph = ctx.tf_graph
    consumer = graph.get_operation_by_name(file_list.consumer)
    # No device here: the new ops feed the pipeline, so Placement puts them on the host
    # with the other shared ops (and this pass can run alone in a local session).
    with graph.as_default(), tf.name_scope(None), tf.control_dependencies(None), \
            tf.device(None), tf.name_scope(SCOPE):
        if file_list.static:
            files = _static_share(file_list, share, options)
            new = tf.constant(files, dtype=tf.string, name="files")
        else:
            LOG.info("EPL %s: worker %d of %d reads shares %d-%d of %d of %s (dealt at run "
                     "time)", SLICING, share.rank, share.workers, share.start,
                     share.stop - 1, share.slots, file_list.source)
            new = shard_tensor(consumer.inputs[0], share, options, file_list.source)
        # TF refuses to rewire an input to a tensor whose static shape differs ([3]
        # files instead of [7]); the list's consumers never needed its length.
        new = tf.placeholder_with_default(new, shape=None, name="any_length")
    tf_adapter.update_input(consumer, 0, new)


def shard_tensor(files, share, options, source):
    """This worker's part of a run-time file list, with the rules asserted at run time.

    The names are dealt in the order given: ``MatchingFiles`` sorts its matches,
    so every worker deals the same deck (a fed or computed list must be in the
    same order on every worker).
    """
    files = tf.reshape(files, [-1])
    count = tf.size(files)
    slots = share.slots
    checks = [
        tf.debugging.Assert(count > 0, [empty_message(source)]),
        tf.debugging.Assert(tf.logical_or(count >= slots, tf.equal(count, 0)),
                            [too_few_message(source, RUNTIME_COUNT, share), "N =", count]),
    ]
    if not (options.drop_last or options.unbalanced):
        checks.append(tf.debugging.Assert(
            tf.logical_or(tf.equal(count % slots, 0), count < slots),
            [uneven_message(source, RUNTIME_COUNT, share), "N =", count]))
    with tf.control_dependencies(checks):
        kept = count - count % slots if options.drop_last else tf.identity(count)
        slot = tf.range(kept) % slots
        mine = tf.logical_and(slot >= share.start, slot < share.stop)
        return tf.boolean_mask(files[:kept], mine, name="worker_files")


# ---- one-shot iterators -----------------------------------------------------------------
def _slice_factory(ctx, factory, share, options):
    """Rewrite a copy of a one-shot iterator's dataset_factory and point the iterator
    at it (the original function stays in the library, unused)."""
    fdef = type(factory.function)()  # FunctionDef has no public tf.* name in TF 1.15
    fdef.CopyFrom(factory.function)
    nodes = dict((n.name, n) for n in fdef.node_def)
    for index, file_list in enumerate(factory.file_lists):
        consumer = nodes[file_list.consumer]
        position = _first_data_input(consumer)
        if file_list.static:
            files = _static_share(file_list, share, options)
            new = _add_const(fdef, "%s/files_%d" % (SCOPE, index), files)
        else:
            function = _shard_function(ctx, share, options, file_list.source)
            new = _add_call(fdef, "%s/shard_%d" % (SCOPE, index), function,
                            consumer.input[position])
        consumer.input[position] = new
    fdef.signature.name = _unique_function_name(
        ctx.tf_graph, "%s_epl_io_worker%d" % (factory.function.signature.name, ctx.worker))
    _add_functions(ctx.tf_graph, [fdef])
    iterator = ctx.tf_graph.get_operation_by_name(factory.iterator)
    _set_function_attr(iterator, "dataset_factory", fdef.signature.name)


def _first_data_input(node):
    for position, name in enumerate(node.input):
        if not name.startswith("^"):
            return position
    raise IOSlicingError("%s: node %r has no data input" % (SLICING, node.name))


def _add_const(fdef, name, files):
    node = fdef.node_def.add()
    node.name, node.op = name, "Const"
    node.attr["dtype"].type = tf.string.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(files, dtype=tf.string))
    return "%s:output:0" % name


def _add_call(fdef, name, function, input_name):
    node = fdef.node_def.add()
    node.name, node.op = name, "StatefulPartitionedCall"
    node.input.append(input_name)
    node.attr["Tin"].list.type.append(tf.string.as_datatype_enum)
    node.attr["Tout"].list.type.append(tf.string.as_datatype_enum)
    node.attr["f"].func.name = function
    for key in ("config", "config_proto", "executor_type"):
        node.attr[key].s = b""
    return "%s:output:0" % name


def _shard_function(ctx, share, options, source):
    """A graph function running :func:`shard_tensor`, added to the graph's library
    (dataset functions call it; they cannot hold main-graph ops)."""
    def shard(files):
        return shard_tensor(files, share, options, source)

    function = tf.function(shard, input_signature=[tf.TensorSpec(None, tf.string)])
    with ctx.tf_graph.as_default():
        concrete = function.get_concrete_function()
        concrete.add_to_graph(ctx.tf_graph)
    name = concrete.name
    return name.decode() if isinstance(name, bytes) else name


def _unique_function_name(graph, base):
    taken = tf_adapter.function_names(graph)
    name, suffix = base, 1
    while name in taken:
        name, suffix = "%s_%d" % (base, suffix), suffix + 1
    return name


def _add_functions(graph, fdefs):
    """Add FunctionDefs to ``graph``'s library (public route: a GraphDef of no nodes)."""
    graph_def = tf.GraphDef()
    graph_def.library.function.extend(fdefs)
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")


def _set_function_attr(op, attr, function):
    """Point function-valued attribute ``attr`` of ``op`` at ``function``.

    """
    value = tf.AttrValue(func=tf.NameAttrList(name=function))
    tf_adapter.set_attr(op, attr, value)
