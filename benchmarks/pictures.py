"""Pictures of benchmark results, drawn with matplotlib from their JSON.

A benchmark that has a picture draws it when it writes its results
(``common.write_results`` calls :func:`draw`), next to its JSON and Markdown:
``benchmarks/results/<name>.png``. The README shows them. To redraw every
picture from the committed JSON, without running a benchmark again::

    .venv/bin/python benchmarks/pictures.py              # all of them
    .venv/bin/python benchmarks/pictures.py pipeline     # one

Only matplotlib's Agg canvas is used (no pyplot, no display); TensorFlow is never
imported. Each drawing is a function of the benchmark's payload alone, so a
picture always shows exactly what its JSON holds.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
MIB = 1024.0 * 1024.0
EPL, EPL_TUNED, HOROVOD, REFERENCE = "#2a9d8f", "#264653", "#e76f51", "#8d99ae"


def _figure(width, height, panels=1):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(1, panels, i + 1) for i in range(panels)]


def _save(figure, path):
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100, metadata={"Software": None})
    return path


# ---- pipeline.py ----------------------------------------------------------------------
def pipeline(payload, path):
    """Speedup of a 2-stage pipeline against micro-batches (with the ideal p*m/(m+p-1)),
    and each stage's peak memory under 1F1B and GPipe."""
    figure, (speed, memory) = _figure(10, 3.6, panels=2)
    rows = payload["speed"]
    counts = [row["micro_batches"] for row in rows]
    speed.plot(counts, [row["ideal"] for row in rows], "--", color=REFERENCE, marker="o",
               label="ideal p*m/(m+p-1)")
    speed.plot(counts, [row["speedup"] for row in rows], color=EPL, marker="o", linewidth=2,
               label="EPL, measured")
    speed.set_xscale("log", base=2)
    speed.set_xticks(counts)
    speed.set_xticklabels([str(c) for c in counts])
    speed.set_xlabel("micro-batches m")
    speed.set_ylabel("speedup over no pipelining")
    speed.set_title("2 stages on 2 devices: step speedup")
    speed.legend(frameon=False)
    strategies = (("PreferBackward", "1F1B (PreferBackward)", EPL),
                  ("PreferForward", "GPipe (PreferForward)", REFERENCE))
    devices = sorted(payload["memory"]["PreferBackward"]["peak_bytes"])
    width = 0.38
    for offset, (key, label, colour) in enumerate(strategies):
        peaks = payload["memory"][key]["peak_bytes"]
        xs = [i + (offset - 0.5) * width for i in range(len(devices))]
        memory.bar(xs, [peaks[d] / MIB for d in devices], width, color=colour, label=label)
    memory.set_xticks(range(len(devices)))
    memory.set_xticklabels(["stage %d" % i for i in range(len(devices))])
    top = max(peak for key, _, _ in strategies
              for peak in payload["memory"][key]["peak_bytes"].values()) / MIB
    memory.set_ylim(0, top * 1.3)
    memory.set_ylabel("peak MiB per device")
    memory.set_title("peak memory at m = %d" % payload["memory"]["PreferBackward"]
                     ["micro_batches"])
    memory.legend(frameon=False, ncol=2, loc="upper center")
    return _save(figure, path)


# ---- dp_vs_horovod.py ---------------------------------------------------------------------
def _horovod_efficiency(runs, model, batch):
    for run in runs:
        if run["role"] == "horovod" and run["model"] == model and \
                run["batch_per_worker"] == batch:
            return run["scaling_efficiency"]
    return None


