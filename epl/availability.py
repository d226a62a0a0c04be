"""Config keys whose feature is not built yet: setting them is an error, never a no-op.

A user who asks for ZeRO or AMP and silently gets neither would train a model
that does not fit, or slower than expected, and find out late. Until a feature
lands, ``epl.init`` refuses a non-default value of its keys, naming the key,
the value and what to do. A feature's keys leave this table when it lands.
"""
from epl.config import ConfigError, FIELDS

_DEFAULTS = dict((field.key, field.default) for field in FIELDS)

# key -> the feature it belongs to (for the message)
NOT_BUILT = {}

# key -> the key that switches its feature on: setting it alone would do nothing
NEEDS = {
    "gradient_checkpoint.end_taskgraph": "gradient_checkpoint.type",
    "gradient_checkpoint.check_gradients": "gradient_checkpoint.type",
}


def unavailable(config):
    """[(key, value, feature)] of the config's non-default values of unbuilt features."""
    found = []
    for key, feature in NOT_BUILT.items():
        value = config.get(key)
        if value != _DEFAULTS[key]:
            found.append((key, value, feature))
    return found


def check_available(config):
    """Raise ConfigError naming every key set to a feature this EPL cannot do yet,
    or set while the key that switches its feature on is not."""
    _check_needs(config)
    found = unavailable(config)
    if not found:
        return
    lines = ["These config keys ask for features this EPL version does not have yet, so "
             "EPL would silently ignore them:"]
    for key, value, feature in found:
        lines.append("  %s = %r (%s; source: %s): set it back to its default %r"
                     % (key, value, feature, config.source(key), _DEFAULTS[key]))
    raise ConfigError("\n".join(lines))


def _check_needs(config):
    for key, needed in NEEDS.items():
        value = config.get(key)
        if value != _DEFAULTS[key] and config.get(needed) == _DEFAULTS[needed]:
            raise ConfigError("%s = %r (source: %s) has no effect unless %s is set; set %s "
                              "too or %s back to its default %r"
                              % (key, value, config.source(key), needed, needed, key,
                                 _DEFAULTS[key]))
