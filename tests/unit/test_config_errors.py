"""Unit tests for epl.config: unknown keys, attribute rules, printing and the docs table."""
import copy
import os
import pickle
import subprocess
import sys

import pytest

from epl.config import FIELDS, Config, ConfigError, markdown_table
from config_tables import (  # noqa: F401
    assert_same, clean_env,
    REPO_ROOT, EXPECTED_DEFAULTS, KEYS, EXTENSION_KEYS, BOOL_KEYS, COUNT_KEYS, INT_KEYS,
    NUMBER_KEYS, OVERRIDES, ENV_OVERRIDES, BAD_TYPES, BAD_VALUES, BAD_ENV)


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
