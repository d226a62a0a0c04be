"""Human-readable numbers for profiler logs (bytes in binary units, flops in decimal)."""

_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB")
_DECIMAL_PREFIXES = ("K", "M", "G", "T", "P")


def format_bytes(num_bytes):
    """``12 -> '12 B'``, ``1536 -> '1.50 KiB'``."""
    if abs(num_bytes) < 1024:
        return "%d B" % num_bytes
    value = float(num_bytes)
    unit = _BYTE_UNITS[0]
    for unit in _BYTE_UNITS:
        value /= 1024.0
        if abs(value) < 1024.0:
            break
    return "%.2f %s" % (value, unit)


def format_flops(flops, suffix="FLOP"):
    """``512 -> '512 FLOP'``, ``3.2e9 -> '3.20 GFLOP'`` (decimal prefixes, as usual for flops)."""
    if abs(flops) < 1000:
        return "%d %s" % (flops, suffix)
    value = float(flops)
    prefix = _DECIMAL_PREFIXES[0]
    for prefix in _DECIMAL_PREFIXES:
        value /= 1000.0
        if abs(value) < 1000.0:
            break
    return "%.2f %s%s" % (value, prefix, suffix)


def device_tag(device):
    """A file-name-safe tag for a device string.

    ``'/job:localhost/replica:0/task:0/device:CPU:0'`` gives
    ``'job_localhost_replica_0_task_0_device_CPU_0'``.
    """
    tag = "".join(c if c.isalnum() else "_" for c in device).strip("_")
    while "__" in tag:
        tag = tag.replace("__", "_")
    return tag or "device"
