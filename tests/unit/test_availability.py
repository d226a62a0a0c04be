"""Keys of features that are not built yet are refused at epl.init, never ignored.

The mechanism is tested on a stand-in table (features leave the real one as
they land); the real table must only name real keys.
"""
import pytest

from epl import availability
from epl.availability import check_available, unavailable
from epl.config import FIELDS, Config, ConfigError

_FIELD = dict((f.key, f) for f in FIELDS)
STAND_IN = {"offload.level": ("offload", "v0"), "amp.loss_scale": ("amp", 128),
            "optimizer.num_apply_group": ("grouped apply", 3)}


@pytest.fixture
def not_built(monkeypatch):
    monkeypatch.setattr(availability, "NOT_BUILT",
                        dict((key, feature) for key, (feature, _) in STAND_IN.items()))


def test_real_table_names_real_keys():
    for key, feature in availability.NOT_BUILT.items():
        assert key in _FIELD and feature


def test_defaults_are_available(not_built):
    check_available(Config())
    assert unavailable(Config()) == []


@pytest.mark.parametrize("key", sorted(STAND_IN))
def test_each_unbuilt_key_is_refused_with_its_name_value_and_default(not_built, key):
    value = STAND_IN[key][1]
    with pytest.raises(ConfigError) as info:
        check_available(Config({key: value}))
    message = str(info.value)
    assert key in message and repr(value) in message
    assert "default %r" % (_FIELD[key].default,) in message


def test_environment_overrides_are_refused_too(not_built, monkeypatch):
    monkeypatch.setenv("EPL_OFFLOAD_LEVEL", "v0")
    with pytest.raises(ConfigError, match=r"offload.level = 'v0' \(offload; source: env "
                                          r"EPL_OFFLOAD_LEVEL"):
        check_available(Config())


def test_zero_v0_is_a_valid_value():
    assert Config({"zero.level": "v0"}).zero.level == "v0"


def test_epl_init_refuses_before_touching_anything(not_built):
    import epl
    with pytest.raises(ConfigError, match="offload.level"):
        epl.init(epl.Config({"offload.level": "v0"}))


def test_gc_refinements_exported_for_every_job_only_warn_once(monkeypatch, caplog):
    """The seed table lists gradient_checkpoint.check_gradients and end_taskgraph as keys
    of their own; exported for every job they must not break one without a type."""
    import logging
    import epl
    monkeypatch.setattr(availability, "_WARNED", set(), raising=False)
    monkeypatch.setenv("EPL_GRADIENT_CHECKPOINT_CHECK_GRADIENTS", "True")
    monkeypatch.setenv("EPL_GRADIENT_CHECKPOINT_END_TASKGRAPH", "1")
    with caplog.at_level(logging.WARNING, logger="epl"):
        epl.init()
        epl.init()
    warned = [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "gradient_checkpoint.check_gradients = True (source: env " \
        "EPL_GRADIENT_CHECKPOINT_CHECK_GRADIENTS) has no effect: gradient_checkpoint.type " \
        "is ''" in warned[0] + warned[1]
    assert "gradient_checkpoint.end_taskgraph = 1" in warned[0] + warned[1]
    epl.init(Config({"gradient_checkpoint.type": "auto"}))   # used: no warning
    assert len([r for r in caplog.records if "has no effect" in r.getMessage()]) == 2
