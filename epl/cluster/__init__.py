"""Who the workers are and which compute devices each one has.

A *compute device* is a GPU when GPUs are visible, otherwise one of N virtual
CPU devices (``tf.ConfigProto(device_count={"CPU": N})``). EPL treats both the
same way; the seed names (``gpu_num_per_worker``, ``total_gpu_num``) are kept
but count compute devices. N comes from ``EPL_NUM_VIRTUAL_DEVICES`` (set by
``epl-launch --gpu_per_worker N`` on CPU hosts), default 1.

``cluster.run_visible_devices`` selects among a worker's devices, GPUs or
virtual CPUs alike: the listed indices must exist, and the selected devices are
renumbered from 0 in the listed order, as TensorFlow's ``visible_device_list``
does for GPUs (``EPL_NUM_VIRTUAL_DEVICES=4`` with ``"1,2"``: the worker uses 2
devices, named ``CPU:0`` and ``CPU:1``).

Example::

    >>> c = Cluster(worker_hosts=["127.0.0.1:2222", "127.0.0.1:2223"],
    ...             worker_index=1, devices_per_worker=2, device_type="CPU")
    >>> c.total_gpu_num, c.device(1, 0)
    (4, '/job:worker/replica:0/task:1/device:CPU:0')
"""
import collections
import os

from epl.checks import check_count, is_integer
from epl.cluster import discovery as _discovery, tf_config as _tf_config
from epl.cluster.common import ClusterError  # noqa: F401  (re-exported)
from epl.cluster.layout import LayoutError  # noqa: F401  (re-exported)

VIRTUAL_DEVICES_ENV = "EPL_NUM_VIRTUAL_DEVICES"
LOCAL_JOB = "localhost"
WORKER_JOB = "worker"

# Set by epl.env (the API layer) so that a Cluster can be used as a context
# manager, can show the plan's devices and reads the current config without
# importing the layers above it: [enter(cluster), exit(cluster),
# virtual_devices(cluster), run_visible_devices()].
_ENV_HOOKS = []


def parse_tf_config(text):
    """Return ``(hosts, index)`` of this training task from a TF_CONFIG JSON string.

    Chief (or master) hosts come first (the chief is worker 0), then workers,
    then ps hosts, which EPL treats as ordinary workers (see
    :mod:`epl.cluster.tf_config`, which also reads evaluators and sparse jobs).
    """
    spec = _tf_config.parse(text)
    if spec.index is None:
        raise ClusterError("TF_CONFIG task %s:%d is not part of the training cluster"
                           % (spec.task_type, spec.task_index))
    return list(spec.hosts), spec.index


def virtual_device_count(environ):
    """Virtual CPU devices per worker from ``EPL_NUM_VIRTUAL_DEVICES`` (default 1)."""
    raw = environ.get(VIRTUAL_DEVICES_ENV, "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ClusterError("%s=%r: expected an integer >= 1 (virtual CPU devices per worker)"
                           % (VIRTUAL_DEVICES_ENV, raw))
    return value


def parse_visible_devices(run_visible_devices):
    """``"1,2"`` -> ``[1, 2]``; "" -> []. Refuses non-integers and duplicates."""
    text = "".join((run_visible_devices or "").split())
    if not text:
        return []
    try:
        wanted = [int(part) for part in text.split(",")]
    except ValueError:
        wanted = [-1]
    if any(i < 0 for i in wanted) or len(set(wanted)) != len(wanted):
        raise ClusterError("cluster.run_visible_devices=%r: expected distinct device indices "
                           "separated by commas, e.g. \"0,1\"" % (run_visible_devices,))
    return wanted


def _physical_gpu_count():
    from epl.tf_adapter import tf
    return len(tf.config.experimental.list_physical_devices("GPU"))


def visible_gpu_count(run_visible_devices=""):
    """GPUs this worker may use, honouring ``cluster.run_visible_devices``."""
    physical = _physical_gpu_count()
    wanted = parse_visible_devices(run_visible_devices)
    if not physical or not wanted:
        return physical
    _check_indices(wanted, physical, run_visible_devices, "GPU(s)", "GPU(s)")
    return len(wanted)


def local_devices(run_visible_devices="", environ=None):
    """``(count, device_type)`` of this worker's compute devices.

    GPUs when any are visible, else ``EPL_NUM_VIRTUAL_DEVICES`` virtual CPUs; in
    both cases ``run_visible_devices`` selects a subset (indices must exist).
    """
    environ = os.environ if environ is None else environ
    wanted = parse_visible_devices(run_visible_devices)
    physical = _physical_gpu_count()
    if physical:
        if wanted:
            _check_indices(wanted, physical, run_visible_devices, "GPU(s)", "GPU(s)")
        return len(wanted) or physical, "GPU"
    virtual = virtual_device_count(environ)
    if wanted:
        has = "virtual CPU device(s) (%s=%d) and no GPU" % (VIRTUAL_DEVICES_ENV, virtual)
        _check_indices(wanted, virtual, run_visible_devices, "device(s)", has)
    return len(wanted) or virtual, "CPU"


