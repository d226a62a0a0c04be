"""Two hosts for real: two network namespaces joined by a veth pair (tests/netns.py),
each with its own address, host name and /dev/shm.

The multi-host paths run there: ``epl-launch --machine_list ... --machine_rank i``
once per host, Slurm's variables with a two-node host list (one task per device,
two per node; and one task per node with two devices), and torchrun-style
variables whose rendezvous is on the other host. Every job trains the
equivalence script to the weights of serial training, and the ring's own report
(each EplRingConnect's state, and its log for links left on TCP) shows the links
between hosts on TCP and the links inside each host in shared memory. Skipped,
with the reason, where namespaces cannot be made (not root, no `ip netns`).
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from engineutil import clean_env, slurm_envs, torchrun_envs
from eplutil import make_data, max_diff, serial_train
from netns import two_hosts

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "engine_train.py")
AGENT = os.path.join(HERE, "scripts", "node_agent.py")
BATCH, STEPS = 4, 3
CROSS_HOST_LOG = "uses TCP (the members are on different hosts)"


def _run_on_hosts(hosts, tasks_per_host, folder, timeout=240):
    """Start each host's tasks (argv, env) through one agent per host; return
    [(exit code, log)] of every task, host 0's first."""
    agents, logs = [], []
    for host, tasks in enumerate(tasks_per_host):
        spec = []
        for number, (argv, env) in enumerate(tasks):
            log = os.path.join(folder, "host%d_task%d.log" % (host, number))
            spec.append({"argv": argv, "log": log,
                         "env": clean_env(TF_CPP_MIN_LOG_LEVEL="0", **env)})
            logs.append(log)
        spec_path = os.path.join(folder, "host%d.json" % host)
        with open(spec_path, "w") as out:
            json.dump(spec, out)
        agents.append(subprocess.Popen(hosts.command(host, [sys.executable, AGENT, spec_path]),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True))
    deadline, outputs = time.time() + timeout, []
    for agent in agents:
        try:
            outputs.append(agent.communicate(timeout=max(1.0, deadline - time.time()))[0])
        except subprocess.TimeoutExpired:
            outputs.append(b"(timed out)")
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    results = []
    for log in logs:
        code = open(log + ".code").read() if os.path.exists(log + ".code") else None
        text = open(log).read() if os.path.exists(log) else ""
        results.append((None if code is None else int(code), text))
    agent_text = "\n".join(o.decode(errors="replace")[-1500:] for o in outputs)
    return results, agent_text


def _describe(results, agent_text):
    return agent_text + "\n".join("--- task %d exited %s:\n%s" % (i, code, text[-2500:])
                                  for i, (code, text) in enumerate(results))


def _check_job(folder, workers, devices, results, agent_text, hostnames):
    """Every task passed; weights equal serial training; each worker ran on its host;
    the ring's links: TCP between hosts, shared memory inside each."""
    assert results and all(code == 0 for code, _ in results), _describe(results, agent_text)
    global_batch = workers * devices * BATCH
    x, y = make_data(global_batch * STEPS)
    _, reference = serial_train(x, y, global_batch, STEPS)
    reports = []
    for worker in range(workers):
        values = np.load(os.path.join(folder, "worker_%d.npz" % worker))
        for name, ref in reference.items():
            key = name.replace("/", "__")
            if key in values:
                assert max_diff(ref, list(values[key])) < 1e-5, (worker, name)
        reports.append(json.load(open(os.path.join(folder, "worker_%d.json" % worker))))
    assert [r["hostname"] for r in reports] == hostnames
    members = {}   # ring -> {ring rank: (state, host of its worker)}
    for report in reports:
        for link in report["ring"]:
            members.setdefault(link["communicator"], {})[link["rank"]] = (
                link["state"], reports[link["worker"]]["hostname"])
    assert members, "no ring was used: %s" % reports
    for ring, by_rank in members.items():
        size = len(by_rank)
        assert sorted(by_rank) == list(range(size)) and size > 1, (ring, by_rank)
        for rank, (state, host) in by_rank.items():
            shm_out = by_rank[(rank + 1) % size][1] == host   # successor on this host
            shm_in = by_rank[(rank - 1) % size][1] == host    # predecessor on this host
            assert state == 1 + 2 * shm_out + 4 * shm_in, (ring, by_rank)
    assert any(len(set(h for _, h in m.values())) == 2 and len(m) > 2
               for m in members.values()), members   # a ring with links of both kinds
    logs = "".join(text for _, text in results)
    assert CROSS_HOST_LOG in logs
    assert "instead of shared memory" not in logs   # no same-host link fell back to TCP
    return reports


