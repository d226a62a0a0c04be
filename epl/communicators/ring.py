"""EPL's CPU ring backend: all-reduce over direct TCP connections between members.

TensorFlow's CPU collectives move data through gRPC at a few hundred MB/s on
this class of machine; a ring over plain sockets (csrc/ops/ring_*.cc) moves
it at memory speed, accumulates float16 in float, and turns an unresponsive
peer into a clear error after ``communication.timeout`` instead of a hang.

Setup runs once per session, in EPL's prepare program: every member listens on
an ephemeral port, the ports are all-gathered with a TF collective, and each
member connects to its successor. Ops of one member are chained with control
dependencies in creation order, which is identical on every worker, so all
members run a group's collectives in the same order. Operations other than
all-reduce are delegated to the TF collective backend.

Members on the same host move bytes through shared-memory queues instead of
loopback TCP (one copy in, one copy out, no TCP stack), after the TCP
handshake; ``EPL_RING_SHARED_MEMORY=0`` keeps every link on TCP.

Select it with ``EPL_COLLECTIVE_BACKEND=auto`` (default: used for all-CPU
groups when the op library is built), ``ring`` (required) or ``tf`` (never;
this also turns off the NCCL backend).
"""
import os

from epl.communicators import library
from epl.communicators.tf_collective import TFCollectiveBackend
from epl.tf_adapter import tf

BACKEND_ENV = "EPL_COLLECTIVE_BACKEND"
SHARED_MEMORY_ENV = "EPL_RING_SHARED_MEMORY"


def backend_choice():
    """``EPL_COLLECTIVE_BACKEND``: auto (default), ring, or tf (TF collectives only)."""
    return _choice()


def _choice():
    value = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "ring", "tf"):
        raise ValueError("%s=%r: expected auto, ring or tf" % (BACKEND_ENV, value))
    return value


def shared_memory_choice():
    """``EPL_RING_SHARED_MEMORY``: 1 (default) upgrades same-host links, 0 keeps TCP."""
    value = os.environ.get(SHARED_MEMORY_ENV, "1").strip().lower() or "1"
    if value not in ("0", "1", "true", "false"):
        raise ValueError("%s=%r: expected 1 or 0" % (SHARED_MEMORY_ENV, value))
    return value in ("1", "true")


def _task(device):
    return tf.DeviceSpec.from_string(device).task or 0


class RingBackend(TFCollectiveBackend):
    """All-reduce on EPL's TCP ring; everything else through TF collectives."""

    name = "epl_ring"
    native_fp16 = True
    fp16_wire = True   # converts float32 <-> float16 inside the op (no TF casts)
    needs_context = True

    def __init__(self, context):
        self._hosts = list(context["hosts"])
        self._timeout = float(context["timeout"])
        self._last = {}      # device -> last ring op of this member (for ordering)
        self._members = []   # devices this graph built ring ops for

    @staticmethod
    def available(devices, context=None):
        choice = _choice()
        if choice == "tf" or context is None:
            return False
        usable = library.load() is not None and all(
            tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices)
        if choice == "ring" and not usable:
            raise RuntimeError("%s=ring but the EPL op library is not built or the group has "
                               "non-CPU devices: %s" % (BACKEND_ENV, devices))
        return usable

    def _ring_name(self, group):
        return "%s@%d" % (group.name, group.key)

    def all_reduce(self, tensor, group, device, instance_key, mean):
        return self._ring_op(tensor, group, device, instance_key, mean, False, 1.0)

    def all_reduce_fp16_wire(self, tensor, group, device, instance_key, mean, scale):
        return self._ring_op(tensor, group, device, instance_key, mean, True, scale)

    def _ring_op(self, tensor, group, device, instance_key, mean, wire_half, scale):
        ops = library.load()
        controls = [self._last[device]] if device in self._last else []
        with tf.control_dependencies(controls):
            result = ops.epl_ring_all_reduce(
                tensor, communicator=self._ring_name(group), rank=group.rank(device),
                size=group.size, instance_key=instance_key, mean=mean,
                wire_float16=wire_half, scale=float(scale), timeout_seconds=self._timeout)
        self._last[device] = result.op
        if device not in self._members:
            self._members.append(device)
        return result

    def relink(self, old, new):
        """``new`` replaces ``old`` as the last op of a chain (re-ordered to the schedule)."""
        for device in [d for d, op in self._last.items() if op is old]:
            self._last[device] = new

    def setup_ops(self, group):
        """Listen -> all-gather ports -> connect, for each member this graph uses."""
        ops, name = library.load(), self._ring_name(group)
        shared_memory = shared_memory_choice()
        hosts = [self._hosts[_task(d)] for d in group.devices]
        result = []
        for device in self._members:
            rank = group.rank(device)
            with tf.device(device), tf.name_scope("EPL_RING_SETUP"):
                port = ops.epl_ring_listen(communicator=name, rank=rank, size=group.size,
                                           timeout_seconds=self._timeout)
            ports = group.all_gather(port, device, "ring_setup/ports")
            with tf.device(device), tf.name_scope("EPL_RING_SETUP"):
                result.append(ops.epl_ring_connect(
                    ports, communicator=name, rank=rank, size=group.size, hosts=hosts,
                    timeout_seconds=self._timeout, shared_memory=shared_memory).op)
        return result
