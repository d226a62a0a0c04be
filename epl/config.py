"""EPL configuration: one typed table of keys, resolved as dict > environment > default.

Usage::

    import epl
    config = epl.Config({"pipeline.num_micro_batch": 4})
    config.pipeline.num_micro_batch      # 4
    config.get("amp.loss_scale")         # "dynamic", unless EPL_AMP_LOSS_SCALE is set
    config.pipeline.strategy = "preferforward"   # validated, stored as "PreferForward"
    print(config)                        # every key, its value and where it came from

Every key is declared exactly once, in ``FIELDS``. Parsing, validation, the environment
variable names (``EPL_<SECTION>_<KEY>``), printing and the table in docs/config.md are all
derived from it, so adding a key is a one-row change and the docs cannot silently drift
(``python -m epl.config`` prints the markdown table; a unit test compares it with the docs).

This module must not import TensorFlow: the config is read before any graph is built and
by tooling (launchers, linters, docs) that runs without TF installed.
"""
import difflib
import enum
import math
import numbers
import os
import re
from collections.abc import Mapping
from typing import Any, NamedTuple, Optional, Tuple

from epl.checks import is_integer

__all__ = ["Config", "ConfigError", "Field", "Kind", "FIELDS", "SECTIONS", "default_of",
           "markdown_table"]


class ConfigError(ValueError):
    """An unknown config key, a badly typed or disallowed value, or a bad EPL_* variable.

    It subclasses ValueError so callers that already catch ValueError keep working.
    """


class Kind(enum.Enum):
    """How a key's value is typed, parsed from the environment and validated."""

    INT = "int"
    OPTIONAL_INT = "int or None"
    BOOL = "bool"
    STR = "str"
    POSITIVE_NUMBER = "int or float"
    DEVICE_LIST = "str (device list)"


class Field(NamedTuple):
    """One config key. Immutable so the table cannot be changed behind the parser's back.

    ``choices`` are the allowed strings (matched case-insensitively, stored as spelled here);
    ``minimum`` is the inclusive lower bound of int kinds; ``extension`` marks keys EPL adds
    to the seed configuration table.
    """

    section: str
    name: str
    kind: Kind
    default: Any
    choices: Tuple[str, ...] = ()
    minimum: Optional[int] = None
    doc: str = ""
    extension: bool = False

    @property
    def key(self) -> str:
        """The flat "section.name" spelling used in param_dict and in messages."""
        return self.section + "." + self.name

    @property
    def env_var(self) -> str:
        """The environment variable that overrides the default, e.g. EPL_PIPELINE_NUM_STAGES."""
        return "EPL_" + self.key.replace(".", "_").upper()


