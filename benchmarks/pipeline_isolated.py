"""Pipeline schedules with each stage on a core of its own (``pipeline.py --isolated``).

Why: in ``pipeline.py``'s main table both stages are virtual devices of one process, so
they share TF's inter-op pool and the process's cores; work of one stage can fill the
other stage's bubbles, which hides what a schedule saves. Here a 2-stage pipeline spans
two worker processes (TF_CONFIG as ``epl-launch`` writes it, one virtual device each):
worker 0 builds the model and drives the steps, worker 1 only serves its device (stage
1). Each worker runs under ``taskset -c <i>`` (core i) with one intra-op and one inter-op
thread, so each stage has exactly one core and nothing else of the job runs on it.

Schedules are compared in paired steps (:mod:`paired`): a PreferBackward job and the
other schedule's job are alive at once and asked for single steps in the order A B B A
..., and each row is the median ratio of adjacent steps, beside the timed simulator's
ratio with equal F, B and W (``epl.strategies.schedule.timed``). While one job steps,
the other's processes sleep on their sockets, so the two jobs never share a core.
"""
import collections
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

import common
import paired as pairing

CORES = (0, 1)
# (row label, pipeline.strategy, pipeline.zero_bubble_memory), each against PreferBackward
ROWS = (("PreferForward", "PreferForward", "pipeline"),
        ("ZeroBubble", "ZeroBubble", "pipeline"),
        ("ZeroBubble, memory per stage", "ZeroBubble", "stage"))
QUICK_ROWS = ROWS[1:2]
QUICK_MICRO_BATCHES = (4,)
SERVER_EXIT_SECONDS = 60  # worker 1 leaves by itself once worker 0 has gone
TRACED_STEPS = 3  # per job, after its warm-up: the action costs' medians
# A stage function's call: EPL_MICRO_BATCH_<m>/EPL_stage<s>_<kind><chunk>[_first]
_CALL = re.compile(r"EPL_MICRO_BATCH_(\d+)/EPL_stage(\d+)_(forward|backward|weights)"
                   r"\d*(_first)?(_\d+)?$")
_KIND = {"forward": "F", "backward": "B", "weights": "W"}
# The _Send TF adds for a tensor a call hands to the other worker: named after the call,
# or after the Identity the schedule lowering sends it through (send_<call, / as _>)
_SEND = re.compile(r"(?:^|/send_)(EPL_MICRO_BATCH_\d+[/_]EPL_stage\d_\w+?)_S\d+:_Send$")
# That Identity itself (EPL_SCHEDULE_<n>/send_<call, / as _>): TF 2.15.1's traces hold no
# _Send (their step stats list the Identity, not the send), so there it stands in for it.
_SEND_IDENTITY = re.compile(r"(?:^|/)send_(EPL_MICRO_BATCH_\d+_EPL_stage\d_\w+)$")


def action_ms(traces):
    """{"<stage><F|B|W>": median milliseconds} of the stage-function calls in traced
    steps (``traces``: RunMetadata protos), over every micro-batch of every step: a
    fused backward is "B"; an action's chunks are summed."""
    per_action = collections.defaultdict(list)
    for run_metadata in traces:
        total = collections.Counter()
        for dev in run_metadata.step_stats.dev_stats:
            if "/host:" in dev.device:
                continue  # TF's host tracer repeats the calls (as async stubs)
            for node in dev.node_stats:
                match = _CALL.search(node.node_name)
                if match:
                    key = (int(match.group(2)), _KIND[match.group(3)], int(match.group(1)))
                    total[key] += node.all_end_rel_micros / 1e3
        for (stage, kind, _), ms in total.items():
            per_action["%d%s" % (stage, kind)].append(ms)
    return dict((key, statistics.median(values)) for key, values in per_action.items())


def late_sends(traces):
    """(late, all): how many cross-worker _Sends of a stage call's output started only
    after another stage call had started on the same worker, over the traced steps.
    An order, not a time: the load does not move it. 0 means each action's output left
    before the stage's next action (see docs/pipeline_schedules.md). A trace without
    _Send nodes (TF 2.15.1 records none) counts the lowering's send Identities instead:
    when each output was ready to leave, which a late _Send would follow."""
    late = total = 0
    for run_metadata in traces:
        calls, sends, identities = {}, [], []
        for dev in run_metadata.step_stats.dev_stats:
            for node in dev.node_stats:
                if _CALL.search(node.node_name) and "/host:" not in dev.device:
                    calls[node.node_name] = (node.all_start_micros, node.all_start_micros +
                                             node.all_end_rel_micros, dev.device)
                for pattern, found in ((_SEND, sends), (_SEND_IDENTITY, identities)):
                    match = pattern.search(node.node_name)
                    if match:
                        found.append((match.group(1).replace("_EPL_stage", "/EPL_stage", 1),
                                      node.all_start_micros))
        for producer, start in sends or identities:
            if producer in calls:
                _, end, device = calls[producer]
                total += 1
                late += any(d == device and end <= s < start for s, _, d in calls.values())
    return late, total


