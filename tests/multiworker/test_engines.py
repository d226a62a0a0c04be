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