_F = Field
FIELDS = (
    _F("pipeline", "num_micro_batch", Kind.INT, 1, minimum=1,
       doc="Micro-batches per step (pipeline), or gradient-accumulation steps with one "
           "TaskGraph."),
    _F("pipeline", "num_stages", Kind.OPTIONAL_INT, None, minimum=1,
       doc="Number of pipeline stages; used only with auto.auto_parallel."),
    _F("pipeline", "strategy", Kind.STR, "PreferBackward",
       choices=("PreferBackward", "PreferForward", "ZeroBubble"),
       doc="Pipeline schedule: PreferBackward is 1F1B (PipeDream-flush-like), "
           "PreferForward is GPipe-like; ZeroBubble (an EPL extension value) is ZB-H1: each "
           "stage's backward split into input gradients (B) and weight gradients (W), W "
           "moved into 1F1B's bubbles. It orders a pipeline's micro-batches (2+ stages and "
           "num_micro_batch > 1); anywhere else it has no effect and a warning says so."),
    _F("pipeline", "micro_batching", Kind.STR, "auto",
       choices=("auto", "stage_functions", "unrolled"), extension=True,
       doc="EPL extension: how the step is repeated per micro-batch of a pipeline and per "
           "local replica. \"stage_functions\" builds each stage's forward and backward once "
           "and calls them per repetition (graph size and start-up independent of "
           "num_micro_batch; what a function cannot hold, such as TF1 control flow and "
           "split layers' collectives, stays ops of each repetition); \"unrolled\" copies "
           "the stage graph per repetition; \"auto\" is \"stage_functions\"."),
    _F("pipeline", "call_executor", Kind.STR, "default", choices=("auto", "default"),
       extension=True,
       doc="EPL extension, for stage functions: which TensorFlow executor runs a call's "
           "body. \"auto\" runs each CPU stage function whose body TF's single-threaded "
           "executor accepts (all of it on the call's device, no control flow, calls, "
           "collectives or waiting kernels) on that executor, its nodes in order on the "
           "calling thread (kernels keep the intra-op threads), and the others, and every "
           "GPU stage, on TF's default executor; the log names which. TF's traced steps do "
           "not list the nodes of single-threaded bodies (EPL's memory and FLOPs profilers "
           "warn). \"default\": TF's default executor for every call (measured no faster "
           "on the ResNet-style and MoE pipelines, docs/design.md)."),
    _F("pipeline", "num_virtual_stages", Kind.INT, 1, minimum=1, extension=True,
       doc="EPL extension: model chunks per device (Megatron's interleaved 1F1B). With "
           "v > 1 the graph declares S * v epl.replicate(1) pipeline stages (S >= 2) and a "
           "model replica takes S devices: TaskGraph t runs on device t mod S, each device "
           "running its chunks in the order of its row of the interleaved schedule (any S "
           "and any num_micro_batch). Needs pipeline.strategy PreferBackward; split or "
           "wider stages, ZeRO and cluster.colocate_split_and_replicate are refused."),
    _F("pipeline", "zero_bubble_memory", Kind.STR, "pipeline", choices=("pipeline", "stage"),
       extension=True,
       doc="EPL extension, for pipeline.strategy ZeroBubble: \"pipeline\" (ZB-H1) keeps "
           "the pipeline's peak activations at 1F1B's (stage 0's) while later stages defer "
           "W and hold up to num_stages micro-batches; \"stage\" keeps every stage within "
           "1.1x of its own 1F1B peak: a stage defers a W only where that bound allows (it "
           "holds 30 or more micro-batches), elsewhere its B and W run fused as "
           "PreferBackward's, with 1F1B's step time."),
    _F("gradient_checkpoint", "type", Kind.STR, "", choices=("", "collection", "auto"),
       doc='Gradient checkpointing: "" is off, "collection" uses the tensors in the tf '
           'collection "checkpoints", "auto" selects them automatically.'),
    _F("gradient_checkpoint", "end_taskgraph", Kind.INT, -1, minimum=-1,
       doc="Last taskgraph index that auto gradient checkpointing applies to; -1 means all."),
    _F("gradient_checkpoint", "check_gradients", Kind.BOOL, False,
       doc="Validate the gradients computed with gradient checkpointing."),
    _F("zero", "level", Kind.STR, "", choices=("", "v0", "v1", "v2"),
       doc='"v0" partitions optimizer states; "v1" also partitions gradient reduction; '
           '"v2" (an EPL extension, beyond the original library) reduce-scatters gradients '
           'in fused buckets and all-gathers the updated weights in buckets.'),
    _F("offload", "level", Kind.STR, "", choices=("", "v0"),
       doc='"v0" offloads all weights to CPU memory.'),
    _F("amp", "level", Kind.STR, "", choices=("", "O1"),
       doc='Automatic mixed precision: "" is off, "O1" enables it.'),
    _F("amp", "debug_log", Kind.BOOL, False,
       doc="Log which ops automatic mixed precision converts."),
    _F("amp", "loss_scale", Kind.POSITIVE_NUMBER, "dynamic", choices=("dynamic",),
       doc='Loss scaling for AMP: "dynamic" or a fixed positive number.'),
    _F("optimizer", "num_apply_group", Kind.INT, 1, minimum=1,
       doc="Number of groups the gradient-apply ops are split into (lowers peak memory)."),
    _F("cluster", "device_place_prefer_intra_node", Kind.BOOL, True,
       doc="Prefer placing one model replica within a single node."),
    _F("cluster", "run_visible_devices", Kind.DEVICE_LIST, "",
       doc='Devices visible to the session, e.g. "0,1"; "" leaves visibility unchanged.'),
    _F("cluster", "colocate_split_and_replicate", Kind.BOOL, False,
       doc="Colocate split (model-parallel) and replicated taskgraphs on the same devices."),
    _F("cluster", "source", Kind.STR, "auto",
       choices=("auto", "tf_config", "slurm", "mpi", "torchrun", "local"), extension=True,
       doc="EPL extension: where epl.init finds the job's tasks. \"auto\": TF_CONFIG if set, "
           "else Slurm (srun), MPI or torchrun-style variables, else one local worker; sources "
           "that disagree are an error. A name uses only that source; \"local\" ignores them "
           "all (docs/clusters.md)."),
    _F("cluster", "port_base", Kind.INT, 20000, minimum=1024, extension=True,
       doc="EPL extension: lowest of the 10000 ports EPL derives when an engine names none "
           "(Slurm tasks' servers, from SLURM_JOB_ID; a one-host MPI job's rendezvous)."),
    _F("cluster", "rendezvous_timeout", Kind.POSITIVE_NUMBER, 300, extension=True,
       doc="EPL extension: seconds MPI and torchrun-style tasks wait for each other at the "
           "rendezvous where they exchange addresses, before failing with the missing ranks."),
    _F("cluster", "place_pruned_graph", Kind.BOOL, True, extension=True,
       doc="EPL extension: sessions of a one-task job (no server) place only the ops each "
           "run needs (TF's GraphOptions.place_pruned_graph): a faster first step on EPL's "
           "larger graphs, but TensorFlow 1.15 then runs no grappler on the main graph. "
           "false leaves the user's ConfigProto as it is (TF's default places and optimizes "
           "the whole graph at the first run); multi-task jobs never prune (docs/design.md)."),
    _F("communication", "num_communicators", Kind.INT, 2, minimum=1,
       doc="Number of communicators used concurrently for collective ops."),
    _F("communication", "sparse_as_dense", Kind.BOOL, False,
       doc="Convert sparse gradients to dense tensors before communication."),
    _F("communication", "sparse_reduction", Kind.STR, "gather",
       choices=("gather", "all_reduce", "auto"), extension=True,
       doc='EPL extension: how sparse gradients are reduced. "gather" all-gathers each '
           'replica\'s rows (row counts may differ); "all_reduce" all-reduces them as a dense '
           'buffer plus per-row touch counts and keeps the sparse update; "auto" picks per '
           'variable the one that moves fewer bytes (stated in the plan print).'),
    _F("communication", "max_splits", Kind.INT, 5, minimum=1,
       doc="Maximum number of gradient fusion buckets."),
    _F("communication", "fp16", Kind.BOOL, False,
       doc="Communicate gradients in fp16."),
    _F("communication", "fp16_scale", Kind.POSITIVE_NUMBER, 128,
       doc="Scale applied to gradients around fp16 communication to avoid underflow."),
    _F("communication", "timeout", Kind.POSITIVE_NUMBER, 600, extension=True,
       doc="EPL extension: seconds a session.run with collectives may wait before EPL reports "
           "the stuck collective group and worker and stops the process."),
    _F("communication", "clip_after_allreduce", Kind.BOOL, False,
       doc="Clip gradients after allreduce instead of before it."),
    _F("communication", "gradients_reduce_method", Kind.STR, "mean", choices=("mean", "sum"),
       doc="How gradients from replicas are combined."),
    _F("io", "slicing", Kind.BOOL, False,
       doc="Slice input files across data-parallel workers."),
    _F("io", "unbalanced_io_slicing", Kind.BOOL, False,
       doc="Allow workers to receive different numbers of files when slicing."),
    _F("io", "drop_last_files", Kind.BOOL, False,
       doc="Drop the trailing files that cannot be divided evenly across workers."),
    _F("auto", "auto_parallel", Kind.BOOL, False,
       doc="Experimental: parallelize the model automatically."),
    _F("checkpoint", "snapshot_steps", Kind.INT, 200, minimum=0, extension=True,
       doc="EPL extension: every N global steps, save the training state (weights, "
           "optimizer slots, AMP loss scale, global step) and each worker's input position "
           "to checkpoint.snapshot_dir, atomically; a restarted job resumes from the newest "
           "complete snapshot, exactly. 0 writes none."),
    _F("checkpoint", "snapshot_dir", Kind.STR, "", extension=True,
       doc="EPL extension: where snapshots go, on a file system every worker shares. \"\" "
           "writes none, except under epl-launch, which sets EPL_CHECKPOINT_SNAPSHOT_DIR to "
           "<log_dir>/epl_snapshots."),
    _F("checkpoint", "snapshot_keep", Kind.INT, 2, minimum=1, extension=True,
       doc="EPL extension: complete snapshots kept; when the newest is damaged, a restart "
           "uses the one before."),
)
del _F

