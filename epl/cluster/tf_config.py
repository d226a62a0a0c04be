"""TF_CONFIG as TensorFlow's cluster engines write it (Kubeflow TFJob, Ray actors,
epl-launch), read without TensorFlow.

Jobs: ``chief`` (or the older ``master``; never both, as TensorFlow's RunConfig
refuses) is worker 0, then the ``worker`` tasks, then the ``ps`` tasks, which EPL
treats as ordinary workers (it keeps variables on the workers, so a parameter
server is one more device holder). An ``evaluator`` task is not part of the
training cluster: it evaluates the checkpoints the training tasks write
(``tf.estimator.train_and_evaluate``), so its EPL cluster is one local worker.
TFJob leaves the evaluator out of ``cluster``; a TF_CONFIG that lists it is read
the same way.

A job is a list of addresses or TensorFlow's sparse form, a mapping
``{index: address}``. EPL's collectives need every training task's address, so a
sparse job must name every index from 0 (a gap is refused, naming the missing
tasks). TFJob's dynamic workers (``enableDynamicWorker``) get a ``sparseCluster``
in which each task's own job lists only that task: nothing in it says how many
peers exist, so a training task refuses it (reading it as a job of one would
train alone); an evaluator, which needs no peers, reads it.

Example::

    >>> spec = parse('{"cluster": {"chief": ["c:1"], "worker": ["w:1"]},'
    ...              ' "task": {"type": "worker", "index": 0}}')
    >>> spec.hosts, spec.index, spec.task_type
    (('c:1', 'w:1'), 1, 'worker')
"""
import collections
import json

from epl.cluster.common import ClusterError

CHIEF, MASTER, WORKER, PS, EVALUATOR = "chief", "master", "worker", "ps", "evaluator"
TRAINING_JOBS = (CHIEF, MASTER, WORKER, PS)   # in the order their tasks are numbered
JOBS = TRAINING_JOBS + (EVALUATOR,)
CLUSTER_KEYS = ("cluster", "sparseCluster")

TaskSpec = collections.namedtuple("TaskSpec", ["hosts", "index", "task_type", "task_index"])
TaskSpec.__doc__ = """This task in a TF_CONFIG: ``hosts`` of the training cluster in EPL's
worker order (a tuple), ``index`` of this task among them (None for an evaluator),
and the task as TF_CONFIG names it (``task_type``, ``task_index``)."""


def load(text):
    """The TF_CONFIG JSON object; a ClusterError that quotes it otherwise."""
    try:
        spec = json.loads(text)
    except ValueError as err:
        raise ClusterError("TF_CONFIG is not valid JSON (%s): %r" % (err, text[:200]))
    if not isinstance(spec, dict):
        raise ClusterError("TF_CONFIG must be a JSON object with 'cluster' and 'task', got "
                           "%r" % text[:200])
    return spec


def parse(text):
    """The :class:`TaskSpec` of this task from a TF_CONFIG JSON string."""
    spec = load(text)
    jobs = cluster_jobs(spec)
    sparse = bool(spec.get(CLUSTER_KEYS[1]))
    task = spec.get("task") or {}
    if not isinstance(task, dict):
        raise ClusterError("TF_CONFIG 'task' must be an object such as {\"type\": \"worker\", "
                           "\"index\": 0}, got %r" % (task,))
    task_type = str(task.get("type", WORKER))
    task_index = _task_index(task.get("index", 0))
    hosts, offset = [], {}
    for job in TRAINING_JOBS:
        offset[job] = len(hosts)
        hosts.extend(jobs.get(job, ()))
    if task_type == EVALUATOR:
        return TaskSpec(tuple(hosts), None, EVALUATOR, task_index)
    if task_type not in TRAINING_JOBS:
        raise ClusterError("TF_CONFIG task type %r is not one of %s" % (task_type,
                                                                        ", ".join(JOBS)))
    if sparse:
        raise ClusterError(
            "TF_CONFIG has a 'sparseCluster' (Kubeflow TFJob's enableDynamicWorker): task "
            "%s:%d sees only its own address in its job, but EPL's collectives need every "
            "training task's address and the number of tasks. Turn enableDynamicWorker off "
            "(TFJob then writes 'cluster' with every task)." % (task_type, task_index))
    if not hosts:
        raise ClusterError("TF_CONFIG has no chief/master/worker/ps hosts: %r" % text[:200])
    group = jobs.get(task_type, ())
    if not 0 <= task_index < len(group):
        raise ClusterError("TF_CONFIG task %s:%d does not exist; the %s job has %d host(s)"
                           % (task_type, task_index, task_type, len(group)))
    return TaskSpec(tuple(hosts), offset[task_type] + task_index, task_type, task_index)


