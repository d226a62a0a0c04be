"""Pictures of a plan: which devices each TaskGraph of each model replica uses.

A plan is pure data (:mod:`epl.parallel.plan`), so its picture is a function of
it alone: one box per device (workers as rows), each box listing what runs
there (TaskGraph, replica, and the batch slice of a ``replicate`` TaskGraph or
the shard of a ``split`` one), coloured by TaskGraph, with an arrow where a
copy's activations go to the next TaskGraph's device (gradients come back the
same way). matplotlib is imported only when a PNG is drawn, and only its Agg
canvas is used. The pictures in docs/hybrid.md come from::

    .venv/bin/python -m epl.parallel.plan_picture docs/images/hybrid_layouts.png

and ``python -m epl.plan_cli ... --png PATH`` draws the plan it prints.
"""
import sys

from epl.cluster import Cluster
from epl.config import Config
from epl.parallel.plan import TaskGraphSpec, make_plan

_COLOURS = ("#8ecae6", "#f4a261", "#90be6d", "#e9c46a", "#cdb4db", "#ffafcc")


def _what_runs(plan):
    """{device: [line per (TaskGraph, replica, position) placed there]}."""
    runs = {}
    for tg in plan.taskgraphs:
        inner = "shard" if tg.kind == "split" else "slice"
        per_device = plan.width // tg.device_count  # a narrow TaskGraph's positions
        for replica, devices in enumerate(tg.devices):
            for index, device in enumerate(devices):
                first = index * per_device
                positions = ("%d" % first if per_device == 1
                             else "%d-%d" % (first, first + per_device - 1))
                runs.setdefault(device, []).append(
                    (tg.index, "%s r%d %s %s" % (tg.name, replica, inner, positions)))
    return runs


def _box_centres(plan):
    """{device: (x, y)}: device d of worker w at column d, row w."""
    centres = {}
    for device, worker in plan.worker_of.items():
        index = int(device.rsplit(":", 1)[1])
        centres[device] = (index * 1.3 + 0.6, worker * 1.5 + 0.6)
    return centres


def draw_plan(axes, plan, title):
    """Draw ``plan`` on matplotlib ``axes``."""
    from matplotlib.patches import FancyArrowPatch, Rectangle
    centres = _box_centres(plan)
    runs = _what_runs(plan)
    for device, (x, y) in centres.items():
        lines = runs.get(device, [])
        colour = _COLOURS[lines[0][0] % len(_COLOURS)] if len(set(i for i, _ in lines)) == 1 \
            else ("#dddddd" if not lines else "#ffffff")
        axes.add_patch(Rectangle((x - 0.6, y - 0.6), 1.2, 1.2, facecolor=colour,
                                 edgecolor="black", linewidth=1))
        axes.text(x, y - 0.45, device.split("/device:", 1)[-1], ha="center", fontsize=7,
                  weight="bold")
        for row, (index, text) in enumerate(lines):
            axes.text(x, y - 0.2 + row * 0.22, text, ha="center", va="center", fontsize=6,
                      bbox=dict(facecolor=_COLOURS[index % len(_COLOURS)], linewidth=0,
                                pad=0.5) if len(lines) > 1 else None)
    if plan.stages:
        for replica in range(plan.num_replicas):
            for position in range(plan.width):
                path = [plan.device_of(tg.index, replica, position) for tg in plan.taskgraphs]
                for src, dst in zip(path, path[1:]):
                    axes.add_patch(FancyArrowPatch(
                        centres[src], centres[dst], arrowstyle="-|>", mutation_scale=10,
                        connectionstyle="arc3,rad=0.25", shrinkA=18, shrinkB=18,
                        color="#264653", linewidth=1.2))
    xs = [x for x, _ in centres.values()]
    ys = [y for _, y in centres.values()]
    axes.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
    axes.set_ylim(max(ys) + 0.8, min(ys) - 0.8)
    axes.set_yticks(sorted(set(ys)))
    axes.set_yticklabels(["worker %d" % w for w in range(plan.worker_num)])
    axes.set_xticks([])
    axes.set_aspect("equal")
    axes.set_title(title, fontsize=9)


def save_png(panels, path):
    """Draw ``panels`` ([(title, plan)], one row each) to ``path``; returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    widest = max(plan.devices_per_worker for _, plan in panels)
    heights = [plan.worker_num for _, plan in panels]
    figure = Figure(figsize=(1.35 * widest + 1.5, sum(1.5 * h + 0.8 for h in heights)))
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(panels), 1, height_ratios=heights)
    for row, (title, plan) in enumerate(panels):
        draw_plan(figure.add_subplot(grid[row, 0]), plan, title)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.text(0.5, 0.01, "r = model replica; arrows: activations forward, gradients back; "
                "a TaskGraph's gradients are averaged over its replicas (a shard's over "
                "its holders)", ha="center", fontsize=8)
    figure.savefig(path, format="png", dpi=110, metadata={"Software": None})
    return path


def docs_panels():
    """The layouts docs/hybrid.md shows: ``replicate(2)`` + ``split(2)`` on 8 devices in
    the seeds' default placement and colocated, a pipeline with stages two devices
    wide on 2 workers x 4 devices (data parallel over the workers), and a pipeline of
    a ``replicate(1)`` stage and a ``split(2)`` stage on 2 workers x 3 devices."""
    specs = [TaskGraphSpec("backbone", "replicate", 2), TaskGraphSpec("head", "split", 2)]
    hosts = ["worker0:2222", "worker1:2222"]
    return [
        ("default placement: replicate(2) + split(2), 1 worker x 8 devices (2 replicas)",
         make_plan(Config(), Cluster(devices_per_worker=8), specs)),
        ("colocated (cluster.colocate_split_and_replicate=True): same model, 4 replicas",
         make_plan(Config({"cluster.colocate_split_and_replicate": True}),
                   Cluster(devices_per_worker=8), specs)),
        ("pipeline, stages 2 devices wide (pipeline.num_micro_batch=2), 2 workers x 4 "
         "devices: one replica per worker",
         make_plan(Config({"pipeline.num_micro_batch": 2}), Cluster(hosts, 0, 4), specs)),
        ("stages of different widths: replicate(1) + split(2), pipeline, 2 workers x 3 "
         "devices: the backbone runs both positions of its replica on one device",
         make_plan(Config({"pipeline.num_micro_batch": 2}), Cluster(hosts, 0, 3),
                   [TaskGraphSpec("backbone", "replicate", 1), specs[1]])),
    ]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m epl.parallel.plan_picture OUT.png\n")
        return 2
    print("drew %s" % save_png(docs_panels(), argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
