"""Which engine started this process, and the cluster it describes: one ordered resolver.

Each source reads its own variables into a :class:`~epl.cluster.common.Claim`
(pure functions of the environment): TF_CONFIG (:mod:`epl.cluster.tf_config`:
epl-launch, Kubeflow TFJob, Ray), Slurm (:mod:`epl.cluster.slurm`), MPI and
torchrun-style variables (:mod:`epl.cluster.mpi`, whose tasks then meet at a
rendezvous, :mod:`epl.cluster.rendezvous`). This module picks one, honestly:

* ``cluster.source`` names a source: only it is read, and its variables must be
  there; ``local`` reads none (one local worker, on purpose).
* ``auto`` (default): an explicit TF_CONFIG wins. Every other source that
  describes a job of several tasks must agree with the one used (same rank, same
  number of tasks), else it is an error that names both: two launchers that
  disagree about who this process is cannot both be right.
* Without TF_CONFIG, the first of Slurm, MPI, torchrun that describes several
  tasks is used. A source that sees a job this process cannot join (a Slurm batch
  script outside ``srun``) is an error unless another source describes the job:
  such a process must never train alone.
* Nothing set: one local worker.

The result is a :class:`Discovery`, whose ``detail`` ``epl.init`` logs.
"""
import collections

from epl.cluster import mpi, rendezvous, slurm, tf_config
from epl.cluster.common import Claim, ClusterError
from epl.config import Config

SOURCES = ("tf_config", "slurm", "mpi", "torchrun")   # the order of "auto"
LOCAL_SOURCE = "local"

Discovery = collections.namedtuple("Discovery", [
    "source", "hosts", "index", "task_type", "visible_devices", "detail", "key"])
Discovery.__doc__ = """Where this process's cluster came from (read-only): ``source``
(TF_CONFIG, Slurm, MPI, torchrun, local or explicit), ``hosts`` (None for one local
worker), this task's ``index``, ``task_type`` (as the engine named it: chief,
master, worker, ps, evaluator), ``visible_devices`` the engine assigned ("" for
all), ``detail`` (what was read, for the log) and ``key`` (what identifies a
rendezvous, so a second ``epl.init`` reuses its result instead of meeting again)."""

LOCAL = Discovery(LOCAL_SOURCE, None, 0, "worker", "", "no cluster variables: one local worker",
                  None)

# Variables an engine sets to describe a job (what :func:`engine_variables` finds).
ENGINE_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "MV2_COMM_WORLD_", "PMI_", "PMIX_",
                   "TORCHELASTIC_")
