"""Memory estimate (epl/profiler/memory_estimate.py): pure arithmetic over profiles and plans.

No TF session: profiles are built by hand or from the transformer formula, plans on
simulated clusters.
"""
import pytest

from epl.cluster import Cluster
from epl.config import Config
from epl import plan_cli
from epl.parallel.plan import TaskGraphSpec, make_plan
from epl.profiler import memory_estimate as me
from epl.profiler.memory_estimate import Activation, Profile, Variable

MB = 1 << 20
SIZES = dict(layers=12, hidden=256, heads=4, seq=64, intermediate=1024, vocab=2000, batch=16)


def _plan(config, workers=1, devices=1, specs=(("replicate", 1),)):
    hosts = ["w%d:2222" % i for i in range(workers)] if workers > 1 else None
    return make_plan(config, Cluster(hosts, 0, devices),
                     [TaskGraphSpec("tg%d" % i, kind, count)
                      for i, (kind, count) in enumerate(specs)])


def _profile(count=4, nbytes=MB, taskgraphs=1, apply_temps=0):
    """``count`` equal variables (Adam-like slots) and one activation per variable."""
    variables = [Variable("v%d" % i, nbytes, True, i * taskgraphs // count, i, 2 * nbytes)
                 for i in range(count)]
    acts = [Activation(i * taskgraphs // count, i, 3 * nbytes, None) for i in range(count)]
    return Profile(variables, acts, {0: apply_temps} if apply_temps else {}, "test", ())


def _only(estimate):
    assert len(estimate.devices) == 1
    return list(estimate.devices.values())[0]


def test_single_device_sums_the_profile():
    config = Config()
    device = _only(me.estimate(_profile(), _plan(config), config))
    assert (device.weights, device.gradients, device.slots) == (4 * MB, 4 * MB, 8 * MB)
    assert device.activations == 12 * MB and device.accumulators == 0
    assert device.persistent == 12 * MB
    # at the top of the backward pass: every activation, the gradient flowing through
    # the last layer (its activation's size) and the last layer's weight gradient
    assert device.peak == 16 * MB
    assert device.total == device.persistent + device.peak


def test_backward_peak_walks_activations_down_and_gradients_up():
    acts = [(0, 10, None), (1, 10, None), (2, 10, None)]
    # top: 30 kept + 10 flowing + the top gradient
    assert me.backward_peak(acts, [(0, 1), (1, 1), (2, 1)]) == 41
    # held gradients larger than activations: the peak is at the bottom
    assert me.backward_peak([(2, 1, None)], [(0, 50), (1, 50), (2, 50)]) == 150
    # gradients applied as they come: one at a time
    assert me.backward_peak([(2, 1, None)], [(0, 50), (1, 50), (2, 50)], hold=False) == 52
    # a recomputed segment adds its bytes once, the largest segment counts
    assert me.backward_peak([(0, 4, None), (0, 7, 0), (1, 9, 1)], []) == 17
    # more micro-batches in flight keep their whole activations
    assert me.backward_peak(acts, [], extra_micro_batches=2) == 100


def test_data_parallel_devices_hold_a_full_copy_each():
    config = Config()
    estimate = me.estimate(_profile(), _plan(config, devices=2), config)
    assert len(estimate.devices) == 2
    first, second = estimate.devices.values()
    assert first._replace(device="") == second._replace(device="")


def test_zero_partitions_slots_by_owner():
    config = Config({"zero.level": "v1"})
    profile = _profile(count=8)
    estimate = me.estimate(profile, _plan(config, workers=4), config)
    slots = [d.slots for d in estimate.devices.values()]
    assert sum(slots) == 8 * 2 * MB and slots == [4 * MB] * 4
    assert all(d.weights == 8 * MB and d.gradients == 8 * MB for d in estimate.devices.values())
    plain = me.estimate(profile, _plan(Config(), workers=4), Config())
    assert all(d.slots == 16 * MB for d in plain.devices.values())


def test_zero_owners_are_zero_modules_table():
    from epl.runtime.zero import owners
    sizes = [5, 1, 9, 3, 3, 7]
    variables = [Variable("v%d" % i, s, True, 0, i, 2 * s) for i, s in enumerate(sizes)]
    ranks = owners(sizes, 3)
    for rank in range(3):
        expected = sum(2 * s for s, r in zip(sizes, ranks) if r == rank)
        assert me.owned_slot_bytes(variables, 3, rank) == expected


def test_zero_v2_owners_are_zero_modules_bucket_table():
    from epl.runtime.zero import bucket_owner_devices
    sizes = [1, 1, 1, 1, 4, 4]  # v0/v1 and v2 choose different owners here
    variables = [Variable("v%d" % i, s, True, 0, i, 2 * s) for i, s in enumerate(sizes)]
    table, _ = bucket_owner_devices([(v.name, v.nbytes) for v in variables], lambda n: (0, 1),
                                    lambda n: "float32", 2)
    for rank in range(2):
        expected = sum(2 * v.nbytes for v in variables if table[v.name] == rank)
        assert me.owned_slot_bytes(variables, 2, rank, max_splits=2) == expected
    assert me.owned_slot_bytes(variables, 2, 0, 2) != me.owned_slot_bytes(variables, 2, 0)


def test_offload_moves_weights_slots_and_update_to_the_host():
    config = Config({"offload.level": "v0"})
    estimate = me.estimate(_profile(apply_temps=6 * MB), _plan(config, devices=2), config)
    host, compute = estimate.devices.values()
    assert host.device.endswith("CPU:0") and compute.device.endswith("CPU:1")
    assert compute.weights == compute.slots == 0
    assert compute.temporaries == MB               # one weight in flight at a time
    assert host.weights == 2 * 4 * MB and host.slots == 2 * 8 * MB   # both copies
    assert compute.gradients == 4 * MB             # gradients stay on the device


def test_grouped_apply_divides_optimizer_temporaries():
    profile = _profile(count=4, apply_temps=8 * MB)
    for groups, expected in ((1, 8 * MB), (2, 4 * MB), (4, 2 * MB), (16, 2 * MB)):
        config = Config({"optimizer.num_apply_group": groups})
        assert _only(me.estimate(profile, _plan(config), config)).temporaries == expected
    assert me.largest_group_share([Variable("a", 3, True, 0, 0, 0),
                                   Variable("b", 1, True, 0, 1, 0)], 2) == 0.75


def test_pipeline_stages_hold_their_in_flight_micro_batches():
    specs = (("replicate", 1), ("replicate", 1))
    profile = _profile(count=4, taskgraphs=2)
    acts = {}
    for strategy, memory in (("PreferBackward", "pipeline"), ("PreferForward", "pipeline"),
                             ("ZeroBubble", "pipeline"), ("ZeroBubble", "stage")):
        config = Config({"pipeline.num_micro_batch": 4, "pipeline.strategy": strategy,
                         "pipeline.zero_bubble_memory": memory})
        plan = _plan(config, devices=2, specs=specs)
        acts[strategy, memory] = [d.activations for d in me.estimate(profile, plan, config)
                                  .devices.values()]
    per_stage = 2 * 3 * MB
    assert acts["PreferBackward", "pipeline"] == [2 * per_stage, 1 * per_stage]
    assert acts["PreferForward", "pipeline"] == [4 * per_stage, 4 * per_stage]
    # ZeroBubble counts a micro-batch from F to W: ZB-H1 holds 2 on both stages
    assert acts["ZeroBubble", "pipeline"] == [2 * per_stage, 2 * per_stage]
    assert acts["ZeroBubble", "stage"] == [2 * per_stage, 1 * per_stage]


def test_interleaved_chunks_add_their_own_in_flight_micro_batches_per_device():
    """Four TaskGraphs on two devices (pipeline.num_virtual_stages=2, m = 4): each chunk
    holds its own micro-batches from F to B in its device's order (device 0's chunks 0
    and 2: 4 and 2, device 1's chunks 1 and 3: 3 and 1); a device adds its chunks'."""
    config = Config({"pipeline.num_micro_batch": 4, "pipeline.num_virtual_stages": 2})
    plan = _plan(config, devices=2, specs=(("replicate", 1),) * 4)
    assert [me.in_flight(plan, t) for t in range(4)] == [4, 3, 2, 1]
    acts = [d.activations for d in me.estimate(_profile(count=4, taskgraphs=4), plan, config)
            .devices.values()]
    assert acts == [(4 + 2) * 3 * MB, (3 + 1) * 3 * MB]


def test_gradient_accumulation_keeps_gradient_sized_buffers():
    config = Config({"pipeline.num_micro_batch": 4})
    device = _only(me.estimate(_profile(), _plan(config), config))
    assert device.accumulators == device.gradients == 4 * MB
    assert device.activations == 12 * MB


def test_split_taskgraph_divides_by_its_shards():
    config = Config()
    estimate = me.estimate(_profile(), _plan(config, devices=2, specs=(("split", 2),)), config)
    assert [d.weights for d in estimate.devices.values()] == [2 * MB, 2 * MB]


def test_a_narrow_stage_holds_a_copy_per_position_on_its_device():
    """replicate(1) then replicate(2): the width-1 stage runs both copies of the replica
    on its one device, so that device holds two sets of the stage's weights and slots."""
    config = Config({"pipeline.num_micro_batch": 2})
    specs = (("replicate", 1), ("replicate", 2))
    devices = me.estimate(_profile(count=4, taskgraphs=2),
                          _plan(config, devices=3, specs=specs), config).devices.values()
    assert [d.weights for d in devices] == [4 * MB, 2 * MB, 2 * MB]
    assert [d.slots for d in devices] == [8 * MB, 4 * MB, 4 * MB]


def test_transformer_checkpointing_keeps_layer_outputs_and_one_layer():
    plain = me.transformer_profile(**SIZES)
    gc = me.transformer_profile(checkpoint=True, **SIZES)
    config = Config()
    plan = _plan(config)
    without = _only(me.estimate(plain, plan, config)).activations
    with_gc = _only(me.estimate(gc, plan, config)).activations
    assert with_gc < 0.5 * without
    layer_output = SIZES["batch"] * SIZES["seq"] * SIZES["hidden"] * 4
    assert with_gc > SIZES["layers"] * layer_output


def test_transformer_amp_halves_most_activations_but_no_weights():
    config = Config()
    plain = _only(me.estimate(me.transformer_profile(**SIZES), _plan(config), config))
    amp = _only(me.estimate(me.transformer_profile(amp=True, **SIZES), _plan(config), config))
    assert amp.weights == plain.weights and amp.slots == plain.slots
    assert 0.5 * plain.activations < amp.activations < 0.8 * plain.activations


def test_transformer_weights_match_the_layer_count():
    profile = me.transformer_profile(**SIZES)
    hidden, inter = SIZES["hidden"], SIZES["intermediate"]
    per_layer = 4 * (4 * hidden * hidden + 2 * hidden * inter + inter + 9 * hidden)
    layers = [v for v in profile.variables if v.name.startswith("layer_")]
    assert len(layers) == 12 and all(v.nbytes == per_layer for v in layers)
    assert all(v.slot_bytes == 2 * v.nbytes for v in profile.variables)


def test_profile_for_config_applies_build_time_savers():
    config = Config({"amp.level": "O1", "gradient_checkpoint.type": "auto"})
    profile = me.profile_for_config(SIZES, config, stages=2)
    assert any(a.segment is not None for a in profile.activations)
    assert set(v.taskgraph for v in profile.variables) == {0, 1}
    assert me.active_savers(config) == ["gc:auto", "amp:O1"]


def test_bad_sizes_are_clear_errors():
    with pytest.raises(me.MemoryEstimateError, match="miss heads"):
        me.parse_sizes("layers=2,hidden=8")
    with pytest.raises(me.MemoryEstimateError, match="expected key=value"):
        me.parse_sizes("layers=2,width=8")
    with pytest.raises(me.MemoryEstimateError, match="not an int"):
        me.parse_sizes("layers=two")
    with pytest.raises(me.MemoryEstimateError, match="positive int"):
        me.transformer_profile(**dict(SIZES, hidden=0))
    assert me.parse_sizes(",".join("%s=%d" % kv for kv in SIZES.items())) == SIZES


def test_largest_fitting_finds_the_boundary():
    config = Config()
    plan = _plan(config)

    def build(layers):
        return me.estimate(me.transformer_profile(**dict(SIZES, layers=layers)), plan, config)
    budget = build(20).max_total
    assert me.largest_fitting(budget, build, 1, 200) == 20
    assert me.largest_fitting(1, build, 1, 200) == 0


def test_estimate_prints_and_serializes():
    config = Config({"zero.level": "v1"})
    estimate = me.estimate(_profile(count=4), _plan(config, workers=2), config)
    text = str(estimate)
    assert "savers: zero:v1" in text and text.count("task:") == 2
    data = estimate.to_dict()
    assert data["savers"] == ["zero:v1"] and len(data["devices"]) == 2
    device = list(estimate.devices)[0]
    assert data["devices"][device]["total"] == estimate[device].total


def test_plan_cli_prints_the_memory_estimate(capsys):
    sizes = ",".join("%s=%d" % kv for kv in SIZES.items())
    assert plan_cli.main(["--workers", "2", "--memory", sizes, "zero.level=v1"]) == 0
    out = capsys.readouterr().out
    assert "Memory estimate per device" in out and "zero:v1" in out
    with pytest.raises(SystemExit):
        plan_cli.main(["--memory", "layers=2"])
    assert "--memory: model sizes miss" in capsys.readouterr().err