class MeasuredCosts(object):
    """Costs for ``epl.strategies.schedule.timed`` from :func:`action_ms`: each stage's
    own F, B and W (a schedule that does not split the backward measured B fused; an
    action no call ran, such as stage 0's B, costs nothing). ``scale``: the timed
    simulator divides an interleaved chunk's cost by the chunks per device (a chunk is
    that share of a stage), so a chunk's measured time is scaled up by as much."""

    def __init__(self, measured, scale=1):
        self.measured, self.scale = measured, scale

    def of(self, action, split):
        del split  # the measured B is already fused or not, as the schedule ran it
        return self.scale * self.measured.get("%d%s" % (action.stage, action.kind), 0.0)


def schedule_of(strategy, micro_batches, memory):
    """The schedule a row's job runs (``measure``'s default)."""
    from epl.strategies.schedule import get_schedule
    options = {"memory": memory} if strategy == "ZeroBubble" else {}
    return get_schedule(strategy, len(CORES), micro_batches, **options)


def simulated_with(measured, schedule):
    """The simulated step (ms) of ``schedule`` with its own measured action costs."""
    from epl.strategies.schedule import timed
    return timed.makespan(schedule, MeasuredCosts(measured, schedule.num_virtual_stages))


def free_hosts(count):
    """``count`` addresses on 127.0.0.1 with ports free now (as epl-launch picks them)."""
    from epl.launcher import pick_free_ports
    return ["127.0.0.1:%d" % port for port in pick_free_ports(count)]


