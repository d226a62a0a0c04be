"""The process-level context behind ``epl.Env.get()``: config, cluster, server.

One Env per thread that called ``epl.init`` (other threads see the Env of the
most recent ``epl.init``), so an in-process multi-worker test can run one
worker per thread, each with its own cluster view. Lower layers never read the
Env: the hooks resolve it once at the TF boundary and pass config and cluster
down explicitly.
"""
import contextlib
import logging
import threading

from epl import tf_adapter
from epl.availability import check_available
from epl.cluster import Cluster
from epl.config import Config
from epl.ir.graph import Graph
from epl.strategies.context import reset_context

LOG = logging.getLogger("epl")


class Env(object):
    """Configuration, cluster and TF server of one EPL job (seed API)."""

    _local = threading.local()
    _latest = None
    _lock = threading.Lock()

    def __init__(self, config, cluster):
        self.config = config
        self.cluster = cluster
        self.server = None

    @classmethod
    def get(cls):
        """The current Env; a default one (no epl.init yet) is created on demand."""
        env = getattr(cls._local, "env", None) or cls._latest
        if env is None:
            with cls._lock:
                if cls._latest is None:
                    config = Config()
                    cls._latest = Env(config, Cluster.from_environment(config))
                env = cls._latest
        return env

    @classmethod
    def _activate(cls, env):
        cls._local.env = env
        cls._latest = env

    @classmethod
    def _deactivate(cls):
        cls._local.env = None
        cls._latest = None

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
                                     config=session_config(self.cluster, config), start=True)
            self.server = server
        return self.server

    def graph(self, tf_graph=None):
        """EPL view of ``tf_graph`` (default graph), owned by this Env."""
        view = Graph.get(tf_graph)
        if view.owner is None:
            view.owner = self
        return view

    def __repr__(self):
        return "Env(%r, config with %d keys)" % (self.cluster, len(self.config.to_dict()))


_HOOKS = []


def _hooks():
    """The process's HookRegistry, built once, bound to ``Env.get``."""
    if not _HOOKS:
        from epl.parallel.registry import build_registry
        _HOOKS.append(build_registry(Env.get))
    return _HOOKS[0]


def init(config=None, cluster=None):
    """Start EPL: validate config, discover the cluster, install TF hooks.

    A second call starts over: new config, no TaskGraphs, no scopes, a fresh
    default graph (inside ``with tf.Graph().as_default()``, that graph's EPL
    state is cleared instead; other threads' graphs are left alone).
    ``cluster`` is for tests that simulate several workers in one process.
    """
    if tf_adapter.executing_eagerly():
        raise RuntimeError(
            "epl.init() needs TensorFlow graph mode, but eager execution is enabled. "
            "Call tf.compat.v1.disable_eager_execution() (or do not enable eager "
            "execution) before epl.init().")
    if config is None:
        config = Config()
    elif isinstance(config, dict):
        config = Config(config)
    elif not isinstance(config, Config):
        raise TypeError("epl.init(config=...) expects an epl.Config or a dict, got %s"
                        % type(config).__name__)
    check_available(config)
    if cluster is None:
        cluster = Cluster.from_environment(config)
    reset_context()
    if not tf_adapter.graph_is_nested():
        tf_adapter.tf.reset_default_graph()
    Graph.forget()
    env = Env(config, cluster)
    Env._activate(env)
    _hooks().install()
    # Register EPL's kernels in every process: a serving worker runs ops (ring
    # collectives, fused buffers) that another worker's graph placed on it.
    from epl.communicators import library
    library.load()
    LOG.info("EPL initialized: %r", cluster)
    return env


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
    """Undo ``epl.init``: restore TensorFlow's original functions, drop EPL state."""
    _hooks().uninstall()
    Graph.reset_all()
    reset_context()
    Env._deactivate()
