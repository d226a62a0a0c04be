"""The same script under every cluster engine, emulated with local processes.

epl-launch, Kubeflow TFJob's TF_CONFIG (chief + worker), Slurm's srun variables,
Open MPI's mpirun variables and torchrun's variables each start the worker script
once per task; every engine's job ends with the weights of the epl-launch job
(max |diff| <= 1e-6) on 2 workers x 1 device and 2 x 2, and those match serial
training. Then the TFJob evaluator: chief and worker train, the evaluator task
evaluates the checkpoints. Then the inputs that must fail, each in a real
process: an unparsable host list, a rank outside the world size, a rank that
never comes to the rendezvous, a Slurm batch script outside srun.
"""
import json
import os

import numpy as np
import pytest

from engineutil import (describe, free_port, mpi_envs, python, run_tasks, slurm_envs,
                        slurm_job_id_with_free_ports, tfjob_envs, torchrun_envs)
from eplutil import make_data, max_diff, run_launcher, serial_train

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "engine_train.py")
BATCH, STEPS, WORKERS = 4, 3, 2
LAYOUTS = [(2, 1), (2, 2)]
ENGINES = ["tfjob", "slurm", "mpi", "torchrun"]
TOLERANCE = 1e-6
SOURCE_NAMES = {"tfjob": "TF_CONFIG", "slurm": "Slurm", "mpi": "MPI", "torchrun": "torchrun"}


def _engine_envs(engine, devices):
    """One environment per task of a 2-task job under ``engine``, on this host."""
    if engine == "tfjob":
        envs = tfjob_envs(["127.0.0.1:%d" % free_port() for _ in range(WORKERS)])
    elif engine == "slurm":   # one node, one task per device block ("one task per GPU")
        job_id = slurm_job_id_with_free_ports(WORKERS)
        envs = slurm_envs("localhost", ["localhost"], WORKERS, job_id)
    elif engine == "mpi":     # mpirun -np 2 on one host: the rendezvous needs no address
        envs = mpi_envs(WORKERS)
    else:
        envs = torchrun_envs(WORKERS, ("127.0.0.1", free_port()))
    for env in envs:
        env["EPL_NUM_VIRTUAL_DEVICES"] = str(devices)
        env["EPL_CLUSTER_RENDEZVOUS_TIMEOUT"] = "60"
    return envs


def _weights(folder):
    return [dict(np.load(os.path.join(folder, "worker_%d.npz" % w))) for w in range(WORKERS)]


def _reports(folder):
    return [json.load(open(os.path.join(folder, "worker_%d.json" % w))) for w in range(WORKERS)]


_LAUNCHED = {}


def _launched(tmp_path_factory, devices):
    """The epl-launch job's weights for this layout (run once per module)."""
    if devices not in _LAUNCHED:
        out = tmp_path_factory.mktemp("launch_%dx%d" % (WORKERS, devices))
        code, output = run_launcher([
            "--num_workers", str(WORKERS), "--gpu_per_worker", str(devices),
            "--log_dir", str(out / "logs"), SCRIPT, str(out), str(STEPS), str(BATCH)])
        assert code == 0, output[-3000:]
        weights = _weights(str(out))
        global_batch = WORKERS * devices * BATCH
        x, y = make_data(global_batch * STEPS)
        _, reference = serial_train(x, y, global_batch, STEPS)
        for name, ref in reference.items():
            key = name.replace("/", "__")
            if key in weights[0]:
                assert max_diff(ref, [c for w in weights for c in w[key]]) < 1e-5, name
        assert all(r["source"] == "TF_CONFIG" for r in _reports(str(out)))
        _LAUNCHED[devices] = weights
    return _LAUNCHED[devices]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["2x1", "2x2"])
def test_engine_matches_epl_launch(tmp_path, tmp_path_factory, engine, layout):
    workers, devices = layout
    reference = _launched(tmp_path_factory, devices)
    results = run_tasks(python(SCRIPT) + [str(tmp_path), str(STEPS), str(BATCH)],
                        _engine_envs(engine, devices), timeout=200)
    assert all(code == 0 for code, _ in results), describe(results)
    reports = _reports(str(tmp_path))
    for rank, report in enumerate(reports):
        assert report["source"] == SOURCE_NAMES[engine] and report["index"] == rank, report
        assert "cluster from %s" % SOURCE_NAMES[engine] in results[rank][1]  # epl.init's log
    assert reports[0]["hosts"] == reports[1]["hosts"] and len(reports[0]["hosts"]) == workers
    weights = _weights(str(tmp_path))
    for worker in range(workers):
        for key, copies in reference[worker].items():
            diff = max_diff(copies, list(weights[worker][key]))
            print("ENGINE_TABLE %s %dx%d %s %.3g" % (engine, workers, devices, key, diff))
            assert diff <= TOLERANCE, (engine, worker, key)


# ------------------------------------------------------------------------- the evaluator
def _eval_events(model_dir):
    """{global step: loss} of the evaluation summaries in ``model_dir``/eval."""
    import tensorflow.compat.v1 as tf
    found = {}
    folder = os.path.join(model_dir, "eval")
    for name in sorted(os.listdir(folder)):
        for event in tf.train.summary_iterator(os.path.join(folder, name)):
            for value in event.summary.value:
                if value.tag == "loss":
                    found[int(event.step)] = float(value.simple_value)
    return found


