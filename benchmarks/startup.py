"""Start-up and steady step on a corpus of shapes: where a user's first step goes.

Issue 41: on one model the first step under EPL took 0.87x plain TF's time, on an
independently written encoder of the same shape 1.75x. So every shape of
``shapes.py`` (the benchmark's own encoder, BERT-base written as users write it,
a ResNet-style CNN with batch norm, an MoE transformer) runs as plain TF and
under EPL's modes (pipeline with both lowerings, data parallelism with both,
gradient accumulation), each configuration in a fresh process, and each row
breaks the time down so that a regression shows where it lives:

* ``build``: building the graph in Python (``epl.init``, the scopes and the
  model; EPL's op-creation hooks are installed for EPL rows);
* ``session``: ``MonitoredTrainingSession`` creation (EPL's rewrite at graph
  finalize, TF's session, the initializers and ``TABLE_INITIALIZERS``, the
  scaffold's readiness checks); ``rewrite`` is EPL's share of it;
* ``first run``: the first step's runs (gradient accumulation: the
  ``micro_batches`` runs of the first apply), including TF's placement, grappler,
  executor creation and function instantiation for that run's signature;
* ``first step`` = session + first run, what issue 17 and 41 set goals on;
* ``steady``: median of the following steps.

Wall-clock times are what a user sees, but on a shared machine they move with the
load; every phase therefore also reports the CPU seconds of the process's main
thread (``main CPU``: Python, and TF's graph work that runs in the caller: placement,
grappler and executor creation for each new run signature; function bodies are
instantiated on TF's own threads, counted in ``CPU``) and of the whole process, and
each row records the load average and the CPU seconds that other processes used
meanwhile. Configurations run in turn (plain TF, then EPL's modes, shape by
shape), ``--repeats`` times, and each row keeps the run with the shortest first
step. Rows also count the ops, the session-run signatures TF executed (each new
signature prunes, places and optimizes a graph and builds executors) and the
stage functions.

Plain TF runs on one device with TF's default CPU allocator (malloc); EPL runs
with what ``epl.init`` selects (TF's BFC allocator for CPU jobs) unless
``--allocator`` names one for both.

    .venv/bin/python benchmarks/startup.py                 # the whole corpus
    .venv/bin/python benchmarks/startup.py --quick         # plain TF and the default pipeline
    .venv/bin/python benchmarks/startup.py --shapes bert --rows plain,pipe/stage_functions
    .venv/bin/python benchmarks/startup.py --rows plain,plain+ckpt   # TF's own step-0 save
    .venv/bin/python benchmarks/startup.py --baseline /tmp/epl-main   # before/after a change
    .venv/bin/python benchmarks/startup.py --snapshots off   # as `python train.py` runs

``--snapshots off`` runs the EPL rows as a user's ``python train.py`` does, without
EPL's snapshots (``EPL_CHECKPOINT_SNAPSHOT_STEPS=0``; under ``epl-launch`` a job writes
a snapshot at step 0 and every ``checkpoint.snapshot_steps`` steps): with the default
rows, the difference splits an EPL row's extra cost into the step-0 snapshot and the
rest. Every launched EPL row reports the snapshot steps its directory holds after
the first run, and a row that holds one it should not (or lacks step 0 with
snapshots on) fails, so that the label cannot lie.

``--baseline DIR`` (a checkout of the code before a change, its op library built)
runs every EPL row with that checkout's ``epl`` as well, the two in turn for each
configuration, so that a before/after table is taken in one go under the same load;
EPL rows start with ``epl-launch --num_workers 1`` (one worker x the mode's
devices), the path users take; ``--in-process`` gives them an in-process
``epl.Cluster`` instead (what ``rewrite_cost.py`` does: before issue 41 that was
not the same, since a one-worker launch ran every session through a server).

Writes benchmarks/results/startup.{json,md}; ``--merge`` keeps the rows not run
this time from the JSON already there.
"""
import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

FUNCTIONS, UNROLLED = "stage_functions", "unrolled"
ROWS = ("plain", "plain+ckpt", "pipe/" + FUNCTIONS, "pipe/" + UNROLLED, "dp/" + FUNCTIONS,
        "dp/" + UNROLLED, "ga")
