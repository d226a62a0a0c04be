"""``tf.estimator`` under EPL: which graphs are parallel, who evaluates, who saves.

* **The cluster is EPL's.** RunConfig parses TF_CONFIG without its ``cluster``
  and ``task`` (EPL's own cluster came from them at ``epl.init``), so every
  worker's Estimator is a local, chief, non-distributed one: no ``chief`` job
  is needed (epl-launch writes worker-only TF_CONFIGs), the Estimator starts no
  server of its own and ``train_and_evaluate`` takes its local path. EPL gives
  the sessions its server and parallelizes the training graph across workers.
* **Only TRAIN graphs are parallelized.** ``Estimator._call_model_fn`` records
  the mode of each graph; evaluation and prediction graphs run unchanged, one
  copy, on the worker that builds them.
* **Worker 0 writes** checkpoints and summaries (eval summaries too), so in
  ``train_and_evaluate`` worker 0 evaluates at its checkpoints and the others
  only train. Any worker may call ``evaluate``/``predict``: they restore the
  latest checkpoint in ``model_dir``. So that it is the final one, ``train``
  on the other workers returns only once worker 0's checkpoint of the last
  step is in ``model_dir`` (a shared directory, as TF's own distributed
  Estimator assumes).
* **An evaluator task evaluates.** A TF_CONFIG task of type ``evaluator`` (Kubeflow
  TFJob's layout for ``train_and_evaluate``) is not part of the training cluster:
  EPL gives it one local worker, and its RunConfig sees the evaluator task, so
  ``train_and_evaluate`` there evaluates each new checkpoint in ``model_dir``
  until the last. With a ``chief`` job in TF_CONFIG, the training tasks keep
  TensorFlow's distributed roles: ``train_and_evaluate`` on the chief only trains,
  as TensorFlow's ``run_chief`` does (the evaluator task evaluates); a ``master``
  trains and evaluates (``run_master``), as worker 0 of an epl-launch job does.
* **Foreign distribution.** A ``train_distribute``/``eval_distribute`` strategy
  is refused on several workers (each worker would train its own model); on
  one worker EPL stands aside (see :mod:`epl.parallel.step_check`).
"""
import functools
import inspect
import logging
import time
import weakref

from epl import tf_adapter
from epl.cluster import tf_config as tf_config_spec
from epl.protocols.hooks import Patch
from epl.session import roles

LOG = logging.getLogger("epl")
TRAIN = "train"
_MODES = weakref.WeakKeyDictionary()   # tf.Graph -> the Estimator mode it was built for
_HIDDEN_KEYS = ("cluster", "task")
_STRATEGY_ARGS = ("train_distribute", "eval_distribute", "experimental_distribute")


def mode_of(tf_graph):
    """The ``tf.estimator.ModeKeys`` value ``tf_graph`` was built for, or None
    (not built by an Estimator)."""
    return _MODES.get(tf_graph)


def is_training_graph(tf_graph):
    """False only for graphs an Estimator built to evaluate or predict."""
    mode = mode_of(tf_graph)
    return mode is None or mode == TRAIN


