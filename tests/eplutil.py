"""Test helpers: a deterministic model, serial reference training, worker threads.

Equivalence tests train the same model K steps serially on global batches and
under EPL on per-replica batches that partition each global batch, then
compare weights.
"""
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np
import tensorflow.compat.v1 as tf

import epl
import isolation
from epl.cluster import Cluster
from epl.launcher.ports import ephemeral_low

tf.disable_v2_behavior()  # TF 2.x: graph mode for worker scripts too (docs/tf2.md); no-op on 1.15

FEATURES, HIDDEN, CLASSES = 6, 5, 3


def make_data(rows, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(rows, FEATURES).astype(np.float32)
    y = rng.randint(0, CLASSES, rows).astype(np.int64)
    return x, y


def initial_weights(seed=1):
    rng = np.random.RandomState(seed)
    return {"d1/kernel": rng.rand(FEATURES, HIDDEN).astype(np.float32) - 0.5,
            "d2/kernel": rng.rand(HIDDEN, CLASSES).astype(np.float32) - 0.5,
            "mid/kernel": rng.rand(HIDDEN, HIDDEN).astype(np.float32) - 0.5}


def optimizer(name="momentum"):
    if name == "adam":
        return tf.train.AdamOptimizer(0.01)
    if name == "adam_eps":  # see tests/realmodels.py on Adam's epsilon and summation order
        return tf.train.AdamOptimizer(0.01, epsilon=1e-4)
    if name == "sgd":
        return tf.train.GradientDescentOptimizer(0.1)
    return tf.train.MomentumOptimizer(0.1, 0.9)


def mlp(x, y, weights):
    """Two dense layers and a mean cross-entropy; returns the loss tensor."""
    init = lambda name: tf.constant_initializer(weights[name])
    h = tf.layers.dense(x, HIDDEN, activation=tf.nn.relu, kernel_initializer=init("d1/kernel"),
                        name="d1")
    logits = tf.layers.dense(h, CLASSES, kernel_initializer=init("d2/kernel"), name="d2")
    return tf.losses.sparse_softmax_cross_entropy(y, logits)


def staged_mlp(x, y, weights, depth=2, scopes=None):
    """The MLP with ``depth`` (2 or 3) layers, each layer one pipeline stage.

    ``scopes(i)`` returns the strategy scope of stage i (default
    ``epl.replicate(1, name="stage_i")``); ``scopes=False`` builds the same
    layers with no EPL scope (the serial reference).
    """
    init = lambda name: tf.constant_initializer(weights[name])
    if scopes is None:
        scopes = lambda i: epl.replicate(1, name="stage_%d" % i)
    layers = [lambda t: tf.layers.dense(t, HIDDEN, activation=tf.nn.relu,
                                        kernel_initializer=init("d1/kernel"), name="d1")]
    if depth == 3:
        layers.append(lambda t: tf.layers.dense(t, HIDDEN, activation=tf.nn.tanh,
                                                kernel_initializer=init("mid/kernel"),
                                                name="mid"))
    layers.append(lambda t: tf.losses.sparse_softmax_cross_entropy(
        y, tf.layers.dense(t, CLASSES, kernel_initializer=init("d2/kernel"), name="d2")))
    value = x
    for index, layer in enumerate(layers):
        if scopes is False:
            value = layer(value)
        else:
            with scopes(index):
                value = layer(value)
    return value


class AdamWeightDecay(tf.train.Optimizer):
    """Adam with decoupled weight decay, written like BERT's AdamWeightDecayOptimizer:
    its ``apply_gradients`` builds the m/v updates with plain assigns and never calls
    ``tf.train.Optimizer.apply_gradients``."""

    def __init__(self, learning_rate, decay=0.01, beta1=0.9, beta2=0.999, epsilon=1e-6,
                 name="AdamWeightDecay"):
        super(AdamWeightDecay, self).__init__(False, name)
        self.learning_rate, self.decay = learning_rate, decay
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        targets = []
        for grad, var in grads_and_vars:
            if grad is None:
                continue
            base = var.op.name
            slot = lambda suffix: tf.get_variable(
                base + suffix, shape=var.shape, dtype=var.dtype.base_dtype, trainable=False,
                initializer=tf.zeros_initializer())
            m, v = slot("/adamw_m"), slot("/adamw_v")
            new_m = self.beta1 * m + (1.0 - self.beta1) * grad
            new_v = self.beta2 * v + (1.0 - self.beta2) * tf.square(grad)
            step = new_m / (tf.sqrt(new_v) + self.epsilon)
            if not base.endswith("bias"):
                step += self.decay * var
            targets += [(var, var - self.learning_rate * step), (m, new_m), (v, new_v)]
        # Every new value is computed before any variable changes: ref variables are
        # read lazily, so an early assign would otherwise leak into other gradients.
        with tf.control_dependencies([value for _, value in targets]):
            return tf.group(*[ref.assign(value) for ref, value in targets], name=name)


def adamw_step(loss):
    """BERT's create_optimizer: apply, then bump the global step outside the optimizer."""
    step = tf.train.get_or_create_global_step()
    tvars = tf.trainable_variables()
    grads = tf.gradients(loss, tvars)
    train = AdamWeightDecay(0.01).apply_gradients(zip(grads, tvars), global_step=step)
    return tf.group(train, step.assign(step + 1))


def dataset_input(x, y, batch):
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    return tf.data.make_one_shot_iterator(data).get_next()


def train_step(loss, opt_name="momentum"):
    step = tf.train.get_or_create_global_step()
    return optimizer(opt_name).minimize(loss, global_step=step)


def variable_values(sess):
    names = sorted(v.op.name for v in tf.global_variables())
    values = sess.run([tf.get_default_graph().get_tensor_by_name(n + ":0") for n in names])
    return dict(zip(names, values))


def epl_paused():
    """Build and run a plain TF graph even while EPL's hooks are installed."""
    return epl.paused()


def serial_train(x, y, batch, steps, opt_name="momentum", weights=None, depth=2):
    """Reference: one device, global batches. Returns (losses, variables).

    ``depth=3`` trains the three-layer variant used by 3-stage pipelines.
    """
    weights = weights or initial_weights()
    with epl_paused(), tf.Graph().as_default():
        xb, yb = dataset_input(x, y, batch)
        if depth == 3:
            loss = staged_mlp(xb, yb, weights, 3, scopes=False)
        else:
            loss = mlp(xb, yb, weights=weights)
        train = train_step(loss, opt_name)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            losses = [sess.run([loss, train])[0] for _ in range(steps)]
            return losses, variable_values(sess)


def worker_rows(x, steps, workers, per_worker_batch, worker):
    """Rows worker ``worker`` reads so that step s covers global batch s."""
    global_batch = workers * per_worker_batch
    parts = [x[s * global_batch + worker * per_worker_batch:
               s * global_batch + (worker + 1) * per_worker_batch] for s in range(steps)]
    return np.concatenate(parts)


def _copy_reads(sess, var_name):
    reads = []
    for op in epl.Graph.get(sess.graph).parallel.variable_copies[var_name]:
        if op.type == "VarHandleOp":
            reads.append(tf.raw_ops.ReadVariableOp(resource=op.outputs[0],
                                                   dtype=op.get_attr("dtype")))
        else:
            reads.append(op.outputs[0])
    return reads


def copy_values(sess, var_name):
    """Values of every local copy of a user variable, ref or resource (copy 0 first)."""
    return sess.run(_copy_reads(sess, var_name))


def all_copy_values(sess, var_names):
    """``{name: copy_values(sess, name)}`` in one run (a run per variable sets up an
    executor per variable: minutes for a ResNet on a loaded machine)."""
    names = list(var_names)
    return dict(zip(names, sess.run([_copy_reads(sess, name) for name in names])))


def this_workers_rows(batch, steps):
    """``(x, y)``: the rows this worker (of the current Env's cluster) reads so that step
    s covers global batch s of ``workers x devices x batch`` rows (:func:`worker_rows`)."""
    cluster = epl.Env.get().cluster
    workers, devices = cluster.worker_num, cluster.gpu_num_per_worker
    x, y = make_data(workers * devices * batch * steps)
    return tuple(worker_rows(rows, steps, workers, devices * batch, cluster.worker_index)
                 for rows in (x, y))


def train_and_save_copies(train, steps, out_dir, worker, after=None):
    """Run ``train`` ``steps`` times in a MonitoredTrainingSession, then save every
    local copy of each trainable variable to ``out_dir/worker_<worker>.npz``
    (keys: variable names with "/" as "__"), for launcher tests to compare.
    ``after(session)``, if given, runs on the raw session after training; its result
    is returned."""
    result = None
    with tf.train.MonitoredTrainingSession() as sess:
        for _ in range(steps):
            sess.run(train)
        raw = sess._tf_sess()  # pylint: disable=protected-access
        values = dict((v.op.name.replace("/", "__"), np.stack(copy_values(raw, v.op.name)))
                      for v in tf.trainable_variables())
        if after is not None:
            result = after(raw)
    np.savez(os.path.join(out_dir, "worker_%d.npz" % worker), **values)
    print("worker %d done" % worker)
    return result


def train_to_the_end(train, names, checkpoint_dir=None):
    """Run ``train`` in a MonitoredTrainingSession until the input ends.

    Returns a dict: ``runs`` that completed, ``step`` (the global step) and
    ``weights`` ({name: [every local copy]}) read in a hook's ``end()`` (which
    MonitoredTrainingSession calls only on a clean stop), ``stopped`` (when the
    OutOfRangeError came) and ``ended`` (when the session was closed)."""
    found = {"runs": 0}

    class End(tf.train.SessionRunHook):
        def end(self, session):
            found["step"] = int(session.run(tf.train.get_global_step()))
            found["weights"] = dict((n, copy_values(session, n)) for n in names)

    with tf.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=[End()],
                                           save_checkpoint_steps=100) as sess:
        while not sess.should_stop():
            try:
                sess.run(train)
            except tf.errors.OutOfRangeError:
                found["stopped"] = time.time()
                raise
            found["runs"] += 1
    found["ended"] = time.time()
    return found


