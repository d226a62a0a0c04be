"""Unit tests for epl.config: defaults, precedence, validation, errors, printing and docs.

Expected values are written out literally here (not read from the FIELDS table) so that an
accidental change to the table is caught.
"""
import copy
import math
import os
import pickle
import subprocess
import sys

import pytest

from epl.config import FIELDS, Config, ConfigError, markdown_table

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPECTED_DEFAULTS = {
    "pipeline.num_micro_batch": 1,
    "pipeline.num_stages": None,
    "pipeline.strategy": "PreferBackward",
    "gradient_checkpoint.type": "",
    "gradient_checkpoint.end_taskgraph": -1,
    "gradient_checkpoint.check_gradients": False,
    "zero.level": "",
    "offload.level": "",
    "amp.level": "",
    "amp.debug_log": False,
    "amp.loss_scale": "dynamic",
    "optimizer.num_apply_group": 1,
    "cluster.device_place_prefer_intra_node": True,
    "cluster.run_visible_devices": "",
    "cluster.colocate_split_and_replicate": False,
    "communication.num_communicators": 2,
    "communication.sparse_as_dense": False,
    "communication.max_splits": 5,
    "communication.fp16": False,
    "communication.fp16_scale": 128,
    "communication.timeout": 600,
    "communication.clip_after_allreduce": False,
    "communication.gradients_reduce_method": "mean",
    "io.slicing": False,
    "io.unbalanced_io_slicing": False,
    "io.drop_last_files": False,
    "auto.auto_parallel": False,
}
KEYS = list(EXPECTED_DEFAULTS)
EXTENSION_KEYS = ["communication.timeout"]
BOOL_KEYS = [k for k, v in EXPECTED_DEFAULTS.items() if isinstance(v, bool)]
COUNT_KEYS = ["pipeline.num_micro_batch", "optimizer.num_apply_group",
              "communication.num_communicators", "communication.max_splits"]
INT_KEYS = COUNT_KEYS + ["pipeline.num_stages", "gradient_checkpoint.end_taskgraph"]
NUMBER_KEYS = ["amp.loss_scale", "communication.fp16_scale", "communication.timeout"]

# A valid, non-default value for every key, as it would appear in param_dict.
OVERRIDES = {
    "pipeline.num_micro_batch": 4,
    "pipeline.num_stages": 3,
    "pipeline.strategy": "PreferForward",
    "gradient_checkpoint.type": "collection",
    "gradient_checkpoint.end_taskgraph": 0,
    "gradient_checkpoint.check_gradients": True,
    "zero.level": "v1",
    "offload.level": "v0",
    "amp.level": "O1",
    "amp.debug_log": True,
    "amp.loss_scale": 1024.5,
    "optimizer.num_apply_group": 2,
    "cluster.device_place_prefer_intra_node": False,
    "cluster.run_visible_devices": "0,1",
    "cluster.colocate_split_and_replicate": True,
    "communication.num_communicators": 1,
    "communication.sparse_as_dense": True,
    "communication.max_splits": 7,
    "communication.fp16": True,
    "communication.fp16_scale": 64,
    "communication.timeout": 30,
    "communication.clip_after_allreduce": True,
    "communication.gradients_reduce_method": "sum",
    "io.slicing": True,
    "io.unbalanced_io_slicing": True,
    "io.drop_last_files": True,
    "auto.auto_parallel": True,
}

