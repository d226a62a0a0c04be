"""The rewritten graph as the session layer sees it.

After the passes run, a ParallelProgram answers three questions per
``session.run``: what to fetch instead of a user element and what else must run
with it (:class:`FetchMap`, the one place where EPL changes a fetch, with the
reasons), and how to bring replicas in sync before the first step.
"""
import logging
import re
import threading

from epl.communicators.keys import stable_key
from epl.ir.traverse import ancestors

LOG = logging.getLogger("epl")


class FetchMap(object):
    """What a ``session.run`` fetches for the user's elements: the one place where EPL
    changes a fetch, and why each change exists.

    * ``extras``: {user op name: ops of the other local copies}. Fetching a user op
      (or one of its tensors) runs its counterparts in every copy, so every replica
      takes part in each step the user runs (the gradient collectives need all).
    * ``merged``, ``merged_extras``: {user tensor name: merged tensor} and {user tensor
      name: the other copies' merge ops}. A tensor in an ``epl.GraphKeys`` collection
      fetches its merge over micro-batches and replicas (``MergedOutputs``).
    * ``substitutes``: {user tensor name: what computes it now}, for user tensors whose
      op no longer runs. Two passes make them: the repetition's stage functions (a
      call computes the user's forward and backward per micro-batch; the user's ops
      stay in the graph, since TensorFlow cannot delete ops, and fetching one would run
      micro-batch 0 again outside the call, so the fetch reads micro-batch 0's call
      result instead), and the end-of-input agreement (the user's get-next op no longer
      pulls; a fetch of its batch reads the guarded batch, never pulls again).
    * ``replaced_ops``: names of user ops that calls replace; fetching a tensor of one
      that no call returns recomputes it outside the calls, and EPL warns once.
    """

    def __init__(self):
        self.extras = {}
        self.merged = {}
        self.merged_extras = {}
        self.substitutes = {}
        self.replaced_ops = set()
        self._warned = set()

    def add_extras(self, op_name, ops):
        """Run ``ops`` whenever the user fetches the op named ``op_name`` (or one of
        its outputs)."""
        self.extras.setdefault(op_name, []).extend(ops)

    def add_merged(self, tensor_name, merged):
        """Fetching the user tensor ``tensor_name`` returns ``merged[0]`` and runs the
        other copies' ``merged[1:]``.

        Keyed by tensor, not by op: outputs of one op (``a, b = tf.unstack(x)``)
        are merged by separate collectives, and a fetch of ``a`` alone must run
        ``a``'s collective on every copy and no other's, or the copies that run
        ``b``'s wait forever for the one that does not.
        """
        self.merged[tensor_name] = merged[0]
        self.merged_extras[tensor_name] = [m.op for m in merged[1:]]

    def map_element(self, element):
        """(what to fetch for a user fetch element, extra ops to run with it).

        ``element`` is a tf.Tensor or tf.Operation from the user's fetches.
        """
        op = getattr(element, "op", element)
        extras = self.extras.get(op.name, ())
        if op is element:          # an operation: its outputs' merges are not fetched
            return element, extras
        name = element.name
        merged = self.merged_extras.get(name)
        substitute = self.merged.get(name, self.substitutes.get(name, element))
        if substitute is element and op.name in self.replaced_ops:
            self._warn_recomputed(name)
        return substitute, (list(extras) + merged) if merged else extras

    def _warn_recomputed(self, name):
        if name not in self._warned:
            self._warned.add(name)
            LOG.warning("EPL: fetching %s runs the pipeline stage's forward of micro-batch 0 "
                        "a second time, outside the stage function (only tensors that leave "
                        "a stage, losses and epl.GraphKeys collections are results of the "
                        "function); add it to an epl.GraphKeys collection to fetch it for "
                        "free", name)


