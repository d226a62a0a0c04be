"""Which engine's variables make the cluster (epl.cluster.discovery, epl.cluster.mpi):
pure functions on simulated environments, the rendezvous replaced by a stub."""
import json

import pytest

from epl.cluster import discovery, mpi
from epl.cluster.common import ClusterError
from epl.cluster.discovery import Options, discover

AUTO = Options("auto", 20000, 30)


def tf_config(hosts, index, task_type="worker"):
    return json.dumps({"cluster": {"worker": hosts}, "task": {"type": task_type,
                                                              "index": index}})


def slurm_step(rank, size=2):
    return {"SLURM_JOB_ID": "10", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(size), "SLURM_STEP_NODELIST": "n[1-%d]" % size,
            "SLURM_STEP_TASKS_PER_NODE": "1(x%d)" % size, "SLURM_NODEID": str(rank),
            "SLURM_LOCALID": "0"}


def torchrun(rank, size=2, **extra):
    env = {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    env.update(extra)
    return env


class Stub(object):
    """The rendezvous: records its calls, answers with made-up addresses."""

    def __init__(self):
        self.calls = []

    def __call__(self, address, rank, size, port, token, timeout):
        self.calls.append((address, rank, size, port, token, timeout))
        return ["10.0.0.%d:%d" % (r + 1, 5000 + r) for r in range(size)]


def found(environ, opts=AUTO, **kwargs):
    kwargs.setdefault("exchange", Stub())
    kwargs.setdefault("pick_port", lambda: 4321)
    return discover(environ, opts, **kwargs)


def test_nothing_set_is_one_local_worker():
    result = found({"HOME": "/root"})
    assert (result.source, result.hosts, result.index) == ("local", None, 0)
    assert "one local worker" in result.detail


def test_tf_config_is_read():
    result = found({"TF_CONFIG": tf_config(["a:1", "b:2"], 1)})
    assert (result.source, result.hosts, result.index) == ("TF_CONFIG", ("a:1", "b:2"), 1)
    assert result.detail == "TF_CONFIG (task worker:1, worker 1 of 2)"


def test_an_evaluator_is_one_local_worker_of_its_own():
    result = found({"TF_CONFIG": tf_config(["a:1", "b:2"], 0, "evaluator")})
    assert (result.hosts, result.index, result.task_type) == (None, 0, "evaluator")
    assert "not part of the training cluster of 2 task(s)" in result.detail


def test_slurm_is_read_without_a_rendezvous():
    stub = Stub()
    result = found(slurm_step(1), exchange=stub)
    assert result.source == "Slurm" and result.index == 1 and not stub.calls
    assert result.hosts == ("n1:20010", "n2:20010")


def test_torchrun_meets_at_master_addr_and_port():
    stub = Stub()
    result = found(torchrun(1), exchange=stub)
    assert stub.calls == [(("10.0.0.1", 29500), 1, 2, 4321, "torchrun/2", 30)]
    assert result.hosts == ("10.0.0.1:5000", "10.0.0.2:5001") and result.index == 1
    assert "RANK=1 of WORLD_SIZE=2, rendezvous at 10.0.0.1:29500" in result.detail


def test_a_second_epl_init_reuses_the_rendezvous():
    first = found(torchrun(1))
    stub = Stub()
    assert found(torchrun(1), previous=first, exchange=stub) is first and not stub.calls
    other = found(torchrun(1, MASTER_PORT="29501"), previous=first, exchange=stub)
    assert other is not first and len(stub.calls) == 1


def test_torchrun_agent_store_takes_the_next_port():
    stub = Stub()
    found(torchrun(0, TORCHELASTIC_USE_AGENT_STORE="True"), exchange=stub)
    assert stub.calls[0][0] == ("10.0.0.1", 29501)


def test_mpi_on_one_host_meets_on_a_derived_local_port():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    stub = Stub()
    result = found(env, exchange=stub, parent_pid=777)
    (host, port), rank, size = stub.calls[0][:3]
    assert (host, rank, size, result.source) == ("127.0.0.1", 1, 2, "MPI")
    assert 20000 <= port < 30000
    same = Stub()
    found(env, exchange=same, parent_pid=777)
    assert same.calls[0][0] == (host, port)       # every rank derives the same port
    with_job = Stub()
    found(dict(env, OMPI_MCA_ess_base_jobid="12345"), exchange=with_job, parent_pid=1)
    assert "OMPI_MCA_ess_base_jobid" in found(dict(env, OMPI_MCA_ess_base_jobid="1")).detail


@pytest.mark.parametrize("env", [
    {"PMI_RANK": "0", "PMI_SIZE": "3", "MPI_LOCALNRANKS": "3"},
    {"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "3",
     "MV2_COMM_WORLD_LOCAL_SIZE": "3"},
])
def test_other_mpi_families(env):
    stub = Stub()
    result = found(env, exchange=stub)
    assert result.source == "MPI" and len(result.hosts) == 3


@pytest.mark.parametrize("env,match", [
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
     r"4 ranks \(OMPI_COMM_WORLD_LOCAL_SIZE=2 here\), but MASTER_ADDR and MASTER_PORT"),
    (torchrun(0, MASTER_PORT=""), "set both"),
    (torchrun(0, MASTER_PORT="70000"), "MASTER_PORT=70000"),
    (torchrun(2), "RANK=2 is outside the world of WORLD_SIZE=2 ranks"),
    ({"RANK": "0"}, "WORLD_SIZE is not set"),
    ({"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"},
     "OMPI_COMM_WORLD_RANK='-1': expected an integer >= 0"),
])
def test_ranks_that_cannot_meet_are_named(env, match):
    with pytest.raises(ClusterError, match=match):
        found(env)