def dp_vs_horovod(payload, path):
    """Scaling efficiency of 2 workers (1.0: twice one process's samples/s) for Horovod,
    EPL's defaults and EPL's tuned settings, per model and batch, with the machine's
    ceiling (two processes training side by side without communicating)."""
    figure, (axes,) = _figure(10, 3.8)
    rows = payload["targets"]
    bars = (("Horovod 0.28.1 (gloo)", HOROVOD,
             lambda r: _horovod_efficiency(payload["runs"], r["model"], r["batch_per_worker"])),
            ("EPL, default settings", EPL, lambda r: r["epl_default"]["scaling_efficiency"]),
            ("EPL, tuned communication.*", EPL_TUNED,
             lambda r: r["epl_tuned"]["scaling_efficiency"]))
    width = 0.26
    for offset, (label, colour, value) in enumerate(bars):
        xs = [i + (offset - 1) * width for i in range(len(rows))]
        axes.bar(xs, [value(r) or 0 for r in rows], width, color=colour, label=label)
    for i, row in enumerate(rows):
        axes.plot([i - 1.5 * width, i + 1.5 * width], [row["ceiling"]] * 2, color="black",
                  linewidth=1.5, label="ceiling (no communication)" if i == 0 else None)
        top = max(row["ceiling"], row["epl_tuned"]["scaling_efficiency"])
        axes.text(i + width, top + 0.02, "%.2fx" % row["epl_tuned"]["vs_horovod"],
                  ha="center", fontsize=8)
    axes.axhline(0.9, color=REFERENCE, linestyle="--", linewidth=1, label="target 0.9")
    axes.set_xticks(range(len(rows)))
    axes.set_xticklabels(["%s\nbatch %d" % (r["model"].upper(), r["batch_per_worker"])
                          for r in rows])
    axes.set_ylim(0, 1.25)
    axes.set_ylabel("scaling efficiency, 2 workers")
    axes.set_title("Data parallelism, 2 workers x 1 device on 2 cores (labels: EPL tuned "
                   "samples/s over Horovod's)")
    axes.legend(frameon=False, fontsize=8, ncol=3, loc="upper left")
    return _save(figure, path)


# ---- memory.py ----------------------------------------------------------------------------
MEMORY_ORDER = ("none", "grouped_4", "zero_v1_n2", "offload_1x2", "gc",
                "gc+zero_v1+grouped_n2", "gc+offload_1x2")
MEMORY_LABELS = {"none": "no saver", "grouped_4": "grouped apply (4)",
                 "zero_v1_n2": "ZeRO v1 (2 workers)", "offload_1x2": "offload v0",
                 "gc": "gradient checkpointing", "gc+zero_v1+grouped_n2":
                 "GC + ZeRO v1 + grouped apply", "gc+offload_1x2": "GC + offload"}


def memory(payload, path):
    """Memory per compute device of a 24-layer transformer under each saver and
    combination: the step's peak (activations, gradients, temporaries) and what stays
    (variables and optimizer slots)."""
    runs = payload["runs_24"]
    names = [n for n in MEMORY_ORDER if n in runs and "measured" in runs[n]]
    peaks, kept = [], []
    for name in names:
        measured = runs[name]["measured"]
        device = sorted(measured)[-1]     # the compute device (memory.compute_device)
        peaks.append(measured[device]["peak"] / MIB)
        kept.append(measured[device]["persistent"] / MIB)
    figure, (axes,) = _figure(10, 3.6)
    ys = list(range(len(names)))[::-1]
    axes.barh(ys, kept, color=EPL_TUNED, label="variables and optimizer slots")
    axes.barh(ys, peaks, left=kept, color=EPL, label="step peak (activations, gradients)")
    for y, a, b in zip(ys, kept, peaks):
        axes.text(a + b + 5, y, "%.0f MiB" % (a + b), va="center", fontsize=8)
    axes.set_yticks(ys)
    axes.set_yticklabels([MEMORY_LABELS.get(n, n) for n in names])
    axes.set_xlabel("MiB per compute device")
    axes.set_xlim(0, max(a + b for a, b in zip(kept, peaks)) * 1.15)
    axes.set_title("Memory savers: a 24-layer transformer (hidden 128, seq 64, batch 16, Adam)")
    axes.legend(frameon=False, fontsize=8, loc="lower right")
    return _save(figure, path)


# name of the benchmark (its results' file name) -> the function that draws it
DRAW = {"pipeline": pipeline, "dp_vs_horovod": dp_vs_horovod, "memory": memory}


def draw(name, payload, out_dir):
    """Draw ``<out_dir>/<name>.png`` from a benchmark's payload; None if it has no picture."""
    if name not in DRAW:
        return None
    return DRAW[name](payload, os.path.join(out_dir, "%s.png" % name))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Redraw benchmark pictures from their JSON.")
    parser.add_argument("names", nargs="*", metavar="name",
                        help="benchmarks to draw: %s (default: all)" % ", ".join(sorted(DRAW)))
    parser.add_argument("--results", default=RESULTS, help="where the JSON is and the PNG goes")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(DRAW))
    if unknown:
        parser.error("no picture for %s; pictures: %s" % (", ".join(unknown),
                                                          ", ".join(sorted(DRAW))))
    for name in args.names or sorted(DRAW):
        with open(os.path.join(args.results, "%s.json" % name)) as handle:
            print("drew %s" % draw(name, json.load(handle), args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
