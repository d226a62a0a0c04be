"""Keys of features that are not built yet are refused at epl.init, never ignored."""
import pytest

from epl.availability import NOT_BUILT, check_available, unavailable
from epl.config import FIELDS, Config, ConfigError

_FIELD = dict((f.key, f) for f in FIELDS)
NON_DEFAULT = {"gradient_checkpoint.type": "auto", "gradient_checkpoint.end_taskgraph": 2,
               "gradient_checkpoint.check_gradients": True,
               "offload.level": "v0", "amp.level": "O1", "amp.debug_log": True,
               "amp.loss_scale": 128, "optimizer.num_apply_group": 3, "auto.auto_parallel": True,
               "pipeline.num_stages": 2}


def test_defaults_are_available():
    check_available(Config())
    assert unavailable(Config()) == []


@pytest.mark.parametrize("key", sorted(NOT_BUILT))
def test_each_unbuilt_key_is_refused_with_its_name_value_and_default(key):
    config = Config({key: NON_DEFAULT[key]})
    with pytest.raises(ConfigError) as info:
        check_available(config)
    message = str(info.value)
    assert key in message and repr(NON_DEFAULT[key]) in message
    assert "default %r" % (_FIELD[key].default,) in message


def test_environment_overrides_are_refused_too(monkeypatch):
    monkeypatch.setenv("EPL_OFFLOAD_LEVEL", "v0")
    with pytest.raises(ConfigError, match=r"offload.level = 'v0' \(offload; source: env "
                                          r"EPL_OFFLOAD_LEVEL"):
        check_available(Config())


def test_zero_v0_is_a_valid_value():
    assert Config({"zero.level": "v0"}).zero.level == "v0"


def test_epl_init_refuses_before_touching_anything():
    import epl
    with pytest.raises(ConfigError, match="amp.level"):
        epl.init(epl.Config({"amp.level": "O1"}))
