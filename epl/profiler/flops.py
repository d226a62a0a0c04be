"""``FlopsProfilerHook``: float operations per training step and the FLOP/s achieved.

::

    from epl.profiler.flops import FlopsProfilerHook

    hook = FlopsProfilerHook(every_n_steps=100, output_dir="/tmp/flops")
    with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        while not sess.should_stop():
            sess.run(train_op)
    hook.flops_per_step      # float ops of one sess.run(train_op)

The first run of each set of fetches is traced (``FULL_TRACE``). From it the
hook counts the float operations of the ops that ran: the ops the fetches need
plus every op in the trace, and their inputs (so EPL's other replicas and ops
grappler fused are included; initializers and savers are not). The count uses
TF's flops statistics (``tf.profiler``) on a copy of the graph whose static
shapes are completed from the fed values and ``batch_size``; if float shapes
are still unknown, the shapes seen in the trace complete them. Ops that ran
several times in the traced step (loop bodies) count once per run. Every
``every_n_steps`` steps the hook logs the flops per step, the mean step time
and the achieved FLOP/s, and writes ``flops.json`` into ``output_dir``.
Traced steps (its own and other hooks') and the first ``skip_first_steps``
steps (graph warm-up) are not timed.
"""
import json
import logging
import os
import time

import numpy as np

from epl import tf_functions
from epl.profiler import shapes as shape_lib
from epl.profiler.profiler import graph_flops, repeated
from epl.profiler.run_metadata import (execution_counts, executed_nodes, fed_shapes,
                                       run_time_shapes)
from epl.profiler.units import format_flops
from epl.tf_adapter import tf

LOG = logging.getLogger("epl.profiler")
PROFILER_CMDS = ("scope", "op", "graph")


def _cmd_list(cmds):
    if cmds is None:
        return []
    if isinstance(cmds, str):
        cmds = [cmds]
    cmds = list(cmds)
    for cmd in cmds:
        if cmd not in PROFILER_CMDS:
            raise ValueError("flops profiler: cmds must be among %s, got %r" % (PROFILER_CMDS, cmd))
    return cmds


def print_profiler_views(graph, cmds):
    """Print ``tf.profiler``'s float-operation tables for ``graph`` (a completed copy)."""
    options = tf.profiler.ProfileOptionBuilder.float_operation()
    for cmd in cmds:
        total = tf.profiler.profile(graph, cmd=cmd, options=options).total_float_ops
        LOG.info("flops (tf.profiler %s view): %s", cmd, format_flops(total))


def feed_shapes(graph, feed_dict):
    """``{tensor name: shape}`` of the fed values of a ``session.run``."""
    out = {}
    for key, value in (feed_dict or {}).items():
        try:
            tensor = graph.as_graph_element(key, allow_tensor=True, allow_operation=False)
        except (TypeError, ValueError, KeyError):
            continue
        if isinstance(tensor, tf.Tensor):
            out[tensor.name] = tuple(np.shape(value))
    return out


def run_time_tensor_shapes(run_metadata, graph=None):
    """``{"op:slot": dims}`` of every output seen in a traced step.

    With ``graph``, the fed placeholders of the step are added too (see
    ``epl.profiler.run_metadata.fed_shapes``).
    """
    out = {}
    for node_name, slots in run_time_shapes(run_metadata).items():
        for slot, dims in slots.items():
            if dims is not None:
                out["%s:%d" % (node_name, slot)] = dims
    if graph is not None:
        placeholders = [op.outputs[0].name for op in graph.get_operations()
                        if op.type in ("Placeholder", "PlaceholderV2", "PlaceholderWithDefault")]
        out.update(fed_shapes(run_metadata, placeholders))
    return out


def _was_traced(run_metadata):
    return run_metadata is not None and len(run_metadata.step_stats.dev_stats) > 0


def _names_inside_calls(graph, executed):
    """Node names inside the functions that the executed call ops of ``graph`` ran."""
    names, seen = set(), set()
    for name in executed:
        op = graph.get_operation_by_name(name)
        if op.type in tf_functions.CALL_OPS and op.get_attr("f").name not in seen:
            seen.add(op.get_attr("f").name)   # every call of a function: the same names
            names |= tf_functions.called_node_names(op)
    return names


def fetch_key(graph, fetches):
    """Identity of a set of fetches: the sorted names of the fetched ops."""
    return tuple(sorted(shape_lib.ops_for_fetches(graph, fetches, closure=False)))


