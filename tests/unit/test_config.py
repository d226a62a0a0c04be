"""Unit tests for epl.config: defaults, precedence, env overrides and value checks."""
import math

import pytest

from epl.config import FIELDS, Config, ConfigError
from config_tables import (  # noqa: F401
    assert_same, clean_env,
    REPO_ROOT, EXPECTED_DEFAULTS, KEYS, EXTENSION_KEYS, BOOL_KEYS, COUNT_KEYS, INT_KEYS,
    NUMBER_KEYS, OVERRIDES, ENV_OVERRIDES, BAD_TYPES, BAD_VALUES, BAD_ENV, FREE_TEXT_KEYS)


def test_tables_in_this_file_cover_every_key():
    # The 26 keys of the seed configuration table plus EPL's extensions.
    assert len(KEYS) == 26 + len(EXTENSION_KEYS)
    assert [f.key for f in FIELDS if f.extension] == EXTENSION_KEYS
    for table in (OVERRIDES, ENV_OVERRIDES, BAD_TYPES):
        assert sorted(table) == sorted(KEYS)
    assert sorted(BAD_ENV) == sorted(set(KEYS) - set(FREE_TEXT_KEYS))
    assert sorted(BAD_VALUES) == sorted(set(KEYS) - set(BOOL_KEYS) - set(FREE_TEXT_KEYS))


def test_defaults():
    config = Config()
    assert config.to_dict() == EXPECTED_DEFAULTS
    assert all(config.source(key) == "default" for key in KEYS)
    assert Config(None) == config == Config({})


def test_keys_in_table_order():
    assert Config.keys() == tuple(KEYS)
    assert Config().keys() == tuple(KEYS)
    assert list(Config().to_dict()) == KEYS


def test_attribute_access_matches_get():
    config = Config(OVERRIDES)
    for key in KEYS:
        section, name = key.split(".")
        assert getattr(getattr(config, section), name) == config.get(key) == OVERRIDES[key]


def test_contract_example():
    config = Config({"pipeline.num_micro_batch": 4})
    assert config.pipeline.num_micro_batch == 4


@pytest.mark.parametrize("key", KEYS)
def test_dict_overrides_each_key(key):
    assert OVERRIDES[key] != EXPECTED_DEFAULTS[key]
    config = Config({key: OVERRIDES[key]})
    assert_same(config.get(key), OVERRIDES[key])
    assert config.source(key) == "dict"
    expected = dict(EXPECTED_DEFAULTS, **{key: OVERRIDES[key]})
    assert config.to_dict() == expected


@pytest.mark.parametrize("key", KEYS)
def test_env_overrides_each_key(key, monkeypatch):
    env_var, raw, value = ENV_OVERRIDES[key]
    assert value != EXPECTED_DEFAULTS[key]
    monkeypatch.setenv(env_var, raw)
    config = Config()
    assert_same(config.get(key), value)
    assert config.source(key) == "env " + env_var
    assert config.to_dict() == dict(EXPECTED_DEFAULTS, **{key: value})


@pytest.mark.parametrize("key", KEYS)
def test_dict_beats_env(key, monkeypatch):
    env_var, raw, _ = ENV_OVERRIDES[key]
    monkeypatch.setenv(env_var, raw)
    config = Config({key: EXPECTED_DEFAULTS[key]})
    assert config.get(key) == EXPECTED_DEFAULTS[key]
    assert config.source(key) == "dict"


def test_spec_env_names(monkeypatch):
    monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCH", "4")
    monkeypatch.setenv("EPL_COMMUNICATION_FP16", "true")
    monkeypatch.setenv("EPL_CLUSTER_RUN_VISIBLE_DEVICES", "0,1")
    config = Config()
    assert config.pipeline.num_micro_batch == 4
    assert config.communication.fp16 is True
    assert config.cluster.run_visible_devices == "0,1"


def test_env_is_read_once_at_construction(monkeypatch):
    config = Config()
    monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCH", "6")
    assert config.pipeline.num_micro_batch == 1
    assert Config().pipeline.num_micro_batch == 6


def test_unrelated_epl_env_vars_are_ignored(monkeypatch):
    monkeypatch.setenv("EPL_NUM_VIRTUAL_DEVICES", "8")
    monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCHES", "not a number")
    monkeypatch.setenv("EPL_PIPELINE", "x")
    assert Config().to_dict() == EXPECTED_DEFAULTS


def test_bad_env_is_not_read_when_dict_sets_the_key(monkeypatch):
    monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCH", "garbage")
    assert Config({"pipeline.num_micro_batch": 2}).pipeline.num_micro_batch == 2
    with pytest.raises(ConfigError):
        Config()


@pytest.mark.parametrize("raw,expected", [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("Yes", True), (" true ", True),
    ("false", False), ("False", False), ("0", False), ("no", False), ("NO", False),
])
def test_env_bool_spellings(raw, expected, monkeypatch):
    monkeypatch.setenv("EPL_IO_SLICING", raw)
    assert Config().io.slicing is expected


@pytest.mark.parametrize("raw", ["none", "None", "NONE", ""])
def test_env_none_for_optional_int(raw, monkeypatch):
    monkeypatch.setenv("EPL_PIPELINE_NUM_STAGES", raw)
    config = Config()
    assert config.pipeline.num_stages is None
    assert config.source("pipeline.num_stages") == "env EPL_PIPELINE_NUM_STAGES"


