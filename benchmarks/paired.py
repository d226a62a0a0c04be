"""Paired steps: two long-lived processes asked for one training step each, in turn.

Timing two configurations in separate processes one after the other cannot tell a
few percent on a shared 2-core VM: the same configuration's median step moves by
10-30% between processes and over minutes. So both run at once, built one after
the other, and the driver asks them for single steps in the order A B B A A B ...:
each step of one has a step of the other right before or after it, under the same
machine state, and the comparison is the median of the per-pair ratios. Only one
process computes at a time: the other waits on its stdin.

Child side: :func:`serve_steps`. Driver side: :func:`run_pair` (a :class:`StepServer`
per process, :func:`alternate` over them). Used by ``steady_step.py`` (two pipeline lowerings)
and ``cpu_allocator.py`` (two CPU allocators).
"""
import queue
import resource
import statistics
import subprocess
import sys
import threading
import time

import common

BUILD_TIMEOUT = 1800  # seconds for a process to build its graph and run its first steps
STEP_TIMEOUT = 300  # seconds for one step
BFC_VARIABLE = common.BFC_VARIABLE
ALLOCATORS = ("malloc", "bfc")  # TF's CPU allocator: its default (glibc) or its BFC


def allocator_env(allocator, env):
    """``env`` with TF's CPU allocator ``allocator`` named explicitly (``0`` or ``1``):
    neither the caller's own setting nor EPL's choice when the variable is unset
    (:mod:`epl.cluster.cpu_allocator`) decides a row."""
    env = dict(env)
    env[BFC_VARIABLE] = "1" if allocator == "bfc" else "0"
    return env


def serve_steps(sess, train, warmup, first_step, runs=1, ready_info=None):
    """Child side: ``warmup`` steps, a ready line (with ``ready_info``'s items: the
    driver's ``StepServer.ready``), then one timed step (seconds and
    minor page faults and the process's CPU seconds, all threads: a BENCH line) per
    line read from stdin, until it closes. A step
    is ``runs`` runs of ``train`` (gradient accumulation: the runs of one apply)."""
    for _ in range(warmup * runs):
        sess.run(train)
    ready = dict(ready_info or {}, ready=True, first_step=first_step)
    common.bench_line(ready)
    for _ in sys.stdin:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start, cpu = time.time(), time.process_time()
        for _ in range(runs):
            sess.run(train)
        seconds, cpu = time.time() - start, time.process_time() - cpu
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        common.bench_line(dict(step=seconds, faults=faults, cpu=cpu))
    common.bench_line(dict(max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0))


class StepServer(object):
    """A child process (``argv``, ``env``) driven one step at a time, every wait
    bounded (a hung or dead child raises BenchmarkError with its last output)."""

    def __init__(self, argv, env, what):
        self.what, self.argv = what, argv
        self.proc = subprocess.Popen(argv, cwd=common.REPO, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     universal_newlines=True, errors="replace")
        self.lines, self.bench = [], queue.Queue()
        self.max_rss_mb = None
        self.cpu = []  # CPU seconds of each step (less sensitive to other processes)
        threading.Thread(target=self._pump, daemon=True).start()
        self.ready = self._next(BUILD_TIMEOUT)
        self.first_step = self.ready["first_step"]

    def _pump(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            found = common.parse_bench([line], common.SINGLE_LINE)
            if found:
                self.bench.put(found[0])
        self.bench.put(None)

    def _next(self, timeout):
        try:
            payload = self.bench.get(timeout=timeout)
        except queue.Empty:
            payload = "timed out after %d s" % timeout
        if isinstance(payload, dict):
            return payload
        self.close()
        raise common.BenchmarkError("\n".join(
            ["%s: %s" % (self.what, payload or "exited without a result"),
             "command: " + common.format_command(self.argv)] + self.lines[-25:]))

    def step(self):
        """(seconds, minor page faults) of one training step."""
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        payload = self._next(STEP_TIMEOUT)
        self.cpu.append(payload.get("cpu"))
        return payload["step"], payload["faults"]

    def finish(self):
        """End the child; its peak resident memory (MB) is kept in ``max_rss_mb``."""
        self.proc.stdin.close()
        self.max_rss_mb = self._next(STEP_TIMEOUT).get("max_rss_mb")
        self.close()

    def close(self):
        try:
            if not self.proc.stdin.closed:
                self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def alternate(servers, pairs):
    """``servers``: [(name, StepServer)] (two). Steps them in the order A B, B A, ...
    ``pairs`` times; returns ({name: [step s]}, {name: [faults per step]})."""
    steps = dict((name, []) for name, _ in servers)
    faults = dict((name, []) for name, _ in servers)
    for round_ in range(pairs):
        for name, server in (servers if round_ % 2 == 0 else servers[::-1]):
            seconds, step_faults = server.step()
            steps[name].append(seconds)
            faults[name].append(step_faults)
    return steps, faults


def run_pair(starts, pairs):
    """``starts``: [(name, callable that starts a StepServer)] (two), started one at a
    time (builds never overlap), stepped by :func:`alternate`, then ended. Returns
    ({name: [step s]}, {name: [faults per step]}, [(name, ended StepServer)]); every
    child is stopped, also when one fails."""
    servers = []
    try:
        for name, start in starts:
            servers.append((name, start()))
        steps, faults = alternate(servers, pairs)
        for _, server in servers:
            server.finish()
    finally:
        for _, server in servers:
            server.close()
    return steps, faults, servers


def quartiles(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]


def cpu_ratio(cpu_a, cpu_b):
    """Median and quartiles of the per-pair ratio of two processes' CPU seconds per
    step (None when a side recorded none): what a step costs the machine, which other
    processes' load changes far less than its wall time."""
    ratios = [a / b for a, b in zip(cpu_a, cpu_b) if a is not None and b]
    if not ratios:
        return None
    return statistics.median(ratios), quartiles(ratios)


def measure_rows(shapes, modes, key_of, measure_one, row):
    """One paired row per shape and mode, each printed as it is measured so a long run
    shows its progress; rows belong to this run (``run`` 0 until merged)."""
    results = {}
    for shape in shapes:
        for mode in modes:
            key = key_of(shape, mode)
            results[key] = dict(measure_one(shape, mode), run=0)
            print(row(key, results[key]), flush=True)
    return results


def run_lines(runs):
    """The Markdown lines naming each run a table's rows come from."""
    return ["- Run %d: `%s`; %s; EPL git %s; %s, %s CPUs; %d warm-up steps per process" % (
        index + 1, info["command"], info["date"], info["git_revision"], info["cpu_model"],
        info["cpu_count"], info["warmup"]) for index, info in enumerate(runs)]


def merge_rows(old, results, runs):
    """``results`` with the rows of ``old`` (a payload read back, or None) whose keys were
    not run this time, and ``runs`` with the runs those rows came from (a row's ``run``
    indexes the runs, renumbered here; payloads from before ``runs`` held one ``run``)."""
    if old is None:
        return results, runs
    old_runs = old.get("runs", [old.get("run")])
    kept = dict((key, r) for key, r in old["results"].items() if key not in results)
    used = sorted(set(r.get("run", 0) for r in kept.values()))
    renumber = dict((index, len(runs) + position) for position, index in enumerate(used))
    for result in kept.values():
        result["run"] = renumber[result.get("run", 0)]
    merged = dict(results)
    merged.update(kept)
    return merged, runs + [old_runs[index] for index in used]
