"""The process-level context behind ``epl.Env.get()``: config, cluster, server.

There is one Env object per process, and ``epl.init`` resets it in place, so a
reference taken with ``epl.Env.get()`` before ``epl.init`` sees the new config.
A thread other than the main thread that calls ``epl.init`` while the process
Env is in use gets an Env of its own (in-process multi-worker tests run one
worker per thread, each with its own cluster view); threads that never called
``epl.init`` see the process Env. Lower layers never read the Env: the hooks
resolve it once at the TF boundary and pass config and cluster down explicitly.
"""
import contextlib
import logging
import threading

from epl import tf_adapter
from epl import cluster as _cluster_module
from epl.availability import check_available
from epl.cluster import Cluster, cpu_allocator
from epl.config import Config
from epl.ir.graph import Graph
from epl.session import snapshot_store
from epl.session.resume import Snapshots
from epl.strategies.context import get_context, reset_context

LOG = logging.getLogger("epl")


class Env(object):
    """Configuration, cluster and TF server of one EPL job (seed API).

    Example::

        env = epl.Env.get()
        env.cluster.worker_index, env.config.pipeline.num_micro_batch
    """

    _local = threading.local()
    _process = None
    _process_claimed = False
    _lock = threading.Lock()

    def __init__(self, config=None, cluster=None):
        self._config = config
        self._cluster = cluster
        self.server = None
        self.initialized = False
        self._cluster_scopes = []   # (entered cluster, previous cluster, previous server)
        self.snapshots = Snapshots()  # the resume and snapshots of this epl.init

    # ---- lookup --------------------------------------------------------------
    @classmethod
    def get(cls):
        """The current Env: this thread's, else the process Env (created on demand)."""
        env = getattr(cls._local, "env", None)
        if env is not None:
            return env
        with cls._lock:
            if cls._process is None:
                cls._process = Env()
            return cls._process

    @classmethod
    def _thread_env(cls):
        """The Env this thread initializes: bound on first use, then kept.

        The main thread, and the first thread to claim it, use the process Env;
        other threads get their own.
        """
        env = getattr(cls._local, "env", None)
        if env is not None:
            return env
        with cls._lock:
            if cls._process is None:
                cls._process = Env()
            main = threading.current_thread() is threading.main_thread()
            if main or not cls._process_claimed:
                cls._process_claimed = True
                env = cls._process
            else:
                env = Env()
        cls._local.env = env
        return env

    # ---- state ----------------------------------------------------------------
    @property
    def config(self):
        """The epl.Config of this job (defaults and EPL_* variables before epl.init)."""
        if self._config is None:
            self._config = Config()
        return self._config

    @config.setter
    def config(self, value):
        self._config = value

    @property
    def cluster(self):
        """The :class:`epl.Cluster` of this worker (discovered on first use)."""
        if self._cluster is None:
            self._cluster = Cluster.from_environment(self.config)
        return self._cluster

    @cluster.setter
    def cluster(self, value):
        self._set_cluster(value)

    def _set_cluster(self, cluster):
        if self.server is not None and cluster != self._cluster:
            self.server = None   # a server serves one cluster spec
        self._cluster = cluster

    @property
    def strategy_context(self):
        """This thread's strategy scopes: ``.current`` segment and ``.default``."""
        return get_context()

    @property
    def default_graph(self):
        """The EPL view (:class:`epl.Graph`) of the current default tf.Graph."""
        return Graph.get()

    def _reset(self, config, cluster):
        """Start over in place (``epl.init``); the server survives an unchanged cluster."""
        self._config = config
        self._set_cluster(cluster)
        self.initialized = True
        self.snapshots = Snapshots()

    def _clear(self):
        """Back to the state before any ``epl.init`` (``epl.reset``)."""
        self._config = None
        self._cluster = None
        self.server = None
        self.initialized = False
        self._cluster_scopes = []
        self.snapshots = Snapshots()

    def get_config_proto(self, base=None):
        """The ConfigProto EPL gives sessions and servers of this worker."""
        from epl.cluster.session_config import session_config
        return session_config(self.cluster, base,
                              place_pruned=self.config.cluster.place_pruned_graph)

    def get_or_create_server(self, config=None):
        """This worker's ``tf.train.Server`` (multi-worker jobs), created once.

        ``config`` is the ConfigProto of the session that needs the server
        first: a server's thread pools are fixed at creation, so a user's
        thread limits must reach it then.
        """
        if self.server is None:
            from epl.cluster.session_config import session_config
            tf = tf_adapter.tf
            spec = tf.train.ClusterSpec(self.cluster.cluster_spec())
            server = tf.train.Server(spec, job_name="worker",
                                     task_index=self.cluster.worker_index,
                                     config=session_config(
                                         self.cluster, config,
                                         place_pruned=self.config.cluster.place_pruned_graph),
                                     start=True)
            self.server = server
        return self.server

    def graph(self, tf_graph=None):
        """EPL view of ``tf_graph`` (default graph), owned by this Env."""
        view = Graph.get(tf_graph)
        if view.owner is None:
            view.owner = self
        return view

    def __repr__(self):
        return "Env(%r, config with %d keys%s)" % (
            self.cluster, len(self.config.to_dict()),
            "" if self.initialized else ", before epl.init")


