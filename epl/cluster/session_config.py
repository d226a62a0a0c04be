"""ConfigProto for EPL sessions and servers: devices, soft placement, collectives."""
from epl.tf_adapter import tf

COLLECTIVE_GROUP_LEADER = "/job:worker/replica:0/task:0"


def session_config(cluster, base=None, device_filters=None):
    """Merge what EPL needs into ``base`` (a user ConfigProto or None).

    The same proto is given to ``tf.train.Server`` and to every session: TF
    hangs silently when the collective group leader is set on one and not the
    other, and virtual CPU devices only exist if the server creates them.
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
    if device_filters:
        del config.device_filters[:]
        config.device_filters.extend(device_filters)
    return config