def test_a_port_base_without_room_is_named():
    one_host = torchrun(0, MASTER_ADDR="", MASTER_PORT="")   # the port is derived
    assert 20000 <= found(one_host).key[3][1] < 30000
    with pytest.raises(ClusterError, match="cluster.port_base=60000: expected 1024..55536"):
        found(one_host, Options("auto", 60000, 30))


def test_a_world_of_one_needs_no_address():
    assert found({"RANK": "0", "WORLD_SIZE": "1"}).hosts is None
    assert found({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}).source == "MPI"


# ---------------------------------------------------------------------------- precedence
def test_explicit_tf_config_wins_over_agreeing_sources():
    env = dict(slurm_step(1), TF_CONFIG=tf_config(["a:1", "b:2"], 1), **torchrun(1))
    stub = Stub()
    result = found(env, exchange=stub)
    assert result.source == "TF_CONFIG" and not stub.calls


def test_epl_launch_inside_a_one_task_allocation_is_fine():
    """srun -n1 epl-launch --num_workers 2: one Slurm task, TF_CONFIG of two workers."""
    env = dict(slurm_step(0, size=1), SLURM_STEP_NODELIST="n1", SLURM_STEP_TASKS_PER_NODE="1",
               TF_CONFIG=tf_config(["a:1", "b:2"], 1))
    assert found(env).index == 1


def test_epl_launch_in_a_batch_script_is_fine():
    env = {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
           "TF_CONFIG": tf_config(["a:1", "b:2"], 1)}
    assert found(env).source == "TF_CONFIG"


@pytest.mark.parametrize("env,match", [
    (dict(slurm_step(1), TF_CONFIG=tf_config(["a:1", "b:2"], 0)),
     r"TF_CONFIG says rank 0 of 2 .* Slurm says rank 1 of 2"),
    (dict(slurm_step(1), TF_CONFIG=tf_config(["a:1"], 0)),
     r"TF_CONFIG says rank 0 of 1 .* Slurm says rank 1 of 2"),
    (dict(slurm_step(1), **torchrun(0)), r"Slurm says rank 1 of 2 .* torchrun says rank 0"),
    (dict(torchrun(1), OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2",
          OMPI_COMM_WORLD_LOCAL_SIZE="2"), r"MPI says rank 0 of 2 .* torchrun says rank 1"),
])
def test_sources_that_disagree_are_an_error(env, match):
    with pytest.raises(ClusterError, match="Two cluster sources disagree about this process: "
                                           + match + ".*EPL_CLUSTER_SOURCE="):
        found(env)


def test_agreeing_sources_use_the_first_in_order():
    env = dict(slurm_step(1), **torchrun(1))
    assert found(env).source == "Slurm"


def test_a_batch_script_cannot_join_its_job():
    env = {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}
    with pytest.raises(ClusterError, match="not started by srun"):
        found(env)
    # ... unless another engine describes the job it is in (torchrun from the script)
    assert found(dict(env, **torchrun(1))).source == "torchrun"
    # ... or the user asks for one local worker
    assert found(env, Options("local", 20000, 30)).hosts is None


def test_a_chosen_source_is_the_only_one_read():
    env = dict(slurm_step(1), TF_CONFIG=tf_config(["a:1", "b:2"], 0))
    assert found(env, Options("slurm", 20000, 30)).source == "Slurm"
    assert found(env, Options("tf_config", 20000, 30)).index == 0
    result = found(env, Options("local", 20000, 30))
    assert result.hosts is None and "engine variables ignored" in result.detail
    with pytest.raises(ClusterError, match="cluster.source='mpi', but none of its variables"):
        found(env, Options("mpi", 20000, 30))


def test_engine_variables_lists_what_engines_set():
    env = dict(slurm_step(0), HOME="/root", RANKING="no", OMPI_COMM_WORLD_RANK="0",
               TF_CONFIG="{}", **torchrun(0))
    names = discovery.engine_variables(env)
    assert "HOME" not in names and "RANKING" not in names
    assert {"TF_CONFIG", "RANK", "MASTER_PORT", "SLURM_PROCID",
            "OMPI_COMM_WORLD_RANK"} <= set(names)


def test_options_come_from_the_config():
    from epl.config import Config
    opts = discovery.options(Config({"cluster.source": "Slurm", "cluster.port_base": 30000}))
    assert opts == Options("slurm", 30000, 300)
    assert mpi.torchrun_claim({}, 20000) is None and mpi.mpi_claim({}, 20000) is None
