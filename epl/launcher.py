"""epl-launch: start a multi-worker TensorFlow job, one process per worker.

Usage: ``epl-launch --num_workers W --gpu_per_worker G [options] script [args...]``
(or ``python -m epl.launcher ...``). See docs/launcher.md.

Design: everything that decides *what* to run (argument validation, TF_CONFIG,
device assignment, commands, log paths) is a pure function returning plain data,
so it can be unit-tested without starting processes. Only `execute` touches
processes. This module deliberately imports neither TensorFlow nor other epl
modules: the launcher must start instantly and run on hosts without TF.
"""
import argparse
import collections
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

PROG = "epl-launch"
TAIL_LINES = 20
DEFAULT_GRACE_PERIOD = 10.0
POLL_INTERVAL = 0.2

Settings = collections.namedtuple("Settings", [
    "num_workers", "gpu_per_worker", "machine_list", "machine_rank",
    "log_dir", "task_label", "debug", "script", "script_args"])
Settings.__doc__ = """Validated command line. Immutable so planning functions cannot
mutate shared state; machine_list and script_args are tuples."""

WorkerSpec = collections.namedtuple(
    "WorkerSpec", ["index", "argv", "env", "log_path", "interactive"], defaults=(False,))
WorkerSpec.__doc__ = """Everything needed to start one worker. `interactive` means
the worker inherits the launcher's stdin/stdout/stderr (debug mode, worker 0)."""


class LaunchError(Exception):
    """A problem with the requested job that is only detectable after parsing
    (e.g. not enough GPUs); main() turns it into a message and exit code 2."""


# ----------------------------------------------------------------------------
# Argument parsing
# ----------------------------------------------------------------------------

def _positive_int(text):
    """argparse type: a positive int, so `--num_workers 0` fails at parse time."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid int value: %r" % text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1, got %r" % text)
    return value


def _non_negative_int(text):
    """argparse type for --machine_rank (0 is a valid rank)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid int value: %r" % text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0, got %r" % text)
    return value


def split_host_port(address):
    """Split 'host:port' (or '[v6]:port') and validate it; returns (host, port).

    Done by hand rather than with urllib because TF_CONFIG wants the exact
    string back and we must reject empty hosts and out-of-range ports early,
    before any worker waits forever for a peer that cannot exist."""
    host, sep, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or re.search(r"\s", host):
        raise ValueError("%r is not host:port" % address)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError("%r: port must be an integer in 1..65535" % address)
    return host, int(port_text)


def _machine_list(text):
    """argparse type: comma-separated host:port list, returned as a tuple."""
    entries = tuple(item.strip() for item in text.split(","))
    for entry in entries:
        try:
            split_host_port(entry)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc))
    return entries


def _task_label(text):
    """argparse type: the label becomes part of a directory name, so keep it to
    characters that cannot create subdirectories or need quoting."""
    if not re.match(r"^[A-Za-z0-9._-]+$", text):
        raise argparse.ArgumentTypeError(
            "%r may only contain letters, digits, '.', '_' and '-'" % text)
    return text


def is_local_host(host):
    """True for loopback names; such workers can all run on this machine."""
    return host in ("localhost", "::1") or host.startswith("127.")


def _build_parser():
    """The argparse parser; allow_abbrev=False so `--num 3` is never silently
    taken as --num_workers."""
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Start a multi-worker EPL/TensorFlow job, one process per worker.")
    parser.add_argument("--num_workers", type=_positive_int, required=True,
                        help="number of worker processes in the job (>= 1)")
    parser.add_argument("--gpu_per_worker", type=_positive_int, required=True,
                        help="devices per worker: GPUs, or virtual CPU devices on a "
                             "host without GPUs")
    parser.add_argument("--machine_list", type=_machine_list, default=None,
                        help="ip:port,ip:port,... one entry per worker (default: free "
                             "ports on 127.0.0.1)")
    parser.add_argument("--machine_rank", type=_non_negative_int, default=None,
                        help="launch only this worker here (needs --machine_list)")
    parser.add_argument("--log_dir", default=None,
                        help="directory for worker_<i>.log (default: experiments/...)")
    parser.add_argument("--task_label", type=_task_label, default=None,
                        help="suffix for the default log directory name")
    parser.add_argument("--debug", action="store_true",
                        help="worker 0 uses this terminal directly (pdb works); "
                             "sets EPL_DEBUG=1")
    parser.add_argument("script", help=".py runs with this Python, anything else with bash")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="passed to the script unchanged")
    return parser