_BY_KEY = {field.key: field for field in FIELDS}
SECTIONS = tuple(dict.fromkeys(field.section for field in FIELDS))
_BY_SECTION = {s: tuple(f for f in FIELDS if f.section == s) for s in SECTIONS}
_TYPE_NAMES = {Kind.INT: "int", Kind.OPTIONAL_INT: "int or None", Kind.BOOL: "bool",
               Kind.STR: "str", Kind.POSITIVE_NUMBER: "int or float", Kind.DEVICE_LIST: "str"}
_TRUE_TEXT = ("true", "1", "yes")
_FALSE_TEXT = ("false", "0", "no")
_DEVICE_LIST_RE = re.compile(r"[0-9]+(,[0-9]+)*")


# ---------------------------------------------------------------------------- descriptions
def _expected_type(field):
    """The type named in type errors; loss_scale also takes its one string."""
    names = _TYPE_NAMES[field.kind]
    if field.kind is Kind.POSITIVE_NUMBER and field.choices:
        names += " or " + " or ".join(repr(c) for c in field.choices)
    return names


def _allowed(field):
    """Human text for the allowed values, shared by error messages and the docs table."""
    kind = field.kind
    if kind is Kind.BOOL:
        return "True or False"
    if kind is Kind.INT:
        return ">= {}".format(field.minimum)
    if kind is Kind.OPTIONAL_INT:
        return "None or >= {}".format(field.minimum)
    if kind is Kind.POSITIVE_NUMBER:
        extra = "".join("{!r} or ".format(c) for c in field.choices)
        return extra + "a number > 0"
    if kind is Kind.DEVICE_LIST:
        return "'' or comma-separated distinct device indices >= 0, e.g. '0,1'"
    return "one of {} (case-insensitive)".format(", ".join(repr(c) for c in field.choices))


