"""Expected config values for the config tests, written out literally (not read from
the FIELDS table) so that an accidental change to the key table is caught."""
import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPECTED_DEFAULTS = {
    "pipeline.num_micro_batch": 1,
    "pipeline.num_stages": None,
    "pipeline.strategy": "PreferBackward",
    "pipeline.micro_batching": "auto",
    "pipeline.zero_bubble_memory": "pipeline",
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
    "cluster.source": "auto",
    "cluster.port_base": 20000,
    "cluster.rendezvous_timeout": 300,
    "cluster.place_pruned_graph": True,
    "communication.num_communicators": 2,
    "communication.sparse_as_dense": False,
    "communication.sparse_reduction": "gather",
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
    "checkpoint.snapshot_steps": 200,
    "checkpoint.snapshot_dir": "",
    "checkpoint.snapshot_keep": 2,
}
KEYS = list(EXPECTED_DEFAULTS)
EXTENSION_KEYS = ["pipeline.micro_batching", "pipeline.zero_bubble_memory", "cluster.source",
                  "cluster.port_base", "cluster.rendezvous_timeout", "cluster.place_pruned_graph",
                  "communication.sparse_reduction", "communication.timeout",
                  "checkpoint.snapshot_steps",
                  "checkpoint.snapshot_dir", "checkpoint.snapshot_keep"]
FREE_TEXT_KEYS = ["checkpoint.snapshot_dir"]  # any text is a value: no bad value to give
BOOL_KEYS = [k for k, v in EXPECTED_DEFAULTS.items() if isinstance(v, bool)]
COUNT_KEYS = ["pipeline.num_micro_batch", "optimizer.num_apply_group",
              "communication.num_communicators", "communication.max_splits"]
INT_KEYS = COUNT_KEYS + ["pipeline.num_stages", "gradient_checkpoint.end_taskgraph",
                         "cluster.port_base", "checkpoint.snapshot_steps",
                         "checkpoint.snapshot_keep"]
NUMBER_KEYS = ["amp.loss_scale", "communication.fp16_scale", "cluster.rendezvous_timeout",
               "communication.timeout"]

# A valid, non-default value for every key, as it would appear in param_dict.
OVERRIDES = {
    "pipeline.num_micro_batch": 4,
    "pipeline.num_stages": 3,
    "pipeline.strategy": "PreferForward",
    "pipeline.micro_batching": "unrolled",
    "pipeline.zero_bubble_memory": "stage",
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
    "cluster.source": "slurm",
    "cluster.port_base": 30000,
    "cluster.rendezvous_timeout": 60,
    "cluster.place_pruned_graph": False,
    "communication.num_communicators": 1,
    "communication.sparse_as_dense": True,
    "communication.sparse_reduction": "auto",
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
    "checkpoint.snapshot_steps": 0,
    "checkpoint.snapshot_dir": "/shared/snapshots",
    "checkpoint.snapshot_keep": 3,
}

# key -> (environment variable, raw text, parsed value); all differ from the defaults.
ENV_OVERRIDES = {
    "pipeline.num_micro_batch": ("EPL_PIPELINE_NUM_MICRO_BATCH", "8", 8),
    "pipeline.num_stages": ("EPL_PIPELINE_NUM_STAGES", "2", 2),
    "pipeline.strategy": ("EPL_PIPELINE_STRATEGY", "preferforward", "PreferForward"),
    "pipeline.micro_batching": ("EPL_PIPELINE_MICRO_BATCHING", "Unrolled", "unrolled"),
    "pipeline.zero_bubble_memory": ("EPL_PIPELINE_ZERO_BUBBLE_MEMORY", "Stage", "stage"),
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
    "cluster.source": ("EPL_CLUSTER_SOURCE", "Local", "local"),
    "cluster.port_base": ("EPL_CLUSTER_PORT_BASE", "41000", 41000),
    "cluster.rendezvous_timeout": ("EPL_CLUSTER_RENDEZVOUS_TIMEOUT", "12.5", 12.5),
    "cluster.place_pruned_graph": ("EPL_CLUSTER_PLACE_PRUNED_GRAPH", "false", False),
    "communication.num_communicators": ("EPL_COMMUNICATION_NUM_COMMUNICATORS", "3", 3),
    "communication.sparse_as_dense": ("EPL_COMMUNICATION_SPARSE_AS_DENSE", "True", True),
    "communication.sparse_reduction": ("EPL_COMMUNICATION_SPARSE_REDUCTION", "All_Reduce",
                                       "all_reduce"),
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
    "checkpoint.snapshot_steps": ("EPL_CHECKPOINT_SNAPSHOT_STEPS", "25", 25),
    "checkpoint.snapshot_dir": ("EPL_CHECKPOINT_SNAPSHOT_DIR", "/tmp/snaps", "/tmp/snaps"),
    "checkpoint.snapshot_keep": ("EPL_CHECKPOINT_SNAPSHOT_KEEP", "5", 5),
}

