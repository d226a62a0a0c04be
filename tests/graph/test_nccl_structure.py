"""The NCCL backend, checked structurally: no GPU here, so no NCCL node is ever run.

Graphs are built over GPU device strings (2 workers x 2 GPUs) with the backend
forced; the tests check op types, devices, attributes and the unique-id wiring.
"""
import pytest
import tensorflow.compat.v1 as tf

from epl.communicators import (BACKENDS, Communicator, KeyRegistry, TFCollectiveBackend,
                               library, select_backend)
from epl.communicators.nccl import NcclBackend, communicator_key, is_gpu_device

pytestmark = pytest.mark.skipif(
    library.load() is None,
    reason="epl/lib/libepl_ops.so is not built (run `make setup`); it holds the NCCL op defs")

GPUS = ["/job:worker/replica:0/task:%d/device:GPU:%d" % (w, i) for w in range(2) for i in range(2)]
CPUS = ["/job:worker/replica:0/task:%d/device:CPU:0" % w for w in range(2)]
NCCL_TYPES = {"EplNcclAllReduce", "EplNcclAllGather", "EplNcclBroadcast",
              "EplNcclBroadcastRecv", "EplNcclReduceScatter", "EplNcclAllToAll"}


def _comm(name="grads/tg0", devices=GPUS, keys=None):
    return Communicator(name, devices, keys or KeyRegistry(), backend=NcclBackend())


def _per_member(comm, build):
    """``build(comm, rank, device)`` for every member, under that member's device."""
    outs = []
    for rank, device in enumerate(comm.devices):
        with tf.device(device):
            outs.append(build(comm, rank, device))
    return outs


def _attrs(op):
    return {name: op.get_attr(name) for name in ("rank", "size", "communicator")}


def _id_source(op):
    """The op feeding a collective's unique_id input (its last input)."""
    return op.inputs[len(op.inputs) - 1].op


def _check_collective(outs, op_type, comm):
    for rank, (out, device) in enumerate(zip(outs, comm.devices)):
        assert out.op.type == op_type
        assert out.op.device == device
        assert _attrs(out.op) == {"rank": rank, "size": comm.size,
                                  "communicator": communicator_key(comm).encode()}


def test_every_collective_builds_nccl_ops_with_member_attrs():
    with tf.Graph().as_default():
        comm = _comm()
        x = lambda: tf.ones([8, 3])
        cases = [
            ("EplNcclAllReduce", lambda c, r, d: c.all_reduce(x(), d, "ar", mean=True)),
            ("EplNcclAllGather", lambda c, r, d: c.all_gather(x(), d, "ag")),
            ("EplNcclReduceScatter", lambda c, r, d: c.reduce_scatter(x(), d, "rs", False)),
            ("EplNcclAllToAll", lambda c, r, d: c.alltoall(x(), d, "a2a")),
        ]
        for op_type, build in cases:
            _check_collective(_per_member(comm, build), op_type, comm)
        assert len(comm.op_names) == 4 * comm.size


def test_reduction_attr_and_static_shapes():
    with tf.Graph().as_default():
        comm = _comm()
        device = comm.devices[1]
        with tf.device(device):
            mean = comm.all_reduce(tf.ones([8, 3]), device, "m", mean=True)
            total = comm.all_reduce(tf.ones([8, 3]), device, "s", mean=False)
            scattered = comm.reduce_scatter(tf.ones([8, 3]), device, "rs", mean=True)
            gathered = comm.all_gather(tf.ones([2, 3]), device, "ag")
            scalar = comm.all_gather(tf.constant(1.0), device, "scalar")
            exchanged = comm.alltoall(tf.ones([4, 5]), device, "a2a")
    assert mean.op.get_attr("reduction") == b"mean"
    assert total.op.get_attr("reduction") == b"sum"
    assert scattered.op.get_attr("reduction") == b"mean"
    assert mean.shape.as_list() == [8, 3]
    assert scattered.shape.as_list() == [2, 3]
    assert gathered.shape.as_list() == [8, 3]
    assert scalar.shape.as_list() == [4]
    assert exchanged.shape.as_list() == [4, 5]


