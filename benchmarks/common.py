"""Shared plumbing for EPL benchmarks: launching jobs, parsing results, writing reports.

Why a separate module: every benchmark needs the same three things done the
same way, so that numbers from different benchmarks are comparable and every
failure is diagnosable:

* jobs start through ``python -m epl.launcher`` (the path users take), with a
  hard timeout, so a hung collective can never hang the benchmark;
* workers report one machine-readable ``BENCH {json}`` line, so results are
  parsed from the stream instead of scraped from human-oriented logs;
* results go to ``<out>/<name>.json`` (for tools) and ``<out>/<name>.md`` (for
  people), both stamped with the command line, date and environment.

This module never imports TensorFlow: the driver stays fast to start, and the
worker side (``bench_line``, ``install_deadline``) is importable from workers.
"""
import collections
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BENCH_TAG = "BENCH"
# Launcher output: "[worker i] text". Worker lines are parsed from this stream.
WORKER_LINE = re.compile(r"^\[worker (\d+)\] (.*)$")
# After SIGTERM the launcher needs up to its own 10 s grace period to stop workers.
LAUNCHER_GRACE = 15.0

LaunchResult = collections.namedtuple(
    "LaunchResult", ["argv", "returncode", "lines", "log_dir", "seconds", "timed_out"])
LaunchResult.__doc__ = """Outcome of one launcher run. ``lines`` is the launcher's
merged stdout/stderr (worker lines carry the ``[worker i]`` prefix)."""


class BenchmarkError(RuntimeError):
    """A run failed; the message already contains the diagnostics to show."""


# ----------------------------------------------------------------------------
# Worker side (no TensorFlow, no epl imports)
# ----------------------------------------------------------------------------

def bench_line(payload):
    """Print the one machine-readable result line of a worker.

    A single JSON object on one line survives the launcher's line-based
    prefixing and interleaving with TF's log output."""
    print("%s %s" % (BENCH_TAG, json.dumps(payload, sort_keys=True)), flush=True)


def install_deadline(seconds, what="benchmark worker"):
    """Hard-exit this process after ``seconds``.

    The launcher tears a job down when one worker fails, but a worker blocked
    in a collective waiting for a peer never fails by itself, and if the
    launcher is killed the workers (in their own sessions) are orphaned. A
    daemon timer with ``os._exit`` guarantees the process ends regardless of
    what TensorFlow's threads are doing."""
    def expire():
        sys.stderr.write("%s: deadline of %.0f s exceeded, exiting\n" % (what, seconds))
        sys.stderr.flush()
        os._exit(124)
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def thread_count():
    """Threads of this process (Linux /proc), or None elsewhere; shows how many
    threads TensorFlow really started despite a 1-thread ConfigProto."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def machine_busy_seconds():
    """CPU-seconds all processes on this machine have spent busy since boot (Linux
    /proc/stat), or None. A worker samples it around its timed steps; subtracting
    the job's own CPU time gives what *other* processes took from the benchmark,
    which on a 2-core machine shared with test runs is the main source of noise."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice (already in user)]
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / float(os.sysconf("SC_CLK_TCK"))


# ----------------------------------------------------------------------------
# Driver side
# ----------------------------------------------------------------------------