# key -> (environment variable, raw text, parsed value); all differ from the defaults.
ENV_OVERRIDES = {
    "pipeline.num_micro_batch": ("EPL_PIPELINE_NUM_MICRO_BATCH", "8", 8),
    "pipeline.num_stages": ("EPL_PIPELINE_NUM_STAGES", "2", 2),
    "pipeline.strategy": ("EPL_PIPELINE_STRATEGY", "preferforward", "PreferForward"),
    "gradient_checkpoint.type": ("EPL_GRADIENT_CHECKPOINT_TYPE", "auto", "auto"),
    "gradient_checkpoint.end_taskgraph": ("EPL_GRADIENT_CHECKPOINT_END_TASKGRAPH", "3", 3),
    "gradient_checkpoint.check_gradients": ("EPL_GRADIENT_CHECKPOINT_CHECK_GRADIENTS",
                                            "true", True),
    "zero.level": ("EPL_ZERO_LEVEL", "V1", "v1"),
    "offload.level": ("EPL_OFFLOAD_LEVEL", "v0", "v0"),
    "amp.level": ("EPL_AMP_LEVEL", "o1", "O1"),
    "amp.debug_log": ("EPL_AMP_DEBUG_LOG", "1", True),
    "amp.loss_scale": ("EPL_AMP_LOSS_SCALE", "512", 512),
    "optimizer.num_apply_group": ("EPL_OPTIMIZER_NUM_APPLY_GROUP", "4", 4),
    "cluster.device_place_prefer_intra_node": ("EPL_CLUSTER_DEVICE_PLACE_PREFER_INTRA_NODE",
                                               "no", False),
    "cluster.run_visible_devices": ("EPL_CLUSTER_RUN_VISIBLE_DEVICES", "2,3", "2,3"),
    "cluster.colocate_split_and_replicate": ("EPL_CLUSTER_COLOCATE_SPLIT_AND_REPLICATE",
                                             "YES", True),
    "communication.num_communicators": ("EPL_COMMUNICATION_NUM_COMMUNICATORS", "3", 3),
    "communication.sparse_as_dense": ("EPL_COMMUNICATION_SPARSE_AS_DENSE", "True", True),
    "communication.max_splits": ("EPL_COMMUNICATION_MAX_SPLITS", "9", 9),
    "communication.fp16": ("EPL_COMMUNICATION_FP16", "true", True),
    "communication.fp16_scale": ("EPL_COMMUNICATION_FP16_SCALE", "0.5", 0.5),
    "communication.timeout": ("EPL_COMMUNICATION_TIMEOUT", "2.5", 2.5),
    "communication.clip_after_allreduce": ("EPL_COMMUNICATION_CLIP_AFTER_ALLREDUCE", "1", True),
    "communication.gradients_reduce_method": ("EPL_COMMUNICATION_GRADIENTS_REDUCE_METHOD",
                                              "SUM", "sum"),
    "io.slicing": ("EPL_IO_SLICING", "yes", True),
    "io.unbalanced_io_slicing": ("EPL_IO_UNBALANCED_IO_SLICING", "TRUE", True),
    "io.drop_last_files": ("EPL_IO_DROP_LAST_FILES", "1", True),
    "auto.auto_parallel": ("EPL_AUTO_AUTO_PARALLEL", "true", True),
}

# key -> (value of the wrong type, text of the expected type).
BAD_TYPES = {
    "pipeline.num_micro_batch": ("4", "int"),
    "pipeline.num_stages": (2.0, "int or None"),
    "pipeline.strategy": (1, "str"),
    "gradient_checkpoint.type": (None, "str"),
    "gradient_checkpoint.end_taskgraph": ("-1", "int"),
    "gradient_checkpoint.check_gradients": ("true", "bool"),
    "zero.level": (1, "str"),
    "offload.level": (0, "str"),
    "amp.level": (1, "str"),
    "amp.debug_log": (1, "bool"),
    "amp.loss_scale": (True, "int or float or 'dynamic'"),
    "optimizer.num_apply_group": (1.5, "int"),
    "cluster.device_place_prefer_intra_node": (None, "bool"),
    "cluster.run_visible_devices": ([0, 1], "str"),
    "cluster.colocate_split_and_replicate": ("false", "bool"),
    "communication.num_communicators": (True, "int"),
    "communication.sparse_as_dense": (0, "bool"),
    "communication.max_splits": ("5", "int"),
    "communication.fp16": ("yes", "bool"),
    "communication.fp16_scale": ("128", "int or float"),
    "communication.timeout": ("600", "int or float"),
    "communication.clip_after_allreduce": (1.0, "bool"),
    "communication.gradients_reduce_method": (["mean"], "str"),
    "io.slicing": ("1", "bool"),
    "io.unbalanced_io_slicing": (None, "bool"),
    "io.drop_last_files": (1, "bool"),
    "auto.auto_parallel": ("True", "bool"),
}