def worker_env(hosts, index):
    """The environment of worker ``index``: TF_CONFIG of the job, one virtual device."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", EPL_NUM_VIRTUAL_DEVICES="1")
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": hosts},
                                   "task": {"type": "worker", "index": index}})
    return env


def pinned(core, argv):
    return ["taskset", "-c", str(core)] + list(argv)


class PinnedJob(pairing.StepServer):
    """One 2-worker pipeline job: worker 1 (core 1) serves stage 1's device and writes
    its output to ``log_path``; worker 0 (core 0) is the :class:`paired.StepServer` the
    driver steps. Closing it ends both processes."""

    def __init__(self, argv, what, log_path):
        hosts = free_hosts(len(CORES))
        self.log = open(log_path, "w")
        self.serving = subprocess.Popen(
            pinned(CORES[1], argv), cwd=common.REPO, env=worker_env(hosts, 1),
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        super(PinnedJob, self).__init__(pinned(CORES[0], argv), worker_env(hosts, 0), what)

    def close(self):
        super(PinnedJob, self).close()
        try:
            self.serving.wait(SERVER_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.serving.kill()
            self.serving.wait()
        self.log.close()


def measure(child_argv, micro_batches, rows, pairs, log_dir, simulated, schedules=schedule_of):
    """{m: {row label: result}}: each row's paired ratio to PreferBackward (median and
    quartiles), both schedules' median steps and the simulator's ratio.
    ``child_argv(m, strategy, memory)`` is the argv of one worker of a job,
    ``schedules(strategy, m, memory)`` the schedule it runs (pipeline_interleaved.py
    names interleaved rows its own way)."""
    found = {}
    for m in micro_batches:
        found[m] = {}
        base_units = simulated("PreferBackward", m)[0]
        for label, strategy, memory in rows:
            starts = []
            for name, (s, mem) in (("base", ("PreferBackward", "pipeline")),
                                   ("other", (strategy, memory))):
                log = os.path.join(log_dir, "m%d_%s_%s_worker1.log" % (m, s, mem))
                starts.append((name, lambda a=child_argv(m, s, mem), w="m=%d %s" % (m, s),
                               p=log: PinnedJob(a, w, p)))
            load_before = common.load_average()
            steps, _, servers = pairing.run_pair(starts, pairs)
            ratios = [a / b for a, b in zip(steps["other"], steps["base"])]
            costs = dict((name, server.ready.get("action_ms", {})) for name, server in servers)
            late = dict((name, server.ready.get("late_sends")) for name, server in servers)
            by_name = dict(servers)
            cpu = pairing.cpu_ratio(by_name["other"].cpu, by_name["base"].cpu)
            base_ms = simulated_with(costs["base"], schedules("PreferBackward", m, "pipeline"))
            other_ms = simulated_with(costs["other"], schedules(strategy, m, memory))
            found[m][label] = {
                "action_ms": costs, "late_sends": late,
                "worker0_cpu_ratio": cpu[0] if cpu else None,
                "simulated_ms": {"base": base_ms, "other": other_ms},
                "simulated_measured": other_ms / base_ms if base_ms else None,
                "median": statistics.median(ratios), "quartiles": pairing.quartiles(ratios),
                "base_step_seconds": statistics.median(steps["base"]),
                "step_seconds": statistics.median(steps["other"]),
                "simulated": simulated(strategy, m, memory)[0] / float(base_units),
                "pairs": len(ratios), "load_before": load_before,
                "load_after": common.load_average()}
            print("isolated m=%d %s / PreferBackward: %.3f (simulated %.3f)" % (
                m, label, found[m][label]["median"], found[m][label]["simulated"]),
                flush=True)
    return found


def report_lines(found, args):
    """Markdown of the isolated table."""
    rows = []
    for m, by_label in sorted(found.items()):
        for label, r in by_label.items():
            gain = common.share_of_gain(r["median"], r["simulated"])
            rows.append([label, m, "%.0f" % (r["base_step_seconds"] * 1e3),
                         "%.0f" % (r["step_seconds"] * 1e3), "%.3f" % r["median"],
                         "%.3f-%.3f" % tuple(r["quartiles"]), "%.3f" % r["simulated"], gain,
                         _ratio(r["simulated_measured"]), _costs(r["action_ms"]["other"]),
                         "%.0f / %.0f" % (r["simulated_ms"]["base"], r["simulated_ms"]["other"]),
                         _late(r.get("late_sends")), _ratio(r.get("worker0_cpu_ratio")),
                         "%s / %s" % (_load(r["load_before"]), _load(r["load_after"]))])
    return [
        "## Stages on their own cores (2 worker processes, `taskset`, 1 thread each)", "",
        "A pipeline across 2 worker processes (one virtual device each, TF_CONFIG as "
        "epl-launch writes it), worker i pinned to core i with one intra-op and one "
        "inter-op thread. Each row: that schedule's job and a PreferBackward job alive at "
        "once, single steps alternated, %d pairs; step / PreferBackward is the median "
        "ratio of adjacent steps; simulated is the timed simulator's ratio with equal F, B "
        "and W (a fused backward costs B + W). Load: 1-minute load average before / after "
        "the row (other processes on the 2 cores). With measured costs: each job traced "
        "%d steps after its warm-up; the simulator ran each schedule with its own median F, "
        "B and W call times per stage (ms, listed for the row's schedule; stage 0 has no B "
        "when the backward is split) and gives the ratio and both simulated steps, to set "
        "beside the measured steps. Late sends: of the tensors an action hands to the "
        "other worker in the traced steps, how many left only after the stage had "
        "started another action (an order, which the load does not move). Worker 0 CPU: "
        "the median ratio of worker 0's (stage 0's process) CPU seconds per step to "
        "PreferBackward's, which other processes' load moves far less than wall time: "
        "a schedule saves idle time, not work, so it should read about 1."
        % (args.pairs, TRACED_STEPS), "",
        common.markdown_table(["schedule", "m", "PreferBackward step ms", "step ms",
                               "step / PreferBackward (median)", "quartiles", "simulated",
                               "of predicted gain", "simulated, measured costs",
                               "F/B/W ms per stage", "simulated ms (PreferBackward / row)",
                               "late sends (PreferBackward / row)",
                               "worker 0 CPU s / PreferBackward", "load"], rows), ""]


def _ratio(value):
    return "-" if value is None else "%.3f" % value


def _costs(measured):
    stages = sorted(set(int(key[:-1]) for key in measured))
    return "; ".join("%d: %s" % (s, "/".join("%.1f" % measured.get("%d%s" % (s, k), 0.0)
                                             for k in "FBW")) for s in stages) or "-"


def _late(by_job):
    if not by_job or None in by_job.values():
        return "-"
    return " / ".join("%d of %d" % tuple(by_job[name]) for name in ("base", "other"))


def _load(value):
    return "-" if not value else "%.2f" % value[0]


def run(args, child_argv, simulated):
    """The ``--isolated`` mode of pipeline.py: measure, write pipeline_isolated.{json,md}."""
    start = time.time()
    micro_batches = (getattr(args, "isolated_micro_batches", None)
                     or (QUICK_MICRO_BATCHES if args.quick else args.schedule_micro_batches))
    rows = QUICK_ROWS if args.quick else ROWS
    log_dir = tempfile.mkdtemp(prefix="epl_pipeline_isolated_")
    print("worker 1 logs: %s" % log_dir, flush=True)
    found = measure(child_argv, micro_batches, rows, args.pairs, log_dir, simulated)
    info = common.environment_info()
    lines = ["# Pipeline schedules with one core per stage", "",
             "- Command: `%s`" % info["command"],
             "- Date: %s; EPL git %s" % (info["date"], info["git_revision"]),
             "- %s, %s CPUs; load average at start %s" % (
                 info["cpu_model"], info["cpu_count"], info["loadavg_start"]),
             "- Model: per stage %d dense layers of width %d; micro-batch %d; "
             "GradientDescent; %d warm-up steps per job; pipeline.micro_batching %s" % (
                 args.layers, args.width, args.batch, args.warmup,
                 getattr(args, "lowering", "auto")), ""]
    if args.label:
        lines += ["**%s**" % args.label, ""]
    lines += report_lines(found, args)
    markdown = "\n".join(lines)
    settings = dict(vars(args), out=common.portable_path(args.out))
    payload = {"environment": info, "settings": settings,
               "rows": dict((str(m), v) for m, v in found.items()),
               "seconds": time.time() - start}
    common.write_results(args.out, "pipeline_isolated", payload, markdown)
    print(markdown)
    return found
