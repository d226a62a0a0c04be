"""Ranks without addresses: MPI launchers and torchrun-style variables.

``mpirun`` (Open MPI: ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/
``_LOCAL_SIZE``; MPICH and Intel MPI through PMI: ``PMI_RANK``/``PMI_SIZE``,
``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``; MVAPICH: ``MV2_COMM_WORLD_*``) and
torchrun-style launchers (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``: torchrun, Kubeflow's
PyTorchJob, many Slurm and LSF scripts) tell each process its rank but not where
the other ranks listen. The tasks learn that at a rendezvous
(:mod:`epl.cluster.rendezvous`) before their servers start. It is held at:

* ``MASTER_ADDR:MASTER_PORT`` when both are set (``mpirun -x MASTER_ADDR=<rank 0's
  host> -x MASTER_PORT=29500``); under torchrun's agent store
  (``TORCHELASTIC_USE_AGENT_STORE=True``) that port is torch's, so EPL uses
  ``MASTER_PORT + 1``;
* otherwise, when every rank runs on this host (local size = world size), at
  rank 0's host, 127.0.0.1, on a port derived from the launcher's job id
  (``OMPI_MCA_ess_base_jobid``, ``PMIX_NAMESPACE``, ``TORCHELASTIC_RUN_ID``; else
  the launching process, which all ranks of one host share) and ``cluster.port_base``;
* otherwise nowhere: a job across hosts without ``MASTER_ADDR`` is an error that
  says what to set.
"""
import zlib

from epl.cluster.common import (PORT_SPAN, Claim, ClusterError, check_port_base, first_set,
                                int_variable)

# (name, rank, size, local rank, local size) of each MPI family, most specific first.
MPI_FAMILIES = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MVAPICH", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)
TORCHRUN = ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
JOB_ID_VARIABLES = ("OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE",
                    "PMI_JOBID", "TORCHELASTIC_RUN_ID")
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def mpi_claim(environ, port_base, parent_pid=None):
    """The Claim of an MPI rank (the first family whose rank variable is set), or None."""
    for family in MPI_FAMILIES:
        if environ.get(family[1]):
            return _rank_claim("MPI", family, environ, port_base, parent_pid)
    return None


def torchrun_claim(environ, port_base, parent_pid=None):
    """The Claim of a torchrun-style rank (RANK and WORLD_SIZE), or None."""
    if not environ.get("RANK") and not environ.get("WORLD_SIZE"):
        return None
    return _rank_claim("torchrun", TORCHRUN, environ, port_base, parent_pid)


def _rank_claim(source, family, environ, port_base, parent_pid):
    name, rank_var, size_var, local_var, local_size_var = family
    size = int_variable(environ, size_var, minimum=1)
    rank = int_variable(environ, rank_var)
    if rank >= size:
        raise ClusterError("%s=%d is outside the world of %s=%d ranks (ranks count from 0)"
                           % (rank_var, rank, size_var, size))
    detail = "%s=%d of %s=%d" % (rank_var, rank, size_var, size)
    if source == "MPI":
        detail = "%s: %s" % (name, detail)
    if size == 1:
        return Claim(source, 0, 1, detail=detail)
    local_size = int_variable(environ, local_size_var, minimum=1, required=False)
    address, how = rendezvous_address(environ, size, local_size, port_base, parent_pid,
                                      (local_size_var,))
    return Claim(source, rank, size, detail="%s, rendezvous at %s:%d (%s)"
                 % (detail, address[0], address[1], how),
                 rendezvous=address, token="%s/%d" % (source, size))


def rendezvous_address(environ, size, local_size, port_base, parent_pid=None,
                       local_names=("LOCAL_WORLD_SIZE",)):
    """``((host, port), how)``: where the ranks of this job meet (see the module doc)."""
    addr, port_text = environ.get("MASTER_ADDR", "").strip(), environ.get("MASTER_PORT", "")
    if addr or port_text.strip():
        if not addr or not port_text.strip():
            raise ClusterError("MASTER_ADDR=%r and MASTER_PORT=%r: set both (rank 0's host and "
                               "a free port there) or neither" % (addr, port_text))
        port = int_variable(environ, "MASTER_PORT", minimum=1)
        if port > 65535:
            raise ClusterError("MASTER_PORT=%d: expected a port in 1..65535" % port)
        if environ.get(AGENT_STORE, "").strip() == "True":
            return (addr, port + 1), "MASTER_ADDR:MASTER_PORT+1; MASTER_PORT is torch's store"
        return (addr, port), "MASTER_ADDR:MASTER_PORT"
    if local_size is not None and local_size == size:
        key_name, key = first_set(environ, JOB_ID_VARIABLES)
        if key is None:
            key_name, key = "the launching process", str(parent_pid or 0)
        port = check_port_base(port_base) + zlib.crc32(key.encode("utf-8")) % PORT_SPAN
        return ("127.0.0.1", port), "every rank on this host; port from %s" % key_name
    raise ClusterError(
        "%d ranks%s, but MASTER_ADDR and MASTER_PORT are not set: EPL's tasks exchange "
        "their addresses at a rendezvous on rank 0's host. Set both for every rank, e.g. "
        "`mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=29500 ...`"
        % (size, "" if local_size is None else " (%s=%d here)" % (local_names[0], local_size)))