def parse_args(argv):
    """Parse and cross-validate the command line into a Settings.

    Cross-flag checks live here (not at launch time) so a bad command fails
    before any port is picked or any process started."""
    parser = _build_parser()
    ns = parser.parse_args(argv)
    machines = ns.machine_list
    if machines is not None and len(machines) != ns.num_workers:
        parser.error("argument --machine_list: has %d entries (%s) but --num_workers is %d"
                     % (len(machines), ",".join(machines), ns.num_workers))
    if ns.machine_rank is not None:
        if machines is None:
            parser.error("argument --machine_rank: %d given without --machine_list"
                         % ns.machine_rank)
        if ns.machine_rank >= ns.num_workers:
            parser.error("argument --machine_rank: %d is out of range for --num_workers %d"
                         % (ns.machine_rank, ns.num_workers))
    elif machines is not None:
        remote = [m for m in machines if not is_local_host(split_host_port(m)[0])]
        if remote:
            parser.error("argument --machine_list: %s is not a local address; to run a "
                         "multi-machine job, start one epl-launch per machine with "
                         "--machine_rank" % remote[0])
    return Settings(
        num_workers=ns.num_workers, gpu_per_worker=ns.gpu_per_worker,
        machine_list=machines, machine_rank=ns.machine_rank, log_dir=ns.log_dir,
        task_label=ns.task_label, debug=ns.debug, script=ns.script,
        script_args=tuple(ns.script_args))


# ----------------------------------------------------------------------------
# Pure planning functions
# ----------------------------------------------------------------------------

def build_tf_config(hosts, index):
    """TF_CONFIG JSON for worker `index`: every worker gets the same cluster
    and differs only in its task index, which is how TF's gRPC runtime knows
    which server to start in this process."""
    return json.dumps({"cluster": {"worker": list(hosts)},
                       "task": {"type": "worker", "index": index}}, sort_keys=True)


def worker_command(script, script_args, python):
    """argv for one worker. Always a list, never a shell string, so user
    arguments reach the script byte-for-byte without quoting issues."""
    if script.endswith(".py"):
        return [python, script] + list(script_args)
    return ["bash", script] + list(script_args)


def visible_gpu_ids(gpu_count, cuda_visible_devices):
    """GPU ids this launcher may hand out, as strings.

    `cuda_visible_devices` is the launcher's own CUDA_VISIBLE_DEVICES (None if
    unset). Entries are kept verbatim (they may be UUIDs); like CUDA, parsing
    stops at the first negative entry, so "" or "-1" means no GPUs."""
    if gpu_count <= 0:
        return []
    if cuda_visible_devices is None:
        return [str(i) for i in range(gpu_count)]
    ids = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        ids.append(entry)
    return ids


def device_env(index, gpu_per_worker, gpu_ids):
    """Device variables for the worker occupying local slot `index`.

    With GPUs, slot i gets the contiguous block gpu_ids[i*G:(i+1)*G] so local
    workers never share a GPU. Without GPUs, EPL creates G virtual CPU devices
    from EPL_NUM_VIRTUAL_DEVICES, so the same script runs on a laptop."""
    if not gpu_ids:
        return {"EPL_NUM_VIRTUAL_DEVICES": str(gpu_per_worker)}
    start, stop = index * gpu_per_worker, (index + 1) * gpu_per_worker
    if stop > len(gpu_ids):
        raise LaunchError("local slot %d needs GPUs %d..%d but only %d are available"
                          % (index, start, stop - 1, len(gpu_ids)))
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids[start:stop])}