def test_broadcast_send_and_recv():
    with tf.Graph().as_default():
        comm = _comm()

        def build(c, rank, device):
            if rank == 0:
                return c.broadcast_send(tf.ones([2, 3]), device, "var/w")
            return c.broadcast_recv(tf.TensorShape([2, 3]), tf.float32, device, "var/w")
        outs = _per_member(comm, build)
    assert outs[0].op.type == "EplNcclBroadcast"
    assert [o.op.type for o in outs[1:]] == ["EplNcclBroadcastRecv"] * 3
    for rank, (out, device) in enumerate(zip(outs, comm.devices)):
        assert out.op.device == device
        assert out.op.get_attr("rank") == rank
        assert out.shape.as_list() == [2, 3]
        assert out.dtype == tf.float32


def test_unique_id_is_made_by_rank0_and_broadcast_to_the_others():
    with tf.Graph().as_default():
        comm = _comm()
        outs = _per_member(comm, lambda c, r, d: c.all_reduce(tf.ones([4]), d, "g"))
        graph = tf.get_default_graph()
    makers = [op for op in graph.get_operations() if op.type == "EplNcclUniqueId"]
    assert len(makers) == 1
    assert makers[0].device == comm.devices[0]
    assert makers[0].get_attr("communicator") == communicator_key(comm).encode()
    assert makers[0].outputs[0].shape.as_list() == [16]
    send = _id_source(outs[0].op)
    assert send.type == "CollectiveBcastSend"
    assert send.inputs[0].op is makers[0]   # root's ops read the id through its send
    assert send.device == comm.devices[0]
    instances = {send.get_attr("instance_key")}
    for out, device in zip(outs[1:], comm.devices[1:]):
        recv = _id_source(out.op)
        assert recv.type == "CollectiveBcastRecv"
        assert recv.device == device
        assert recv.get_attr("T") == tf.int64
        assert recv.get_attr("shape").dim[0].size == 16
        assert recv.get_attr("group_size") == comm.size
        assert recv.get_attr("group_key") == comm.key
        instances.add(recv.get_attr("instance_key"))
    assert len(instances) == 1   # one broadcast instance shared by all members


def test_id_is_bootstrapped_once_per_member_and_ops_are_chained():
    with tf.Graph().as_default():
        comm = _comm()
        device = comm.devices[2]
        with tf.device(device):
            with tf.control_dependencies([tf.no_op(name="gate")]):
                first = comm.all_reduce(tf.ones([4]), device, "a")
            second = comm.all_gather(tf.ones([4]), device, "b")
            third = comm.all_reduce(tf.ones([4]), device, "c")
        graph = tf.get_default_graph()
    recvs = [op for op in graph.get_operations() if op.type == "CollectiveBcastRecv"]
    assert len(recvs) == 1
    assert {_id_source(o.op) for o in (first, second, third)} == {recvs[0]}
    assert not recvs[0].control_inputs   # built outside the caller's control dependencies
    # NCCL needs every rank to issue a communicator's ops in the same (build) order
    assert first.op in second.op.control_inputs
    assert second.op in third.op.control_inputs


def test_communicator_key_is_shared_by_members_and_distinct_across_groups():
    with tf.Graph().as_default():
        keys = KeyRegistry()
        grads = _comm("grads/tg0", GPUS, keys)
        bucket = _comm("grads/tg0/communicator_1", GPUS, keys)
        pair = _comm("outputs/tg0", GPUS[:2], keys)
        outs = {c.name: _per_member(c, lambda c, r, d: c.all_reduce(tf.ones([2]), d, "x"))
                for c in (grads, bucket, pair)}
    names = {name: {o.op.get_attr("communicator") for o in ops} for name, ops in outs.items()}
    assert all(len(v) == 1 for v in names.values())
    assert len(set.union(*names.values())) == 3
    assert communicator_key(grads) == communicator_key(_comm("grads/tg0", GPUS))  # stable