def cluster_jobs(spec):
    """``{job: [addresses]}`` of a loaded TF_CONFIG, sparse jobs made dense."""
    present = [key for key in CLUSTER_KEYS if spec.get(key)]
    if len(present) > 1:
        raise ClusterError("TF_CONFIG has both %s; give one of them" % " and ".join(present))
    cluster = spec.get(present[0]) if present else {}
    if not isinstance(cluster, dict):
        raise ClusterError("TF_CONFIG %r must map job names to addresses, got %r"
                           % (present[0], cluster))
    unknown = sorted(set(cluster) - set(JOBS))
    if unknown:
        raise ClusterError("TF_CONFIG has unsupported job(s) %s; allowed: %s"
                           % (unknown, ", ".join(JOBS)))
    if cluster.get(CHIEF) and cluster.get(MASTER):
        raise ClusterError("TF_CONFIG has both a 'chief' and a 'master' job; 'master' is the "
                           "older name of the chief: give one of them (TensorFlow's RunConfig "
                           "refuses both too)")
    jobs = dict((job, _addresses(job, cluster[job])) for job in cluster if cluster[job])
    for job in (CHIEF, MASTER):
        if len(jobs.get(job, ())) > 1:
            raise ClusterError("TF_CONFIG's %r job has %d tasks; a job has one %s"
                               % (job, len(jobs[job]), job))
    return jobs


def _addresses(job, entries):
    """The addresses of one job, from a list or the sparse ``{index: address}`` form."""
    if isinstance(entries, (list, tuple)):
        found = list(entries)
    elif isinstance(entries, dict):
        found = _dense(job, entries)
    else:
        raise ClusterError("TF_CONFIG job %r must be a list of addresses or a mapping "
                           "{index: address}, got %r" % (job, entries))
    if not all(isinstance(a, str) and a.strip() for a in found):
        raise ClusterError("TF_CONFIG job %r has an address that is not a host:port string: "
                           "%r" % (job, entries))
    return found


def _dense(job, entries):
    try:
        by_index = dict((int(key), value) for key, value in entries.items())
    except (TypeError, ValueError):
        raise ClusterError("TF_CONFIG job %r: sparse keys must be task indices, got %r"
                           % (job, sorted(entries)))
    if min(by_index) < 0:
        raise ClusterError("TF_CONFIG job %r: sparse keys must be task indices >= 0, got %r"
                           % (job, sorted(by_index)))
    missing = [i for i in range(max(by_index) + 1) if i not in by_index]
    if missing:
        raise ClusterError(
            "TF_CONFIG's sparse %r job lists task(s) %s only: EPL's collectives need every "
            "training task's address, and task(s) %s are missing. (Kubeflow TFJob writes "
            "this form for dynamic workers, enableDynamicWorker: turn it off for EPL jobs.)"
            % (job, sorted(by_index), missing))
    return [by_index[i] for i in range(len(by_index))]


def _task_index(value):
    try:
        index = int(value)
    except (TypeError, ValueError):
        index = -1
    if index < 0 or isinstance(value, bool):
        raise ClusterError("TF_CONFIG task index must be an integer >= 0, got %r" % (value,))
    return index


def evaluator_view(tf_config):
    """What TensorFlow's RunConfig should read on an evaluator task, from the parsed
    TF_CONFIG ``tf_config``: the task as given and a ``chief`` job, which RunConfig
    requires before it sets an evaluator's cluster aside (it keeps none of it). The
    chief is the training cluster's worker 0 whatever the layout called it (TFJob
    writes ``chief``; an epl-launch-style TF_CONFIG has only workers)."""
    jobs = cluster_jobs(tf_config)
    first = [jobs[job][0] for job in TRAINING_JOBS if jobs.get(job)]
    view = dict((k, v) for k, v in tf_config.items() if k not in CLUSTER_KEYS)
    view["cluster"] = {CHIEF: first[:1] or ["localhost:0"]}
    return view