# key -> (value of the wrong type, text of the expected type).
BAD_TYPES = {
    "pipeline.num_micro_batch": ("4", "int"),
    "pipeline.num_stages": (2.0, "int or None"),
    "pipeline.strategy": (1, "str"),
    "pipeline.micro_batching": (True, "str"),
    "pipeline.zero_bubble_memory": (2, "str"),
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
    "cluster.source": (["slurm"], "str"),
    "cluster.port_base": ("20000", "int"),
    "cluster.rendezvous_timeout": ("300", "int or float"),
    "cluster.place_pruned_graph": ("true", "bool"),
    "communication.num_communicators": (True, "int"),
    "communication.sparse_as_dense": (0, "bool"),
    "communication.sparse_reduction": (True, "str"),
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
    "checkpoint.snapshot_steps": (10.0, "int"),
    "checkpoint.snapshot_dir": (None, "str"),
    "checkpoint.snapshot_keep": ("2", "int"),
}

# key -> (value of the right type that is not allowed, fragment of the allowed text).
# Every bool is allowed, so bool keys get their bad values from the environment instead.
BAD_VALUES = {
    "pipeline.num_micro_batch": (0, ">= 1"),
    "pipeline.num_stages": (0, "None or >= 1"),
    "pipeline.strategy": ("1F1B", "'PreferBackward', 'PreferForward'"),
    "pipeline.micro_batching": ("loop", "'auto', 'stage_functions', 'unrolled'"),
    "pipeline.zero_bubble_memory": ("device", "'pipeline', 'stage'"),
    "gradient_checkpoint.type": ("checkpoints", "'', 'collection', 'auto'"),
    "gradient_checkpoint.end_taskgraph": (-2, ">= -1"),
    "zero.level": ("v3", "'', 'v0', 'v1', 'v2'"),
    "offload.level": ("v1", "'', 'v0'"),
    "amp.level": ("O2", "'', 'O1'"),
    "amp.loss_scale": ("static", "'dynamic' or a number > 0"),
    "optimizer.num_apply_group": (-1, ">= 1"),
    "cluster.run_visible_devices": ("0;1", "comma-separated"),
    "cluster.source": ("kubernetes", "'auto', 'tf_config', 'slurm', 'mpi', 'torchrun', 'local'"),
    "cluster.port_base": (80, ">= 1024"),
    "cluster.rendezvous_timeout": (0, "a number > 0"),
    "communication.num_communicators": (0, ">= 1"),
    "communication.max_splits": (-5, ">= 1"),
    "communication.sparse_reduction": ("dense", "'gather', 'all_reduce', 'auto'"),
    "communication.fp16_scale": (0, "a number > 0"),
    "communication.timeout": (-1, "a number > 0"),
    "communication.gradients_reduce_method": ("avg", "'mean', 'sum'"),
    "checkpoint.snapshot_steps": (-1, ">= 0"),
    "checkpoint.snapshot_keep": (0, ">= 1"),
}

# key -> (bad raw environment text, fragment of what the variable accepts).
BAD_ENV = {key: ("maybe", "true/1/yes/false/0/no") for key in BOOL_KEYS}
BAD_ENV.update({
    "pipeline.num_micro_batch": ("four", "an integer >= 1"),
    "pipeline.num_stages": ("0", "'none', '' or an integer >= 1"),
    "pipeline.strategy": ("gpipe", "'PreferBackward', 'PreferForward'"),
    "pipeline.micro_batching": ("copies", "'auto', 'stage_functions', 'unrolled'"),
    "pipeline.zero_bubble_memory": ("worker", "'pipeline', 'stage'"),
    "gradient_checkpoint.type": ("on", "'collection', 'auto'"),
    "gradient_checkpoint.end_taskgraph": ("1.5", "an integer >= -1"),
    "zero.level": ("v3", "'v2'"),
    "offload.level": ("yes", "'v0'"),
    "amp.level": ("O3", "'O1'"),
    "amp.loss_scale": ("-8", "'dynamic' or a number > 0"),
    "optimizer.num_apply_group": ("", "an integer >= 1"),
    "cluster.run_visible_devices": ("gpu0", "comma-separated"),
    "cluster.source": ("ray", "'torchrun', 'local'"),
    "cluster.port_base": ("high", "an integer >= 1024"),
    "cluster.rendezvous_timeout": ("never", "a number > 0"),
    "communication.num_communicators": ("0", "an integer >= 1"),
    "communication.max_splits": ("many", "an integer >= 1"),
    "communication.sparse_reduction": ("allgather", "'gather', 'all_reduce', 'auto'"),
    "communication.fp16_scale": ("nan", "a number > 0"),
    "communication.timeout": ("soon", "a number > 0"),
    "communication.gradients_reduce_method": ("max", "'mean', 'sum'"),
    "checkpoint.snapshot_steps": ("-3", "an integer >= 0"),
    "checkpoint.snapshot_keep": ("two", "an integer >= 1"),
})


def assert_same(actual, expected):
    """Equal and of the same type: 1 == 1.0 == True must not hide a wrong type."""
    assert (actual, type(actual).__name__) == (expected, type(expected).__name__)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Tests must not see EPL_* variables from the developer's shell (autouse in every
    module that imports it)."""
    for name in list(os.environ):
        if name.startswith("EPL_"):
            monkeypatch.delenv(name)