QUICK_ROWS = ("plain", "pipe/" + FUNCTIONS)
PLAIN_CHECKPOINT = "plain+ckpt"  # plain TF with MonitoredTrainingSession(checkpoint_dir=...)
SHAPES = ("mid", "bert", "resnet", "moe")  # shapes.SHAPES also has bert_mid (issue 41's question)
PHASES = ("build", "session", "first_run")
BEFORE, CURRENT = "before", "after"  # with --baseline: its code, this checkout's
SNAPSHOT_STEPS_VARIABLE = "EPL_CHECKPOINT_SNAPSHOT_STEPS"  # checkpoint.snapshot_steps
TIMEOUT = 3600


# ---- child: one configuration in this process ------------------------------------
class Phases(object):
    """Wall seconds, process CPU seconds and main-thread CPU seconds per phase."""

    def __init__(self):
        self.wall, self.cpu, self.main = {}, {}, {}
        self.busy = common.machine_busy_seconds()

    def start(self):
        return time.time(), time.process_time(), time.thread_time()

    def stop(self, name, started):
        wall, cpu, main = started
        self.wall[name] = time.time() - wall
        self.cpu[name] = time.process_time() - cpu
        self.main[name] = time.thread_time() - main

    def other_cpu_seconds(self):
        """CPU seconds other processes used since this process started measuring."""
        busy = common.machine_busy_seconds()
        if busy is None or self.busy is None:
            return None
        return max(0.0, busy - self.busy - time.process_time())


def _record_runs(runs):
    """Record every run TF executes: its signature (targets, fetches, feeds: each new
    one prunes, places and optimizes a graph and builds executors), a label (its first
    target or fetch op) and its wall, process CPU and main-thread CPU seconds."""
    from tensorflow.python.client import session as session_lib
    original = session_lib.BaseSession._do_run

    def name(element):  # an Operation (target) or a Tensor (fetch)
        return getattr(getattr(element, "op", element), "name", str(element))

    def _do_run(self, handle, target_list, fetch_list, feed_dict, *rest):
        names = [name(t) for t in target_list] + [name(f) for f in fetch_list]
        signature = (tuple(sorted(names)), tuple(sorted(str(f) for f in feed_dict)))
        started = time.time(), time.process_time(), time.thread_time()
        try:
            return original(self, handle, target_list, fetch_list, feed_dict, *rest)
        finally:
            runs.append(dict(signature=hash(signature), label=names[0] if names else "-",
                             wall=time.time() - started[0], cpu=time.process_time() - started[1],
                             main=time.thread_time() - started[2]))
    session_lib.BaseSession._do_run = _do_run


def _time_rewrite(phases):
    from epl.parallel import rewriter
    original = rewriter.parallelize

    def timed(*args, **kwargs):
        started = phases.start()
        try:
            return original(*args, **kwargs)
        finally:
            phases.stop("rewrite", started)
    rewriter.parallelize = timed


def _graph_counts(tf):
    graph = tf.get_default_graph()
    library = graph.as_graph_def().library
    return dict(ops_after=len(graph.get_operations()), functions=len(library.function),
                function_nodes=sum(len(f.node_def) for f in library.function))


def _lowering(tf):
    """The plan's lowering of repeated steps (None without repetition or EPL)."""
    import epl
    view = epl.Graph.get(tf.get_default_graph(), create=False)
    program = view and view.parallel
    choice = program and program.plan.micro_batching
    return choice[0] if choice else None