class FlopsProfilerHook(tf.train.SessionRunHook):
    """Reports the float operations per step and the achieved FLOP/s.

    Args:
      every_n_steps: log (and write ``flops.json``) every this many steps.
      output_dir: directory for ``flops.json`` (created if missing); None to only log.
      batch_size: for unknown first dimensions not given by fed values (default:
        the ``tf.data`` pipeline's constant batch size if any).
      cmds: optionally also print ``tf.profiler``'s tables of the whole graph in
        these views (``"scope"``, ``"op"``, ``"graph"``) when the flops are first
        counted, as the original EPL hook did.
      skip_first_steps: steps at the start that are not timed (warm-up).

    Attributes: ``flops_per_step`` and ``result`` (a ``ProfileResult`` per op)
    of the last counted fetches; ``history``, one dict per report.
    """

    def __init__(self, every_n_steps=100, output_dir=None, batch_size=None, cmds=None,
                 skip_first_steps=1):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) \
                or every_n_steps < 1:
            raise ValueError("FlopsProfilerHook: every_n_steps must be a positive int, got %r"
                             % (every_n_steps,))
        self._every_n_steps = every_n_steps
        self._output_dir = output_dir or None
        self._batch_size = batch_size
        self._cmds = _cmd_list(cmds)
        self._skip_first_steps = max(0, int(skip_first_steps))
        self._graph = None
        self._results = {}
        self._step = 0
        self._window = [0, 0.0, 0]   # flops, seconds, steps since the last report
        self._current = None         # (key, run args, traced, start time) of this step
        self.result = None
        self.flops_per_step = None
        self.history = []

    def begin(self):
        self._graph = tf.get_default_graph()
        if self._output_dir and not os.path.isdir(self._output_dir):
            os.makedirs(self._output_dir)

    def before_run(self, run_context):
        self._step += 1
        args = run_context.original_args
        key = fetch_key(self._graph, args.fetches)
        traced = key not in self._results
        self._current = (key, args, traced, time.time())
        if traced:   # count this set of fetches from this step's trace
            options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
            return tf.train.SessionRunArgs(fetches=None, options=options)
        return None

    def after_run(self, run_context, run_values):
        key, args, traced, start = self._current
        elapsed = time.time() - start
        if traced:
            self._count(key, args, run_values.run_metadata)
            return
        # Warm-up steps and steps another hook traced are not representative: not timed.
        if self._step > self._skip_first_steps and not _was_traced(run_values.run_metadata):
            self._window[0] += self._results[key].total
            self._window[1] += elapsed
            self._window[2] += 1
        if self._step % self._every_n_steps == 0 and self._window[2]:
            self._report()

    def _count(self, key, args, metadata):
        """Flops of one step: static shapes (with the fed values), else the traced shapes.

        The ops counted are those the fetches need plus every op that ran in
        the traced step (and their inputs): that adds what the session runs
        besides the fetches (EPL runs every replica in every step) and the ops
        grappler fused or renamed. A trace names the ops inside a called function
        (EPL's stage functions) by their names in the body, which are the names of
        the graph ops the function replaced: those count inside their calls only.
        """
        graph = self._graph
        names = set(op.name for op in graph.get_operations())
        executed = executed_nodes(metadata) & names
        scope = [args.fetches, sorted(executed - _names_inside_calls(graph, executed))]
        feeds = feed_shapes(graph, args.feed_dict)
        shapes = feeds
        result = graph_flops(graph, self._batch_size, scope, source_shapes=feeds,
                             tensor_shapes=feeds)
        if result.unknown:
            shapes = run_time_tensor_shapes(metadata, graph)
            shapes.update(feeds)
            result = graph_flops(graph, self._batch_size, scope, source_shapes=shapes,
                                 tensor_shapes=shapes, source="run_metadata")
        result = repeated(result, execution_counts(metadata), graph)
        if result.unknown:
            LOG.info("flops: %d ops keep unknown shapes after a traced step (they did not "
                     "run, or grappler rewrote them): %s", len(result.unknown),
                     ", ".join(result.unknown[:5]))
        self._store(key, result, shapes)

    def end(self, session):
        if self._window[2]:
            self._report()

    def _store(self, key, result, shapes):
        self._results[key] = result
        self.result = result
        self.flops_per_step = result.total
        LOG.info("flops per step: %s (%s shapes; %s)", format_flops(result.total),
                 result.source, result.describe())
        if self._cmds:
            copy, _ = shape_lib.completed_copy(self._graph, self._batch_size, shapes, shapes)
            print_profiler_views(copy, self._cmds)
        self._write()

    def _report(self):
        flops, seconds, steps = self._window
        self._window = [0, 0.0, 0]
        record = {"step": self._step, "timed_steps": steps, "flops_per_step": flops / steps,
                  "mean_step_seconds": seconds / steps,
                  "flops_per_second": flops / seconds if seconds > 0 else None}
        self.history.append(record)
        LOG.info("flops step %d: %s per step, %.3f ms per step (mean of %d), %s achieved",
                 self._step, format_flops(record["flops_per_step"]),
                 1000.0 * record["mean_step_seconds"], steps,
                 format_flops(record["flops_per_second"] or 0, "FLOP/s"))
        self._write()

    def _write(self):
        if not self._output_dir:
            return
        report = {"flops_per_step": self.flops_per_step,
                  "profile": self.result.to_dict() if self.result is not None else None,
                  "history": self.history}
        with open(os.path.join(self._output_dir, "flops.json"), "w") as out:
            json.dump(report, out, indent=1)


def profile_flops(sess_or_graph=None, run_metadata=None, cmds=None, batch_size=None):
    """Total float operations of a whole graph (the original EPL's ``flops.profile_flops``).

    Args:
      sess_or_graph: a session (its graph is used), a ``tf.Graph``, or None for
        the default graph.
      run_metadata: optionally a traced step's RunMetadata; its run-time shapes
        complete the static ones.
      cmds: optionally print ``tf.profiler``'s tables in these views.
      batch_size: for unknown first dimensions, as in ``epl.profiler.profile_flops``.

    Returns an int. For the per-op breakdown use ``epl.profiler.profile_flops``
    (static) or ``epl.profiler.profiler.graph_flops`` (with run-time shapes).
    """
    graph = getattr(sess_or_graph, "graph", sess_or_graph) or tf.get_default_graph()
    seen = run_time_tensor_shapes(run_metadata, graph) if run_metadata is not None else {}
    result = graph_flops(graph, batch_size, source_shapes=seen, tensor_shapes=seen,
                         source="run_metadata" if seen else "static")
    cmds = _cmd_list(cmds)
    if cmds:
        copy, _ = shape_lib.completed_copy(graph, result.batch_size, seen, seen)
        print_profiler_views(copy, cmds)
    return result.total
