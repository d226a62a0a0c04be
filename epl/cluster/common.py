"""What every cluster source shares: the error it raises, how it reads a count from
the environment, and the :class:`Claim` it returns. Its own module so that each
source (TF_CONFIG, Slurm, MPI, the rendezvous) can use it without importing the
package."""
import collections


class ClusterError(ValueError, RuntimeError):
    """TF_CONFIG, engine variables or device settings that EPL cannot use.

    Also a ``RuntimeError``, which the original EPL raised for them, so code that
    catches either keeps working."""


def int_variable(environ, name, minimum=0, required=True):
    """The integer in ``environ[name]`` (at least ``minimum``); None when it is unset
    and not ``required``. The error names the variable and its value."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        if required:
            raise ClusterError("%s is not set; it is needed with the other variables of its "
                               "engine" % name)
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ClusterError("%s=%r: expected an integer >= %d" % (name, raw, minimum))
    return value


PORT_SPAN = 10000   # ports EPL derives lie in [cluster.port_base, cluster.port_base + PORT_SPAN)


def check_port_base(port_base):
    """``cluster.port_base`` must leave PORT_SPAN valid ports above it."""
    if not 1024 <= port_base <= 65536 - PORT_SPAN:
        raise ClusterError("cluster.port_base=%d: expected 1024..%d, so that the %d ports "
                           "above it are valid" % (port_base, 65536 - PORT_SPAN, PORT_SPAN))
    return port_base


def first_set(environ, names):
    """(name, value) of the first of ``names`` set in ``environ``, else (None, None)."""
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip():
            return name, value.strip()
    return None, None


class Claim(collections.namedtuple("Claim", [
        "source", "rank", "size", "hosts", "task_type", "visible_devices", "detail",
        "rendezvous", "token", "problem"])):
    """What one source of cluster variables says about this process (read-only).

    ``rank`` of ``size`` tasks; ``hosts`` (``host:port`` of every task, rank order)
    when the source names them, else ``rendezvous`` = ``(host, port)`` where the
    tasks exchange them (``token`` tells one job's tasks from another's);
    ``task_type`` as the engine calls this task; ``visible_devices`` the device
    indices this task should use ("" for all); ``detail`` the variables read, for
    the log. ``problem`` is set instead when the variables show a job of several
    tasks that this process cannot join (a Slurm batch script outside ``srun``).
    """

    __slots__ = ()

    def __new__(cls, source, rank=None, size=None, hosts=None, task_type="worker",
                visible_devices="", detail="", rendezvous=None, token="", problem=None):
        return super(Claim, cls).__new__(cls, source, rank, size, hosts, task_type,
                                         visible_devices, detail, rendezvous, token, problem)

    @property
    def training(self):
        """True for a task of the training cluster (not an evaluator, not a problem)."""
        return self.problem is None and self.rank is not None