@pytest.mark.parametrize("raw,expected", [
    ("dynamic", "dynamic"), ("DYNAMIC", "dynamic"), ("1024", 1024), ("0.25", 0.25)])
def test_env_loss_scale(raw, expected, monkeypatch):
    monkeypatch.setenv("EPL_AMP_LOSS_SCALE", raw)
    assert_same(Config().amp.loss_scale, expected)


def test_env_choices_use_canonical_spelling(monkeypatch):
    monkeypatch.setenv("EPL_PIPELINE_STRATEGY", "PREFERFORWARD")
    monkeypatch.setenv("EPL_AMP_LEVEL", "o1")
    config = Config()
    assert config.pipeline.strategy == "PreferForward"
    assert config.amp.level == "O1"


@pytest.mark.parametrize("key", sorted(BAD_ENV))
def test_bad_env_value_names_the_variable(key, monkeypatch):
    env_var = ENV_OVERRIDES[key][0]
    raw, allowed = BAD_ENV[key]
    monkeypatch.setenv(env_var, raw)
    with pytest.raises(ConfigError) as info:
        Config()
    message = str(info.value)
    assert env_var in message
    assert repr(raw) in message
    assert key in message
    assert allowed in message


@pytest.mark.parametrize("key", KEYS)
def test_bad_type_for_each_key(key):
    value, expected_type = BAD_TYPES[key]
    with pytest.raises(ConfigError) as info:
        Config({key: value})
    message = str(info.value)
    assert repr(key) in message
    assert repr(value) in message
    assert "of type " + type(value).__name__ in message
    assert "expects " + expected_type + "," in message


@pytest.mark.parametrize("key", sorted(BAD_VALUES))
def test_bad_value_for_each_key(key):
    value, allowed = BAD_VALUES[key]
    with pytest.raises(ConfigError) as info:
        Config({key: value})
    message = str(info.value)
    assert repr(key) in message
    assert repr(value) in message
    assert allowed in message


@pytest.mark.parametrize("key", COUNT_KEYS)
@pytest.mark.parametrize("value", [0, -1])
def test_counts_must_be_at_least_one(key, value):
    with pytest.raises(ConfigError, match=">= 1"):
        Config({key: value})
    assert Config({key: 1}).get(key) == 1


@pytest.mark.parametrize("value,ok", [(-2, False), (-1, True), (0, True), (5, True)])
def test_end_taskgraph_range(value, ok):
    if ok:
        assert Config({"gradient_checkpoint.end_taskgraph": value}).get(
            "gradient_checkpoint.end_taskgraph") == value
    else:
        with pytest.raises(ConfigError, match=">= -1"):
            Config({"gradient_checkpoint.end_taskgraph": value})


@pytest.mark.parametrize("key", INT_KEYS + NUMBER_KEYS)
@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_a_number(key, value):
    with pytest.raises(ConfigError, match="of type bool"):
        Config({key: value})


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", [2.0, "2"])
def test_ints_reject_float_and_str(key, value):
    with pytest.raises(ConfigError, match="expects int"):
        Config({key: value})


def test_num_stages_accepts_none():
    assert Config({"pipeline.num_stages": None}).pipeline.num_stages is None


@pytest.mark.parametrize("key", NUMBER_KEYS)
@pytest.mark.parametrize("value", [1, 0.5, 2 ** 15, 1e-3])
def test_numbers_accept_positive_int_and_float(key, value):
    assert_same(Config({key: value}).get(key), value)


@pytest.mark.parametrize("key", NUMBER_KEYS)
@pytest.mark.parametrize("value", [0, -1, 0.0, -0.5, math.inf, math.nan])
def test_numbers_must_be_positive_and_finite(key, value):
    with pytest.raises(ConfigError, match="> 0"):
        Config({key: value})


def test_dynamic_is_only_for_loss_scale():
    with pytest.raises(ConfigError, match="expects int or float,"):
        Config({"communication.fp16_scale": "dynamic"})


@pytest.mark.parametrize("key,given,canonical", [
    ("pipeline.strategy", "preferforward", "PreferForward"),
    ("pipeline.strategy", "PREFERBACKWARD", "PreferBackward"),
    ("gradient_checkpoint.type", "Collection", "collection"),
    ("gradient_checkpoint.type", "AUTO", "auto"),
    ("zero.level", "V1", "v1"),
    ("offload.level", "V0", "v0"),
    ("amp.level", "o1", "O1"),
    ("amp.loss_scale", "Dynamic", "dynamic"),
    ("communication.gradients_reduce_method", "SUM", "sum"),
    ("communication.gradients_reduce_method", "Mean", "mean"),
])
def test_choices_are_case_insensitive_and_stored_canonically(key, given, canonical):
    assert Config({key: given}).get(key) == canonical
    config = Config()
    section, name = key.split(".")
    setattr(getattr(config, section), name, given)
    assert config.get(key) == canonical


@pytest.mark.parametrize("given,stored", [("", ""), ("0", "0"), ("0,1", "0,1"),
                                          ("0, 1", "0,1"), ("7,3,12", "7,3,12")])
def test_run_visible_devices_accepted(given, stored):
    assert Config({"cluster.run_visible_devices": given}).cluster.run_visible_devices == stored


@pytest.mark.parametrize("given", ["a", "0,", ",0", "-1", "0,0", "1.5", "0;1", "gpu:0"])
def test_run_visible_devices_rejected(given):
    with pytest.raises(ConfigError, match="cluster.run_visible_devices"):
        Config({"cluster.run_visible_devices": given})
