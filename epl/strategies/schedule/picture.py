"""Pictures and the command line of pipeline schedules (see :mod:`epl.strategies.schedule`).

Kept apart from the schedule data so that the core module stays small and
imports nothing heavy; matplotlib is imported only when a PNG is drawn.
"""
import argparse
import sys

from epl.strategies.schedule import timed
from epl.strategies.schedule.interleaved import interleaved
from epl.strategies.schedule.core import (BACKWARD, FORWARD, PREFER_BACKWARD, WEIGHT,
                                          ScheduleError, bubble_fraction, get_schedule,
                                          simulate, to_grid)
from epl.strategies.schedule.validation import validate

_COLOURS = {FORWARD: "#8ecae6", BACKWARD: "#f4a261", WEIGHT: "#90be6d"}
_LABELS = {FORWARD: "forward F(m)", BACKWARD: "backward B(m)",
           WEIGHT: "weight gradients W(m)"}


def save_png(schedule, path):
    """Draw the simulated grid to a PNG (forwards, backwards and, when the backward is
    split, weight-gradient backwards in their own colours, stages as rows, time as
    columns) and return ``path``. matplotlib is imported here, and only its
    Agg canvas is used, so importing this module and the global pyplot backend are
    unaffected."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as exc:
        raise ScheduleError("save_png needs matplotlib (pip install 'pyepl[plot]'): %s" % exc)
    timeline = simulate(schedule)
    num_slots, num_stages = max(timeline.makespan, 1), schedule.num_stages
    chunks = schedule.num_virtual_stages
    figure = Figure(figsize=(max(5.0, 0.45 * num_slots + 1.8), 0.55 * num_stages + 1.6))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for t, slot in enumerate(timeline.slots):
        for s, action in enumerate(slot):
            if action is not None:
                # interleaved: a device's later chunks drawn lighter, labelled with the
                # virtual stage
                chunk = action.stage // num_stages
                axes.add_patch(Rectangle((t, s), 1, 1, facecolor=_COLOURS[action.kind],
                                         alpha=1.0 - 0.45 * chunk / chunks,
                                         edgecolor="white", linewidth=1.5))
                text = "%s%d" % (action.kind, action.micro_batch)
                axes.text(t + 0.5, s + 0.5, text if chunks == 1 else str(action),
                          ha="center", va="center", fontsize=8 if chunks == 1 else 6)
    axes.set_xlim(0, num_slots)
    axes.set_ylim(num_stages, 0)
    step = max(1, num_slots // 30)
    axes.set_xticks([t + 0.5 for t in range(0, num_slots, step)])
    axes.set_xticklabels([str(t) for t in range(0, num_slots, step)])
    axes.set_yticks([s + 0.5 for s in range(num_stages)])
    axes.set_yticklabels([("stage %d" if chunks == 1 else "device %d") % s
                          for s in range(num_stages)])
    axes.set_xlabel("time slot")
    kinds = schedule.kinds()
    if schedule.splits_backward:
        labels = dict(_LABELS, **{BACKWARD: "input gradients B(m)"})
    else:
        labels = _LABELS
    axes.legend(handles=[Patch(facecolor=_COLOURS[kind], label=labels[kind]) for kind in kinds],
                loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    status = ", STALLED" if not timeline.complete else (
        ", bubble %.1f%%" % (100.0 * bubble_fraction(schedule)) if timeline.slots else "")
    shape = "S=%d stages" % num_stages if chunks == 1 else "S=%d devices x v=%d" % (
        num_stages, chunks)
    axes.set_title("%s: %s, M=%d micro-batches (%d slots%s)" % (
        schedule.name, shape, schedule.num_micro_batch, timeline.makespan, status))
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    return path


# --------------------------------------------------------------------------- command line

def main(argv=None):
    """``python -m epl.strategies.schedule``: print (and optionally draw) a schedule."""
    parser = argparse.ArgumentParser(
        prog="python -m epl.strategies.schedule",
        description="Print the simulated time-slot grid of an EPL pipeline schedule.")
    parser.add_argument("--stages", type=int, required=True, help="number of stages S")
    parser.add_argument("--micro-batches", type=int, required=True,
                        help="number of micro-batches M per step")
    parser.add_argument("--strategy", default=PREFER_BACKWARD,
                        help="PreferBackward (1F1B, default), PreferForward (GPipe-like) or "
                             "ZeroBubble (ZB-H1: backward split into B and W)")
    parser.add_argument("--virtual-stages", type=int, default=1,
                        help="model chunks per device (interleaved 1F1B, with PreferBackward; "
                             "pipeline.num_virtual_stages in a job)")
    parser.add_argument("--costs",
                        help="times of F, B and W such as 1,1,1 (a backward that is not split "
                             "costs B+W): also print the step time these costs give")
    parser.add_argument("--png", help="also save the grid as a PNG picture to this path")
    parser.add_argument("--compact", action="store_true",
                        help="print the per-stage order (golden-file form) instead of the grid")
    args = parser.parse_args(argv)
    try:
        schedule = _schedule(args)
        validate(schedule)
        print(schedule.compact() if args.compact else to_grid(schedule))
        if args.costs and not args.compact:
            costs = _parse_costs(args.costs)
            print("step time with costs F=%g B=%g W=%g: %g (ideal speed-up %.2fx on %d stages)"
                  % (costs + (timed.makespan(schedule, costs),
                              timed.ideal_speedup(schedule, costs), schedule.num_stages)))
        if args.png:
            print("saved %s" % save_png(schedule, args.png))
    except ScheduleError as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    return 0


def _schedule(args):
    if args.virtual_stages == 1:
        return get_schedule(args.strategy, args.stages, args.micro_batches)
    if args.strategy.lower() != PREFER_BACKWARD.lower():
        raise ScheduleError("--virtual-stages %d needs --strategy PreferBackward (interleaved "
                            "1F1B), got %r" % (args.virtual_stages, args.strategy))
    return interleaved(args.stages, args.micro_batches, args.virtual_stages)


def _parse_costs(text):
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 3 or min(values) <= 0:
        raise ScheduleError("--costs must be three positive numbers F,B,W such as 1,1,1; "
                            "got %r" % (text,))
    return timed.Costs(*values)
