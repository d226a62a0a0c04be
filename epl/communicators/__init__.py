"""One collective interface over pluggable backends.

A :class:`Communicator` is one collective group (an ordered device list).
Each call builds the op of ONE member on ``device``; every member must build
the same call with the same ``name`` (which derives the instance key), and run
it in the same step. Backends are picked from an ordered list of
(available(devices), implementation): NCCL for all-GPU groups when its
kernels are loaded (GPU builds), TensorFlow collective ops otherwise.

Example::

    comm = Communicator("grads/tg0", devices, KeyRegistry())
    with tf.device(devices[1]):
        reduced = comm.all_reduce(grad, devices[1], "dense/kernel", mean=True)
"""
from epl.communicators.keys import KeyRegistry, stable_key  # noqa: F401
from epl.communicators.tf_collective import TFCollectiveBackend, as_rank1
from epl.tf_adapter import tf

BACKENDS = [TFCollectiveBackend]


def select_backend(devices, backends=None):
    """First backend whose ``available(devices)`` holds."""
    for backend in backends or BACKENDS:
        if backend.available(devices):
            return backend()
    raise RuntimeError("no collective backend can serve devices %s" % (devices,))


class Communicator(object):
    """A collective group over ``devices`` (global order, identical on all workers)."""

    def __init__(self, name, devices, keys, backend=None):
        self.name = name
        self.devices = tuple(devices)
        if len(set(self.devices)) != len(self.devices):
            raise ValueError("communicator %r lists a device twice: %s" % (name, self.devices))
        self.group_size = len(self.devices)
        self.group_key = keys.group_key(self.devices)
        self._keys = keys
        self.backend = backend or select_backend(self.devices)
        self.op_names = []  # every collective op built, for diagnostics

    def _record(self, tensor):
        self.op_names.append(tensor.op.name)
        return tensor

    def _instance(self, name):
        return self._keys.instance_key(self.group_key, "%s/%s" % (self.name, name))

    def _check(self, device):
        if device not in self.devices:
            raise ValueError("device %s is not a member of communicator %r (%s)"
                             % (device, self.name, ", ".join(self.devices)))

    def all_reduce(self, tensor, device, name, mean=True):
        """Sum (or mean) of ``tensor`` over the group, built on ``device``."""
        self._check(device)
        with tf.device(device):
            return self._record(self.backend.all_reduce(tensor, self.group_size, self.group_key,
                                                        self._instance(name), mean))

    def all_gather(self, tensor, device, name):
        """Concatenation along axis 0 of every member's tensor, in TF's rank order."""
        self._check(device)
        with tf.device(device):
            return self._record(self.backend.all_gather(as_rank1(tensor), self.group_size,
                                                        self.group_key, self._instance(name)))

    def broadcast_send(self, tensor, device, name):
        """Send ``tensor`` from ``device`` (the root) to every other member."""
        self._check(device)
        with tf.device(device):
            return self._record(self.backend.broadcast_send(tensor, self.group_size,
                                                            self.group_key, self._instance(name)))

    def broadcast_recv(self, shape, dtype, device, name):
        """Receive the root's tensor on ``device``."""
        self._check(device)
        with tf.device(device):
            return self._record(self.backend.broadcast_recv(shape, dtype, self.group_size,
                                                            self.group_key, self._instance(name)))