# ---- what lower layers ask the API layer (injected, so they import nothing above) -----
class _Introspection(object):
    """Plans for read-only views: ``epl.Graph`` / TaskGraph / cluster introspection."""

    @staticmethod
    def env_of(view):
        return view.owner or Env.get()

    @staticmethod
    def initialized():
        """Has this thread's Env (else the process Env) been through ``epl.init``?
        Strategy scopes refuse to open before it (epl.strategies.base.require_init)."""
        return Env.get().initialized

    def config_and_cluster(self, view):
        env = self.env_of(view)
        return env.config, env.cluster

    def plan(self, view, taskgraphs, cluster=None):
        """make_plan of ``taskgraphs`` on the view's Env (cached per TaskGraph specs,
        config and cluster)."""
        from epl.parallel.plan import make_plan, specs_from_graph
        specs = specs_from_graph(_TaskGraphs(taskgraphs))
        env = self.env_of(view)
        cluster = cluster if cluster is not None else env.cluster
        key = (tuple(specs), tuple(sorted(env.config.to_dict().items())), cluster)
        cached = view.plan_cache
        if cached is None or cached[0] != key:
            cached = view.plan_cache = (key, make_plan(env.config, cluster, specs))
        return cached[1]


class _TaskGraphs(object):
    """Something with ``.taskgraphs``, for ``specs_from_graph``."""

    def __init__(self, taskgraphs):
        self.taskgraphs = taskgraphs


def _virtual_devices(cluster):
    """``cluster.virtual_devices``: the plan's devices of each TaskGraph of the model."""
    view = Graph.get(create=False)
    return [] if view is None else view.virtual_devices(cluster)


def _enter_cluster(cluster):
    env = Env._thread_env()
    env._cluster_scopes.append((cluster, env._cluster, env.server))
    env._set_cluster(cluster)


def _exit_cluster(cluster):
    env = Env._thread_env()
    for position in range(len(env._cluster_scopes) - 1, -1, -1):
        entered, previous, server = env._cluster_scopes[position]
        if entered is cluster:
            del env._cluster_scopes[position]
            env._cluster, env.server = previous, server
            return


def _run_visible_devices():
    """``cluster.run_visible_devices`` of the current config (a bare ``epl.Cluster()``)."""
    return Env.get().config.cluster.run_visible_devices


_cluster_module._ENV_HOOKS[:] = [_enter_cluster, _exit_cluster, _virtual_devices,
                                 _run_visible_devices]
Graph.introspection = _Introspection()

_HOOKS = []


def _hooks():
    """The process's HookRegistry, built once, bound to ``Env.get``."""
    if not _HOOKS:
        from epl.parallel.registry import build_registry
        _HOOKS.append(build_registry(Env.get))
    return _HOOKS[0]


def _prefer_bfc(cluster):
    """TF's BFC allocator for a CPU job's tensors unless the user chose one
    (:mod:`epl.cluster.cpu_allocator` says why); said once, when it is set."""
    settings = cpu_allocator.prefer_bfc(cluster.device_type)
    if settings:
        LOG.info("EPL: TensorFlow's BFC allocator for CPU tensors (%s; TensorFlow reads it at "
                 "the process's first session); set %s=0 before epl.init to keep "
                 "TensorFlow's default (malloc)",
                 ", ".join("%s=%s" % item for item in sorted(settings.items())),
                 cpu_allocator.BFC_VARIABLE)


def _check_snapshot_dir(config):
    """A snapshot directory that cannot be written is an error at start, naming it."""
    section = config.checkpoint
    if section.snapshot_steps and section.snapshot_dir:
        snapshot_store.check_writable(section.snapshot_dir)