class ParallelProgram(object):
    """Run-time view of one parallelized graph on one worker."""

    # The fields passes write (``program.<field>`` in a pass's ``writes``); the
    # session layer reads them. variable_copies, collective_ops, timeout and the
    # labels are filled by the core after the passes (RewriteContext.finish_program).
    FIELDS = {
        "fetches": "what a session.run fetches for the user's elements and runs with them "
                   "(FetchMap: other copies' ops, merged collections, substitutes, replaced "
                   "ops)",
        "sync_op": "the broadcast of replica 0's variables",
        "setup_op": "EPL state and collective set-up run after the initializers",
        "linked_init": "the user's initializers also set the local copies",
        "init_check": "are the user's variables initialized?",
        "after_sync": "callables run once after each sync",
        "schedule": "the pipeline Schedule imposed",
        "boundaries": "per copy, entrance and exit ops of each action",
        "gradient_plans": "per copy, the GradientPlan that was lowered",
        "variable_copies": "{user variable: its op in each copy}",
        "collective_ops": "{collective op name: group name}",
        "timeout": "communication.timeout",
        "worker_label": "this worker's name in messages",
        "peer_hosts": "the other workers of our groups",
        "snapshot": "what a snapshot saves on this worker (epl.session.resume.SnapshotRecord)",
    }

    def __init__(self, plan, worker, num_copies):
        self.plan = plan
        self.worker = worker
        self.num_copies = num_copies
        self.groups = []        # (name, devices) of every collective group
        self.fetches = FetchMap()  # what a run fetches for the user's elements, and why
        self.sync_op = None     # broadcasts replica 0's variables to every copy
        # EPL's state and collectives' set-up, all a session needs after the user's
        # initializers ran when they also initialize the local copies (linked_init)
        self.setup_op = None
        self.linked_init = False
        self.init_check = None  # scalar bool: are the user's variables initialized?
        self._sync_builder = None  # builds sync_op and init_check when first needed
        self._sync_lock = threading.Lock()
        # after_sync: callables(run, restored) run once after each sync_op, in order;
        # ``run(fetches, feed_dict)`` runs guarded, ``restored`` is (saver, path) of the
        # session's last restore or None (ZeRO restores the owners' slots there).
        self.after_sync = []
        self.variable_copies = {}  # user variable op name -> [variable op of each copy]
        self.schedule = None       # the pipeline Schedule imposed, if any
        self.boundaries = []       # per copy: ({action: entrance ops}, {action: exit ops})
        self.collective_ops = {}   # collective op name -> group name
        self.gradient_plans = []   # per local copy: the GradientPlan that was lowered
        self.timeout = None        # communication.timeout (seconds)
        self.worker_label = "worker %d" % worker
        self.peer_hosts = ()       # host:port of the other workers in our collective groups
        self.snapshot = None       # what a snapshot saves here (epl.session.resume), if on
        self._reach_cache = {}

    @property
    def needs_sync(self):
        return (self.sync_op is not None or self.setup_op is not None
                or self._sync_builder is not None)

    def defer_sync(self, builder):
        """``builder()`` sets ``sync_op`` and ``init_check`` when a session first
        needs them (:meth:`build_sync`): on one worker whose copies the user's
        initializers set (``linked_init``), only a restore needs the broadcast."""
        self._sync_builder = builder

    def build_sync(self):
        """Build the deferred broadcast now (once, whichever session asks first). A
        builder that fails stays, so the next run tries again rather than skipping
        the broadcast."""
        with self._sync_lock:
            if self._sync_builder is not None:
                self._sync_builder()
                self._sync_builder = None

    def map_element(self, element):
        """(what to fetch for a user fetch element, extra ops to run with it): see
        :class:`FetchMap`."""
        return self.fetches.map_element(element)

    def groups_reached(self, ops):
        """Names of the collective groups a run of ``ops`` executes (cached per fetch set)."""
        if not self.collective_ops:
            return ()
        key = frozenset(op.name for op in ops)
        if key not in self._reach_cache:
            groups = set(self.collective_ops[name] for name in ancestors(ops)
                         if name in self.collective_ops)
            self._reach_cache[key] = tuple(sorted(groups))
        return self._reach_cache[key]

    def collective_graph_key(self, ops):
        """The collective graph key of a run of ``ops``: the same on every worker
        (a stable hash of the names of the groups it reaches that span workers), or
        None when it reaches none (see :func:`epl.session.runner.keyed_options`)."""
        devices = dict(self.groups)
        spanning = [g for g in self.groups_reached(ops)
                    if len(set(_task_of(d) for d in devices.get(g, ()))) > 1]
        return stable_key("collective graph", *spanning) if spanning else None

    def timeout_message(self, groups, elapsed):
        devices = dict(self.groups)
        lines = ["EPL collective timeout: a session.run on %s has waited %.0f s (limit "
                 "communication.timeout=%s s) for collective group(s):"
                 % (self.worker_label, elapsed, self.timeout)]
        lines += ["  %s: %d devices (%s)" % (g, len(devices.get(g, ())),
                                             ", ".join(devices.get(g, ()))) for g in groups]
        lines.append("A member of a group is missing, has crashed or runs a different step. "
                     "Stopping this worker; raise communication.timeout "
                     "(EPL_COMMUNICATION_TIMEOUT) if steps legitimately take longer.")
        return "\n".join(lines)

    def describe_groups(self):
        """One line per collective group, for error messages."""
        return "\n".join("  %s: %d devices (%s)" % (name, len(devices), ", ".join(devices))
                         for name, devices in self.groups)

    def __repr__(self):
        return ("ParallelProgram(worker=%d, copies=%d, groups=%d, merged=%d)"
                % (self.worker, self.num_copies, len(self.groups), len(self.fetches.merged)))


def _task_of(device):
    """The task index in a device string (None for a one-process job's devices)."""
    match = re.search(r"/task:(\d+)", device)
    return int(match.group(1)) if match else None