def launch(script, script_args, num_workers, gpu_per_worker, timeout, log_dir=None,
           extra_env=None, echo=None):
    """Run ``python -m epl.launcher`` with a hard ``timeout`` (seconds).

    Output is read line by line in a thread (so a chatty job cannot fill the
    pipe) and optionally passed to ``echo(line)``. On timeout the launcher gets
    SIGTERM, which makes it stop its workers; if it is still alive after its
    grace period it is killed. Returns a LaunchResult; never raises for a
    failed job, so callers decide how to report it."""
    if log_dir is None:
        log_dir = tempfile.mkdtemp(prefix="epl_bench_")
    argv = [sys.executable, "-m", "epl.launcher", "--num_workers", str(num_workers),
            "--gpu_per_worker", str(gpu_per_worker), "--log_dir", log_dir, script]
    argv += [str(a) for a in script_args]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.update(extra_env or {})
    start = time.monotonic()
    # Own session: our Ctrl-C handling stays ours, and the launcher is signalled alone.
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True, errors="replace", start_new_session=True)
    lines = []

    def pump():
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            if echo is not None:
                echo(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    except BaseException:  # e.g. KeyboardInterrupt: never leave the job running
        _stop(proc)
        raise
    reader.join(5.0)
    return LaunchResult(argv, proc.returncode, lines, log_dir, time.monotonic() - start,
                        timed_out)


def _stop(proc):
    """SIGTERM the launcher (it stops its workers), SIGKILL it after its grace period."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(LAUNCHER_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


def discard_logs(result):
    """Delete a successful run's temporary log directory (failed runs keep theirs,
    and the failure report names it)."""
    if os.path.basename(result.log_dir).startswith("epl_bench_"):
        shutil.rmtree(result.log_dir, ignore_errors=True)


def worker_lines(lines, worker):
    """Lines written by one worker, without the launcher's prefix."""
    result = []
    for line in lines:
        match = WORKER_LINE.match(line)
        if match and int(match.group(1)) == worker:
            result.append(match.group(2))
    return result


def parse_bench(lines):
    """``{worker index: payload}`` from the ``BENCH {json}`` lines of a launcher run."""
    found = {}
    for line in lines:
        match = WORKER_LINE.match(line)
        if not match or not match.group(2).startswith(BENCH_TAG + " "):
            continue
        try:
            found[int(match.group(1))] = json.loads(match.group(2)[len(BENCH_TAG) + 1:])
        except ValueError:
            continue  # a truncated line; reported as missing by the caller
    return found


def log_tail(path, count):
    """Last ``count`` lines of a file ([] if it does not exist)."""
    try:
        with open(path, errors="replace") as handle:
            return [line.rstrip("\n") for line in collections.deque(handle, count)]
    except OSError:
        return []


def failure_report(result, what, num_workers, tail=25):
    """Human-readable diagnosis of a failed run: why it failed, the launcher's
    own last lines, and the last lines of every worker log (the root cause is
    usually in one worker, the others only show the teardown)."""
    if result.timed_out:
        why = "timed out after %.0f s" % result.seconds
    elif result.returncode != 0:
        why = "exited with code %s" % result.returncode
    else:
        why = "finished without a BENCH line from worker 0"
    parts = ["%s %s" % (what, why), "command: " + format_command(result.argv)]
    own = [line for line in result.lines if not WORKER_LINE.match(line)]
    if own:
        parts.append("--- launcher output (last %d lines) ---" % min(tail, len(own)))
        parts.extend(own[-tail:])
    for worker in range(num_workers):
        path = os.path.join(result.log_dir, "worker_%d.log" % worker)
        lines = log_tail(path, tail) or worker_lines(result.lines, worker)[-tail:]
        parts.append("--- worker %d: last %d lines (%s) ---" % (worker, len(lines), path))
        parts.extend(lines)
    return "\n".join(parts)


def format_command(argv):
    """A shell-quoted command line that can be pasted back into a terminal."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def git_revision():
    """Current commit (plus '-dirty' when the tree has changes), or None; read-only."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, timeout=10,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, timeout=10, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, universal_newlines=True)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment_info(argv=None):
    """Everything needed to judge whether two result files are comparable."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = None
    return {
        "command": format_command([sys.executable] + list(sys.argv if argv is None else argv)),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "loadavg_start": load_average(),
    }


def load_average():
    """1/5/15-minute load average, or None. Recorded because on a small machine
    any other busy process (a test run, a build) directly lowers the numbers."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def markdown_table(headers, rows):
    """A GitHub Markdown table; numbers are formatted by the caller."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out.extend("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)
    return "\n".join(out)


def write_results(out_dir, name, payload, markdown):
    """Write ``<out_dir>/<name>.json`` and ``.md``; returns both paths.

    Files are written to a temporary name and renamed, so an interrupted run
    never leaves a half-written result next to good ones."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext, text in (("json", json.dumps(payload, indent=2, sort_keys=True) + "\n"),
                      ("md", markdown.rstrip("\n") + "\n")):
        path = os.path.join(out_dir, "%s.%s" % (name, ext))
        with open(path + ".tmp", "w") as handle:
            handle.write(text)
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths
