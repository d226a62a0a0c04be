"""Pure planning: Settings + hosts + GPUs + environment -> one WorkerSpec per worker.

Nothing here starts a process or reads the machine; the impure inputs (free
ports, GPU count, the launcher's environment, the current time) are arguments,
so every decision can be unit-tested on a simulated cluster.
"""
import collections
import json
import os
import shlex
import sys

from epl.launcher.settings import split_host_port

WorkerSpec = collections.namedtuple(
    "WorkerSpec", ["index", "argv", "env", "log_path", "interactive", "task_dir"],
    defaults=(False, None))
WorkerSpec.__doc__ = """Everything needed to start one worker. `interactive` (debug
mode, worker 0) means the worker reads the launcher's stdin and its output is
shown unprefixed as it arrives, so pdb works; it is still logged. `task_dir` is
the worker's own directory (created before it starts)."""


class LaunchError(Exception):
    """A problem with the requested job that is only detectable after parsing
    (e.g. not enough GPUs); main() turns it into a message and exit code 2."""


def build_tf_config(hosts, index):
    """TF_CONFIG JSON for worker `index`: every worker gets the same cluster
    and differs only in its task index, which is how TF's gRPC runtime knows
    which server to start in this process."""
    return json.dumps({"cluster": {"worker": list(hosts)},
                       "task": {"type": "worker", "index": index}}, sort_keys=True)


def is_shell_script(script):
    """Anything that is not a .py file runs with bash (the original's rule)."""
    return not script.endswith(".py")


def task_dir(log_dir, index):
    """Worker `index`'s own directory, `<log_dir>/<index>`, as in the original EPL.

    Scripts written for the original write their outputs there (model-zoo BERT:
    `output_dir=$1`, then `train.tf_record`, `predictions.json`, checkpoints),
    so each worker needs its own: a shared one made workers race on the same
    files. Only worker 0 writes checkpoints, and EPL restores the other workers
    from worker 0's (they need no checkpoint of their own)."""
    return os.path.join(log_dir, str(index))


# `python` and `python3` in the shell scripts the launcher starts: its own Python.
PYTHON_NAMES = ("python", "python3")


def python_dir(log_dir):
    """``<log_dir>/bin``: the launcher's ``python`` for the shell scripts it starts."""
    return os.path.join(log_dir, "bin")


def python_shim(python):
    """The text of ``python`` in :func:`python_dir`: a shell script that runs the
    launcher's own interpreter by the path it was started with. A symlink would not
    do: Python finds its virtualenv next to the path it is started from (pyvenv.cfg),
    so a link to a venv's python elsewhere starts the base installation, without
    the venv's TensorFlow."""
    return ("#!/bin/sh\n# epl-launch: `python` in the shell scripts it starts is its own "
            "Python\nexec %s \"$@\"\n" % shlex.quote(python))


def worker_command(script, script_args, python, task_dir=None):
    """argv for one worker. Always a list, never a shell string, so user
    arguments reach the script byte-for-byte without quoting issues.

    A shell script gets `task_dir` (when given: the worker's own directory,
    see :func:`task_dir`) as its first argument, before the user's arguments:
    model-zoo scripts written for the original EPL read `output_dir=$1`. A .py
    script never gets it, because an unexpected positional breaks argparse
    scripts (a known defect of the original); it reads EPL_TASK_DIR instead."""
    if not is_shell_script(script):
        return [python, script] + list(script_args)
    leading = [task_dir] if task_dir is not None else []
    return ["bash", script] + leading + list(script_args)


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


def snapshot_dir(log_dir):
    """Where a launched job's workers write EPL's snapshots unless the user chose a
    place (EPL_CHECKPOINT_SNAPSHOT_DIR): the job's log directory, which a restart (by
    --max_restarts, or the same command with the same --log_dir) reads again."""
    return os.path.join(log_dir, "epl_snapshots")


def worker_env(settings, hosts, index, slot, gpu_ids, base_env):
    """The environment of worker `index`. Inherited TF_CONFIG and device
    variables are replaced so a stale value in the user's shell cannot silently
    change the job. EPL_TASK_DIR is the original EPL's task_dir, the worker's
    own `<log_dir>/<index>` (:func:`task_dir`), so .py scripts need no extra
    argument; EPL_LAUNCH_LOG_DIR is the job's log directory; EPL_RESTART_COUNT
    counts the job's restarts (0 here, see epl.launcher.relaunch). A shell script finds
    the launcher's Python first on PATH (:func:`python_dir`), as a .py script runs
    with it, whatever the caller's PATH or activated virtualenv."""
    env = dict(base_env)
    env.pop("EPL_NUM_VIRTUAL_DEVICES", None)
    env.update(device_env(slot, settings.gpu_per_worker, gpu_ids))
    env["TF_CONFIG"] = build_tf_config(hosts, index)
    env["EPL_LAUNCH_LOG_DIR"] = settings.log_dir
    env["EPL_TASK_DIR"] = task_dir(settings.log_dir, index)
    env["PYTHONUNBUFFERED"] = "1"
    if is_shell_script(settings.script):
        path = env.get("PATH")
        env["PATH"] = python_dir(settings.log_dir) + (os.pathsep + path if path else "")
    env["EPL_RESTART_COUNT"] = "0"
    env.setdefault("EPL_CHECKPOINT_SNAPSHOT_DIR", snapshot_dir(settings.log_dir))
    if settings.debug:
        env["EPL_DEBUG"] = "1"
    return env


def plan_workers(settings, hosts, gpu_ids, base_env, python=None):
    """WorkerSpecs for the workers this machine runs; settings.log_dir must be
    resolved (main() makes it absolute, so a script that changes directory
    still finds its task directory)."""
    if not settings.log_dir:
        raise ValueError("settings.log_dir must be set before planning")
    if len(hosts) != settings.num_workers:
        raise ValueError("expected %d hosts, got %d" % (settings.num_workers, len(hosts)))
    placement = local_workers(settings, hosts)
    check_gpu_capacity([slot for _, slot in placement], settings.gpu_per_worker, gpu_ids)
    return [WorkerSpec(index=index,
                       argv=worker_command(settings.script, settings.script_args,
                                           python or sys.executable,
                                           task_dir=task_dir(settings.log_dir, index)),
                       env=worker_env(settings, hosts, index, slot, gpu_ids, base_env),
                       log_path=os.path.join(settings.log_dir, "worker_%d.log" % index),
                       interactive=settings.debug and index == 0,
                       task_dir=task_dir(settings.log_dir, index))
            for index, slot in placement]


def exit_code_for(returncode):
    """Map a Popen returncode to a shell-style non-zero exit code:
    positive codes pass through, death by signal N becomes 128+N."""
    if returncode > 0:
        return returncode
    if returncode < 0:
        return 128 - returncode
    return 1