def _wrap_call_model_fn(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _call_model_fn(self, *args, **kwargs):
        mode = signature.bind(self, *args, **kwargs).arguments.get("mode")
        if mode is not None:
            _MODES[tf_adapter.get_default_graph()] = str(mode)
        return original(self, *args, **kwargs)
    return _call_model_fn


def _wrap_cluster_setting(original, provider):
    @functools.wraps(original)
    def init_distributed_setting(self, tf_config):
        tf_config = dict(tf_config or {})
        if provider().cluster.task_type == tf_config_spec.EVALUATOR and tf_config:
            return original(self, tf_config_spec.evaluator_view(tf_config))
        if any(key in tf_config for key in _HIDDEN_KEYS):
            LOG.debug("EPL: the Estimator sees a local job; EPL runs the TF_CONFIG cluster")
        return original(self, dict((k, v) for k, v in tf_config.items()
                                   if k not in _HIDDEN_KEYS))
    return init_distributed_setting


def _wrap_run_local(original, provider):
    """On a chief (a TF_CONFIG with a ``chief`` job), train_and_evaluate only trains:
    TensorFlow's chief leaves evaluation to the evaluator task."""
    @functools.wraps(original)
    def run_local(self):
        if provider().cluster.task_type != tf_config_spec.CHIEF:
            return original(self)
        estimator, spec, hooks = tf_adapter.train_and_evaluate_parts(self)
        LOG.info("EPL: train_and_evaluate on the chief trains only; TF_CONFIG's evaluator "
                 "task evaluates the checkpoints (TensorFlow's distributed roles)")
        estimator.train(input_fn=spec.input_fn, max_steps=spec.max_steps,
                        hooks=list(spec.hooks) + hooks)
        return None, []
    return run_local


def _wrap_run_config_init(original, provider):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        given = [name for name in _STRATEGY_ARGS if arguments.get(name) is not None]
        workers = provider().cluster.worker_num
        if given and workers > 1:
            raise ValueError(
                "RunConfig(%s=...) cannot be used with EPL on %d workers: a tf.distribute "
                "strategy only sees this worker's devices, so every worker would train its "
                "own model. Remove it; EPL parallelizes the Estimator's training graph "
                "itself (epl.replicate gives data parallelism across all workers)."
                % (given[0], workers))
        original(self, *args, **kwargs)
    return __init__


class ChiefCheckpointWait(tf_adapter.tf.train.SessionRunHook):
    """On workers other than 0: at the end of training, wait until worker 0's
    checkpoint of the last step is in ``model_dir``, so that an ``evaluate`` or
    ``predict`` (or the next ``train``) on this worker restores the final weights.

    Only when ``model_dir`` is shared with worker 0: worker 0 saves a checkpoint
    when its session starts, before the first step, so a ``model_dir`` without
    any checkpoint at the end of training is this worker's own (``epl-launch``
    gives each worker its own task directory, as the original EPL did), and
    there is nothing to wait for."""

    def __init__(self, model_dir, timeout):
        self._model_dir = model_dir
        self._timeout = timeout
        self._step = None

    def begin(self):
        self._step = tf_adapter.tf.train.get_global_step()

    def end(self, session):
        if self._step is None:
            return
        if checkpoint_step(self._model_dir) < 0:
            LOG.info("EPL: %s holds no checkpoint of worker 0 (a directory of this worker "
                     "only); not waiting for worker 0's last checkpoint", self._model_dir)
            return
        wait_for_checkpoint(self._model_dir, int(session.run(self._step)), self._timeout)


def checkpoint_step(model_dir):
    """Global step of the latest checkpoint in ``model_dir`` (-1 if none)."""
    state = tf_adapter.tf.train.get_checkpoint_state(model_dir)
    if state is None or not state.model_checkpoint_path:
        return -1
    suffix = state.model_checkpoint_path.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def wait_for_checkpoint(model_dir, step, timeout, poll=0.1):
    """Wait until ``model_dir`` holds a checkpoint of ``step`` or later; warn after
    ``timeout`` seconds. Returns True if it appeared."""
    deadline = time.time() + timeout
    while checkpoint_step(model_dir) < step:
        if time.time() > deadline:
            LOG.warning(
                "EPL: worker 0's checkpoint of step %d did not appear in %s within %s s. "
                "Is model_dir on a filesystem every worker shares? Evaluation and "
                "prediction on this worker restore the latest checkpoint there.",
                step, model_dir, timeout)
            return False
        time.sleep(poll)
    return True


def _wrap_train(original, provider):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def train(self, *args, **kwargs):
        env = provider()
        config = tf_adapter.estimator_run_config(self)
        if roles.writes_checkpoints(env.cluster) or not (
                config.save_checkpoints_steps or config.save_checkpoints_secs):
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        hooks = list(bound.arguments.get("hooks") or [])
        hooks.append(ChiefCheckpointWait(self.model_dir, env.config.communication.timeout))
        bound.arguments["hooks"] = hooks
        return original(*bound.args, **bound.kwargs)
    return train


def _wrap_eval_summary(original, provider):
    @functools.wraps(original)
    def write_summary(*args, **kwargs):
        if not roles.writes_checkpoints(provider().cluster):
            return None
        return original(*args, **kwargs)
    return write_summary


def patches(provider):
    """The Estimator and RunConfig patches (none if TF has no tf.estimator)."""
    if tf_adapter.ESTIMATOR_TRAIN is None:  # pragma: no cover
        return []
    bind = lambda make: (lambda original: make(original, provider))
    result = [
        Patch("estimator", tf_adapter.ESTIMATOR_CALL_MODEL_FN, _wrap_call_model_fn),
        Patch("estimator", tf_adapter.ESTIMATOR_TRAIN, bind(_wrap_train)),
        Patch("estimator", tf_adapter.RUN_CONFIG_INIT, bind(_wrap_run_config_init)),
        Patch("estimator", tf_adapter.RUN_CONFIG_CLUSTER, bind(_wrap_cluster_setting)),
        Patch("estimator", tf_adapter.TRAINING_EXECUTOR_RUN_LOCAL, bind(_wrap_run_local)),
    ]
    for target in tf_adapter.ESTIMATOR_EVAL_SUMMARIES:
        result.append(Patch("estimator", target, bind(_wrap_eval_summary)))
    return result