# key -> (value of the right type that is not allowed, fragment of the allowed text).
# Every bool is allowed, so bool keys get their bad values from the environment instead.
BAD_VALUES = {
    "pipeline.num_micro_batch": (0, ">= 1"),
    "pipeline.num_stages": (0, "None or >= 1"),
    "pipeline.strategy": ("1F1B", "'PreferBackward', 'PreferForward'"),
    "gradient_checkpoint.type": ("checkpoints", "'', 'collection', 'auto'"),
    "gradient_checkpoint.end_taskgraph": (-2, ">= -1"),
    "zero.level": ("v2", "'', 'v1'"),
    "offload.level": ("v1", "'', 'v0'"),
    "amp.level": ("O2", "'', 'O1'"),
    "amp.loss_scale": ("static", "'dynamic' or a number > 0"),
    "optimizer.num_apply_group": (-1, ">= 1"),
    "cluster.run_visible_devices": ("0;1", "comma-separated"),
    "communication.num_communicators": (0, ">= 1"),
    "communication.max_splits": (-5, ">= 1"),
    "communication.fp16_scale": (0, "a number > 0"),
    "communication.timeout": (-1, "a number > 0"),
    "communication.gradients_reduce_method": ("avg", "'mean', 'sum'"),
}

# key -> (bad raw environment text, fragment of what the variable accepts).
BAD_ENV = {key: ("maybe", "true/1/yes/false/0/no") for key in BOOL_KEYS}
BAD_ENV.update({
    "pipeline.num_micro_batch": ("four", "an integer >= 1"),
    "pipeline.num_stages": ("0", "'none', '' or an integer >= 1"),
    "pipeline.strategy": ("gpipe", "'PreferBackward', 'PreferForward'"),
    "gradient_checkpoint.type": ("on", "'collection', 'auto'"),
    "gradient_checkpoint.end_taskgraph": ("1.5", "an integer >= -1"),
    "zero.level": ("v2", "'v1'"),
    "offload.level": ("yes", "'v0'"),
    "amp.level": ("O3", "'O1'"),
    "amp.loss_scale": ("-8", "'dynamic' or a number > 0"),
    "optimizer.num_apply_group": ("", "an integer >= 1"),
    "cluster.run_visible_devices": ("gpu0", "comma-separated"),
    "communication.num_communicators": ("0", "an integer >= 1"),
    "communication.max_splits": ("many", "an integer >= 1"),
    "communication.fp16_scale": ("nan", "a number > 0"),
    "communication.timeout": ("soon", "a number > 0"),
    "communication.gradients_reduce_method": ("max", "'mean', 'sum'"),
})


def assert_same(actual, expected):
    """Equal and of the same type: 1 == 1.0 == True must not hide a wrong type."""
    assert (actual, type(actual).__name__) == (expected, type(expected).__name__)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Tests must not see EPL_* variables from the developer's shell."""
    for name in list(os.environ):
        if name.startswith("EPL_"):
            monkeypatch.delenv(name)


def test_tables_in_this_file_cover_every_key():
    # The 26 keys of the seed configuration table plus EPL's extensions.
    assert len(KEYS) == 26 + len(EXTENSION_KEYS)
    assert [f.key for f in FIELDS if f.extension] == EXTENSION_KEYS
    for table in (OVERRIDES, ENV_OVERRIDES, BAD_TYPES, BAD_ENV):
        assert sorted(table) == sorted(KEYS)
    assert sorted(BAD_VALUES) == sorted(set(KEYS) - set(BOOL_KEYS))


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


@pytest.mark.parametrize("key", KEYS)
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


@pytest.mark.parametrize("key,suggestion", [
    ("pipeline.num_micro_batches", "pipeline.num_micro_batch"),
    ("num_micro_batch", "pipeline.num_micro_batch"),
    ("amp.los_scale", "amp.loss_scale"),
    ("pipline.num_stages", "pipeline.num_stages"),
    ("Pipeline.Num_Micro_Batch", "pipeline.num_micro_batch"),
    ("fp16", "communication.fp16"),
])
def test_unknown_key_suggests_closest(key, suggestion):
    with pytest.raises(ConfigError) as info:
        Config({key: 1})
    message = str(info.value)
    assert "Unknown config key {!r}".format(key) in message
    assert "Did you mean {!r}?".format(suggestion) in message
    section = suggestion.split(".")[0]
    section_keys = [k for k in KEYS if k.startswith(section + ".")]
    assert "Keys in section {!r}: {}.".format(section, ", ".join(section_keys)) in message