@pytest.mark.timeout(300)
def test_tfjob_evaluator_evaluates_what_chief_and_worker_train(tmp_path):
    """TFJob's layout for train_and_evaluate: the chief and the worker train under EPL
    (2 x 2 devices, data parallel), the evaluator task, outside the training cluster,
    evaluates their checkpoints until the last one; the chief does not evaluate."""
    import sys
    import tensorflow.compat.v1 as tf
    import epl
    sys.path.insert(0, os.path.join(HERE, "scripts"))
    from estimator_model import (checkpoint_weights, input_fn, make_model_fn,
                                 max_weight_diff, run_config, serial_estimator_train)
    devices = 2
    envs = tfjob_envs(["127.0.0.1:%d" % free_port() for _ in range(WORKERS)], evaluator=True)
    for env in envs:
        env["EPL_NUM_VIRTUAL_DEVICES"] = str(devices)
    script = os.path.join(HERE, "scripts", "estimator_tae.py")
    results = run_tasks(python(script) + [str(tmp_path), str(STEPS), str(BATCH)], envs,
                        timeout=240)
    assert all(code == 0 for code, _ in results), describe(results)
    chief, evaluator = (json.load(open(str(tmp_path / (n + ".json"))))
                        for n in ("chief", "evaluator"))
    assert chief["metrics"] is None and chief["workers"] == WORKERS   # the chief only trains
    assert "trains only" in results[0][1]
    assert evaluator["run_config_task"] == ["evaluator", 0] and not evaluator["distributed"]
    assert "not part of the training cluster" in results[2][1]
    model_dir = str(tmp_path / "model")
    global_batch = WORKERS * devices * BATCH
    x, y = make_data(global_batch * STEPS)
    reference = serial_estimator_train(x, y, global_batch, STEPS, tmp_path / "serial")
    trained = checkpoint_weights(model_dir)
    assert trained["global_step"] == STEPS
    assert max_weight_diff(reference, trained) < 1e-5
    losses = _eval_events(model_dir)
    print("EVALUATOR evaluated steps %s: %s" % (sorted(losses), losses))
    with epl.paused():   # the final checkpoint evaluated by plain TensorFlow
        plain = tf.estimator.Estimator(make_model_fn(), config=run_config(model_dir))
        expected = plain.evaluate(input_fn(*make_data(16, seed=7), batch=8), steps=2,
                                  name="plain")
    assert max(losses) == STEPS
    assert losses[STEPS] == pytest.approx(expected["loss"], abs=1e-6)


# ------------------------------------------------------------------------- bad inputs
def _slurm_task(**changes):
    env = slurm_envs("node[01-02]", ["node01", "node02"], 1, 4242)[1]
    env.update(changes)
    return env


BAD_JOBS = {
    # what the engine gave, the message every task must print, how many tasks there are
    "unparsable hostlist": ([_slurm_task(SLURM_STEP_NODELIST="node[01-02",
                                         SLURM_JOB_NODELIST="node[01-02")],
                            [r"SLURM_STEP_NODELIST 'node\[01-02': '\[' without '\]'"]),
    "slurm rank outside the world": ([_slurm_task(SLURM_PROCID="2")],
                                     [r"SLURM_PROCID=2 is outside the step's 2 task\(s\)"]),
    "torchrun rank outside the world": (
        [dict(torchrun_envs(2, ("127.0.0.1", 1))[1], RANK="5")],
        [r"RANK=5 is outside the world of WORLD_SIZE=2 ranks"]),
    "missing rank at the rendezvous": (
        "torchrun-3", [r"rank\(s\) \[2\] of 3 never arrived within 5 s"] * 2),
    "slurm batch script outside srun": (
        [{"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
          "SLURM_JOB_NODELIST": "node[01-04]"}],
        [r"SLURM_NTASKS=4 tasks but was not started by srun"]),
    "sources that disagree": (
        [dict(_slurm_task(), TF_CONFIG=json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                   "task": {"type": "worker", "index": 0}}))],
        [r"Two cluster sources disagree about this process: TF_CONFIG says rank 0 of 2.*"
         r"Slurm says rank 1 of 2"]),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(BAD_JOBS))
def test_a_job_that_cannot_be_joined_fails_in_epl_init(tmp_path, case):
    """Every task of a job EPL cannot form exits non-zero at epl.init with a message that
    names the problem, before training anything (no weights are written)."""
    import re
    envs, patterns = BAD_JOBS[case]
    if envs == "torchrun-3":   # ranks 0 and 1 of 3 come; rank 2 never does
        envs = torchrun_envs(3, ("127.0.0.1", free_port()))[:2]
        for env in envs:
            env["EPL_CLUSTER_RENDEZVOUS_TIMEOUT"] = "5"
    results = run_tasks(python(SCRIPT) + [str(tmp_path), str(STEPS), str(BATCH)], envs,
                        timeout=90)
    for (code, output), pattern in zip(results, patterns):
        assert code == 1, describe(results)   # an uncaught error: permanent for engines
        assert re.search(r"(Cluster|Hostlist|Rendezvous)Error", output), output[-2000:]
        assert re.search(pattern, output), (pattern, output[-2000:])
    assert not [name for name in os.listdir(str(tmp_path)) if name.endswith(".npz")]