def check_gpu_capacity(slots, gpu_per_worker, gpu_ids):
    """Fail before starting anything if the local workers need more GPUs than
    are visible; the message names every number so the fix is obvious."""
    if not gpu_ids or not slots:
        return
    needed = (max(slots) + 1) * gpu_per_worker
    if needed > len(gpu_ids):
        raise LaunchError(
            "not enough GPUs: %d worker(s) x %d GPU(s) per worker = %d GPUs needed on this "
            "machine, but only %d are available (ids: %s)"
            % (max(slots) + 1, gpu_per_worker, needed, len(gpu_ids), ",".join(gpu_ids)))


def default_log_dir(settings, now):
    """experiments/<time>_<W>w<G>g_<script>[_<label>]: sortable by time and
    self-describing, so runs can be compared without opening them."""
    name = "%s_%dw%dg_%s" % (now.strftime("%Y%m%d-%H%M%S"), settings.num_workers,
                             settings.gpu_per_worker,
                             os.path.splitext(os.path.basename(settings.script))[0])
    if settings.task_label:
        name += "_" + settings.task_label
    return os.path.join("experiments", name)


def local_workers(settings, hosts):
    """(index, local_slot) for each worker to start on this machine.

    With --machine_rank the slot counts earlier entries on the same host, so
    two ranks sharing a machine still get disjoint GPU blocks."""
    if settings.machine_rank is None:
        return [(i, i) for i in range(len(hosts))]
    rank = settings.machine_rank
    host = split_host_port(hosts[rank])[0]
    slot = sum(1 for h in hosts[:rank] if split_host_port(h)[0] == host)
    return [(rank, slot)]


def plan_workers(settings, hosts, gpu_ids, base_env, python=None):
    """WorkerSpecs for the workers this machine runs; settings.log_dir must be
    resolved. Inherited TF_CONFIG and device variables are replaced so a stale
    value in the user's shell cannot silently change the job."""
    if not settings.log_dir:
        raise ValueError("settings.log_dir must be set before planning")
    if len(hosts) != settings.num_workers:
        raise ValueError("expected %d hosts, got %d" % (settings.num_workers, len(hosts)))
    argv = worker_command(settings.script, settings.script_args, python or sys.executable)
    placement = local_workers(settings, hosts)
    check_gpu_capacity([slot for _, slot in placement], settings.gpu_per_worker, gpu_ids)
    specs = []
    for index, slot in placement:
        env = dict(base_env)
        env.pop("EPL_NUM_VIRTUAL_DEVICES", None)
        env.update(device_env(slot, settings.gpu_per_worker, gpu_ids))
        env["TF_CONFIG"] = build_tf_config(hosts, index)
        env["EPL_LAUNCH_LOG_DIR"] = settings.log_dir
        env["PYTHONUNBUFFERED"] = "1"
        if settings.debug:
            env["EPL_DEBUG"] = "1"
        specs.append(WorkerSpec(
            index=index, argv=list(argv), env=env,
            log_path=os.path.join(settings.log_dir, "worker_%d.log" % index),
            interactive=settings.debug and index == 0))
    return specs


def exit_code_for(returncode):
    """Map a Popen returncode to a shell-style non-zero exit code:
    positive codes pass through, death by signal N becomes 128+N."""
    if returncode > 0:
        return returncode
    if returncode < 0:
        return 128 - returncode
    return 1


# ----------------------------------------------------------------------------
# Environment probes (small and impure on purpose)
# ----------------------------------------------------------------------------

def count_gpus():
    """Number of NVIDIA GPUs via `nvidia-smi -L`, 0 if it is missing or fails.
    Avoids importing TensorFlow, which would take seconds and grab the GPUs."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.decode("utf-8", "replace").splitlines()
               if line.startswith("GPU "))


def pick_free_ports(count, host="127.0.0.1"):
    """`count` distinct free TCP ports. All sockets stay bound until every port
    is read so the kernel cannot hand out the same port twice."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# ----------------------------------------------------------------------------
