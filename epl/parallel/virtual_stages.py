"""Interleaved stages in the plan: S * v pipeline TaskGraphs on S devices per replica.

With ``pipeline.num_virtual_stages`` v > 1 the user declares S * v pipeline stages
(``epl.replicate(1)`` scopes) and each model replica takes S devices: TaskGraph t runs on
the replica's device t mod S, so device d holds the model chunks d, d + S, d + 2S, ...
and a micro-batch crosses every device v times (device S - 1's chunk c sends to device
0's chunk c + 1). The schedule is Megatron's interleaved 1F1B
(:func:`epl.strategies.schedule.interleaved`): one row per DEVICE, whose actions name
virtual stages (TaskGraph indices); the schedule lowering orders each row's actions on
its device like any other stage's.

Only what is lowered and tested is accepted: ``pipeline.strategy`` PreferBackward (the
interleaved order is 1F1B's), every TaskGraph ``replicate(1)``, TaskGraphs on devices of
their own (not colocated), no ZeRO. Everything else is refused here, naming the key, its
value, the counts and what works, rather than run as another schedule.
"""
from epl.cluster import layout as _layout

KEY = "pipeline.num_virtual_stages"
STRATEGY = "PreferBackward"


class VirtualStagesError(ValueError):
    """``pipeline.num_virtual_stages`` cannot be honoured for this graph and config."""


def chunks_of(config):
    """The key's value: model chunks per device (1 = no interleaving)."""
    return config.pipeline.num_virtual_stages


def check(config, specs):
    """Raise VirtualStagesError unless ``specs`` (TaskGraphSpecs) and ``config`` form an
    interleaved pipeline EPL lowers; returns S, the devices of one replica."""
    chunks = chunks_of(config)
    count = len(specs)
    if count % chunks or count // chunks < 2:
        raise VirtualStagesError(
            "%s=%d needs S * %d pipeline TaskGraphs with S >= 2 devices per replica "
            "(TaskGraph t on device t mod S), but the graph has %d TaskGraph(s). Declare "
            "a multiple of %d (at least %d) epl.replicate(1) stages, or set %s=1"
            % (KEY, chunks, chunks, count, chunks, 2 * chunks, KEY))
    _refuse_features(config, specs, chunks)
    return count // chunks


def _refuse_features(config, specs, chunks):
    """What interleaved stages are not lowered with, one clear refusal each."""
    wrong = ["%s: %s(%d)" % (s.name, s.kind, s.device_count) for s in specs
             if s.kind != "replicate" or s.device_count != 1]
    if wrong:
        raise VirtualStagesError(
            "%s=%d needs every pipeline TaskGraph to be epl.replicate(1) (one device per "
            "virtual stage; split stages and wider stages are not lowered with interleaved "
            "stages in this EPL version); these are not: %s" % (KEY, chunks, ", ".join(wrong)))
    refusals = (
        (config.pipeline.strategy != STRATEGY, "pipeline.strategy=%r" % config.pipeline.strategy,
         "the interleaved order is 1F1B's: use pipeline.strategy=%r (ZeroBubble and "
         "PreferForward are not interleaved)" % STRATEGY),
        (config.cluster.colocate_split_and_replicate, "cluster.colocate_split_and_replicate=True",
         "interleaved stages place TaskGraph t on device t mod S themselves"),
        (bool(config.zero.level), "zero.level=%r" % config.zero.level,
         "ZeRO is not lowered with interleaved stages"))
    for refused, setting, why in refusals:
        if refused:
            raise VirtualStagesError("%s=%d cannot be combined with %s: %s; remove one of "
                                     "them" % (KEY, chunks, setting, why))


def layout(cluster, prefer_intra_node, num_devices, names):
    """``layout[replica][taskgraph]`` for TaskGraph t of ``len(names)`` on the replica's
    device t mod ``num_devices``: the ordinary layout of ``num_devices`` one-device
    stages, repeated for every chunk."""
    devices = _layout.replica_layout(
        cluster.worker_num, cluster.gpu_num_per_worker, [1] * num_devices,
        prefer_intra_node=prefer_intra_node, names=names[:num_devices])
    return [[replica[t % num_devices] for t in range(len(names))] for replica in devices]


def describe(schedule):
    """The plan print's line for an interleaved pipeline, None without one."""
    if schedule is None or schedule.num_virtual_stages == 1:
        return None
    return ("  interleaved: %d devices x %d virtual stages (TaskGraph t on device t mod %d; "
            "each device runs its chunks in the order of its schedule row)"
            % (schedule.num_stages, schedule.num_virtual_stages, schedule.num_stages))