def child(args):
    """Build, create the session, first step, steady steps; one BENCH line."""
    tf = common.graph_mode_tf()
    import shapes
    log, phases = [], Phases()
    _record_runs(log)
    epl_path = None
    if not is_plain(args.mode):
        import epl  # imported before timing, as a user's script does
        epl_path = os.path.dirname(os.path.dirname(os.path.abspath(epl.__file__)))
        _time_rewrite(phases)
    started = phases.start()
    built = shapes.train_op(tf, args.shape, "plain" if is_plain(args.mode) else args.mode,
                            args.lowering, args.micro_batches, launched=args.launched)
    phases.stop("build", started)
    ops_before = len(tf.get_default_graph().get_operations())
    config = tf.ConfigProto(device_count={"CPU": built.devices})
    started = phases.start()
    sess = tf.train.MonitoredTrainingSession(config=config, **_checkpoint_arguments(args))
    phases.stop("session", started)
    session_runs = len(log)
    started = phases.start()
    for _ in range(built.runs_per_step):
        sess.run(built.train)
    phases.stop("first_run", started)
    first_runs = len(log)
    snapshot_steps = _snapshot_steps()
    steps, step_cpu = [], []
    for _ in range(args.steady_steps):
        wall, cpu = time.time(), time.process_time()
        for _ in range(built.runs_per_step):
            sess.run(built.train)
        steps.append(time.time() - wall)
        step_cpu.append(time.process_time() - cpu)
    sess.close()
    common.bench_line(dict(
        wall=phases.wall, cpu=phases.cpu, main=phases.main, ops_before=ops_before,
        steady=statistics.median(steps) if steps else None,
        steady_cpu=statistics.median(step_cpu) if step_cpu else None,
        session_runs=session_runs, run_signatures=len(set(r["signature"] for r in log)),
        runs=log[:first_runs],
        lowering=_lowering(tf) if not is_plain(args.mode) else None,
        allocator=os.environ.get(common.BFC_VARIABLE, "unset"), epl_path=epl_path,
        other_cpu_seconds=phases.other_cpu_seconds(), snapshot_steps=snapshot_steps,
        **_graph_counts(tf)))


def _snapshot_steps():
    """Steps of the snapshot directories the job holds after the first run (the step-0
    snapshot is committed before the first run returns), or None without a snapshot
    directory (plain TF, an in-process cluster)."""
    root = os.environ.get("EPL_CHECKPOINT_SNAPSHOT_DIR")
    if not root:
        return None
    from epl.session import snapshot_store
    return snapshot_store.steps(root)


def check_snapshots(result, snapshots, what):
    """Raise BenchmarkError when a row's snapshot directory disagrees with its label:
    with snapshots off it holds none, with snapshots on it holds step 0."""
    found = result.get("snapshot_steps")
    if found is None:
        return
    if snapshots == "off" and found:
        raise common.BenchmarkError("%s: ran with snapshots off (%s=0) but wrote the "
                                    "snapshots of steps %s" % (what, SNAPSHOT_STEPS_VARIABLE,
                                                               found))
    if snapshots == "on" and 0 not in found:
        raise common.BenchmarkError("%s: ran with snapshots on but wrote no step-0 snapshot "
                                    "(steps found: %s)" % (what, found))


def is_plain(mode):
    """Plain TF rows: without EPL, with or without TF's own checkpoints."""
    return mode in ("plain", PLAIN_CHECKPOINT)


def _checkpoint_arguments(args):
    """MonitoredTrainingSession's arguments of the row: ``plain+ckpt`` gives a
    ``checkpoint_dir`` (a new temporary one, deleted at exit), whose CheckpointSaverHook
    saves the graph, the meta graph and a checkpoint of step 0 at session creation, as
    EPL's step-0 snapshot saves the state at the first run; TF's summaries and step
    counter stay off, so the row differs from ``plain`` by the checkpoints only."""
    if args.mode != PLAIN_CHECKPOINT:
        return {}
    directory = tempfile.mkdtemp(prefix="epl_bench_ckpt_")
    atexit.register(shutil.rmtree, directory, True)
    return dict(checkpoint_dir=directory, save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=None)


# ---- driver -------------------------------------------------------------------------
def run_row(args, shape, row, code=None):
    """One configuration in a fresh process; ``code``: the checkout whose ``epl`` it
    imports (default: this one)."""
    mode, _, lowering = row.partition("/")
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--shape", shape,
            "--mode", mode, "--micro-batches", str(args.micro_batches),
            "--steady-steps", str(args.steady_steps)]
    if lowering:
        argv += ["--lowering", lowering]
    env = {"PYTHONPATH": code or common.REPO}
    drop = ()
    if args.allocator == "default":
        drop = (common.BFC_VARIABLE,)
    else:
        env[common.BFC_VARIABLE] = "1" if args.allocator == "bfc" else "0"
    if args.snapshots == "off":
        env[SNAPSHOT_STEPS_VARIABLE] = "0"
    else:
        drop += (SNAPSHOT_STEPS_VARIABLE,)
    load = common.load_average()
    what = "%s %s" % (shape, row)
    if not args.in_process and not is_plain(mode):
        result = _launched(argv[2:] + ["--launched"], shapes_devices(mode), env, drop, what)
    else:
        result = common.run_single(argv, TIMEOUT, what, extra_env=env, drop_env=drop)
    check_snapshots(result, args.snapshots, what)
    result["load_before"] = load
    # results name the code, not a machine path (epl_path: which checkout's epl it imported)
    result["code"] = "baseline" if code else "this checkout"
    result["epl_path"] = {common.REPO: "this checkout", code: "baseline"}.get(
        result.get("epl_path"), result.get("epl_path") and "another checkout")
    return result