def _env_allowed(field):
    """Allowed spellings in an environment variable, where everything arrives as text."""
    if field.kind is Kind.BOOL:
        return "one of {} (case-insensitive)".format("/".join(_TRUE_TEXT + _FALSE_TEXT))
    if field.kind is Kind.OPTIONAL_INT:
        return "'none', '' or an integer >= {}".format(field.minimum)
    if field.kind is Kind.INT:
        return "an integer >= {}".format(field.minimum)
    return _allowed(field)


# ------------------------------------------------------------------------------ validation
def _type_error(field, value):
    return ConfigError("Config key {!r} expects {}, got {!r} of type {} (allowed: {}).".format(
        field.key, _expected_type(field), value, type(value).__name__, _allowed(field)))


def _value_error(field, value):
    return ConfigError("Config key {!r} does not allow {!r}; allowed: {}.".format(
        field.key, value, _allowed(field)))


def _is_int(value):
    """True for ints (and numpy ints) but not bools: True is not a count."""
    return is_integer(value)


def _check_int(field, value):
    if not _is_int(value):
        raise _type_error(field, value)
    if field.minimum is not None and value < field.minimum:
        raise _value_error(field, value)
    return int(value)


def _check_optional_int(field, value):
    return None if value is None else _check_int(field, value)


def _check_bool(field, value):
    if not isinstance(value, bool):
        raise _type_error(field, value)
    return value


def _canonical_choice(field, value):
    """Match case-insensitively but store the table's spelling, so comparisons stay exact."""
    for choice in field.choices:
        if choice.lower() == value.lower():
            return choice
    raise _value_error(field, value)


def _check_str(field, value):
    if not isinstance(value, str):
        raise _type_error(field, value)
    return _canonical_choice(field, value) if field.choices else value


def _check_positive_number(field, value):
    if isinstance(value, str) and field.choices:
        return _canonical_choice(field, value)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise _type_error(field, value)
    if not math.isfinite(value) or value <= 0:
        raise _value_error(field, value)
    return int(value) if _is_int(value) else float(value)


def _check_device_list(field, value):
    """Accept "0,1" (spaces ignored); duplicates are rejected because TF rejects them later."""
    if not isinstance(value, str):
        raise _type_error(field, value)
    compact = "".join(value.split())
    if compact and not _DEVICE_LIST_RE.fullmatch(compact):
        raise _value_error(field, value)
    indices = [int(part) for part in compact.split(",")] if compact else []
    if len(set(indices)) != len(indices):
        raise _value_error(field, value)
    return compact


_CHECKS = {Kind.INT: _check_int, Kind.OPTIONAL_INT: _check_optional_int,
           Kind.BOOL: _check_bool, Kind.STR: _check_str,
           Kind.POSITIVE_NUMBER: _check_positive_number, Kind.DEVICE_LIST: _check_device_list}


def _validate(field, value):
    """Return the canonical stored value for ``value`` or raise ConfigError."""
    return _CHECKS[field.kind](field, value)


