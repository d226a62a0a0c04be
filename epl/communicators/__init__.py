"""One collective interface over pluggable backends.

A :class:`Communicator` is one collective group: an ordered device list, the
same on every worker. Each call builds the op of ONE member on ``device``;
every member must build the same call with the same ``name`` (which derives
the instance key) and run it in the same step. Backends are picked from
``BACKENDS``, an ordered list of classes with ``available(devices)``: NCCL for
all-GPU groups when its kernels are loaded (GPU builds), TensorFlow
collective ops otherwise.

Backend contract (``group`` has ``devices``, ``size``, ``key``, ``rank(device)``):
``all_reduce(t, group, device, key, mean)``, ``all_gather(t, group, device, key)``
(concatenation along dim 0 in group order; optionally ``all_gather_v`` where
members' dim 0 may differ, else :mod:`~epl.communicators.gather_v` pads),
``broadcast_send(t, group, device, key)``, ``broadcast_recv(shape, dtype, group, device, key)``,
``reduce_scatter(t, group, device, key, mean)`` (this member's slice of dim 0)
and ``alltoall(t, group, device, key)`` (dim 0 split in group-size chunks; chunk
j goes to member j; the result concatenates what each member sent us).

Example::

    comm = Communicator("grads/tg0", devices, KeyRegistry())
    reduced = comm.all_reduce(grad, devices[1], "dense/kernel", mean=True)
"""
from epl.communicators import chains, gather_v
from epl.communicators.keys import KeyRegistry, stable_key  # noqa: F401
from epl.communicators.nccl import NcclBackend
from epl.communicators.ring import RingBackend
from epl.communicators.tf_collective import TFCollectiveBackend, as_rank1  # noqa: F401
from epl.tf_adapter import tf

BACKENDS = [NcclBackend, RingBackend, TFCollectiveBackend]


def select_backend(devices, context=None, backends=None):
    """First backend whose ``available(devices, context)`` holds.

    ``context`` carries job facts some backends need: ``hosts`` (the address
    of each worker, by task index) and ``timeout`` (seconds).
    """
    for backend in backends or BACKENDS:
        if backend.available(devices, context):
            return backend(context) if backend.needs_context else backend()
    raise RuntimeError("no collective backend can serve devices %s" % (devices,))


class Communicator(object):
    """A collective group over ``devices`` (global order, identical on all workers)."""

    def __init__(self, name, devices, keys, backend=None, context=None):
        self.name = name
        self.devices = tuple(devices)
        if len(set(self.devices)) != len(self.devices):
            raise ValueError("communicator %r lists a device twice: %s" % (name, self.devices))
        self.size = self.group_size = len(self.devices)
        self.key = self.group_key = keys.group_key(self.devices)
        self._keys = keys
        self.backend = backend or select_backend(self.devices, context)
        self.op_names = []  # every collective op built, for diagnostics
        # collectives that run only in the steps that choose them (a variable-size
        # all-gather's buckets), and the ops that join them (which every step runs)
        self._gated, self._joins = set(), []

    def step_op_names(self):
        """Names of the collective ops (or the joins of gated ones) every step runs:
        what an op that must follow all of a step's collectives may wait for (a
        control input from a collective some step skips would make it skip too)."""
        return [n for n in self.op_names if n not in self._gated] + self._joins

    def gate(self, op_names, join):
        """Record ``op_names`` as run only by the steps that choose them, joined by the
        op ``join`` (a Merge) in every step."""
        self._gated.update(op_names)
        self._joins.append(join.name)

    def setup_ops(self):
        """Ops to run once before the first step (backend connection setup)."""
        setup = getattr(self.backend, "setup_ops", None)
        return setup(self) if setup is not None else []

    def reorder_chains(self, graph, rank):
        """Make each member's chain of collectives (backends that order them with
        control edges) follow ``rank(op)`` -> (owner, position) or None: the pipeline
        schedule's order (:mod:`epl.communicators.chains`); later collectives chain
        after the new last op."""
        relink = getattr(self.backend, "relink", None)
        for old, new in chains.reorder(graph, self.op_names, rank):
            if relink is not None:
                relink(old, new)

    def rank(self, device):
        """Position of ``device`` in this group's device order."""
        try:
            return self.devices.index(device)
        except ValueError:
            raise ValueError("device %s is not a member of communicator %r (%s)"
                             % (device, self.name, ", ".join(self.devices)))

    def _build(self, device, name, method, *args):
        self.rank(device)
        if len(self.devices) == 1:
            return self._alone(args[0], device, name)
        instance = self._keys.instance_key(self.group_key, "%s/%s" % (self.name, name))
        with tf.device(device):
            result = getattr(self.backend, method)(*(args[:1] + (self, device, instance)
                                                     + args[1:]))
        self.op_names.append(result.op.name)
        return result

    def _alone(self, tensor, device, name):
        """A group of one device: every collective is the identity (backends refuse a
        group of one, and a split over 1 device or a one-device dp group makes them)."""
        with tf.device(device):
            result = tf.identity(tensor, name="%s_alone" % self.name.replace("/", "_"))
        self.op_names.append(result.op.name)
        return result

    def all_reduce(self, tensor, device, name, mean=True):
        """Sum (or mean) of ``tensor`` over the group, built on ``device``."""
        return self._build(device, name, "all_reduce", tensor, mean)

    def all_reduce_fp16_wire(self, tensor, device, name, mean, scale):
        """All-reduce of float32 data sent as float16 of ``tensor * scale`` (backends
        with ``fp16_wire``); the result is float32, identical on every member."""
        return self._build(device, name, "all_reduce_fp16_wire", tensor, mean, scale)

    def all_gather(self, tensor, device, name):
        """Every member's tensor concatenated along dim 0, in group order."""
        return self._build(device, name, "all_gather", tensor)

    def all_gather_v(self, tensor, device, name):
        """Every member's tensor concatenated along dim 0, in group order, where
        members may have different numbers of rows (sparse gradients): the backend's
        own variable-size all-gather where it has one (EPL's ring), else row counts,
        then a padded all-gather, then trimming (:mod:`epl.communicators.gather_v`)."""
        if len(self.devices) == 1 or self.native_gather_v:
            return self._build(device, name, "all_gather_v", gather_v.as_rows(tensor))
        return gather_v.all_gather_v(self, tensor, device, name)

    @property
    def native_gather_v(self):
        """True when the backend moves exactly the members' rows (no padding)."""
        return hasattr(self.backend, "all_gather_v")

    def broadcast_send(self, tensor, device, name):
        """Send ``tensor`` from ``device`` (the root) to every other member."""
        return self._build(device, name, "broadcast_send", tensor)

    def broadcast_recv(self, shape, dtype, device, name):
        """Receive the root's tensor on ``device``."""
        self.rank(device)
        if len(self.devices) == 1:
            raise ValueError("communicator %r has one device (%s): nothing to receive from"
                             % (self.name, device))
        instance = self._keys.instance_key(self.group_key, "%s/%s" % (self.name, name))
        with tf.device(device):
            result = self.backend.broadcast_recv(shape, dtype, self, device, instance)
        self.op_names.append(result.op.name)
        return result

    def reduce_scatter(self, tensor, device, name, mean=True):
        """This member's slice (dim 0, group order) of the reduced tensor."""
        return self._build(device, name, "reduce_scatter", tensor, mean)

    def alltoall(self, tensor, device, name):
        """Exchange dim-0 chunks: chunk j of every member lands on member j."""
        return self._build(device, name, "alltoall", tensor)