# Execution and supervision
# ----------------------------------------------------------------------------

class _Worker(object):
    """A started worker: its process, reader thread and recent output."""

    def __init__(self, spec, proc, thread, tail):
        self.spec, self.proc, self.thread, self.tail = spec, proc, thread, tail


def _pump(stream, index, log, out, lock, tail):
    """Copy a worker's output line by line: prefixed to `out`, raw to its log.
    Runs in its own thread so a chatty worker can never block on a full pipe;
    keeps draining even if `out` breaks (e.g. `epl-launch ... | head`)."""
    prefix = "[worker %d] " % index
    with log, stream:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            text = raw.decode("utf-8", "replace")
            if not text.endswith("\n"):
                text += "\n"
            tail.append(text.rstrip("\n"))
            with lock:
                try:
                    out.write(prefix + text)
                    out.flush()
                except (OSError, ValueError):
                    pass


def _start(spec, out, lock):
    """Start one worker in its own session/process group so it can be stopped
    as a unit (with its children) and does not receive the terminal's Ctrl-C.
    The log is opened here, not in the thread, so an unwritable log dir fails
    loudly instead of leaving a worker blocked on an undrained pipe."""
    tail = collections.deque(maxlen=TAIL_LINES)
    if spec.interactive:
        proc = subprocess.Popen(spec.argv, env=spec.env, start_new_session=True)
        return _Worker(spec, proc, None, tail)
    log_dir = os.path.dirname(spec.log_path)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    log = open(spec.log_path, "ab")
    try:
        proc = subprocess.Popen(spec.argv, env=spec.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError:
        log.close()
        raise
    thread = threading.Thread(target=_pump, daemon=True, name="epl-worker-%d" % spec.index,
                              args=(proc.stdout, spec.index, log, out, lock, tail))
    thread.start()
    return _Worker(spec, proc, thread, tail)


def _signal_groups(workers, signum):
    """Signal each worker's process group, even if its leader already exited,
    so orphaned grandchildren die too. Never looks processes up by name."""
    for worker in workers:
        try:
            os.killpg(worker.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(pgid):
    """True while the group has a member that is not a zombie. Zombies are
    ignored because orphaned grandchildren may never be reaped when PID 1 is
    not a real init (common in containers), and waiting on them is pointless."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return True  # no /proc (macOS): trust kill(0)
    for name in names:
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_workers(workers, grace_period, hurry=lambda: False):
    """SIGTERM the process groups, wait up to `grace_period` seconds (less if
    `hurry()` turns true, e.g. a second Ctrl-C), then SIGKILL what is left.

    Workers that already exited 0 are left alone: their pid may be long reaped,
    and signalling a recycled process-group id could hit an unrelated job."""
    for worker in workers:
        worker.proc.poll()
    targets = [w for w in workers if w.proc.returncode != 0]
    _signal_groups(targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_period
    while time.monotonic() < deadline and not hurry():
        for worker in targets:
            worker.proc.poll()  # reap leaders so zombies do not count as alive
        if not any(_group_alive(w.proc.pid) for w in targets):
            break
        time.sleep(0.05)
    _signal_groups(targets, signal.SIGKILL)
    for worker in targets:
        worker.proc.wait()


def _install_handlers(received):
    """Route SIGINT/SIGTERM into `received` (a list) and return the previous
    handlers. Only possible in the main thread; elsewhere we skip it."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, lambda s, _frame: received.append(s))
    return previous


def _supervise(workers, received, poll_interval):
    """Poll until all workers succeed (None), one fails (its _Worker) or the
    launcher gets a signal (the signal number)."""
    while True:
        if received:
            return received[0]
        running = False
        for worker in workers:
            code = worker.proc.poll()
            if code is None:
                running = True
            elif code != 0:
                return worker
        if not running:
            return None
        time.sleep(poll_interval)


def _report_failure(worker, err):
    """Name the failed worker and show its last lines: the root cause is
    usually there, and the other workers' logs only show the teardown."""
    code = exit_code_for(worker.proc.returncode)
    note = ""
    if worker.proc.returncode < 0:
        note = " (killed by %s)" % signal.Signals(-worker.proc.returncode).name
    err.write("%s: worker %d failed with exit code %d%s\n" % (PROG, worker.spec.index, code, note))
    if worker.spec.interactive:
        err.write("(worker %d wrote to the terminal; no log captured)\n" % worker.spec.index)
    else:
        err.write("--- last %d lines of %s ---\n" % (len(worker.tail), worker.spec.log_path))
        for line in worker.tail:
            err.write(line + "\n")
    err.flush()
    return code


def execute(worker_specs, grace_period=DEFAULT_GRACE_PERIOD, poll_interval=POLL_INTERVAL,
            stdout=None, stderr=None):
    """Start all workers, stream their output and supervise them.

    Returns 0 if every worker exits 0; the failed worker's code (128+N if killed
    by signal N) after stopping the rest if any fails; 130/143 after stopping
    everyone on SIGINT/SIGTERM. A partially failed job is always torn down,
    because TF workers would otherwise block forever waiting for the lost peer."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    lock, received, workers = threading.Lock(), [], []
    previous = _install_handlers(received)
    try:
        try:
            for spec in worker_specs:
                workers.append(_start(spec, out, lock))
        except OSError as exc:
            err.write("%s: cannot start worker %d: %s\n" % (PROG, spec.index, exc))
            stop_workers(workers, grace_period)
            return 127
        outcome = _supervise(workers, received, poll_interval)
        if outcome is None:
            code = 0
        elif isinstance(outcome, _Worker):
            stop_workers(workers, grace_period, hurry=lambda: bool(received))
            code = None
        else:
            err.write("%s: received %s, stopping workers\n"
                      % (PROG, signal.Signals(outcome).name))
            err.flush()
            stop_workers(workers, grace_period, hurry=lambda: len(received) > 1)
            code = 128 + outcome
        for worker in workers:
            if worker.thread is not None:
                worker.thread.join(timeout=5.0)
        return _report_failure(outcome, err) if code is None else code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# ----------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------

def _describe(settings, specs, gpu_ids):
    """One-line job summary, so the device kind (GPU vs virtual CPU) that was
    auto-detected is never a surprise."""
    kind = "GPU" if gpu_ids else "virtual CPU"
    indices = ",".join(str(s.index) for s in specs)
    return ("%s: %d worker(s) x %d %s device(s) per worker; running worker(s) %s here; "
            "logs in %s%s" % (PROG, settings.num_workers, settings.gpu_per_worker, kind,
                              indices, settings.log_dir, " [debug]" if settings.debug else ""))


def main(argv=None, detect_gpus=count_gpus):
    """Parse, plan, print a one-line summary and run. `detect_gpus` is
    injectable so tests can pretend to have GPUs (or none)."""
    settings = parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isfile(settings.script):
        sys.stderr.write("%s: error: script not found: %s\n" % (PROG, settings.script))
        return 2
    if settings.log_dir is None:
        settings = settings._replace(log_dir=default_log_dir(settings, datetime.datetime.now()))
    if settings.machine_list is not None:
        hosts = list(settings.machine_list)
    else:
        hosts = ["127.0.0.1:%d" % port for port in pick_free_ports(settings.num_workers)]
    gpu_ids = visible_gpu_ids(detect_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    try:
        specs = plan_workers(settings, hosts, gpu_ids, os.environ)
    except LaunchError as exc:
        sys.stderr.write("%s: error: %s\n" % (PROG, exc))
        return 2
    os.makedirs(settings.log_dir, exist_ok=True)
    print(_describe(settings, specs, gpu_ids), flush=True)
    return execute(specs)


if __name__ == "__main__":
    sys.exit(main())