def test_key_in_wrong_section_suggests_the_right_one():
    with pytest.raises(ConfigError) as info:
        Config({"pipeline.fp16": True})
    message = str(info.value)
    assert "Did you mean 'communication.fp16'?" in message
    assert "pipeline.num_micro_batch, pipeline.num_stages, pipeline.strategy" in message


def test_unknown_key_lists_section_keys():
    with pytest.raises(ConfigError) as info:
        Config({"amp.los_scale": 8})
    assert "amp.level, amp.debug_log, amp.loss_scale" in str(info.value)


def test_ambiguous_bare_name_suggests_all():
    with pytest.raises(ConfigError) as info:
        Config({"level": "v1"})
    assert "'zero.level' or 'offload.level' or 'amp.level'" in str(info.value)


def test_section_name_as_key_explains_flat_keys():
    with pytest.raises(ConfigError, match="flat 'section.key'"):
        Config({"pipeline": {"num_micro_batch": 4}})


def test_non_string_key_rejected():
    with pytest.raises(ConfigError, match="of type int"):
        Config({1: 2})


def test_get_and_source_reject_unknown_keys():
    config = Config()
    with pytest.raises(ConfigError, match="pipeline.num_micro_batch"):
        config.get("pipeline.num_micro_batches")
    with pytest.raises(ConfigError, match="pipeline.num_micro_batch"):
        config.source("num_micro_batch")


@pytest.mark.parametrize("param_dict", [[("pipeline.num_micro_batch", 4)], "pipeline", 4,
                                        ("a", "b")])
def test_non_dict_param_dict_is_type_error(param_dict):
    with pytest.raises(TypeError, match="dict"):
        Config(param_dict)


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


def test_attribute_assignment_is_validated():
    config = Config()
    config.pipeline.num_micro_batch = 4
    assert config.pipeline.num_micro_batch == 4
    assert config.get("pipeline.num_micro_batch") == 4
    assert config.source("pipeline.num_micro_batch") == "set"
    for bad in (0, -1, "4", 4.0, True, None):
        with pytest.raises(ConfigError, match="pipeline.num_micro_batch"):
            config.pipeline.num_micro_batch = bad
    assert config.pipeline.num_micro_batch == 4
    with pytest.raises(ConfigError, match="'PreferBackward', 'PreferForward'"):
        config.pipeline.strategy = "1F1B"
    with pytest.raises(ConfigError, match="expects bool"):
        config.communication.fp16 = "true"
    assert config.pipeline.strategy == "PreferBackward"
    assert config.communication.fp16 is False


def test_unknown_attribute_assignment_is_rejected():
    config = Config()
    with pytest.raises(ConfigError, match="Did you mean 'pipeline.num_micro_batch'"):
        config.pipeline.num_micro_batches = 4
    with pytest.raises(ConfigError):
        config.pipeline.brand_new = 1
    with pytest.raises(ConfigError, match="Sections cannot be replaced"):
        config.pipeline = {"num_micro_batch": 4}
    with pytest.raises(ConfigError):
        config.new_section = 1
    with pytest.raises(ConfigError):
        del config.pipeline.num_micro_batch
    assert config == Config()
    assert not hasattr(config.pipeline, "brand_new")
    assert not hasattr(config, "new_section")


def test_unknown_attribute_read_is_attribute_error():
    config = Config()
    with pytest.raises(AttributeError, match="Did you mean 'pipeline.num_micro_batch'"):
        config.pipeline.num_micro_batches
    with pytest.raises(AttributeError, match="Did you mean 'pipeline'"):
        config.pipelin
    assert getattr(config.amp, "nope", "fallback") == "fallback"


def test_section_dir_lists_keys():
    assert dir(Config().amp) == ["debug_log", "level", "loss_scale"]


def test_equality_is_by_value(monkeypatch):
    monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCH", "4")
    from_env = Config()
    from_dict = Config({"pipeline.num_micro_batch": 4})
    assert from_env == from_dict
    assert from_env != Config({"pipeline.num_micro_batch": 5})
    assert Config() != EXPECTED_DEFAULTS
    with pytest.raises(TypeError):
        hash(Config())