def shapes_devices(mode):
    import shapes
    return shapes.mode_devices(mode)


def _launched(script_args, devices, env, drop, what):
    """One EPL configuration started by ``python -m epl.launcher`` (one worker)."""
    result = common.launch(os.path.abspath(__file__), script_args, 1, devices, TIMEOUT,
                           extra_env=env, drop_env=drop)
    found = common.parse_bench(result.lines)
    if result.timed_out or result.returncode != 0 or 0 not in found:
        common.raise_failure(result, what, 1)
    common.discard_logs(result)
    return found[0]


def first_step(run):
    return run["wall"]["session"] + run["wall"]["first_run"]


def sides(args, row, repeat):
    """The code each EPL configuration runs with: this checkout, or with ``--baseline``
    the baseline and this checkout, in turn (the order swaps every repeat)."""
    if not args.baseline or is_plain(row):
        return [CURRENT]
    return [BEFORE, CURRENT] if repeat % 2 == 0 else [CURRENT, BEFORE]


def compile_epl(codes):
    """Byte-compile the ``epl`` package of each checkout before any row runs. TF's
    modules in the virtual environment are compiled at install, as an installed EPL's
    would be; with ``PYTHONDONTWRITEBYTECODE`` set (as on our machines) every child
    would otherwise compile EPL's ~120 modules from source, about 0.1 s CPU that
    ``build`` charged to EPL and that no installed EPL pays (issue 41)."""
    import compileall
    for code in codes:
        if not compileall.compile_dir(os.path.join(code, "epl"), quiet=1):
            raise common.BenchmarkError("could not byte-compile %s/epl" % code)


def measure(args):
    """{(shape, row, side): [runs]}: every configuration ``args.repeats`` times, in turn."""
    compile_epl([common.REPO] + ([args.baseline] if args.baseline else []))
    runs = {}
    for repeat in range(args.repeats):
        for shape in args.shapes:
            for row in args.rows:
                for side in sides(args, row, repeat):
                    code = args.baseline if side == BEFORE else None
                    try:
                        run = run_row(args, shape, row, code)
                    except common.BenchmarkError as err:
                        run = dict(error=str(err).splitlines()[0])
                        print(str(err), file=sys.stderr)
                    runs.setdefault((shape, row, side), []).append(run)
                    print("%s %s %s repeat %d: %s" % (shape, row, side, repeat + 1, _brief(run)),
                          flush=True)
    return runs


def _brief(run):
    if "error" in run:
        return "failed: " + run["error"]
    return "build %.1f session %.1f first run %.1f steady %s (main CPU %.1f / %.1f / %.1f)" % (
        run["wall"]["build"], run["wall"]["session"], run["wall"]["first_run"],
        "%.2f" % run["steady"] if run["steady"] is not None else "-",
        run["main"]["build"], run["main"]["session"], run["main"]["first_run"])


