"""epl-launch: start a multi-worker TensorFlow job, one process per worker.

Usage: ``epl-launch --num_workers W --gpu_per_worker G [options] script [args...]``
(or ``python -m epl.launcher ...``). See docs/launcher.md.

Design: everything that decides *what* to run is a pure function returning
plain data, so it can be unit-tested without starting processes; only
`execute` touches processes. By concern:

* settings.py   command line -> Settings (validation, `--debug [BOOL]`)
* plan.py       Settings -> WorkerSpecs (TF_CONFIG, devices, commands, env)
* console.py    worker output -> terminal and logs, lines never interleaved
* failure.py    a failed worker's error and last lines, for the failure summary
* supervisor.py execute(): start, stream, supervise, tear down (one attempt)
* restart.py    --max_restarts: after a failed attempt, restart or give up (pure)
* relaunch.py   execute_with_restarts(): attempts until success or the policy gives up
* cli.py        main(): the few impure inputs (ports, GPUs, clock) + execute

The package deliberately imports no TensorFlow: the launcher must start instantly
and run on hosts without TF. Of the rest of epl it reads only the snapshot
directory's layout (epl.session.snapshot_store, plain files) to see a restarted
job's progress.
"""
from epl.launcher.cli import count_gpus, main
from epl.launcher.plan import (LaunchError, WorkerSpec, build_tf_config, check_gpu_capacity,
                               default_log_dir, device_env, exit_code_for, is_shell_script,
                               local_workers, plan_workers, snapshot_dir, task_dir,
                               visible_gpu_ids, worker_command, worker_env)
from epl.launcher.ports import pick_free_ports
from epl.launcher.relaunch import execute_with_restarts
from epl.launcher.restart import FAULT_EXIT_CODE, RETRYABLE, decide, is_retryable
from epl.launcher.settings import (PROG, Settings, explicit_debug_value, is_local_host,
                                   parse_args, split_host_port)
from epl.launcher.supervisor import DEFAULT_GRACE_PERIOD, execute, stop_workers

__all__ = [
    "DEFAULT_GRACE_PERIOD", "FAULT_EXIT_CODE", "LaunchError", "PROG", "RETRYABLE", "Settings",
    "WorkerSpec", "build_tf_config", "check_gpu_capacity", "count_gpus", "decide",
    "default_log_dir", "device_env", "execute", "execute_with_restarts", "exit_code_for",
    "explicit_debug_value", "is_local_host", "is_retryable", "is_shell_script",
    "local_workers", "main", "parse_args", "pick_free_ports", "plan_workers",
    "snapshot_dir", "split_host_port", "stop_workers", "task_dir", "visible_gpu_ids",
    "worker_command", "worker_env",
]
