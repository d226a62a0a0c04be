"""State shared by the rewrite passes of one graph (explicit, no globals).

Passes read the plan, the IR view and the per-copy records from here, and record
their results in the ParallelProgram. Communication groups come from the plan
(:mod:`epl.parallel.mesh`); a pass asks ``ctx.communicator(group, purpose)`` and
never makes up a group.
"""
import collections

from epl import tf_adapter
from epl.communicators import Communicator, KeyRegistry
from epl.ops import state as split_state
from epl.parallel import repeat
from epl.parallel.program import ParallelProgram
from epl.protocols.passes import GRADIENTS, INPUT, LAYERS, OUTPUTS, SYNC  # noqa: F401
from epl.runtime import optimizers


# What a pass declares in ``reads`` and ``writes``: fields of the RewriteContext and of
# its ParallelProgram (``program.<field>``). tests/graph/test_pass_contracts.py runs the
# passes on representative graphs and checks that each touches only what it declares.
FIELDS = collections.OrderedDict([
    ("graph", "the tf.Graph: ops, inputs, devices, attributes, functions (every pass "
              "reads it; a pass that changes it declares it)"),
    ("view", "the IR: op table, build-time records, collections, per-graph feature state"),
    ("config", "the epl.Config"),
    ("cluster", "this worker's Cluster"),
    ("plan", "the plan: devices, groups, schedule, micro-batching"),
    ("worker", "this worker's index"),
    ("copies", "this worker's Copy records"),
    ("roles", "cloned, shared, variables, step, init-only and pinned ops"),
    ("repetition", "the step repeated per (copy, micro-batch): what stands for a user op or "
                   "tensor in each, gradient sums, schedule boundaries (epl.parallel.repeat)"),
    ("communicators", "the collective groups built so far and their keys"),
    ("epl_variables", "EPL's own state, initialized by the sync op"),
    ("state_initializers", "initializers of more EPL state, run by the sync op (ZeRO's slots "
                           "on their owners)"),
    ("accumulator_stores", "{copy: the gradient accumulators' writes}"),
    ("zero", "ZeRO's owners per copy (epl.runtime.zero_partition.ZeroPlan), or None"),
    ("split_inputs", "get-next ops whose batch the local copies split"),
    ("per_run_writes", "EPL writes every run makes whatever its input"),
] + [("program." + name, doc) for name, doc in ParallelProgram.FIELDS.items()])
# Attributes that belong to a field under another name (a cache, a private table).
FIELD_OF = {"tf_graph": "graph", "_sharded": "view", "program.groups": "communicators",
            "program.plan": "plan", "program.worker": "worker", "program.num_copies": "copies"}


def sharded_variable_names(view):
    """{name: ShardInfo} of the variables split layers sharded, plus their optimizer
    slots and moving averages (sharded like their variable). Slots are found through
    the chain of wrapped optimizers (a wrapper may have no slot table), moving averages
    by their colocation and shard shape (:mod:`epl.runtime.optimizers`)."""
    own = split_state.sharded_variables(view)
    names = dict(own)
    if not names:
        return names
    for call in view.apply_calls:
        for _, var in call:
            info = own.get(var.op.name)
            if info is None:
                continue
            for slot in optimizers.slot_variables(call.optimizer, var):
                names[slot.op.name] = info
    variables = view.tf_graph.get_collection(tf_adapter.tf.GraphKeys.GLOBAL_VARIABLES)
    for name, leader in optimizers.shard_followers(variables, own).items():
        names.setdefault(name, own[leader])
    return names


class Communicators(object):
    """The communicators of one rewrite, one per (purpose, plan group), and the
    registry of their collective keys (collisions inside a program raise)."""

    def __init__(self, program, backend_context):
        self.keys = KeyRegistry()
        self._program = program
        self._backend_context = backend_context
        self.by_name = {}

    def get(self, group, purpose):
        name = "%s/%s" % (purpose, group.name)
        if name not in self.by_name:
            self.by_name[name] = Communicator(name, group.devices, self.keys,
                                              context=self._backend_context)
            self._program.groups.append((name, tuple(group.devices)))
        return self.by_name[name]

    def all(self):
        return list(self.by_name.values())


