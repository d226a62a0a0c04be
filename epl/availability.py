"""Config keys that would do nothing: an error at ``epl.init``, or a warning once.

A user who asks for a feature and silently gets nothing would train a model
that does not fit, or slower than expected, and find out late. ``epl.init``
checks, before anything else:

* ``NOT_BUILT``: keys of features this version does not have (empty now; a
  feature's keys leave the table when it lands): an error naming key, value and
  default;
* ``NEEDS``: keys that only refine a feature another key switches on. Setting
  ``amp.loss_scale`` or ``amp.debug_log`` without ``amp.level`` is an error: the
  program believes it trains with mixed precision;
* ``NO_EFFECT_WITHOUT``: refinements the seed configuration table lists as keys of
  their own with defaults, which jobs export for every job
  (``EPL_GRADIENT_CHECKPOINT_CHECK_GRADIENTS=True``): without
  ``gradient_checkpoint.type`` they are accepted, with one warning that they have
  no effect.
"""
import logging

from epl.config import ConfigError, FIELDS

LOG = logging.getLogger("epl")

_DEFAULTS = dict((field.key, field.default) for field in FIELDS)

# key -> the feature it belongs to (for the message)
NOT_BUILT = {}

# key -> the key that switches its feature on: setting it alone is an error
NEEDS = {
    "amp.loss_scale": "amp.level",
    "amp.debug_log": "amp.level",
}

# key -> the key that switches its feature on: setting it alone is warned about, once
NO_EFFECT_WITHOUT = {
    "gradient_checkpoint.end_taskgraph": "gradient_checkpoint.type",
    "gradient_checkpoint.check_gradients": "gradient_checkpoint.type",
}
_WARNED = set()
_SWITCH_VALUES = {"amp.level": '"O1"', "gradient_checkpoint.type": '"collection" or "auto"'}


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
    or set while the key that switches its feature on is not (``NEEDS``); warn once
    about ``NO_EFFECT_WITHOUT`` keys set alone."""
    _check_needs(config)
    _warn_no_effect(config)
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
    for key, value, needed in _alone(config, NEEDS):
        raise ConfigError("%s = %r (source: %s) has no effect unless %s is set; set %s "
                          "to %s too, or %s back to its default %r"
                          % (key, value, config.source(key), needed, needed,
                             _SWITCH_VALUES[needed], key, _DEFAULTS[key]))


def _alone(config, table):
    """[(key, value, needed key)] of ``table``'s keys set while their switch is not."""
    found = []
    for key, needed in table.items():
        value = config.get(key)
        if value != _DEFAULTS[key] and config.get(needed) == _DEFAULTS[needed]:
            found.append((key, value, needed))
    return found


def _warn_no_effect(config):
    for key, value, needed in _alone(config, NO_EFFECT_WITHOUT):
        if (key, value) in _WARNED:
            continue
        _WARNED.add((key, value))
        LOG.warning("EPL: %s = %r (source: %s) has no effect: %s is %r, so nothing uses it. "
                    "Set %s to %s to use it; this warning is given once.",
                    key, value, config.source(key), needed, config.get(needed), needed,
                    _SWITCH_VALUES[needed])