def best(runs):
    """The run with the shortest first step (the least disturbed), with every run's
    first step; a failed configuration keeps its error."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return dict(runs[-1])
    chosen = dict(min(good, key=first_step))
    chosen["first_steps"] = [first_step(run) for run in good]
    return chosen


# ---- report -------------------------------------------------------------------------
def _ratio(value, base):
    return " (%.2fx)" % (value / base) if base else ""


def _cells(run, plain):
    """Formatted cells of one row, each EPL value with its ratio to plain TF's
    (``plain`` None: the plain row itself, or no plain row)."""
    is_plain = plain is None
    ref = (lambda field: None) if is_plain else plain.get
    wall, main = run["wall"], run["main"]
    first = wall["session"] + wall["first_run"]
    plain_first = None if is_plain else plain["wall"]["session"] + plain["wall"]["first_run"]
    setup = main["session"] + main["first_run"]
    plain_setup = None if is_plain else plain["main"]["session"] + plain["main"]["first_run"]
    return [
        "%.1f%s" % (wall["build"], _ratio(wall["build"], ref("wall") and ref("wall")["build"])),
        "%.2f" % wall["rewrite"] if "rewrite" in wall else "-",
        "%.1f" % wall["session"], "%.1f" % wall["first_run"],
        "%.1f%s" % (first, _ratio(first, plain_first)),
        "%.2f%s" % (run["steady"], _ratio(run["steady"], ref("steady")))
        if run["steady"] is not None else "-",
        "%.1f / %.1f%s" % (main["build"], setup, _ratio(setup, plain_setup)),
        "%.1f" % (run["cpu"]["session"] + run["cpu"]["first_run"]),
        "%d -> %d" % (run["ops_before"], run["ops_after"]),
        "%d (%d nodes)" % (run["functions"], run["function_nodes"]) if run["functions"] else "-",
        "%d" % run["run_signatures"],
        "%.1f" % run["load_before"][0] if run.get("load_before") else "?",
        "%.0f" % run["other_cpu_seconds"] if run.get("other_cpu_seconds") is not None else "?"]


HEADERS = ["shape", "mode", "lowering", "build s", "rewrite s", "session s", "first run s",
           "first step s", "steady s", "main CPU s: build / first step", "CPU s first step",
           "ops", "functions", "run signatures", "load", "others' CPU s"]


def table_rows(records):
    rows = []
    for record in records:
        run, plain = record["run"], record.get("plain")
        mode, _, lowering = record["row"].partition("/")
        mode += " (in-process)" if not record.get("launched") and not is_plain(mode) else ""
        mode += " (no snapshots)" if record.get("snapshots") == "off" and not is_plain(mode) \
            else ""
        mode += " [before]" if record.get("side") == BEFORE else ""
        head = [record["shape"], mode, (run.get("lowering") or lowering or "-")
                + (" (default)" if record.get("default") else "")]
        if "error" in run:
            rows.append(head + ["failed: %s" % run["error"]] + [""] * (len(HEADERS) - 4))
        else:
            usable = plain and record["row"] != "plain" and "error" not in plain
            rows.append(head + _cells(run, plain if usable else None))
    return rows


def records_of(runs, args):
    records = []
    for shape in args.shapes:
        plain = best(runs[(shape, "plain", CURRENT)]) if (shape, "plain", CURRENT) in runs \
            else None
        for row in args.rows:
            for side in sides(args, row, 0):
                run = best(runs[(shape, row, side)])
                records.append(dict(shape=shape, row=row, run=run, plain=plain, side=side,
                                    default=_is_default(row, run), snapshots=args.snapshots,
                                    launched=not args.in_process and not is_plain(row)))
    return records


def _is_default(row, run):
    """The row ran EPL's default lowering (what the plan chose with the key unset)."""
    mode, _, lowering = row.partition("/")
    return bool(lowering) and lowering == FUNCTIONS and run.get("lowering") == "stage functions"


def markdown(payload):
    lines = ["# Start-up and steady step on a corpus of shapes (1 worker, virtual CPU devices)",
             ""]
    for info in payload["runs"]:
        lines.append("- `%s`; %s; EPL git %s; %s, %s CPUs; load average at start %s" % (
            info["command"], info["date"], info["git_revision"], info["cpu_model"],
            info["cpu_count"], info["loadavg_start"]))
    lines += [
        "- Global batch per step the same in every mode: plain = TF alone on one device "
        "(plain+ckpt: with MonitoredTrainingSession(checkpoint_dir=...), whose hook saves "
        "the graph, the meta graph and a step-0 checkpoint at session creation); pipe = "
        "2 stages x %d micro-batches; dp = 2 local replicas; ga = %d accumulated runs on one "
        "device (its first run and steady step are %d runs)"
        % ((payload["micro_batches"],) * 3),
        "- first step = session (MonitoredTrainingSession creation, EPL's rewrite included) "
        "+ first run; ratios are against plain TF's row of the shape; steady = median of "
        "%d steps; each row is the run with the shortest first step of %d" % (
            payload["steady_steps"], payload["repeats"]),
        "- main CPU = CPU seconds of the main thread (Python; TF's placement, grappler and "
        "executors for each new run signature), less sensitive to other processes than wall "
        "time; CPU s first step = the whole process's; load = 1-min load average before the "
        "run; others' CPU s = CPU seconds other processes used during the run; [before] = "
        "the --baseline checkout's code, run in turn with this checkout's; EPL rows under "
        "epl-launch write the job's step-0 snapshot unless labelled (no snapshots) "
        "(--snapshots off: checkpoint.snapshot_steps=0, checked: no snapshot written); "
        "EPL's modules are byte-compiled before the runs, as an installed package's are", "",
        common.markdown_table(HEADERS, table_rows(payload["records"])), "",
        "## Where session creation and the first run go", "",
        "Each TF run of session creation, then (after `|`) of the first run, as `op: process "
        "CPU s (main thread CPU s)`, op = the run's first target or fetch; rewrite = EPL's "
        "parallelize inside session creation (CPU s). MonitoredTrainingSession's runs are "
        "the initializer, the readiness check for the local initializer, the local "
        "initializer (local variables and `TABLE_INITIALIZERS`) and the readiness check.", "",
        common.markdown_table(["shape", "mode", "lowering", "rewrite", "runs"],
                              [row[:3] + _runs_cells(record["run"])
                               for row, record in zip(table_rows(payload["records"]),
                                                      payload["records"])])]
    return "\n".join(lines)


