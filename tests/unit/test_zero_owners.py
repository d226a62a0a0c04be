"""ZeRO's owner table: a pure function of the plan's data-parallel groups, checked on
simulated clusters of hundreds of devices (no TF session)."""
import collections

from epl.cluster import Cluster
from epl.config import Config
from epl.parallel.plan import TaskGraphSpec, make_plan
from epl.buckets import owner_chunks
from epl.runtime.zero import bucket_owner_devices, load_by_device, owner_devices


def _cluster(workers, devices):
    return Cluster(["127.0.0.1:%d" % (2000 + i) for i in range(workers)], 0, devices)


def _variables(stages, per_stage):
    """(name, bytes, stage): sizes like a transformer's (a few large, many small)."""
    found = []
    for stage in range(stages):
        for index in range(per_stage):
            nbytes = 4 * (1024 * 1024 if index % 6 == 0 else 4096 * (1 + index % 5))
            found.append(("s%d/v%d" % (stage, index), nbytes, stage))
    return found


def _table(plan, variables):
    stage_of = dict((name, stage) for name, _, stage in variables)
    return owner_devices([(n, b) for n, b, _ in variables],
                         lambda name: plan.taskgraphs[stage_of[name]].dp_group().devices)


def test_512_devices_one_group_every_device_owns_a_balanced_share():
    plan = make_plan(Config(), _cluster(64, 8), [TaskGraphSpec("model", "replicate", 1)])
    variables = _variables(1, 2048)
    table = _table(plan, variables)
    devices = plan.taskgraphs[0].dp_group().devices
    assert len(devices) == 512 and set(table.values()) == set(devices)
    nbytes = dict((n, b) for n, b, _ in variables)
    load = load_by_device(table, nbytes)
    ideal = sum(nbytes.values()) / 512.0
    assert max(load.values()) <= ideal + max(nbytes.values())  # greedy bound
    assert min(load.values()) > 0


def test_pipeline_owners_stay_in_their_stage_group_and_copies_split_them_exactly():
    specs = [TaskGraphSpec("s%d" % i, "replicate", 1) for i in range(4)]
    plan = make_plan(Config({"pipeline.num_micro_batch": 4}), _cluster(32, 8), specs)
    variables = _variables(4, 200)
    table = _table(plan, variables)
    for name, _, stage in variables:
        assert table[name] in plan.taskgraphs[stage].dp_group().devices
    # every (worker, copy) updates what it owns; together they update each variable once
    updates = collections.Counter()
    for worker in range(32):
        for copy in plan.copies_of(worker):
            for name, _, stage in variables:
                if table[name] == copy.devices[stage]:
                    updates[name] += 1
    assert updates == collections.Counter(dict((n, 1) for n, _, _ in variables))


def test_the_table_does_not_depend_on_the_worker_that_computes_it():
    specs = [TaskGraphSpec("model", "replicate", 1)]
    variables = _variables(1, 300)
    tables = [_table(make_plan(Config(), Cluster(["127.0.0.1:%d" % (2000 + i)
                                                  for i in range(16)], w, 4), specs), variables)
              for w in (0, 7, 15)]
    assert tables[0] == tables[1] == tables[2]


def test_a_group_of_one_device_or_a_shard_has_no_owner():
    table = owner_devices([("a", 8), ("b", 8), ("shard", 8)],
                          lambda n: None if n == "shard" else ("d0",))
    assert table == {}


def test_v2_buckets_are_balanced_each_on_its_own_and_every_device_owns_some():
    """ZeRO v2: each bucket's reduce-scatter pads every member's chunk to the largest
    share of that bucket, so each bucket is balanced; 64 devices, 5 buckets."""
    plan = make_plan(Config(), _cluster(8, 8), [TaskGraphSpec("model", "replicate", 1)])
    devices = plan.taskgraphs[0].dp_group().devices
    variables = [(n, b) for n, b, _ in _variables(1, 1200)]
    table, bucket = bucket_owner_devices(variables, lambda n: devices, lambda n: "float32", 5)
    assert set(bucket.values()) == set(range(5)) and set(table.values()) == set(devices)
    nbytes = dict(variables)
    largest = max(nbytes.values())
    for number in range(5):
        names = [n for n, _ in variables if bucket[n] == number]
        assert names == sorted(names, key=[n for n, _ in variables].index)  # contiguous
        load = load_by_device(dict((n, table[n]) for n in names), nbytes)
        chunk, _ = owner_chunks([nbytes[n] for n in names],
                                [devices.index(table[n]) for n in names], len(devices))
        assert chunk == max(load.values())
        assert chunk <= sum(nbytes[n] for n in names) / 64.0 + largest  # greedy bound


def test_v2_buckets_of_one_variable_go_to_different_devices():
    table, bucket = bucket_owner_devices([("a", 8), ("b", 8), ("c", 8)],
                                         lambda n: ("d0", "d1", "d2"), lambda n: "float32", 3)
    assert bucket == {"a": 0, "b": 1, "c": 2}
    assert sorted(table.values()) == ["d0", "d1", "d2"]


def test_v2_buckets_never_mix_dtypes():
    dtypes = {"a": "float32", "b": "float32", "h": "float16"}
    _, bucket = bucket_owner_devices([("a", 8), ("b", 8), ("h", 4)], lambda n: ("d0", "d1"),
                                     dtypes.get, 1)
    assert bucket["a"] == bucket["b"] != bucket["h"]


def test_owner_chunks_lay_each_bucket_out_by_owner():
    chunk, by_owner = owner_chunks([4, 2, 3, 5], [1, 0, 1, 0], 3)
    assert (chunk, by_owner) == (7, [[1, 3], [0, 2], []])


def test_zero_v1_warns_once_that_fp16_does_not_reach_its_reduce_scatter(caplog, monkeypatch):
    """The seeds' level keeps running with communication.fp16 (programs written for the
    original EPL may set both) but says, once, that its gradients go in float32; v2
    refuses (tests/multiworker/test_zero.py), and so do both levels for
    clip_after_allreduce."""
    from epl.runtime import zero_partition
    from epl.runtime.zero_error import ZeroError
    monkeypatch.setattr(zero_partition, "_FP16_WARNED", [])
    communication = Config({"communication.fp16": True}).communication
    with caplog.at_level("WARNING", logger="epl"):
        zero_partition.refuse_what_cannot_combine("v1", communication)
        zero_partition.refuse_what_cannot_combine("v1", communication)
        zero_partition.refuse_what_cannot_combine("v0", communication)
    said = [r.getMessage() for r in caplog.records if "communication.fp16" in r.getMessage()]
    assert len(said) == 1 and "zero.level='v1'" in said[0] and "float32" in said[0]
    for level in ("v1", "v2"):
        clip = Config({"communication.clip_after_allreduce": True}).communication
        try:
            zero_partition.refuse_what_cannot_combine(level, clip)
        except ZeroError as error:
            assert "zero.level=%r" % level in str(error)
            assert "communication.clip_after_allreduce=True" in str(error)
        else:
            raise AssertionError("zero.level=%r with clip_after_allreduce was accepted" % level)
