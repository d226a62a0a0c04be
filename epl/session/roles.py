"""Which worker does what at the session boundary.

Only worker 0 writes checkpoints and summaries (every worker holds the same
weights, and several writers would race on one path). Every worker's
MonitoredTrainingSession is a chief for initialization (each initializes its
own variables before EPL's broadcast), but the chief-only duties (saving,
summaries, step-count logs, chief-only hooks) stay on worker 0.
"""
CHIEF_ONLY_ARGS = ("save_checkpoint_secs", "save_checkpoint_steps", "save_summaries_steps",
                   "save_summaries_secs", "chief_only_hooks")


def writes_checkpoints(cluster):
    """True on the one worker that saves checkpoints (worker 0)."""
    return cluster.worker_index == 0


def monitored_session_arguments(cluster, arguments):
    """Adjust the bound arguments of ``MonitoredTrainingSession`` for this worker."""
    arguments["is_chief"] = True  # each worker initializes its own variables
    if not writes_checkpoints(cluster):
        for name in CHIEF_ONLY_ARGS:
            arguments[name] = None
        arguments["log_step_count_steps"] = 0
    return arguments
