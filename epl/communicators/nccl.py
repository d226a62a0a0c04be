"""NCCL collective backend for groups whose every device is a GPU (GPU builds).

The ops are defined in ``libepl_ops.so`` (so these graphs build anywhere) and
run by the GPU kernels of ``libepl_nccl_ops.so`` (``csrc/nccl``), which exist
only where CUDA and NCCL were found at build time; ``available`` asks for both,
so CPU machines and CPU builds keep using TensorFlow's collectives.

Why the pieces below exist:

* NCCL ranks are positions in ``group.devices``, so gathers come back in group
  order natively (no re-sorting as with TF's name-ordered collectives).
* The NCCL communicator is named by the group's name and key, which are stable
  across workers; communicators over the same devices under different names
  (gradient buckets spread over several groups) get independent NCCL
  communicators and streams.
* Bootstrap: rank 0 makes the ncclUniqueId and TF's collective broadcast (the
  TF backend, on the same GPUs) carries it to the others. Rank 0's own ops read
  the id through its broadcast_send, or TF would prune the send from the step.
  The id subgraph runs every step; the kernels use it only to create the
  communicator on first use, and rank 0 reuses one id per process.
* Ordering: every rank must issue one communicator's collectives in the same
  order, but TF runs independent ops in any order. Each member's NCCL ops on one
  communicator are chained with control edges in build order, which is the
  same on every member (they all build the same calls).
"""
import weakref

from epl import tf_adapter
from epl.communicators import library
from epl.communicators.keys import stable_key
from epl.communicators.ring import backend_choice
from epl.communicators.tf_collective import TFCollectiveBackend, as_rank1
from epl.tf_adapter import tf

UNIQUE_ID_WORDS = 16  # ncclUniqueId: 128 bytes as int64[16]


def is_gpu_device(device):
    """True for a GPU device string (``/job:w/replica:0/task:1/device:GPU:0``, ``/gpu:0``)."""
    return (tf.DeviceSpec.from_string(device).device_type or "").upper() == "GPU"


def communicator_key(group):
    """The NCCL communicator name: equal on all members, distinct across groups."""
    return "%s@%d" % (group.name, group.key)


def _id_instance_key(group):
    """TF collective instance key of the unique-id broadcast (``KeyRegistry``'s formula;
    '@' keeps it apart from the names ``Communicator`` builds)."""
    return stable_key("instance", str(group.key), "%s/@nccl_unique_id" % group.name)


def _require_gpus(group):
    others = [d for d in group.devices if not is_gpu_device(d)]
    if others:
        raise ValueError("the NCCL backend serves only all-GPU groups; communicator %r has "
                         "non-GPU devices %s (the TF collective backend serves those)"
                         % (group.name, ", ".join(others)))


def _flow_context():
    """Control edges cannot join ops of different while/cond frames, so chains are per frame."""
    return tf_adapter.control_flow_context()


class NcclBackend(object):
    """Builds one member's NCCL collective; see the module docstring."""

    name = "nccl"
    native_fp16 = True
    needs_context = False

    @staticmethod
    def available(devices, context=None):
        del context
        devices = list(devices)
        return (backend_choice() != "tf" and bool(devices)
                and all(is_gpu_device(d) for d in devices) and library.nccl_kernels_loaded())

    def __init__(self):
        self._ops = library.load()
        if self._ops is None:
            raise RuntimeError("the NCCL backend needs EPL's op library (epl/lib/libepl_ops.so, "
                               "built by `make setup`)")
        self._tf = TFCollectiveBackend()
        self._graphs = weakref.WeakKeyDictionary()  # graph -> {"ids": {}, "last": {}}

    def all_reduce(self, tensor, group, device, instance_key, mean):
        del instance_key
        return self._call("epl_nccl_all_reduce", group, device, tensor,
                          reduction="mean" if mean else "sum")

    def all_gather(self, tensor, group, device, instance_key):
        del instance_key
        return self._call("epl_nccl_all_gather", group, device, as_rank1(tensor))

    def broadcast_send(self, tensor, group, device, instance_key):
        del instance_key
        return self._call("epl_nccl_broadcast", group, device, tensor)

    def broadcast_recv(self, shape, dtype, group, device, instance_key):
        del instance_key
        shape = tf.TensorShape(shape)
        if not shape.is_fully_defined():
            raise ValueError("NCCL broadcast_recv needs a fully defined shape, got %s" % shape)
        return self._call("epl_nccl_broadcast_recv", group, device, shape=shape,
                          T=tf.as_dtype(dtype))

    def reduce_scatter(self, tensor, group, device, instance_key, mean):
        del instance_key
        _check_rows(tensor, group)
        return self._call("epl_nccl_reduce_scatter", group, device, tensor,
                          reduction="mean" if mean else "sum")

    def alltoall(self, tensor, group, device, instance_key):
        del instance_key
        _check_rows(tensor, group)
        return self._call("epl_nccl_all_to_all", group, device, tensor)

    def _call(self, op_name, group, device, *inputs, **attrs):
        _require_gpus(group)
        key = communicator_key(group)
        unique_id = self._unique_id(group, device, key)
        last = self._state()["last"]
        chain = (key, device, _flow_context())
        previous = last.get(chain)
        with tf.control_dependencies([previous] if previous is not None else []):
            result = getattr(self._ops, op_name)(*(inputs + (unique_id,)),
                                                 rank=group.rank(device), size=group.size,
                                                 communicator=key, **attrs)
        last[chain] = result.op
        return result

    def relink(self, old, new):
        """``new`` replaces ``old`` as the last op of a chain (re-ordered to the schedule)."""
        last = self._state()["last"]
        for chain in [c for c, op in last.items() if op is old]:
            last[chain] = new

    def _state(self):
        graph = tf.get_default_graph()
        if graph not in self._graphs:
            self._graphs[graph] = {"ids": {}, "last": {}}
        return self._graphs[graph]

    def _unique_id(self, group, device, key):
        ids = self._state()["ids"]
        if (key, device) not in ids:
            ids[(key, device)] = self._bootstrap(group, device, key)
        return ids[(key, device)]

    def _bootstrap(self, group, device, key):
        """The id tensor of one member, built outside any control-flow frame and
        control dependencies, so every later op of the communicator can read it."""
        instance = _id_instance_key(group)
        with tf.control_dependencies(None), tf.device(device), tf.name_scope("EPL_NCCL_ID"):
            if group.rank(device) != 0:
                return self._tf.broadcast_recv(tf.TensorShape([UNIQUE_ID_WORDS]), tf.int64,
                                               group, device, instance)
            unique_id = self._ops.epl_nccl_unique_id(communicator=key)
            if group.size == 1:
                return unique_id
            return self._tf.broadcast_send(unique_id, group, device, instance)


def _check_rows(tensor, group):
    """Static check of what the kernels check at run time (dim 0 splits evenly)."""
    if tensor.shape.ndims == 0:
        raise ValueError("reduce_scatter/alltoall need a tensor of rank >= 1, got a scalar")
    rows = tensor.shape[0].value if tensor.shape.ndims else None
    if rows is not None and rows % group.size:
        raise ValueError("reduce_scatter/alltoall need dim 0 (%d) divisible by the group size "
                         "%d" % (rows, group.size))