# ----------------------------------------------------------------------- environment text
def _parse_bool_text(text):
    lowered = text.strip().lower()
    if lowered in _TRUE_TEXT:
        return True
    if lowered in _FALSE_TEXT:
        return False
    raise ValueError(text)


def _parse_optional_int_text(text):
    return None if text.strip().lower() in ("", "none") else int(text)


def _parse_number_text(text):
    """int, else float, else the raw text so the validator can accept "dynamic" or reject."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


_ENV_PARSERS = {Kind.INT: int, Kind.OPTIONAL_INT: _parse_optional_int_text,
                Kind.BOOL: _parse_bool_text, Kind.STR: str,
                Kind.POSITIVE_NUMBER: _parse_number_text, Kind.DEVICE_LIST: str}


def _from_env(field, raw):
    """Parse and validate one variable; errors name the variable, since that is what to fix."""
    try:
        return _validate(field, _ENV_PARSERS[field.kind](raw))
    except ValueError as err:  # includes ConfigError
        raise ConfigError(
            "Environment variable {}={!r} is not valid for config key {!r}: expected {}.".format(
                field.env_var, raw, field.key, _env_allowed(field))) from err


# ---------------------------------------------------------------------------- unknown keys
def _keys_named_like(name):
    """Keys whose last part is closest to ``name``; all of them when several share it."""
    names = list(dict.fromkeys(f.name for f in FIELDS))
    close = difflib.get_close_matches(name, names, n=1)
    return [f.key for f in FIELDS if close and f.name == close[0]]


def _suggest(key):
    """Closest valid keys: by name within a known section, by whole key, then by bare name."""
    lowered = key.lower()
    if lowered in _BY_KEY:
        return [lowered]
    section, _, name = lowered.rpartition(".")
    if section in _BY_SECTION:
        names = [f.name for f in _BY_SECTION[section]]
        found = [section + "." + n for n in difflib.get_close_matches(name, names, n=1)]
    elif section:
        found = difflib.get_close_matches(lowered, list(_BY_KEY), n=1)
    else:
        found = []
    return found or _keys_named_like(name)


def _unknown_key_message(key):
    """Say what was wrong, the likely intended key, and what the section really holds."""
    parts = ["Unknown config key {!r}.".format(key)]
    suggestions = _suggest(key)
    if suggestions:
        parts.append("Did you mean {}?".format(" or ".join(repr(s) for s in suggestions)))
    section = key.rpartition(".")[0]
    if section not in _BY_SECTION and key in _BY_SECTION:
        parts.append("{!r} is a section; config keys are flat 'section.key' strings.".format(key))
        section = key
    elif section not in _BY_SECTION and len(suggestions) == 1:
        section = suggestions[0].rpartition(".")[0]
    if section in _BY_SECTION:
        keys = ", ".join(f.key for f in _BY_SECTION[section])
        parts.append("Keys in section {!r}: {}.".format(section, keys))
    elif not suggestions:
        parts.append("Sections: {}.".format(", ".join(SECTIONS)))
    return " ".join(parts)


def _unknown_section_message(name):
    """For ``config.<name>``: suggest a section, else treat the name as a misplaced key."""
    close = difflib.get_close_matches(name.lower(), SECTIONS, n=1)
    if close:
        return "Config has no section {!r}. Did you mean {!r}? Sections: {}.".format(
            name, close[0], ", ".join(SECTIONS))
    return "Config has no section {!r}. {}".format(name, _unknown_key_message(name))


def _field_for(key):
    if not isinstance(key, str):
        raise ConfigError("Config keys are 'section.key' strings, got {!r} of type {}.".format(
            key, type(key).__name__))
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ConfigError(_unknown_key_message(key)) from None


def default_of(key):
    """The default of ``key`` ("section.name"), for units that compare a value with it:
    the table stays the one place a default is written."""
    return _field_for(key).default


# ---------------------------------------------------------------------------------- config
class _Section:
    """Attribute view of one section (``config.pipeline``); writes go through validation."""

    __slots__ = ("_config", "_section")

    def __init__(self, config, section):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_section", section)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        key = self._section + "." + name
        if key not in _BY_KEY:
            raise AttributeError(_unknown_key_message(key))
        return self._config.get(key)

    def __setattr__(self, name, value):
        self._config._assign(self._section + "." + name, value)

    def __delattr__(self, name):
        raise ConfigError("Config keys cannot be deleted: {}.{}".format(self._section, name))

    def __dir__(self):
        return [f.name for f in _BY_SECTION[self._section]]

    def __repr__(self):
        items = ", ".join("{}={!r}".format(f.name, self._config.get(f.key))
                          for f in _BY_SECTION[self._section])
        return "<config section {}: {}>".format(self._section, items)


class Config:
    """Resolved EPL settings: param_dict > EPL_<SECTION>_<KEY> environment variable > default.

    The environment is read once, here, so a config does not change under a running job.
    Values are reachable as ``config.<section>.<key>`` or ``config.get("section.key")``.
    """

    __slots__ = ("_values", "_sources", "_sections")
    __hash__ = None  # mutable, compared by value

    def __init__(self, param_dict=None):
        if param_dict is None:
            param_dict = {}
        if not isinstance(param_dict, Mapping):
            raise TypeError("Config(param_dict) expects a dict of flat 'section.key' entries, "
                            "got {!r} of type {}".format(param_dict, type(param_dict).__name__))
        given = {}
        for key, value in param_dict.items():
            given[key] = _validate(_field_for(key), value)
        values, sources = {}, {}
        for field in FIELDS:
            if field.key in given:
                values[field.key], sources[field.key] = given[field.key], "dict"
            elif field.env_var in os.environ:
                values[field.key] = _from_env(field, os.environ[field.env_var])
                sources[field.key] = "env " + field.env_var
            else:
                values[field.key], sources[field.key] = field.default, "default"
        self._set_state(values, sources)

    def _set_state(self, values, sources):
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_sources", sources)
        object.__setattr__(self, "_sections", {s: _Section(self, s) for s in SECTIONS})

    @classmethod
    def _restore(cls, values, sources):
        """Build a config from already validated state, without reading the environment."""
        config = cls.__new__(cls)
        config._set_state(dict(values), dict(sources))
        return config

    def _assign(self, key, value):
        field = _field_for(key)
        self._values[key] = _validate(field, value)
        self._sources[key] = "set"

    @classmethod
    def keys(cls):
        """All flat keys, in table order."""
        return tuple(_BY_KEY)

    def get(self, key):
        """Value of a flat "section.key"; unknown keys raise ConfigError with a suggestion."""
        return self._values[_field_for(key).key]

    def source(self, key):
        """Where the value came from: "default", "env EPL_...", "dict" or "set" (assigned)."""
        return self._sources[_field_for(key).key]

    def to_dict(self):
        """A fresh flat {"section.key": value} dict; editing it does not change the config."""
        return dict(self._values)

    def copy(self):
        """An independent config with the same values and sources (the env is not re-read)."""
        return Config._restore(self._values, self._sources)

    __copy__ = copy

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        return (Config._restore, (self._values, self._sources))

    def __eq__(self, other):
        if not isinstance(other, Config):
            return NotImplemented
        return self._values == other._values

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._sections:
            return self._sections[name]
        raise AttributeError(_unknown_section_message(name))

    def __setattr__(self, name, value):
        hint = ("Sections cannot be replaced." if name in _BY_SECTION
                else _unknown_section_message(name))
        raise ConfigError("Cannot set config attribute {!r}: assign keys as "
                          "config.<section>.<key> = value. {}".format(name, hint))

    def __delattr__(self, name):
        raise ConfigError("Config attributes cannot be deleted: {!r}.".format(name))

    def __dir__(self):
        return list(SECTIONS) + ["copy", "get", "keys", "source", "to_dict"]

    def __repr__(self):
        changed = {f.key: self._values[f.key] for f in FIELDS
                   if self._values[f.key] != f.default}
        return "Config({!r})".format(changed)

    def __str__(self):
        width = max(len(key) for key in _BY_KEY)
        shown = {key: repr(value) for key, value in self._values.items()}
        value_width = max(len(text) for text in shown.values())
        lines = ["EPL config (dict > env EPL_<SECTION>_<KEY> > default):"]
        for section in SECTIONS:
            lines.append("[{}]".format(section))
            for field in _BY_SECTION[section]:
                lines.append("  {:<{w}} = {:<{vw}}  ({})".format(
                    field.key, shown[field.key], self._sources[field.key],
                    w=width, vw=value_width))
        return "\n".join(lines)


def markdown_table():
    """The key table of docs/config.md, generated so the docs match the code exactly."""
    rows = ["| Key | Type | Default | Allowed | Env var | Description |",
            "|---|---|---|---|---|---|"]
    for field in FIELDS:
        rows.append("| `{}`{} | {} | `{!r}` | {} | `{}` | {} |".format(
            field.key, " (EPL extension)" if field.extension else "", _expected_type(field),
            field.default, _allowed(field), field.env_var, field.doc))
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