def _check_indices(wanted, available, text, what, has):
    bad = [i for i in wanted if i >= available]
    if bad:
        raise ClusterError("cluster.run_visible_devices=%r names %s %s, but this worker has "
                           "%d %s" % (text, what, bad, available, has))


class VirtualDevice(collections.namedtuple(
        "VirtualDevice", ["taskgraph", "name", "devices", "local_devices"])):
    """The devices of one TaskGraph in the plan (read-only).

    ``devices[replica]`` is the tuple of devices one model replica of the
    TaskGraph uses (``device_count`` of them); ``local_devices`` are the ones on
    this worker, replica-major. The original EPL called ``devices``
    ``slice_devices``; that name works too.
    """

    __slots__ = ()

    @property
    def slice_devices(self):
        return self.devices

    @property
    def all_devices(self):
        """Every device of the TaskGraph, replica-major."""
        return tuple(d for replica in self.devices for d in replica)

    @property
    def num_replicas(self):
        """Model replicas of the TaskGraph (not devices: see ``all_devices``)."""
        return len(self.devices)


class ClusterSpecDict(dict):
    """``{"worker": [hosts]}``; also callable (``cluster.cluster_spec()``), and
    ``as_dict()`` like ``tf.train.ClusterSpec``, so code of either style works."""

    def __call__(self):
        return dict(self)

    def as_dict(self):
        return dict(self)


