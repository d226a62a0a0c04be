"""``MemoryProfilerHook``: per-device peak memory of traced training steps.

::

    from epl.profiler.memory_profiler_hook import MemoryProfilerHook

    hook = MemoryProfilerHook(save_steps=100, max_steps=1000, output_dir="/tmp/mem",
                              visualize=True, dump_metadata=False)
    with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        while not sess.should_stop():
            sess.run(train_op)

``MemoryProfilerHook()`` (the original EPL's defaults) logs steps 1 to 5.
Steps are counted by the hook: the first ``run`` through the session is step 1.
Steps ``save_steps, 2 * save_steps, ...`` up to ``max_steps`` run with
``RunOptions(trace_level=FULL_TRACE)`` (slower), and for each the hook logs one
line per device and writes into ``output_dir``:

* ``memory_step_<step>.json``: per device, peak bytes, persistent bytes, the
  timeline of bytes in use and the top allocating ops;
* ``memory_step_<step>_<device>.png`` when ``visualize`` (needs matplotlib);
* ``run_metadata_<step>.bin`` (binary proto) or ``.pbtxt`` (text) when
  ``dump_metadata``.

The numbers come from ``epl.profiler.run_metadata.device_memory_stats``.
"""
import json
import logging
import os
import re

from epl import tf_functions
from epl.profiler import run_metadata as run_metadata_lib
from epl.profiler.units import device_tag, format_bytes
from epl.tf_adapter import tf

LOG = logging.getLogger("epl.profiler")
METADATA_FORMATS = ("bin", "pbtxt")


def _positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("MemoryProfilerHook: %s must be a positive int%s, got %r"
                         % (name, " or None" if allow_none else "", value))
    return value


_SAID = []


def _matplotlib_or_say_once():
    """True if matplotlib can draw; else log once that PNGs are left out."""
    from epl.profiler import plot
    try:
        plot.require_matplotlib()
        return True
    except ImportError as error:
        if not _SAID:
            _SAID.append(True)
            LOG.warning("MemoryProfilerHook: no PNG timelines (%s); the JSON reports are "
                        "written", error)
        return False


def describe_device(step, mem):
    """The log line of one device in one profiled step."""
    top = ", ".join("%s %s" % (name, format_bytes(num_bytes))
                    for name, num_bytes in mem.top_ops[:3])
    peak_at = "" if mem.peak_micros is None else " at +%.3f ms" % (mem.peak_micros / 1000.0)
    return ("memory step %d %s: peak %s%s, persistent %s, %d allocations%s"
            % (step, mem.device, format_bytes(mem.peak_bytes), peak_at,
               format_bytes(mem.persistent_bytes), mem.num_allocations,
               "; top: " + top if top else ""))


_PAIR = re.compile(r'\[\s+("(?:[^"\\]|\\.)*"|-?\d+),\s+(-?\d+)\s+\]')


def _compact_pairs(text):
    """Put each ``[a, b]`` pair of an indented JSON text on one line (timelines stay readable)."""
    return _PAIR.sub(r"[\1, \2]", text)


def write_memory_report(output_dir, step, stats, visualize=False):
    """Write ``memory_step_<step>.json`` (and PNGs when ``visualize``); return the paths."""
    paths = []
    report = {"step": step, "unit": "bytes", "time_unit": "micros since step start",
              "devices": run_metadata_lib.memory_stats_to_dict(stats)}
    path = os.path.join(output_dir, "memory_step_%d.json" % step)
    with open(path, "w") as out:
        out.write(_compact_pairs(json.dumps(report, indent=1)))
    paths.append(path)
    if visualize:
        from epl.profiler import plot
        for device, mem in stats.items():
            png = os.path.join(output_dir, "memory_step_%d_%s.png" % (step, device_tag(device)))
            plot.plot_memory_timeline(png, device, mem.timeline, mem.peak_bytes,
                                      mem.persistent_bytes,
                                      title="%s, step %d" % (device, step))
            paths.append(png)
    return paths


def dump_run_metadata(output_dir, step, metadata, metadata_format="bin"):
    """Write the raw RunMetadata as ``run_metadata_<step>.bin`` or ``.pbtxt``."""
    path = os.path.join(output_dir, "run_metadata_%d.%s" % (step, metadata_format))
    if metadata_format == "bin":
        with open(path, "wb") as out:
            out.write(metadata.SerializeToString())
    else:
        with open(path, "w") as out:
            out.write(str(metadata))
    return path