class RewriteContext(object):
    """What every pass reads and extends.

    ``copies`` are this worker's :class:`epl.parallel.mesh.Copy` records: copy 0
    is the user's graph, the others are clones. ``repetition`` is the step repeated
    per (copy, micro-batch) (:mod:`epl.parallel.repeat`): it says what stands for a
    user op or tensor in each repetition (``instance``, ``tensor_instance`` ask it).
    The build-time gradient and apply calls are the IR's (``view``).
    """

    def __init__(self, view, config, cluster, plan):
        self.view = view
        self.tf_graph = view.tf_graph
        self.config = config
        self.cluster = cluster
        self.plan = plan
        self.worker = cluster.worker_index
        self.copies = plan.copies_of(self.worker)
        self.repetition = repeat.for_plan(plan, self.copies)
        self.roles = None
        self.epl_variables = []    # EPL's own state (accumulators), initialized by the sync op
        self.state_initializers = []  # more of it, as initializer ops (ZeRO's owned slots)
        self.zero = None           # ZeRO's per-copy owners (epl.runtime.zero_partition)
        self.accumulator_stores = collections.defaultdict(list)  # copy -> accumulator writes
        self.split_inputs = set()  # get-next ops whose batch BatchSplit splits over copies
        # EPL state writes every run makes whatever its input (the accumulation
        # counter): they wait for the end-of-input agreement (EndOfInput)
        self.per_run_writes = []
        self._sharded = None
        self.program = ParallelProgram(plan, self.worker, len(self.copies))
        self.communicators = Communicators(self.program, self._backend_context())

    @property
    def num_micro_batch(self):
        """Micro-batches each copy runs per step (1 unless a pipeline runs)."""
        return self.repetition.micro_batches

    # ---- devices -----------------------------------------------------------------
    def device(self, taskgraph, copy):
        """Compute device of ``taskgraph`` in local copy ``copy``."""
        return self.copies[copy].devices[taskgraph]

    @property
    def host(self):
        """This worker's CPU: input pipelines, placeholders, the global step."""
        return self.cluster.worker_cpu()

    def device_for(self, op, copy):
        """Device of a (user) op's instance in local copy ``copy``."""
        if op.name in self.roles.shared or op.name in self.roles.pinned:
            return self.host
        info = self.view.info(op)
        if info.taskgraph is None:
            raise RuntimeError("op %s (%s) has no TaskGraph: %r" % (op.name, op.type, info))
        return self.device(info.taskgraph, copy)

    def taskgraph_of(self, op):
        return self.view.info(op).taskgraph

    @property
    def sharded_variables(self):
        """{name: ShardInfo} of variables that hold one shard per position: those split
        layers made, and the optimizer slots of those."""
        if self._sharded is None:
            self._sharded = sharded_variable_names(self.view)
        return self._sharded

    def weight_position(self, var_op, copy):
        """The shard of ``var_op`` that ``copy`` holds, or None when every copy holds
        the whole variable."""
        if var_op.name in self.sharded_variables:
            return self.copies[copy].position
        return None

    def dp_group(self, var_op, copy):
        """The data-parallel group of ``copy``'s instance of ``var_op``."""
        tg_plan = self.plan.taskgraphs[self.taskgraph_of(var_op)]
        return tg_plan.dp_group(self.weight_position(var_op, copy))

    def readers(self):
        """[(reader copy, [copies sharing its batch])]: per model replica, the first
        local copy pulls the input and the others take slices of it."""
        groups = {}
        for index, copy in enumerate(self.copies):
            groups.setdefault(copy.replica, []).append(index)
        return [(members[0], members) for _, members in sorted(groups.items())]

    # ---- instances (asked of the repetition) ---------------------------------------
    def instance(self, op, copy, micro_batch=0):
        """The op standing for user op ``op`` in (copy, micro_batch)."""
        return self.repetition.op(op, copy, micro_batch)

    def tensor_instance(self, tensor, copy, micro_batch=0):
        """The tensor standing for user tensor ``tensor`` in (copy, micro_batch)."""
        return self.repetition.tensor(tensor, copy, micro_batch)

    def is_cloned(self, op):
        return op.name not in self.roles.shared

    # ---- communication ---------------------------------------------------------------
    def communicator(self, group, purpose):
        """The Communicator of plan group ``group`` for ``purpose`` (created once)."""
        return self.communicators.get(group, purpose)

    def _backend_context(self):
        """Job facts for collective backends: worker addresses and the timeout."""
        if self.cluster.distributed:
            hosts = [h.rsplit(":", 1)[0] for h in self.cluster.hosts]
        else:
            hosts = ["127.0.0.1"]
        return {"hosts": hosts, "timeout": self.config.communication.timeout}

    def rewire(self, tensor, new_tensor, consumers):
        """Point ``consumers``' inputs that read ``tensor`` at ``new_tensor``."""
        for op in consumers:
            for index, value in enumerate(op.inputs):
                if value is tensor:
                    tf_adapter.update_input(op, index, new_tensor)

    def finish_program(self):
        """Record what the session layer needs: variable copies, collectives, peers."""
        program = self.program
        slots = self.zero.slots if self.zero is not None else ()
        for var_op in self.roles.variables:
            if var_op.name in slots:
                continue  # ZeRO's state: one owner holds it, not every copy
            program.variable_copies[var_op.name] = [
                self.instance(var_op, copy) for copy in range(len(self.copies))]
        peers = set(self.plan.drivers)
        for comm in self.communicators.all():
            for op_name in comm.op_names:
                program.collective_ops[op_name] = comm.name
            peers.update(self.plan.worker_of.get(d, self.worker) for d in comm.devices)
        program.timeout = self.config.communication.timeout
        if self.cluster.distributed:
            program.worker_label = "worker %d (%s)" % (self.worker,
                                                       self.cluster.hosts[self.worker])
            program.peer_hosts = tuple(self.cluster.hosts[w] for w in sorted(peers)
                                       if w != self.worker)