@pytest.mark.timeout(400)
def test_epl_launch_once_per_host(tmp_path):
    with two_hosts() as hosts:
        machines = ",".join("%s:23456" % address for address in hosts.addresses)
        tasks = [[([sys.executable, "-m", "epl.launcher", "--num_workers", "2",
                    "--gpu_per_worker", "2", "--machine_list", machines, "--machine_rank",
                    str(host), "--log_dir", str(tmp_path / ("logs%d" % host)), SCRIPT,
                    str(tmp_path), str(STEPS), str(BATCH)], {})] for host in (0, 1)]
        results, agent_text = _run_on_hosts(hosts, tasks, str(tmp_path))
    logs = [open(str(tmp_path / ("logs%d" % h) / ("worker_%d.log" % h))).read() for h in (0, 1)]
    results = [(code, text + log) for (code, text), log in zip(results, logs)]
    reports = _check_job(str(tmp_path), 2, 2, results, agent_text, list(hosts.names))
    assert reports[1]["hosts"] == [a + ":23456" for a in hosts.addresses]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("tasks_per_node,devices", [(2, 1), (1, 2)],
                         ids=["task_per_device", "task_per_node"])
def test_slurm_two_node_host_list(tmp_path, tasks_per_node, devices):
    envs = slurm_envs("node[01-02]", ["node01", "node02"], tasks_per_node, job_id=36)
    argv = [sys.executable, SCRIPT, str(tmp_path), str(STEPS), str(BATCH)]
    tasks = [[(argv, dict(env, EPL_NUM_VIRTUAL_DEVICES=str(devices)))
              for env in envs[host * tasks_per_node:(host + 1) * tasks_per_node]]
             for host in (0, 1)]
    with two_hosts() as hosts:
        results, agent_text = _run_on_hosts(hosts, tasks, str(tmp_path))
    workers = 2 * tasks_per_node
    reports = _check_job(str(tmp_path), workers, devices, results, agent_text,
                         [hosts.names[w // tasks_per_node] for w in range(workers)])
    assert reports[0]["hosts"][-1] == "node02:%d" % (20000 + 36 * tasks_per_node
                                                     + tasks_per_node - 1)
    assert all(r["source"] == "Slurm" for r in reports)


@pytest.mark.timeout(400)
def test_torchrun_rendezvous_on_the_other_host(tmp_path):
    """Rank 1 meets rank 0 at node01 (by name, through the hosts' /etc/hosts); each
    learns the other's address as the rendezvous saw it."""
    envs = torchrun_envs(2, ("node01", 29500), local_size=1)
    argv = [sys.executable, SCRIPT, str(tmp_path), str(STEPS), str(BATCH)]
    tasks = [[(argv, dict(envs[host], EPL_NUM_VIRTUAL_DEVICES="2"))] for host in (0, 1)]
    with two_hosts() as hosts:
        results, agent_text = _run_on_hosts(hosts, tasks, str(tmp_path))
        addresses = list(hosts.addresses)
    reports = _check_job(str(tmp_path), 2, 2, results, agent_text, ["node01", "node02"])
    assert [h.rsplit(":", 1)[0] for h in reports[0]["hosts"]] == addresses
    assert all(r["source"] == "torchrun" for r in reports)
