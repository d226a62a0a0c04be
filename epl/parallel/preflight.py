"""Refusals that need only the config and the cluster, made by ``epl.init``.

A combination of keys that EPL refuses whatever the model is must be refused
before the model is built: on a real model, building the graph and rewriting it
take minutes, and an error at the first ``session.run`` throws them away. Each
check lives with its feature, whose pass or unit calls it too (a program that
calls the rewrite directly, as tests do, still gets the refusal); this module
lists them in one place, and ``epl.init`` runs them after it has the cluster.

Example::

    preflight.check(epl.Config({"pipeline.num_stages": 2}), cluster)
    # ConfigError: pipeline.num_stages=2 is only read by automatic parallelism ...
"""
from epl.communicators import ring
from epl.parallel import partition
from epl.parallel.file_shards import check_options
from epl.runtime import gradient_checkpoint, zero_partition


def _stages_without_auto_parallel(config, cluster):
    partition.check_config(config)


def _auto_stages_divide_the_devices(config, cluster):
    stages = partition.stage_count(config)
    if config.auto.auto_parallel and stages > 1:
        partition.check_devices(stages, cluster.worker_num, cluster.gpu_num_per_worker)


def _checkpointing_with_auto_stages(config, cluster):
    gradient_checkpoint.check_config(config)


def _zero_with_what_it_cannot_combine(config, cluster):
    zero_partition.refuse_what_cannot_combine(config.zero.level, config.communication)


def _io_slicing_options(config, cluster):
    check_options(config.io.slicing, config.io.drop_last_files, config.io.unbalanced_io_slicing)


def _collective_backend_variables(config, cluster):
    """EPL_COLLECTIVE_BACKEND and EPL_RING_SHARED_MEMORY (not config keys: environment
    variables read when the first collective is built)."""
    ring.backend_choice()
    ring.shared_memory_choice()


# (config, cluster) -> None, or raises naming the keys; in the order of the passes.
REFUSALS = (_stages_without_auto_parallel, _auto_stages_divide_the_devices,
            _checkpointing_with_auto_stages, _zero_with_what_it_cannot_combine,
            _io_slicing_options, _collective_backend_variables)


def check(config, cluster, refusals=REFUSALS):
    """Raise the first refusal of ``config`` on ``cluster`` (a ValueError naming the keys)."""
    for refusal in refusals:
        refusal(config, cluster)