def test_copy_is_independent():
    config = Config({"amp.level": "O1"})
    for clone in (config.copy(), copy.copy(config), copy.deepcopy(config)):
        assert clone == config and clone is not config
        assert clone.source("amp.level") == "dict"
        clone.amp.level = ""
        assert config.amp.level == "O1"
        assert clone.amp.level == ""


def test_copy_does_not_reread_env(monkeypatch):
    config = Config()
    monkeypatch.setenv("EPL_AMP_LEVEL", "O1")
    assert config.copy().amp.level == ""


def test_to_dict_is_a_copy():
    config = Config()
    flat = config.to_dict()
    flat["pipeline.num_micro_batch"] = 99
    assert config.pipeline.num_micro_batch == 1


def test_pickle_round_trip():
    config = Config(OVERRIDES)
    config.zero.level = ""
    restored = pickle.loads(pickle.dumps(config))
    assert restored == config
    assert restored.source("zero.level") == "set"
    assert restored.pipeline.num_micro_batch == 4


def test_repr_shows_only_changed_values():
    assert repr(Config()) == "Config({})"
    config = Config({"pipeline.num_micro_batch": 4, "amp.level": "o1"})
    assert repr(config) == "Config({'pipeline.num_micro_batch': 4, 'amp.level': 'O1'})"


def _line_for(text, key):
    lines = [line for line in text.splitlines() if line.strip().startswith(key + " ")]
    assert len(lines) == 1, (key, text)
    return lines[0]


def test_str_lists_every_key_with_value_and_source(monkeypatch):
    monkeypatch.setenv("EPL_COMMUNICATION_FP16", "1")
    config = Config({"pipeline.num_micro_batch": 4})
    config.amp.level = "O1"
    text = str(config)
    sources = {"pipeline.num_micro_batch": "(dict)",
               "communication.fp16": "(env EPL_COMMUNICATION_FP16)",
               "amp.level": "(set)"}
    for key in KEYS:
        line = _line_for(text, key)
        value = config.get(key)
        assert line.startswith("  " + key)
        assert " = {!r} ".format(value) in line
        assert line.rstrip().endswith(sources.get(key, "(default)"))
    headers = [line for line in text.splitlines() if line.startswith("[")]
    assert headers == ["[{}]".format(s) for s in dict.fromkeys(k.split(".")[0] for k in KEYS)]


def test_print_example_format(capsys):
    print(Config({"pipeline.num_micro_batch": 4}))
    out = capsys.readouterr().out
    line = _line_for(out, "pipeline.num_micro_batch")
    assert line.split() == ["pipeline.num_micro_batch", "=", "4", "(dict)"]


def test_field_table_is_consistent():
    assert [f.key for f in FIELDS] == KEYS
    env_vars = [f.env_var for f in FIELDS]
    assert env_vars == [ENV_OVERRIDES[k][0] for k in KEYS]
    assert len(set(env_vars)) == len(env_vars)
    assert all(f.doc and "|" not in f.doc for f in FIELDS)
    with pytest.raises(AttributeError):
        FIELDS[0].default = 2


def test_section_names_do_not_shadow_methods():
    sections = {k.split(".")[0] for k in KEYS}
    assert not sections & {"copy", "get", "keys", "source", "to_dict"}


def test_docs_mention_every_key_and_env_var():
    path = os.path.join(REPO_ROOT, "docs", "config.md")
    with open(path) as f:
        docs = f.read()
    for key in KEYS:
        assert "`{}`".format(key) in docs, key
        assert ENV_OVERRIDES[key][0] in docs, key
    assert "dict > environment variable > default" in docs
    assert markdown_table() in docs, "regenerate the table with: python -m epl.config"


def test_module_does_not_need_tensorflow():
    """Load config.py by path with TensorFlow made unimportable."""
    code = ("import importlib.util, sys\n"
            "sys.modules['tensorflow'] = None\n"
            "spec = importlib.util.spec_from_file_location('cfg', sys.argv[1])\n"
            "mod = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(mod)\n"
            "assert mod.Config().pipeline.num_micro_batch == 1\n"
            "assert 'tensorflow' not in [m for m in sys.modules if sys.modules[m]]\n")
    path = os.path.join(REPO_ROOT, "epl", "config.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPL_")}
    subprocess.run([sys.executable, "-c", code, path], check=True, env=env, timeout=60)