class MemoryProfilerHook(tf.train.SessionRunHook):
    """Traces every ``save_steps``-th step up to ``max_steps`` and reports memory per device.

    Args:
      save_steps: profile steps ``save_steps, 2 * save_steps, ...`` (1-based).
      max_steps: last step that may be profiled; None for no limit.
      output_dir: directory for the reports (created if missing); "" or None to
        only log.
      visualize: also write a PNG of each device's timeline (needs matplotlib;
        checked when the hook is created). The default, None, writes PNGs when
        there is an ``output_dir`` and matplotlib is installed (and says once
        when it is not); True insists (an error without either).
      dump_metadata: also write the raw RunMetadata of each profiled step.
      top_k: number of top allocating ops kept per device.
      metadata_format: ``"bin"`` (binary proto) or ``"pbtxt"`` (text proto).

    The defaults are the original EPL's (``save_steps=1, max_steps=5,
    output_dir="", visualize=True, dump_metadata=False``, visualize meaning "when
    possible"), so ``MemoryProfilerHook()`` logs steps 1 to 5. (The original's
    defaults failed at ``begin``: it made the directory "".)

    After a profiled step, ``hook.last_stats`` is ``(step, {device: DeviceMemory})``.
    """

    def __init__(self, save_steps=1, max_steps=5, output_dir="", visualize=None,
                 dump_metadata=False, top_k=10, metadata_format="bin"):
        self._save_steps = _positive_int("save_steps", save_steps)
        self._max_steps = _positive_int("max_steps", max_steps, allow_none=True)
        if metadata_format not in METADATA_FORMATS:
            raise ValueError("MemoryProfilerHook: metadata_format must be one of %s, got %r"
                             % (METADATA_FORMATS, metadata_format))
        if not output_dir and (visualize or dump_metadata):
            raise ValueError("MemoryProfilerHook: visualize and dump_metadata need an output_dir")
        if visualize is None:
            visualize = bool(output_dir) and _matplotlib_or_say_once()
        elif visualize:
            from epl.profiler import plot
            plot.require_matplotlib()
        self._output_dir = output_dir or None
        self._visualize = bool(visualize)
        self._dump_metadata = bool(dump_metadata)
        self._top_k = top_k
        self._metadata_format = metadata_format
        self._checked_calls = False  # warned about untraced bodies
        self._step = 0
        self._profiling = False
        self.last_stats = None

    def should_profile(self, step):
        """True if the 1-based ``step`` is traced."""
        if self._max_steps is not None and step > self._max_steps:
            return False
        return step % self._save_steps == 0

    def begin(self):
        if self._output_dir and not os.path.isdir(self._output_dir):
            os.makedirs(self._output_dir)

    def before_run(self, run_context):
        self._step += 1
        self._profiling = self.should_profile(self._step)
        if not self._profiling:
            return None
        options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
        return tf.train.SessionRunArgs(fetches=None, options=options)

    def after_run(self, run_context, run_values):
        if not self._profiling:
            return
        self._profiling = False
        if not self._checked_calls:
            self._checked_calls = True
            _warn_untraced_bodies(run_context.session.graph)
        metadata = run_values.run_metadata
        stats = run_metadata_lib.device_memory_stats(metadata, top_k=self._top_k)
        self.last_stats = (self._step, stats)
        for mem in stats.values():
            LOG.info("%s", describe_device(self._step, mem))
        if self._output_dir:
            write_memory_report(self._output_dir, self._step, stats, self._visualize)
            if self._dump_metadata:
                dump_run_metadata(self._output_dir, self._step, metadata, self._metadata_format)


def _warn_untraced_bodies(graph):
    """Say once that calls on TF's single-threaded executor (``pipeline.call_executor:
    auto``) hide their bodies' allocations from a traced step."""
    calls = tf_functions.single_threaded_calls(graph)
    if calls:
        LOG.warning("EPL memory profile: %d calls of stage functions run on TF's single-"
                    "threaded executor (pipeline.call_executor=auto, e.g. %s); a traced step "
                    "does not list the nodes inside them, so their allocations are missing "
                    "from this profile. Set pipeline.call_executor=default to profile them.",
                    len(calls), calls[0].name)


def profile_memory(run_metadata, prefix_name=None, visualize=False, top_k=10):
    """Per-device memory of a traced step, as a list of dicts (the original EPL's form).

    Each dict has ``device``, ``peak_memory`` (bytes), ``persist`` (persistent
    bytes), ``peak_micros``, ``num_allocations`` and ``top_ops``. With
    ``visualize``, a PNG per device is written to
    ``<prefix_name or "memory">_<device>.png``.

    Not to be confused with ``epl.profiler.profile_memory``, the static estimate
    from a graph's shapes.
    """
    stats = run_metadata_lib.device_memory_stats(run_metadata, top_k=top_k)
    out = []
    for device, mem in stats.items():
        out.append({"device": device, "peak_memory": mem.peak_bytes,
                    "persist": mem.persistent_bytes, "peak_micros": mem.peak_micros,
                    "num_allocations": mem.num_allocations, "top_ops": list(mem.top_ops)})
        if visualize:
            from epl.profiler import plot
            path = "%s_%s.png" % (prefix_name or "memory", device_tag(device))
            plot.plot_memory_timeline(path, device, mem.timeline, mem.peak_bytes,
                                      mem.persistent_bytes)
    return out