MEASURED = []  # (test id, max difference) for the equivalence summary printed by conftest
TIMINGS = []  # (what, seconds) that tests measured, printed by conftest


def max_diff(reference, copies):
    """Largest |copy - reference| over all copies; recorded for the test report."""
    value = max(float(np.abs(np.asarray(c) - reference).max()) for c in copies)
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    MEASURED.append((test, value))
    return value


# Below the Slurm tests' derived ports (port_base 20000) and the kernel's ephemeral range.
_TEST_PORTS = (8000, 20000)
_PORT_LOCKS = []  # lock files of the ports this process reserved, held until it exits


def _reserve(port, lock_dir):
    """Hold ``port`` for this process if no other test process holds it and it binds."""
    import fcntl
    handle = open(os.path.join(lock_dir, "%d.lock" % port), "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    except OSError:
        handle.close()
        return False
    _PORT_LOCKS.append(handle)
    return True


def free_ports(count):
    """Ports for in-process servers, below the kernel's ephemeral range and reserved across
    the suite's processes by a lock file each. A port the kernel gave to one socket and took
    back is the next outgoing connection's local port as often as not: with a gRPC client of
    another test holding it, a server started there fails ("Could not start gRPC server") and
    its peers wait for it until the test's deadline (seen in CI)."""
    import random
    lock_dir = os.path.join(tempfile.gettempdir(), "epl-test-ports")
    os.makedirs(lock_dir, exist_ok=True)
    top = min(_TEST_PORTS[1], ephemeral_low())
    ports = []
    for port in random.sample(range(_TEST_PORTS[0], top), top - _TEST_PORTS[0]):
        if len(ports) == count:
            break
        if _reserve(port, lock_dir):
            ports.append(port)
    if len(ports) < count:
        raise RuntimeError("no free test ports in %d-%d" % (_TEST_PORTS[0], top))
    return ports


def slot_bytes_by_device(sess):
    """{device: bytes of the initialized Adam slots there}, measured in the session
    (a slot never initialized takes no memory). Slots are named like Adam's
    and AdamWeightDecay's."""
    graph = sess.graph
    slots = [op for op in graph.get_operations() if op.type in ("VariableV2", "VarHandleOp")
             and "adam" in op.name.lower() and "power" not in op.name
             and not op.name.startswith("EPL_ZERO_REMOTE")]
    with epl.paused():
        checks = [tf.is_variable_initialized(op.outputs[0]) if op.type == "VariableV2"
                  else tf.raw_ops.VarIsInitializedOp(resource=op.outputs[0]) for op in slots]
        flags = sess.run(checks)
    found = collections.defaultdict(int)
    for op, initialized in zip(slots, flags):
        if initialized:
            shape = tf.TensorShape(op.get_attr("shape"))
            found[op.device] += shape.num_elements() * 4
    return dict(found)


# When the running test must end (set by conftest from its pytest-timeout limit, minus a
# margin): helpers that wait stop waiting by then and fail with what was stuck, instead of
# pytest-timeout ending the whole process ("worker crashed", the stacks lost in the log).
TEST_DEADLINE = [None]
DEADLINE_MARGIN = 20  # seconds: enough for the test to fail with its own message, tear down


def wait_budget(timeout):
    """Seconds to wait: ``timeout``, or less if the running test's deadline is nearer."""
    if TEST_DEADLINE[0] is None:
        return timeout
    return max(0.0, min(timeout, TEST_DEADLINE[0] - time.time()))


def thread_stacks(threads):
    """The Python stack of each live thread, for a hang's error message."""
    frames = sys._current_frames()
    parts = []
    for index, thread in threads:
        frame = frames.get(thread.ident)
        if frame is not None:
            stack = "".join(traceback.format_stack(frame)[-6:])
            parts.append("worker %d was at:\n%s" % (index, stack))
    return "\n".join(parts)


def run_workers(fn, workers, devices_per_worker, config=None, timeout=120):
    """Run ``fn(worker_index)`` for each worker in its own thread, graph and Env.

    Each thread gets an explicit Cluster over 127.0.0.1 ports. Workers that have
    not finished after ``timeout`` seconds in all (or when the test's own deadline
    comes first) fail the test with their stacks instead of blocking the suite.
    """
    if workers > 1 and not isolation.in_isolated_process():
        raise AssertionError(
            "run_workers starts %d in-process tf.train.Servers, whose threads TensorFlow never "
            "ends: run it from a test marked @pytest.mark.servers, which runs in a process of "
            "its own (tests/isolation.py)" % workers)
    hosts = ["127.0.0.1:%d" % p for p in free_ports(workers)]
    results, errors, ended = [None] * workers, [], _Ended(workers)

    def target(index):
        try:
            with tf.Graph().as_default():
                epl.init(config, cluster=Cluster(hosts, index, devices_per_worker))
                results[index] = fn(index)
        except Exception as err:  # reported to the test below
            errors.append((index, err, time.time()))
        finally:
            ended.add(index)

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    budget = wait_budget(timeout)
    _join_workers(threads, errors, time.time() + budget, ended)
    hung = [(i, t) for i, t in enumerate(threads) if t.is_alive()]
    if errors:
        index, err, _ = errors[0]
        raise AssertionError("worker %d failed: %s: %s%s" % (
            index, type(err).__name__, err, "" if not hung else
            "\nworkers %s were still waiting for it:\n%s" % ([i for i, _ in hung],
                                                             thread_stacks(hung))))
    if hung:
        raise AssertionError("workers %s did not finish within %.0f s\n%s" % (
            [i for i, _ in hung], budget, thread_stacks(hung)))
    return results


PEER_ERROR_GRACE = 2.0  # seconds the other workers get to end after one worker's error


class _Ended:
    """Which worker threads have ended, with a condition the waiting test wakes on (a
    thread's own end cannot be waited for on several threads at once)."""

    def __init__(self, workers):
        self.workers, self.indices = workers, set()
        self.condition = threading.Condition()

    def add(self, index):
        with self.condition:
            self.indices.add(index)
            self.condition.notify_all()

    def all(self):
        return len(self.indices) == self.workers


def _join_workers(threads, errors, deadline, ended):
    """Wait for every thread until ``deadline``, or ``PEER_ERROR_GRACE`` after the first
    worker error: its peers would otherwise wait for it in a collective until the
    deadline, and the test would report a hang instead of the error (a worker that
    fails alone, for instance in its graph rewrite, is reported at once)."""
    with ended.condition:
        while not ended.all() and time.time() < deadline:
            if errors:
                deadline = min(deadline, errors[0][2] + PEER_ERROR_GRACE)
            ended.condition.wait(max(0.0, deadline - time.time()))
    for index in sorted(ended.indices):
        threads[index].join(5)  # it has ended its target; let the thread itself end


def run_launcher(args, timeout=200):
    """Run ``python -m epl.launcher ARGS``; on timeout stop it (and so its workers).

    Returns (exit code, combined output). SIGTERM lets the launcher stop
    every worker's process group before we give up on it.
    """
    proc = subprocess.Popen([sys.executable, "-m", "epl.launcher"] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        raise AssertionError("epl-launch did not finish within %d s:\n%s"
                             % (timeout, output.decode(errors="replace")[-3000:]))
    return proc.returncode, output.decode(errors="replace")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF1 = tf.version.VERSION.startswith("1.")
_TF_IMPORT = re.compile(r"^import tensorflow as tf$", re.M)


def compat_v1_copy(source, target):
    """A copy of the directory ``source`` (TF 1 programs: ``import tensorflow as tf``) in
    ``target``, switched the way docs/tf2.md tells TF 2.x users (what ``tf_upgrade_v2``
    produces): ``import tensorflow.compat.v1 as tf`` and ``tf.disable_v2_behavior()``.
    Nothing else in the programs changes. Returns ``target``."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for folder, _, files in os.walk(target):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as handle:
                    text = handle.read()
                with open(path, "w") as handle:
                    handle.write(_TF_IMPORT.sub(
                        "import tensorflow.compat.v1 as tf\ntf.disable_v2_behavior()", text))
    return target


def user_examples(tmp_path_factory):
    """The examples/ directory as a user of this TensorFlow runs it: the seeds' TF 1
    programs themselves on TF 1.15, their tf.compat.v1 switch (:func:`compat_v1_copy`)
    on TF 2.x, where ``import tensorflow as tf`` is the TF 2 API."""
    source = os.path.join(REPO, "examples")
    if TF1:
        return source
    return compat_v1_copy(source, str(tmp_path_factory.mktemp("compat_v1") / "examples"))


def stage_peak_bytes(settings, stages=2, traced=1):
    """Peak bytes allocated on each stage's device (stage order) in a traced step
    (activations and temporaries) of a pipeline of ``stages`` stages of 3 dense layers
    of 256 x 256 whose activations dwarf its weights (the model of
    benchmarks/zero_bubble_memory.py), under config ``settings``; the least of
    ``traced`` traced steps (see :func:`traced_stage_peaks`)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import zero_bubble_memory  # benchmarks/ is not a package
    finally:
        sys.path.pop(0)
    tf.reset_default_graph()
    return traced_stage_peaks(zero_bubble_memory.relu_stack_train(tf, settings, stages),
                              stages, traced)


def traced_stage_peaks(train, stages=2, traced=1):
    """Peak bytes allocated on each stage's device (stage order) in a traced run of
    ``train`` after one untraced run (stage s on device CPU:s of this worker). A peak
    depends on the order the executor happens to run ready ops in (the same graph
    measured 2.5-3.3 MB on a stage in different steps): with ``traced`` > 1, each
    stage's least peak over that many traced steps, the schedule's own need."""
    from epl.profiler import device_memory_stats
    peaks = [None] * stages
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        for _ in range(traced):
            meta = tf.RunMetadata()
            sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                     run_metadata=meta)
            stats = device_memory_stats(meta)
            for stage in range(stages):
                found = [m.peak_bytes for d, m in stats.items()
                         if d.endswith("device:CPU:%d" % stage)]
                if not found:
                    raise AssertionError("no allocation records for CPU:%d" % stage)
                peaks[stage] = min(max(found), peaks[stage] or max(found))
    return peaks


def trace_times(sess, op_name, end="all_end_rel_micros"):
    """({node: start micros}, {node: end micros}) of one traced run of op ``op_name``;
    ``end`` is the NodeExecStats field the end is measured by."""
    meta = tf.RunMetadata()
    sess.run(sess.graph.get_operation_by_name(op_name),
             options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE), run_metadata=meta)
    start, finish = {}, {}
    for device in meta.step_stats.dev_stats:
        for node in device.node_stats:
            start[node.node_name] = node.all_start_micros
            finish[node.node_name] = node.all_start_micros + getattr(node, end)
    return start, finish