def init(config=None, cluster=None):
    """Start EPL: validate config, discover the cluster, install TF hooks.

    A second call starts over in place (the same ``epl.Env`` object): new
    config, no TaskGraphs, no scopes. Ops that EPL has not recorded (a dataset
    built before ``epl.init``) are kept: they belong to no TaskGraph yet and
    join the first TaskGraph created, like ops outside every scope. A default
    graph holding a model built under a previous ``epl.init`` is replaced by a
    fresh one (inside ``with graph.as_default()``, only its EPL state is cleared).
    ``cluster`` is for tests that simulate several workers in one process;
    inside ``with epl.Cluster(...)`` that cluster is used.
    """
    if tf_adapter.executing_eagerly():
        raise RuntimeError(
            "epl.init() needs TensorFlow graph mode, but eager execution is enabled (the "
            "default of TensorFlow 2.x). Call tf.compat.v1.disable_v2_behavior() (TF1 "
            "behaviour: graph mode, TF1 control flow and variables; what tf_upgrade_v2's "
            "`import tensorflow.compat.v1 as tf; tf.disable_v2_behavior()` does) or at "
            "least tf.compat.v1.disable_eager_execution() at the start of the program, "
            "before epl.init() (docs/tf2.md).")
    if config is None:
        config = Config()
    elif isinstance(config, dict):
        config = Config(config)
    elif not isinstance(config, Config):
        raise TypeError("epl.init(config=...) expects an epl.Config or a dict, got %s"
                        % type(config).__name__)
    check_available(config)
    _check_snapshot_dir(config)
    env = Env._thread_env()
    if cluster is None and env._cluster_scopes:
        cluster = env._cluster_scopes[-1][0]
    if cluster is None:
        previous = env._cluster.discovery if env._cluster is not None else None
        cluster = Cluster.from_environment(config, previous=previous)
    # Imported here, like the hooks: `import epl.env` stays light for the launcher's tools.
    from epl.parallel import preflight
    preflight.check(config, cluster)
    _prefer_bfc(cluster)
    reset_context()
    _start_graph_over()
    env._reset(config, cluster)
    _hooks().install()
    # Register EPL's kernels in every process: a serving worker runs ops (ring
    # collectives, fused buffers) that another worker's graph placed on it.
    from epl.communicators import library
    library.load()
    LOG.info("EPL initialized: %r; cluster from %s", cluster, cluster.discovery.detail)
    return env


def estimate_memory(graph=None, batch_size=None, config=None, cluster=None):
    """Expected bytes per device of the training step built in ``graph`` (default: the
    default graph) under EPL's plan, with every saver of ``config`` (default: the
    ``epl.init`` one) applied. Call it after building the step, before running it::

        est = epl.estimate_memory()
        print(est)                       # one row per device
        est.devices[device].total        # bytes; est.to_dict() for JSON

    ``batch_size`` fills unknown batch dimensions of placeholders and iterators.
    The arithmetic is :mod:`epl.profiler.memory_estimate` (docs/memory.md)."""
    from epl.profiler import memory_estimate
    tf_graph = graph if graph is not None else tf_adapter.tf.get_default_graph()
    view = Graph.get(tf_graph, create=False)
    if config is None:
        config = (view.owner if view is not None and view.owner else Env.get()).config
    return memory_estimate.estimate_graph(view, config, cluster, batch_size)


def _start_graph_over():
    """Forget the default graph's EPL state; replace the graph if a previous epl.init
    built a model in it (its records are gone, so it could not be parallelized)."""
    view = Graph.get(create=False)
    if view is not None and view.recorded_ops and not tf_adapter.graph_is_nested():
        LOG.info("EPL: epl.init() starts a new default graph; the current one holds a "
                 "model built under a previous epl.init()")
        tf_adapter.tf.reset_default_graph()
    Graph.forget()


@contextlib.contextmanager
def paused():
    """Build and run plain TensorFlow while EPL is initialized.

    Inside the block EPL's hooks are removed: new graphs are not recorded, tf
    sessions are not parallelized (a serial reference in a test, a tool that
    must see TF unchanged). On exit the hooks come back if they were installed.

    Example::

        with epl.paused(), tf.Graph().as_default():
            reference = train_serially()
    """
    registry = _hooks()
    was_installed = registry.installed
    registry.uninstall()
    try:
        yield
    finally:
        if was_installed:
            registry.install()


def reset():
    """Undo ``epl.init``: restore TensorFlow's original functions, drop EPL state.

    The Env object stays (references keep working) and returns to its state
    before ``epl.init``. Outside a ``with graph.as_default()`` block the default
    graph, which EPL may have rewritten, is replaced by a fresh one, as
    ``tf.reset_default_graph()`` does.
    """
    _hooks().uninstall()
    Graph.reset_all()
    reset_context()
    if not tf_adapter.graph_is_nested():
        tf_adapter.tf.reset_default_graph()
    env = getattr(Env._local, "env", None)
    if env is not None:
        env._clear()
    if Env._process is not None:
        Env._process._clear()
    Env._local.env = None
    Env._process_claimed = False
