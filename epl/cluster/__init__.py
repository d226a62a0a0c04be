"""Who the workers are and which compute devices each one has.

A *compute device* is a GPU when GPUs are visible, otherwise one of N virtual
CPU devices (``tf.ConfigProto(device_count={"CPU": N})``). EPL treats both the
same way; the seed names (``gpu_num_per_worker``, ``total_gpu_num``) are kept
but count compute devices. N comes from ``EPL_NUM_VIRTUAL_DEVICES`` (set by
``epl-launch --gpu_per_worker N`` on CPU hosts), default 1.

Example::

    >>> c = Cluster(worker_hosts=["127.0.0.1:2222", "127.0.0.1:2223"],
    ...             worker_index=1, devices_per_worker=2, device_type="CPU")
    >>> c.total_gpu_num, c.device(1, 0)
    (4, '/job:worker/replica:0/task:1/device:CPU:0')
"""
import json
import os

from epl.checks import check_count
from epl.cluster.layout import LayoutError  # noqa: F401  (re-exported)

VIRTUAL_DEVICES_ENV = "EPL_NUM_VIRTUAL_DEVICES"
LOCAL_JOB = "localhost"
WORKER_JOB = "worker"


class ClusterError(ValueError):
    """TF_CONFIG or device settings that EPL cannot use."""


def parse_tf_config(text):
    """Return ``(hosts, index)`` of this task from a TF_CONFIG JSON string.

    Chief hosts come first (the chief is worker 0), then workers, then ps
    hosts, which EPL treats as ordinary workers: EPL keeps variables on the
    workers, so a parameter-server task is just one more device holder.
    """
    try:
        spec = json.loads(text)
    except ValueError as err:
        raise ClusterError("TF_CONFIG is not valid JSON (%s): %r" % (err, text[:200]))
    cluster = spec.get("cluster") or {}
    task = spec.get("task") or {}
    groups = [(job, list(cluster.get(job) or [])) for job in ("chief", "worker", "ps")]
    unknown = sorted(set(cluster) - {"chief", "worker", "ps", "evaluator"})
    if unknown:
        raise ClusterError("TF_CONFIG has unsupported job(s) %s; allowed: chief, worker, ps"
                           % unknown)
    hosts = [h for _, group in groups for h in group]
    if not hosts:
        raise ClusterError("TF_CONFIG has no chief/worker/ps hosts: %r" % text[:200])
    task_type, task_index = task.get("type", "worker"), int(task.get("index", 0))
    offset = 0
    for job, group in groups:
        if job == task_type:
            if not 0 <= task_index < len(group):
                raise ClusterError("TF_CONFIG task %s:%d does not exist; the %s job has %d "
                                   "host(s)" % (task_type, task_index, job, len(group)))
            return hosts, offset + task_index
        offset += len(group)
    raise ClusterError("TF_CONFIG task type %r is not one of chief, worker, ps" % task_type)


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


def visible_gpu_count(run_visible_devices=""):
    """GPUs this worker may use, honouring ``cluster.run_visible_devices``."""
    from epl.tf_adapter import tf
    physical = len(tf.config.experimental.list_physical_devices("GPU"))
    if not run_visible_devices:
        return physical
    wanted = [int(x) for x in run_visible_devices.split(",") if x.strip()]
    bad = [x for x in wanted if x >= physical]
    if bad:
        raise ClusterError("cluster.run_visible_devices=%r names GPU(s) %s, but this worker "
                           "has %d GPU(s)" % (run_visible_devices, bad, physical))
    return len(wanted)


class Cluster(object):
    """The job's workers and their compute devices (read-only after creation)."""

    def __init__(self, worker_hosts=None, worker_index=0, devices_per_worker=1,
                 device_type="CPU", run_visible_devices=""):
        if device_type not in ("CPU", "GPU"):
            raise ClusterError("device_type must be 'CPU' or 'GPU', got %r" % (device_type,))
        check_count(devices_per_worker, "devices per worker", ClusterError)
        self._distributed = worker_hosts is not None
        self._hosts = list(worker_hosts) if self._distributed else ["localhost"]
        if not 0 <= worker_index < len(self._hosts):
            raise ClusterError("worker_index %d is out of range for %d worker(s)"
                               % (worker_index, len(self._hosts)))
        self._worker_index = worker_index
        self._devices_per_worker = devices_per_worker
        self._device_type = device_type
        self._run_visible_devices = run_visible_devices

    @classmethod
    def from_environment(cls, config, environ=None):
        """Build from TF_CONFIG (if set), visible GPUs or EPL_NUM_VIRTUAL_DEVICES."""
        environ = os.environ if environ is None else environ
        visible = config.cluster.run_visible_devices if config is not None else ""
        hosts, index = None, 0
        if environ.get("TF_CONFIG", "").strip():
            hosts, index = parse_tf_config(environ["TF_CONFIG"])
        gpus = visible_gpu_count(visible)
        if gpus:
            return cls(hosts, index, gpus, "GPU", visible)
        return cls(hosts, index, virtual_device_count(environ), "CPU", visible)

    # ---- seed attributes -------------------------------------------------
    @property
    def worker_num(self):
        return len(self._hosts)

    @property
    def worker_index(self):
        return self._worker_index

    @property
    def gpu_num_per_worker(self):
        """Compute devices per worker (GPUs, or virtual CPUs without GPUs)."""
        return self._devices_per_worker

    @property
    def total_gpu_num(self):
        return self._devices_per_worker * len(self._hosts)

    @property
    def run_visible_devices(self):
        return self._run_visible_devices

    # ---- EPL attributes --------------------------------------------------
    @property
    def device_type(self):
        return self._device_type

    @property
    def hosts(self):
        return list(self._hosts)

    @property
    def distributed(self):
        """True when workers talk over gRPC (TF_CONFIG or explicit hosts)."""
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

    def cluster_spec(self):
        """Dict for ``tf.train.ClusterSpec`` (one job named ``worker``)."""
        return {WORKER_JOB: list(self._hosts)}

    def __eq__(self, other):
        return isinstance(other, Cluster) and self._key() == other._key()

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (self._distributed, tuple(self._hosts), self._worker_index,
                self._devices_per_worker, self._device_type, self._run_visible_devices)

    def __repr__(self):
        return ("Cluster(workers=%d, worker_index=%d, %d %s device(s) per worker%s)"
                % (self.worker_num, self._worker_index, self._devices_per_worker,
                   self._device_type, ", hosts=%s" % self._hosts if self._distributed else ""))