class Cluster(object):
    """The job's workers and their compute devices (read-only after creation).

    ``Cluster(worker_hosts, worker_index, devices_per_worker)``; without
    ``devices_per_worker`` the devices are discovered (visible GPUs, else
    ``EPL_NUM_VIRTUAL_DEVICES`` virtual CPUs, both filtered by
    ``run_visible_devices``, by default the current config's
    ``cluster.run_visible_devices``, as ``epl.init`` filters them). Without
    hosts, the workers come from TF_CONFIG when it is set, as in ``epl.init()``
    and the original EPL (else one local worker). The original EPL's keywords ``ps_hosts`` (extra
    workers), ``job_name`` ("worker" or "ps": which list ``worker_index``
    counts in) and ``layout="auto"`` are accepted; other layouts are refused,
    because EPL's plan places TaskGraphs (see ``docs/migration.md``).

    As a context manager it is the cluster of the current ``epl.Env`` inside
    the block::

        with epl.Cluster(worker_hosts=hosts, worker_index=1) as cluster:
            epl.init()          # uses ``cluster``
    """

    def __init__(self, worker_hosts=None, worker_index=None, devices_per_worker=None,
                 device_type=None, run_visible_devices=None, ps_hosts=None, job_name=None,
                 layout=None, environ=None, discovery=None):
        _check_layout(layout)
        if run_visible_devices is None:
            run_visible_devices = _configured_visible_devices(devices_per_worker)
        if discovery is None and worker_hosts is None and ps_hosts is None:
            discovery = _discover_bare(os.environ if environ is None else environ,
                                       worker_index, job_name)
        if discovery is not None and discovery.hosts is not None:
            worker_hosts, worker_index, job_name = list(discovery.hosts), discovery.index, None
        worker_index = 0 if worker_index is None else worker_index
        named = worker_hosts is not None or ps_hosts is not None
        workers, ps = _host_list(worker_hosts, "worker_hosts"), _host_list(ps_hosts, "ps_hosts")
        self._hosts = workers + ps if named else ["localhost"]
        # A job of one task has no one to talk to: no server, no gRPC (see `distributed`).
        self._distributed = len(self._hosts) > 1
        if not is_integer(worker_index):
            raise ClusterError("worker_index must be an integer, got %r" % (worker_index,))
        worker_index = _global_index(job_name, worker_index, len(workers), len(ps))
        if not 0 <= worker_index < len(self._hosts):
            raise ClusterError("worker_index %d is out of range for %d worker(s)"
                               % (worker_index, len(self._hosts)))
        if device_type not in (None, "CPU", "GPU"):
            raise ClusterError("device_type must be 'CPU' or 'GPU', got %r" % (device_type,))
        if devices_per_worker is None:
            devices_per_worker, found = local_devices(run_visible_devices)
            device_type = device_type or found
        check_count(devices_per_worker, "devices per worker", ClusterError)
        self._worker_index = int(worker_index)
        self._devices_per_worker = int(devices_per_worker)
        self._device_type = device_type or "CPU"
        self._run_visible_devices = "".join((run_visible_devices or "").split())
        self._discovery = discovery or _discovery.explicit(
            self._hosts if named else None, self._worker_index)

    @classmethod
    def from_environment(cls, config, environ=None, previous=None):
        """Build from the engine that started this process (TF_CONFIG, Slurm, MPI or
        torchrun-style variables: :mod:`epl.cluster.discovery`), with its devices
        (visible GPUs or EPL_NUM_VIRTUAL_DEVICES). ``previous``: the Discovery of an
        earlier ``epl.init`` in this process, reused rather than meeting the other
        tasks at a rendezvous again."""
        environ = os.environ if environ is None else environ
        found = _discovery.discover(environ, _discovery.options(config), os.getppid(),
                                    previous)
        visible = config.cluster.run_visible_devices if config is not None else ""
        visible = visible or found.visible_devices
        count, device_type = local_devices(visible, environ)
        return cls(None, None, count, device_type, visible, environ=environ, discovery=found)

    # ---- seed attributes -------------------------------------------------
    @property
    def worker_num(self):
        """Number of workers in the job."""
        return len(self._hosts)

    @property
    def worker_index(self):
        """This worker's index (0 is the chief)."""
        return self._worker_index

    @property
    def gpu_num_per_worker(self):
        """Compute devices per worker (GPUs, or virtual CPUs without GPUs)."""
        return self._devices_per_worker

    @property
    def total_gpu_num(self):
        """Compute devices of the whole job."""
        return self._devices_per_worker * len(self._hosts)

    @property
    def run_visible_devices(self):
        return self._run_visible_devices

    # ---- the original EPL's attributes -------------------------------------
    @property
    def available_devices(self):
        """This worker's compute device strings, in local index order."""
        return [self.device(self._worker_index, i) for i in range(self._devices_per_worker)]

    @property
    def virtual_devices(self):
        """Per TaskGraph of the current model, its :class:`VirtualDevice` in the plan.

        Computed from the current Env's config and this cluster when asked; empty
        before the model has ops (or when the cluster belongs to no Env).
        """
        if not _ENV_HOOKS:
            return []
        return _ENV_HOOKS[2](self)

    @property
    def cluster_spec(self):
        """``{"worker": hosts}`` for ``tf.train.ClusterSpec`` (call it or read it)."""
        return ClusterSpecDict({WORKER_JOB: list(self._hosts)})

    def current_worker_cpu(self):
        """This worker's host CPU device string."""
        return self.worker_cpu()

    def current_worker_chief_gpu(self):
        """This worker's first compute device (a GPU, or virtual CPU 0)."""
        return self.device(self._worker_index, 0)

    def get_local_rank(self, global_rank=None):
        """``get_local_rank(global_rank)``: the local index, on its worker, of the
        device of global rank ``global_rank`` (the original EPL's meaning:
        ``global_rank % gpu_num_per_worker``). ``get_local_rank()``: this worker's
        index among the workers on the same host (by address)."""
        if global_rank is not None:
            if not is_integer(global_rank) or not 0 <= global_rank < self.total_gpu_num:
                raise ClusterError("get_local_rank(global_rank=%r): expected a device rank "
                                   "in 0..%d (%d worker(s) x %d device(s))"
                                   % (global_rank, self.total_gpu_num - 1, self.worker_num,
                                      self._devices_per_worker))
            return int(global_rank) % self._devices_per_worker
        if not self._distributed:
            return 0
        mine = _address(self._hosts[self._worker_index])
        return sum(1 for h in self._hosts[:self._worker_index] if _address(h) == mine)

    # ---- EPL attributes --------------------------------------------------
    @property
    def device_type(self):
        return self._device_type

    @property
    def discovery(self):
        """Where the workers came from (:class:`epl.cluster.discovery.Discovery`):
        ``source``, ``detail`` (what was read), ``task_type``."""
        return self._discovery

    @property
    def task_type(self):
        """This task as its engine named it: "chief", "master", "worker", "ps", or
        "evaluator" (a TF_CONFIG task outside the training cluster, one local worker
        that evaluates checkpoints)."""
        return self._discovery.task_type

    @property
    def hosts(self):
        return list(self._hosts)

    @property
    def distributed(self):
        """True when workers talk over gRPC: the job has two tasks or more (TF_CONFIG,
        Slurm, MPI, torchrun or explicit hosts). A job of one task (``epl-launch
        --num_workers 1`` writes a TF_CONFIG of one worker) runs in this process:
        no ``tf.train.Server``, local sessions, devices named ``/job:localhost``.
        Through a server, every session was TF's distributed master session, which
        cannot place only each run's pruned graph and registers every partition
        with the worker: 1.3-1.5x the CPU time of a local session to the first step
        of a BERT-base pipeline (``benchmarks/startup.py --launcher``, docs/design.md)."""
        return self._distributed

    @property
    def job_name(self):
        return WORKER_JOB if self._distributed else LOCAL_JOB

    def device(self, worker, local_index):
        """TF device string of compute device ``local_index`` on ``worker``."""
        return "/job:%s/replica:0/task:%d/device:%s:%d" % (
            self.job_name, worker, self._device_type, local_index)

    def worker_cpu(self, worker=None):
        """Host CPU of a worker: where input pipelines and shared counters live."""
        worker = self._worker_index if worker is None else worker
        return "/job:%s/replica:0/task:%d/device:CPU:0" % (self.job_name, worker)

    def worker_device_prefix(self, worker=None):
        worker = self._worker_index if worker is None else worker
        return "/job:%s/replica:0/task:%d" % (self.job_name, worker)

    # ---- context manager ---------------------------------------------------
    def __enter__(self):
        if not _ENV_HOOKS:
            raise RuntimeError("epl.Cluster(...) as a context manager needs epl.Env: "
                               "import epl before entering it")
        _ENV_HOOKS[0](self)
        return self

    def __exit__(self, exc_type, exc, tb):
        _ENV_HOOKS[1](self)
        return False

    def __eq__(self, other):
        return isinstance(other, Cluster) and self._key() == other._key()

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (self._distributed, tuple(self._hosts), self._worker_index,
                self._devices_per_worker, self._device_type, self._run_visible_devices,
                self.task_type)

    def __repr__(self):
        return ("Cluster(workers=%d, worker_index=%d, %d %s device(s) per worker%s%s)"
                % (self.worker_num, self._worker_index, self._devices_per_worker,
                   self._device_type,
                   ", hosts=%s" % self._hosts if self._hosts != ["localhost"] else "",
                   ", evaluator" if self.task_type == _tf_config.EVALUATOR else ""))


