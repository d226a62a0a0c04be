"""main(): the epl-launch command. Glues the pure parts to the few impure
inputs (free ports, GPU count, clock, environment) and calls execute()."""
import datetime
import os
import shutil
import subprocess
import sys

from epl.launcher.plan import (PYTHON_NAMES, LaunchError, default_log_dir, is_shell_script,
                               plan_workers, python_dir, python_shim, visible_gpu_ids)
from epl.launcher.ports import pick_free_ports
from epl.launcher.relaunch import execute_with_restarts
from epl.launcher.settings import PROG, parse_args
from epl.launcher.supervisor import execute


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


def _describe(settings, specs, gpu_ids):
    """One-line job summary, so the device kind (GPU vs virtual CPU) that was
    auto-detected is never a surprise."""
    kind = "GPU" if gpu_ids else "virtual CPU"
    indices = ",".join(str(s.index) for s in specs)
    return ("%s: %d worker(s) x %d %s device(s) per worker; running worker(s) %s here; "
            "logs in %s%s%s" % (PROG, settings.num_workers, settings.gpu_per_worker, kind,
                                indices, settings.log_dir,
                                "; up to %d restart(s)" % settings.max_restarts
                                if settings.max_restarts else "",
                                " [debug]" if settings.debug else ""))


def _resolve_log_dir(settings):
    """Fill in the default log directory and make it absolute: it is the task
    directory workers receive, and a script that changes directory must still
    find it."""
    log_dir = settings.log_dir or default_log_dir(settings, datetime.datetime.now())
    return settings._replace(log_dir=os.path.abspath(log_dir))


def write_python_shims(log_dir, python=sys.executable):
    """``<log_dir>/bin/python`` and ``python3`` running ``python`` (plan.python_shim), for
    the shell scripts the launcher starts (their PATH begins with that directory)."""
    directory = python_dir(log_dir)
    os.makedirs(directory, exist_ok=True)
    for name in PYTHON_NAMES:
        path = os.path.join(directory, name)
        with open(path, "w") as shim:
            shim.write(python_shim(python))
        os.chmod(path, 0o755)


CHECK_BUILD = ("--check-build", "--check_build")


def check_build():
    """`epl-launch --check-build`: run `python -m epl.check_build` with this launcher's
    Python (the one workers get) in a child, so the launcher itself never imports TF."""
    return subprocess.call([sys.executable, "-m", "epl.check_build"])


def main(argv=None, detect_gpus=count_gpus):
    """Parse, plan, print a one-line summary and run. `detect_gpus` is
    injectable so tests can pretend to have GPUs (or none)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in CHECK_BUILD:
        return check_build()
    settings = parse_args(argv)
    if not os.path.isfile(settings.script):
        sys.stderr.write("%s: error: script not found: %s\n" % (PROG, settings.script))
        return 2
    settings = _resolve_log_dir(settings)
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
    if is_shell_script(settings.script):
        write_python_shims(settings.log_dir)
    print(_describe(settings, specs, gpu_ids), flush=True)
    if settings.max_restarts:
        return execute_with_restarts(specs, settings.max_restarts)
    return execute(specs)