def test_fp16_and_integer_types_are_accepted():
    with tf.Graph().as_default():
        comm = _comm()
        assert comm.backend.native_fp16
        device = comm.devices[0]
        with tf.device(device):
            half = comm.all_reduce(tf.ones([6], tf.float16), device, "h")
            ints = comm.all_gather(tf.ones([2], tf.int32), device, "i")
            longs = comm.reduce_scatter(tf.ones([4], tf.int64), device, "l", mean=False)
            with pytest.raises(TypeError):
                comm.all_reduce(tf.ones([2], tf.bool), device, "b")
    assert half.dtype == tf.float16 and half.op.get_attr("T") == tf.float16
    assert ints.dtype == tf.int32 and longs.dtype == tf.int64


def test_bad_shapes_are_rejected_at_build_time():
    with tf.Graph().as_default():
        comm = _comm()
        device = comm.devices[0]
        with tf.device(device):
            with pytest.raises(ValueError, match="divisible"):
                comm.reduce_scatter(tf.ones([6]), device, "rs")
            with pytest.raises(ValueError, match="divisible"):
                comm.alltoall(tf.ones([3, 2]), device, "a2a")
            with pytest.raises(ValueError, match="fully defined"):
                comm.broadcast_recv(tf.TensorShape([None, 2]), tf.float32, device, "b")


def test_mixed_cpu_gpu_group_is_refused():
    with tf.Graph().as_default():
        comm = _comm("mixed", [GPUS[0], CPUS[1]])
        with pytest.raises(ValueError, match="only all-GPU groups.*CPU:0"):
            comm.all_reduce(tf.ones([2]), GPUS[0], "x")
    assert not NcclBackend.available([GPUS[0], CPUS[1]])


def test_select_backend_uses_tf_collectives_without_nccl_kernels(monkeypatch):
    monkeypatch.setattr(library, "nccl_kernels_loaded", lambda: False)
    assert NcclBackend in BACKENDS and BACKENDS.index(NcclBackend) < BACKENDS.index(
        TFCollectiveBackend)
    assert isinstance(select_backend(GPUS), TFCollectiveBackend)
    assert isinstance(select_backend(CPUS), TFCollectiveBackend)


def test_select_backend_picks_nccl_only_for_all_gpu_groups(monkeypatch):
    monkeypatch.setattr(library, "nccl_kernels_loaded", lambda: True)
    assert isinstance(select_backend(GPUS), NcclBackend)
    assert isinstance(select_backend(["/gpu:0", "/device:GPU:1"]), NcclBackend)
    assert not isinstance(select_backend(CPUS), NcclBackend)
    assert not isinstance(select_backend([GPUS[0], CPUS[0]]), NcclBackend)


def test_this_machine_has_no_nccl_kernels_unless_built():
    # the real situation on CPU machines and CI: only libepl_ops.so is built
    import os
    if os.path.exists(library.NCCL_LIBRARY_PATH):
        pytest.skip("libepl_nccl_ops.so was built here (GPU build)")
    assert library.load_nccl() is None
    assert not library.nccl_kernels_loaded()
    assert isinstance(select_backend(GPUS), TFCollectiveBackend)


def test_gpu_device_strings():
    assert all(is_gpu_device(d) for d in GPUS + ["/gpu:1", "/device:gpu:0"])
    assert not any(is_gpu_device(d) for d in CPUS + ["/job:worker/task:0"])


def test_nccl_graph_survives_export_and_import():
    with tf.Graph().as_default():
        comm = _comm()
        _per_member(comm, lambda c, r, d: c.all_reduce(tf.ones([4]), d, "g"))
        graph_def = tf.get_default_graph().as_graph_def()
    with tf.Graph().as_default() as imported:
        tf.import_graph_def(graph_def, name="")
    types = [op.type for op in imported.get_operations()]
    assert types.count("EplNcclAllReduce") == 4
    assert types.count("EplNcclUniqueId") == 1
    assert NCCL_TYPES.issuperset(t for t in types if t.startswith("EplNccl") and "Unique" not in t)