def _runs_cells(run):
    """[rewrite CPU s, each run of session creation and the first run]."""
    if "runs" not in run:
        return ["-", "not recorded"]
    cells = ["%s: %.1f (%.1f)" % (r["label"][:32], r["cpu"], r["main"]) for r in run["runs"]]
    session = run["session_runs"]
    text = "; ".join(cells[:session]) + " | " + "; ".join(cells[session:])
    return ["%.1f" % run["cpu"]["rewrite"] if "rewrite" in run["cpu"] else "-", text]


def _key(record):
    return (record["shape"], record["row"], bool(record.get("launched")),
            record.get("side", CURRENT), record.get("snapshots", "on"))


def merged(out, records, runs):
    old = common.read_results(out, "startup")
    if old is None:
        return records, runs
    fresh = set(_key(r) for r in records)
    kept = [r for r in old["records"] if _key(r) not in fresh]
    order = lambda r: (list(SHAPES + ("bert_mid",)).index(r["shape"]) if r["shape"] in
                       SHAPES + ("bert_mid",) else 99, bool(r.get("launched")),
                       list(ROWS).index(r["row"]), r.get("snapshots") == "off",
                       r.get("side") != BEFORE)
    return sorted(kept + records, key=order), old["runs"] + runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--lowering", help=argparse.SUPPRESS)
    parser.add_argument("--launched", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", type=common.csv_list(str), default=list(SHAPES))
    parser.add_argument("--rows", type=common.csv_list(str, ROWS), default=list(ROWS))
    parser.add_argument("--micro-batches", type=common.positive_int, default=4)
    parser.add_argument("--repeats", type=common.positive_int, default=2)
    parser.add_argument("--steady-steps", type=int, default=3)
    parser.add_argument("--allocator", choices=("default", "malloc", "bfc"), default="default")
    parser.add_argument("--baseline", default=None,
                        help="a checkout of the code before a change (its epl is imported; "
                        "its op library built): each EPL row also runs with it, in turn with "
                        "this checkout")
    parser.add_argument("--snapshots", choices=("on", "off"), default="on",
                        help="off: EPL rows without EPL's snapshots (%s=0), as a user's "
                        "`python train.py` runs; labelled '(no snapshots)'"
                        % SNAPSHOT_STEPS_VARIABLE)
    parser.add_argument("--in-process", action="store_true",
                        help="give EPL rows an in-process cluster (epl.Cluster) instead of "
                        "starting them with epl-launch, as users do")
    parser.add_argument("--quick", action="store_true",
                        help="plain TF and the default pipeline, once each, 2 steady steps")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--merge", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        args.rows, args.repeats, args.steady_steps = list(QUICK_ROWS), 1, 2
    started = time.time()
    runs = measure(args)
    records = records_of(runs, args)
    info = [common.environment_info(sys.argv)]
    if args.merge:
        records, info = merged(args.out, records, info)
    payload = dict(records=records, runs=info, micro_batches=args.micro_batches,
                   repeats=args.repeats, steady_steps=args.steady_steps)
    return common.publish(args.out, "startup", payload, markdown(payload), time.time() - started)


if __name__ == "__main__":
    sys.exit(main())