def _configured_visible_devices(devices_per_worker):
    """The current config's ``cluster.run_visible_devices`` for a Cluster that discovers
    its devices ("" when they are given, or before ``epl.env`` is loaded): a bare
    ``epl.Cluster()`` sees the devices ``epl.init`` would."""
    if devices_per_worker is not None or len(_ENV_HOOKS) < 4:
        return ""
    return _ENV_HOOKS[3]()


def _discover_bare(environ, worker_index, job_name):
    """The Discovery of a Cluster made without hosts: the engine's cluster, as in
    ``epl.init()`` (config keys from EPL_CLUSTER_* variables). An explicit index or
    job that the engine contradicts is refused rather than silently replaced."""
    found = _discovery.discover(environ, _discovery.options(), os.getppid())
    if found.hosts is not None and (
            (worker_index is not None and worker_index != found.index) or
            job_name not in (None, "worker")):
        raise ClusterError("Cluster(worker_index=%r, job_name=%r) without hosts: %s says "
                           "this is worker %d of %s. Pass worker_hosts too, or drop "
                           "worker_index/job_name" % (worker_index, job_name, found.source,
                                                      found.index, list(found.hosts)))
    return found


def _host_list(hosts, what):
    """A list of ``host:port`` from a list or a comma-separated string."""
    if hosts is None:
        return []
    if isinstance(hosts, str):
        hosts = [h.strip() for h in hosts.split(",") if h.strip()]
    hosts = list(hosts)
    if not all(isinstance(h, str) and h for h in hosts):
        raise ClusterError("%s must be host:port strings, got %r" % (what, hosts))
    return hosts


def _global_index(job_name, index, workers, ps):
    """Index among all hosts of task ``index`` of ``job_name`` (ps hosts come last)."""
    if job_name in (None, WORKER_JOB):
        return index
    if job_name == "ps":
        if not 0 <= index < ps:
            raise ClusterError("job_name='ps', worker_index=%d: there are %d ps host(s)"
                               % (index, ps))
        return workers + index
    raise ClusterError("job_name=%r: EPL runs one job of workers; use 'worker' (or 'ps' for "
                       "a host listed in ps_hosts, which EPL treats as a worker)" % (job_name,))


def _check_layout(layout):
    if layout is None or layout == "auto":
        return
    if layout == "all":
        raise ClusterError(
            "Cluster(layout='all') is the original EPL's colocated layout; in EPL it is a "
            "config key: epl.Config({'cluster.colocate_split_and_replicate': True})")
    raise ClusterError(
        "Cluster(layout=%r) is not supported: EPL's plan places TaskGraphs on devices "
        "(row order, or column order with cluster.device_place_prefer_intra_node=False); "
        "only layout=None or 'auto' is accepted" % (layout,))


def _address(host):
    return host.rsplit(":", 1)[0]
