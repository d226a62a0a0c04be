"""ConfigProto for EPL sessions and servers: devices, soft placement, collectives."""
from epl.tf_adapter import tf

COLLECTIVE_GROUP_LEADER = "/job:worker/replica:0/task:0"


def session_config(cluster, base=None, device_filters=None, calls_functions=False,
                   place_pruned=True, ordered_sends=False):
    """Merge what EPL needs into ``base`` (a user ConfigProto or None).

    The same proto is given to ``tf.train.Server`` and to every session: TF
    hangs silently when the collective group leader is set on one and not the
    other, and virtual CPU devices only exist if the server creates them.

    ``calls_functions``: the graph calls EPL's stage functions once per
    micro-batch and local replica. Grappler's function optimizer then turns
    off (unless the user's config sets it): it rebuilds a function's whole body
    at every call site to decide whether to inline it, although EPL marks the
    functions never to be inlined; measured on a 12-layer encoder, 2 stages x
    32 micro-batches, that is 4.5 s of the first step, growing with the
    micro-batches. Nor does grappler rewrite the bodies at their calls (EPL's
    calls turn it off), and in a one-task session with the pruned placement
    below the main graph and its library get none either: the bodies run as
    built (turned on, it removed about 900 executed nodes per step of a
    ResNet-style pipeline and did not close its CPU gap to unrolled copies;
    docs/design.md, issue 41 item 3).

    ``ordered_sends``: the graph is a pipeline, whose schedule lowering orders each
    stage's actions with barrier no-ops (:mod:`epl.parallel.passes.pipeline`), under
    either lowering of the repeated step; with stage functions it also sends each
    action's outputs to the next stage through an Identity ordered after the
    barrier. Grappler's dependency optimizer then turns off (unless the user's
    config sets it). In a distributed session (where grappler runs on the main
    graph) it removes the barriers of both lowerings (10 of 14 per worker of an
    unrolled 2-stage pipeline at m = 4; every barrier with stage functions), moving
    their edges to their neighbours, so the stage order survives, but the graph
    that runs is no longer the one the lowering built; and it removes the send
    Identities (once the barrier's edges move to the calls, an Identity only
    forwards its input), after which TF's executor may run the _Send after the
    stage's next actions (on a 2-stage pipeline with stages on their own cores,
    ZeroBubble's steps fell into a slow mode in some processes and not others).
    One rule for every pipeline keeps the barriers where the lowering put them
    (traces and the late-send counts of ``benchmarks/pipeline_isolated.py`` name
    them) whichever lowering the plan picked (tests/multiworker/
    test_schedule_barriers_workers.py). It only prunes control edges, so turning
    it off changes no result.

    A session in one process (no server) places only the ops each run needs
    (``place_pruned_graph``): by default TF places the whole graph at the first
    run, and each later run with new fetches (the initializer, the readiness
    checks, the first step) prunes and optimizes against that whole graph. EPL
    makes the graph larger (local replicas' variables, the copies' assignments),
    so on a 12-layer encoder with 2 local replicas that is seconds before the
    first step (measured in ``benchmarks/rewrite_cost.py``). A distributed
    session cannot do it (TF's master turns it off with a warning), so servers
    and their sessions keep TF's default. With the pruned placement TF 1.15 runs
    no grappler on the main graph (its layout, arithmetic and fusion rewrites), so
    ``place_pruned`` False (``cluster.place_pruned_graph``) leaves the option as
    the user's ConfigProto has it: proto3 cannot tell an explicit False from unset.
    """
    config = tf.ConfigProto()
    if base is not None:
        config.CopyFrom(base)
    config.allow_soft_placement = True
    if cluster.device_type == "CPU":
        current = config.device_count.get("CPU", 0)
        config.device_count["CPU"] = max(current, cluster.gpu_num_per_worker)
    elif cluster.run_visible_devices:
        config.gpu_options.visible_device_list = cluster.run_visible_devices
    if cluster.distributed:
        config.experimental.collective_group_leader = COLLECTIVE_GROUP_LEADER
    elif place_pruned:
        config.graph_options.place_pruned_graph = True
    rewrites = config.graph_options.rewrite_options
    if calls_functions and rewrites.function_optimization == rewrites.DEFAULT:
        rewrites.function_optimization = rewrites.OFF
    if ordered_sends and rewrites.dependency_optimization == rewrites.DEFAULT:
        rewrites.dependency_optimization = rewrites.OFF
    if device_filters:
        del config.device_filters[:]
        config.device_filters.extend(device_filters)
    return config