ENGINE_NAMES = ("TF_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "MPI_LOCALRANKID",
                "MPI_LOCALNRANKS", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid")

Options = collections.namedtuple("Options", ["source", "port_base", "rendezvous_timeout"])
Options.__doc__ = """The config keys discovery reads: cluster.source, cluster.port_base,
cluster.rendezvous_timeout (:func:`options`)."""


def options(config=None):
    """:class:`Options` from ``config`` (default: a fresh Config, so EPL_CLUSTER_*
    variables apply)."""
    section = (config if config is not None else Config()).cluster
    return Options(section.source, section.port_base, section.rendezvous_timeout)


def explicit(hosts, index):
    """The Discovery of a Cluster built from hosts given in code."""
    return Discovery("explicit", tuple(hosts) if hosts is not None else None, index, "worker",
                     "", "hosts given to epl.Cluster", None)


def engine_variables(environ):
    """Names of the engine variables set in ``environ`` (sorted): what a process
    that must not look like an engine's task (a test, a nested job) removes."""
    return sorted(name for name in environ
                  if name in ENGINE_NAMES or name.startswith(ENGINE_PREFIXES))


def read_claims(environ, opts, parent_pid=None, names=SOURCES):
    """``{source name: Claim}`` of every source in ``names`` whose variables are set."""
    readers = {
        "tf_config": lambda: _tf_config_claim(environ),
        "slurm": lambda: slurm.claim(environ, opts.port_base),
        "mpi": lambda: mpi.mpi_claim(environ, opts.port_base, parent_pid),
        "torchrun": lambda: mpi.torchrun_claim(environ, opts.port_base, parent_pid),
    }
    found = collections.OrderedDict()
    for name in names:
        claim = readers[name]()
        if claim is not None:
            found[name] = claim
    return found


def choose(claims, chosen="auto"):
    """The Claim to use among ``claims`` (from :func:`read_claims`), or None for one
    local worker; raises ClusterError when sources disagree or a job cannot be joined."""
    if chosen == LOCAL_SOURCE:
        return None
    if chosen != "auto":
        if chosen not in claims:
            raise ClusterError("cluster.source=%r, but none of its variables are set in this "
                               "process (%s)" % (chosen, _variables_of(chosen)))
        if claims[chosen].problem:
            raise ClusterError(claims[chosen].problem)
        return claims[chosen]
    valid = [c for c in claims.values() if c.problem is None]
    several = [c for c in valid if c.training and c.size > 1]
    used = claims.get("tf_config") or (several[0] if several else None)
    if used is not None:
        for other in several if used.training else ():
            _check_agree(used, other)
        return used
    problems = [c.problem for c in claims.values() if c.problem]
    if problems:
        raise ClusterError(problems[0])
    return valid[0] if valid else None


def discover(environ, opts, parent_pid=None, previous=None, exchange=rendezvous.exchange,
             pick_port=rendezvous.free_port):
    """This process's :class:`Discovery`. ``previous`` (the Discovery of an earlier
    ``epl.init`` in this process) is reused when it came from the same rendezvous.
    ``exchange`` and ``pick_port`` are the rendezvous (injectable for tests)."""
    names = SOURCES if opts.source in ("auto", LOCAL_SOURCE) else (opts.source,)
    if opts.source == LOCAL_SOURCE:
        return LOCAL._replace(detail="cluster.source=local: one local worker (engine "
                                     "variables ignored)")
    claim = choose(read_claims(environ, opts, parent_pid, names), opts.source)
    if claim is None:
        return LOCAL
    detail = "%s (%s)" % (claim.source, claim.detail)
    if not claim.training:
        return Discovery(claim.source, None, 0, claim.task_type, "", detail, None)
    hosts, key = claim.hosts, None
    if claim.rendezvous is not None and claim.size > 1:
        key = (claim.source, claim.rank, claim.size, claim.rendezvous, claim.token)
        if previous is not None and previous.key == key:
            return previous
        hosts = tuple(exchange(claim.rendezvous, claim.rank, claim.size, pick_port(),
                               claim.token, opts.rendezvous_timeout))
    return Discovery(claim.source, hosts, claim.rank if hosts else 0, claim.task_type,
                     claim.visible_devices, detail, key)


def _tf_config_claim(environ):
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    spec = tf_config.parse(text)
    task = "task %s:%d" % (spec.task_type, spec.task_index)
    if spec.index is None:
        return Claim("TF_CONFIG", task_type=spec.task_type, detail=(
            "%s: not part of the training cluster of %d task(s), one local worker that "
            "evaluates its checkpoints" % (task, len(spec.hosts))))
    return Claim("TF_CONFIG", spec.index, len(spec.hosts), spec.hosts,
                 task_type=spec.task_type,
                 detail="%s, worker %d of %d" % (task, spec.index, len(spec.hosts)))


def _check_agree(used, other):
    if other is used or (other.rank, other.size) == (used.rank, used.size):
        return
    raise ClusterError(
        "Two cluster sources disagree about this process: %s says rank %s of %s (%s), %s says "
        "rank %d of %d (%s). Unset the variables of the one that is wrong, or choose one with "
        "EPL_CLUSTER_SOURCE=%s." % (used.source, used.rank, used.size, used.detail,
                                    other.source, other.rank, other.size, other.detail,
                                    "|".join(SOURCES + (LOCAL_SOURCE,))))


def _variables_of(name):
    return {"tf_config": "TF_CONFIG",
            "slurm": "SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST, ... inside srun",
            "mpi": "OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE or MV2_COMM_WORLD_RANK/SIZE",
            "torchrun": "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"}[name]
