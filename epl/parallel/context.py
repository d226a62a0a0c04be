"""State shared by the rewrite passes of one graph (explicit, no globals)."""
from epl import tf_adapter
from epl.communicators import Communicator, KeyRegistry
from epl.parallel.program import ParallelProgram


class RewriteContext(object):
    """What every pass reads and extends.

    ``copies`` lists this worker's copies of the model as (replica, device)
    pairs: copy 0 is the user's graph; with ``replicate(device_count=k)`` a
    model replica has k copies that split its batch. ``instances[(copy,
    micro_batch)]`` maps a user op name to its clone (shared ops map to
    themselves).
    """

    def __init__(self, view, config, cluster, plan):
        self.view = view
        self.tf_graph = view.tf_graph
        self.config = config
        self.cluster = cluster
        self.plan = plan
        self.worker = cluster.worker_index
        self.copies = self._local_copies(plan, self.worker)
        self.num_micro_batch = plan.num_micro_batch if plan.pipeline else 1
        self.instances = {}
        self.roles = None
        self.keys = KeyRegistry()
        self.prepare_ops = []      # run once before the first step (broadcasts)
        self.epl_variables = []    # EPL's own state (accumulators), initialized then too
        self.program = ParallelProgram(plan, self.worker, len(self.copies))
        self._communicators = {}

    @staticmethod
    def _local_copies(plan, worker):
        width = plan.taskgraphs[0].device_count
        return [(replica, j) for replica in plan.replicas_built_by(worker) for j in range(width)]

    # ---- devices -----------------------------------------------------------------
    def device(self, taskgraph, copy):
        """Compute device of ``taskgraph`` in local copy ``copy``."""
        replica, j = self.copies[copy]
        return self.plan.taskgraphs[taskgraph].devices[replica][j]

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

    # ---- instances -----------------------------------------------------------------
    def instance(self, op, copy, micro_batch=0):
        """The op standing for user op ``op`` in (copy, micro_batch)."""
        if copy == 0 and micro_batch == 0:
            return op
        return self.instances.get((copy, micro_batch), {}).get(op.name, op)

    def tensor_instance(self, tensor, copy, micro_batch=0):
        op = self.instance(tensor.op, copy, micro_batch)
        return op.outputs[tensor.value_index]

    def is_cloned(self, op):
        return op.name not in self.roles.shared

    # ---- communication ---------------------------------------------------------------
    def communicator(self, purpose, taskgraph):
        """The collective group over every device holding ``taskgraph``."""
        devices = self.plan.taskgraphs[taskgraph].all_devices
        return self.group("%s/%s" % (purpose, self.plan.taskgraphs[taskgraph].name), devices)

    def group(self, name, devices):
        """The collective group ``name`` over ``devices`` (created once)."""
        if name not in self._communicators:
            self._communicators[name] = Communicator(name, devices, self.keys,
                                                     context=self._backend_context())
            self.program.groups.append((name, tuple(devices)))
        return self._communicators[name]

    def _backend_context(self):
        """Job facts for collective backends: worker addresses and the timeout."""
        if self.cluster.distributed:
            hosts = [h.rsplit(":", 1)[0] for h in self.cluster.hosts]
        else:
            hosts = ["127.0.0.1"]
        return {"hosts": hosts, "timeout": self.config.communication.timeout}

    def communicators(self):
        return list(self._communicators.values())

    def driver_devices(self, taskgraph):
        """One device of ``taskgraph`` per driver worker: its first local copy's."""
        tg_plan = self.plan.taskgraphs[taskgraph]
        return tuple(tg_plan.devices[self.plan.replicas_built_by(w)[0]][0] for w in self.drivers)

    @property
    def drivers(self):
        """Workers that build a model replica (the others only serve devices)."""
        return sorted(set(self.plan.constructor_of(r) for r in range(self.plan.num_replicas)))

    def host_communicator(self, purpose):
        """A group with the host CPU of every driver worker (per-worker state: the step)."""
        return self.group(purpose, tuple(self.cluster.worker_cpu(w) for w in self.drivers))

    def rewire(self, tensor, new_tensor, consumers):
        """Point ``consumers``' inputs that read ``tensor`` at ``new_tensor``."""
        for op in consumers:
            for index, value in enumerate(op.inputs):
                if value is tensor:
                    tf_adapter.update_input(op, index, new_tensor)

    def finish_program(self):
        """Record what the session layer needs: variable copies, collectives, peers."""
        program = self.program
        for var_op in self.roles.variables:
            program.variable_copies[var_op.name] = [
                self.instance(var_op, copy) for copy in range(len(self.copies))]
        peers = set()
        for comm in self._communicators.values():
            for op_name in comm.op_names:
                program.collective_ops[op_name] = comm.name
            peers.update(self.plan.worker_of.get(d, self.worker) for d in comm.devices)
        for worker in self.drivers:
            peers.add(worker)
        program.timeout = self.config.communication.timeout
        if self.cluster.distributed:
            program.worker_label = "worker %d (%s)" % (self.worker,
                                                       self.cluster.hosts[self.worker])
            program.peer_hosts = tuple(self.cluster.hosts[w] for w in sorted(peers)
                                       if w != self.worker)
