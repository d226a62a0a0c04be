"""PNG plots of memory timelines. matplotlib is imported here only, and only when called.

Plots are drawn on an Agg canvas attached to a private ``Figure``; pyplot and
its global state (current figure, backend selection) are never touched.
"""

MATPLOTLIB_HINT = ("epl.profiler: visualize=True needs matplotlib, which is not installed. "
                   "Install it with `pip install \"matplotlib<3.6\"` or use visualize=False.")


def require_matplotlib():
    """Import matplotlib's Agg pieces, or raise ImportError saying how to install it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("%s (%s)" % (MATPLOTLIB_HINT, error))
    return Figure, FigureCanvasAgg


def _scale(peak_bytes):
    """(divisor, unit) that shows ``peak_bytes`` with a readable number."""
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if peak_bytes >= 1024 ** power:
            return float(1024 ** power), unit
    return 1.0, "B"


def plot_memory_timeline(path, device, timeline, peak_bytes, persistent_bytes=0, title=None):
    """Write a step plot of bytes in use over the step to ``path`` (PNG).

    ``timeline`` is a list of ``(micros, bytes in use)`` as in
    ``epl.profiler.run_metadata.DeviceMemory``.
    """
    figure_cls, canvas_cls = require_matplotlib()
    figure = figure_cls(figsize=(8, 4), dpi=100)
    canvas_cls(figure)
    axes = figure.add_subplot(1, 1, 1)
    divisor, unit = _scale(max(peak_bytes, persistent_bytes))
    millis = [0.0] + [micros / 1000.0 for micros, _ in timeline]
    values = [0.0] + [num_bytes / divisor for _, num_bytes in timeline]
    axes.step(millis, values, where="post", linewidth=1.0, label="allocated during the step")
    axes.axhline(peak_bytes / divisor, color="tab:red", linestyle="--", linewidth=0.8,
                 label="peak %.3f %s" % (peak_bytes / divisor, unit))
    axes.set_xlabel("time since step start (ms)")
    axes.set_ylabel("bytes in use (%s)" % unit)
    axes.set_title("%s\npersistent (variables, not in the curve): %.3f %s"
                   % (title or device, persistent_bytes / divisor, unit), fontsize=9)
    axes.legend(loc="lower right", fontsize=8)
    axes.grid(True, linewidth=0.3)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path
