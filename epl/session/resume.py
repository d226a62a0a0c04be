"""Exact resume: the first training step after ``epl.init`` continues from the newest
snapshot, and a snapshot is written every ``checkpoint.snapshot_steps`` steps.

The TF hooks call :meth:`Snapshots.before_run` and :meth:`Snapshots.after_run` around
every ``session.run`` of a parallelized graph. Only *training runs* count: runs that
reach an apply op of the step (``SnapshotRecord.is_step``). So a restarted process,
whatever started it (``epl-launch --max_restarts``, a Kubernetes controller, Slurm's
``--requeue``, the same command again), resumes in the session, after the program has
done its own set-up (initialized or restored variables, initialized its iterators):

1. at the first training run since ``epl.init``, every worker picks the newest complete
   snapshot whose files are intact (:func:`epl.session.snapshot_store.choose`; every
   worker reads the same directory, so they pick the same one);
2. each worker restores its input positions from its part; worker 0 restores the model
   state (also the state only other workers hold, after the broadcast: ZeRO's slots,
   split shards); every worker then joins EPL's broadcast of replica 0's values (in a
   multi-worker job always, so no worker waits for a broadcast another one skips);
3. every worker checks that the global step now equals the step it resumed from
   (another snapshot chosen elsewhere is an error, never a silent mix);
4. after every ``snapshot_steps`` x ``runs_per_step`` training runs, each writer saves
   its part of a snapshot of the current global step; worker 0 prunes old ones.

A job that finds no snapshot writes one of its starting point at its first training run
(step 0, or the step of the checkpoint the program restored), so every restart has one.
A user's checkpoint that is newer than the newest snapshot is not used for the resume:
its input position is unknown, the snapshot's is exact (the steps after it are redone,
at most ``snapshot_steps``). What no snapshot can hold is reported once, at the first
training run: queue runners, inputs TensorFlow cannot serialize (``py_func``,
generators), data fed through ``feed_dict``, stateful random ops in the step.
"""
import collections
import logging
import os
import threading
import time
import weakref

from epl import tf_adapter
from epl.ir.traverse import ancestors
from epl.session import snapshot_store as store
from epl.session.faults import ResumeMismatchError
from epl.session.runner import ensure_synced, mark_unsynced

LOG = logging.getLogger("epl")

SnapshotSettings = collections.namedtuple("SnapshotSettings", ["directory", "every", "keep"])
SnapshotSettings.__doc__ = """checkpoint.snapshot_dir, snapshot_steps and snapshot_keep."""
# The model's data file has no CRC-32 in the manifest: its index (which has one) records
# each tensor's CRC32C, and a resume has TF read the tensors back (snapshot_store.problem)
MODEL_DATA = "model.data-"
InputState = collections.namedtuple("InputState", ["name", "saver", "state"])
InputState.__doc__ = """One tf.data iterator: its op ``name``, the Saver of its state and
the serialized ``state`` tensor (run once at start to check that it can be saved)."""


class SnapshotRecord(object):
    """What a snapshot holds on this worker (built by epl.runtime.snapshot_state)."""

    def __init__(self, settings, worker, writers, global_step, apply_ops, runs_per_step,
                 model_saver, inputs, not_exact):
        self.settings, self.worker, self.writers = settings, worker, tuple(writers)
        self.global_step, self.apply_ops = global_step, frozenset(apply_ops)
        self.runs_per_step, self.model_saver = runs_per_step, model_saver
        self.inputs, self.not_exact = tuple(inputs), tuple(not_exact)
        self._steps = {}

    def is_step(self, ops):
        """True if a run of ``ops`` trains (reaches an apply op); cached per fetch set."""
        key = frozenset(op.name for op in ops)
        if key not in self._steps:
            self._steps[key] = bool(self.apply_ops & ancestors(ops))
        return self._steps[key]

    def __repr__(self):
        return "SnapshotRecord(worker=%d, writers=%s, inputs=%d, model=%s, every=%d)" % (
            self.worker, self.writers, len(self.inputs), self.model_saver is not None,
            self.settings.every)


class _SessionState(object):
    def __init__(self):
        self.runs = 0
        # input names whose state is not saved; None until known: a resume checks each
        # input before it restores, a fresh job's first snapshot finds out by saving
        self.skipped = None
        self.committing = None  # the step-0 snapshot's _Commit while the first run runs


def _value(run, session, tensor):
    return int(run(session, tensor))


class Snapshots(object):
    """Resume and snapshots of one ``epl.init`` (``Env.snapshots``). Only the first
    training session since ``epl.init`` resumes; later ones in the same process
    (another ``Estimator.train``) continue from what the program gives them."""

    def __init__(self):
        self._resumed = False
        self._sessions = weakref.WeakKeyDictionary()
        self._warned = set()
        self._lock = threading.Lock()
        self.resumed_from = None   # step of the snapshot this process resumed from
        self.written = []          # (step, seconds) of every snapshot written

    def before_run(self, session, program, run, ops, feed_dict):
        """Resume at the first training run; returns whether this run trains."""
        record = getattr(program, "snapshot", None)
        if record is None or not record.is_step(ops):
            return False
        if session not in self._sessions:
            with self._lock:
                if session not in self._sessions:
                    self._sessions[session] = self._start(session, program, run, record,
                                                          feed_dict)
        return self._sessions[session] is not None

    def after_run(self, session, program, run, training):
        """Count a finished training run; write a snapshot when one is due."""
        if not training:
            return
        state = self._sessions.get(session)
        record = program.snapshot
        state.runs += 1
        if state.committing is not None:  # the step-0 snapshot, finished while this run ran
            committing, state.committing = state.committing, None
            committing.join()
        if state.runs % (record.settings.every * record.runs_per_step) == 0:
            self._write(session, run, record, state)

    # ---- start -----------------------------------------------------------------------
    def _warn_once(self, message):
        if message not in self._warned:
            self._warned.add(message)
            LOG.warning("EPL: a resume will not be exact: %s", message)

    def _start(self, session, program, run, record, feed_dict):
        if record.global_step is None:
            self._warn_once("the graph has no global step, so EPL cannot number its "
                            "snapshots and writes none (create one with "
                            "tf.train.get_or_create_global_step() and pass it to minimize)")
            return None
        for problem in record.not_exact:
            self._warn_once(problem)
        if feed_dict:
            self._warn_once(
                "the training step is fed through feed_dict (%s): EPL cannot save where "
                "your loop is in the data it feeds; after a resume it feeds what your loop "
                "feeds next" % ", ".join(sorted(getattr(k, "name", str(k))
                                                for k in feed_dict)[:3]))
        state = _SessionState()
        if not self._resumed:
            self._resumed = True
            self._resume(session, program, run, record, state)
        return state

    def _unsaveable_inputs(self, session, run, record):
        """Names of inputs whose state cannot be saved (warned) or that are not in use.
        Each input is tried in a run of its own: when a run fails, TF cancels its other
        ops, and a one-shot iterator whose first initialization is cancelled keeps that
        error (the job's training runs then fail "Operation was cancelled")."""
        skipped = set()
        for entry in record.inputs:
            try:
                run(session, entry.state.op)
            except Exception as err:  # pylint: disable=broad-except
                skipped.add(entry.name)
                self._not_saved(entry, err)
        return skipped

    def _not_saved(self, entry, err):
        """Say why input ``entry`` is left out of snapshots (``err``: TF's error, which
        names what cannot be saved)."""
        text = error_reason(err)
        if "not been initialized" in text or "uninitialized" in text.lower():
            LOG.info("EPL: input %s is not initialized at the first step; its "
                     "position is not saved", entry.name)
            return
        self._warn_once("TensorFlow cannot save the position of input %s (%s: %s); "
                        "after a resume it starts at its beginning"
                        % (entry.name, type(err).__name__, text))

    # ---- resume ----------------------------------------------------------------------
    def _resume(self, session, program, run, record, state):
        root = record.settings.directory
        before = _value(run, session, record.global_step)
        step, manifests = store.choose(root, verify=_checkpoint_problem)
        restored = None
        if step is not None:
            state.skipped = self._unsaveable_inputs(session, run, record)
            restored = self._restore(session, run, record, state, step, manifests)
            LOG.warning("EPL: resuming from the snapshot of step %d in %s (the program "
                        "had set up step %d)", step, root, before)
            self.resumed_from = step
        if restored is not None or len(record.writers) > 1 or program.peer_hosts:
            mark_unsynced(session, restored)
        ensure_synced(session, program, run)
        after = _value(run, session, record.global_step)
        expected = before if step is None else step
        if after != expected:
            raise ResumeMismatchError(
                "EPL: worker %d resumed %s, but after the broadcast of worker 0's state the "
                "global step is %d: the workers chose different snapshots. Is %s on a file "
                "system every worker shares (checkpoint.snapshot_dir)?" % (
                    record.worker, "from the snapshot of step %d" % step if step is not None
                    else "without a snapshot (at step %d)" % before, after, root))
        if step is None:
            # Where this job starts is a snapshot too: a kill before the first periodic
            # one resumes here, not from a user's checkpoint without its input position.
            self._write(session, run, record, state, background=True)

    def _restore(self, session, run, record, state, step, manifests):
        """Restore this worker's inputs and (worker 0) the model; returns (saver, path)
        of the model restore or None."""
        directory = store.step_dir(record.settings.directory, step)
        own = manifests.get(record.worker)
        if sorted(manifests) != sorted(record.writers) or own is None:
            self._warn_once("the snapshot of step %d was written by workers %s, this job's "
                            "are %s: input positions are not restored"
                            % (step, sorted(manifests), list(record.writers)))
            own = {"inputs": {}}
        for entry in record.inputs:
            prefix = own.get("inputs", {}).get(entry.name)
            if prefix is None:
                if entry.name not in state.skipped:
                    self._warn_once("the snapshot of step %d holds no position of input %s"
                                    % (step, entry.name))
                continue
            _run_restore(session, run, entry.saver, os.path.join(directory, prefix))
        if record.model_saver is None:
            return None
        path = os.path.join(directory, "model")
        _run_restore(session, run, record.model_saver, path)
        return record.model_saver, path

    # ---- write -----------------------------------------------------------------------
    def _write(self, session, run, record, state, background=False):
        """Save this worker's part of a snapshot of the current step, then commit it
        (flush, checksums, manifest). ``background``: the commit runs on a thread while
        the next run computes (the step-0 snapshot: see _Commit)."""
        start = time.time()
        root = record.settings.directory
        step = _value(run, session, record.global_step)
        directory = store.begin_part(root, step, record.worker)
        inputs, prefixes = self._save(session, run, record, state, directory)
        files = [name for name in os.listdir(directory)
                 if name.startswith(tuple(prefixes)) and "tempstate" not in name]

        def commit():
            store.commit_part(root, step, record.worker, record.writers, files,
                              extra={"inputs": inputs},
                              self_checked=[n for n in files if n.startswith(MODEL_DATA)])
            if record.model_saver is not None:
                store.prune(root, record.settings.keep)
            seconds = time.time() - start
            self.written.append((step, seconds))
            LOG.info("EPL: snapshot of step %d written to %s in %.2f s", step, directory,
                     seconds)
        if background:
            state.committing = _Commit(commit, step)
        else:
            commit()

    def _save(self, session, run, record, state, directory):
        """Save this worker's part into ``directory``; returns ({input name: file
        prefix}, [prefixes of the files written]).

        Each new set of fetches costs TF a pruning, a placement and executors (about
        0.25 s CPU on a 12k-op encoder), and a fresh job pays for its first snapshot
        before its first step, so that snapshot is also the check that each input can
        be saved (``state.skipped`` None): an input that fails to save is left out.
        With one input, it and the model are saved in one run (that input's iterator is
        initialized before its state is read, so a failure cancels no initialization);
        only when that run fails is each saved alone. Several inputs are saved one run
        each (see _unsaveable_inputs)."""
        if state.skipped is None and len(record.inputs) == 1 and record.model_saver is not None:
            entry, prefix = record.inputs[0], _input_prefix(record, 0)
            try:
                run(session, [_save_tensor(entry.saver), _save_tensor(record.model_saver)],
                    dict([_save_feed(entry.saver, os.path.join(directory, prefix)),
                          _save_feed(record.model_saver, os.path.join(directory, "model"))]))
                state.skipped = set()
                return {entry.name: prefix}, [prefix + ".", "model."]
            except Exception:  # pylint: disable=broad-except
                pass  # the input cannot be saved (or the model): alone, below
        checking = state.skipped is None
        state.skipped = set() if checking else state.skipped
        inputs, prefixes = {}, []
        for index, entry in enumerate(record.inputs):
            if entry.name in state.skipped:
                continue
            prefix = _input_prefix(record, index)
            try:
                _run_save(session, run, entry.saver, os.path.join(directory, prefix))
            except Exception as err:  # pylint: disable=broad-except
                if not checking:
                    raise
                state.skipped.add(entry.name)
                self._not_saved(entry, err)
                continue
            inputs[entry.name] = prefix
            prefixes.append(prefix + ".")
        if record.model_saver is not None:
            _run_save(session, run, record.model_saver, os.path.join(directory, "model"))
            prefixes.append("model.")
        return inputs, prefixes


class _Commit(object):
    """The commit of the step-0 snapshot (flushing its files to disk, checksums of the
    small ones, the manifest) on a thread, while the first training run computes: the
    files were saved before that run started, and no run changes them. The first run
    joins it before it returns (Snapshots.after_run), so every step a program has seen
    complete has the snapshot of where the job started; a kill before that leaves no
    manifest, as a kill during set-up does, and the job starts again from its own
    set-up. An error is raised there, and logged here in case that run fails first."""

    def __init__(self, work, step):
        self.error = None
        self._thread = threading.Thread(target=self._run, args=(work, step),
                                        name="epl-snapshot-commit-%d" % step)
        self._thread.start()

    def _run(self, work, step):
        try:
            work()
        except BaseException as err:  # pylint: disable=broad-except (re-raised at join)
            self.error = err
            LOG.error("EPL: the snapshot of step %d could not be committed: %s", step, err)

    def join(self):
        self._thread.join()
        if self.error is not None:
            raise self.error


def error_reason(err):
    """The first line of a TF error that says what went wrong: errors that come back from
    another task of a distributed session start with a line "From /job:worker/...:" that
    names only the task."""
    lines = [line.strip() for line in str(err).split("\n") if line.strip()]
    said = [line for line in lines if not (line.startswith("From /job:") and line.endswith(":"))]
    return (said or lines or [""])[0]


def _checkpoint_problem(data_path):
    """What is wrong with the TF checkpoint whose data file is ``data_path`` (the
    model's: every tensor read back, which checks its CRC32C), or None."""
    return tf_adapter.checkpoint_problem(data_path.rsplit(".data-", 1)[0])


def _input_prefix(record, index):
    return "data-%d-%d" % (record.worker, index)


def _save_tensor(saver):
    return saver.saver_def.save_tensor_name


def _save_feed(saver, path):
    return saver.saver_def.filename_tensor_name, path


def _run_save(session, run, saver, path):
    run(session, _save_tensor(saver), dict([_save_feed(saver, path)]))


def _run_restore(session, run, saver, path):
    """Restore ``saver`` from ``path``; its restore ops are built now if they were
    deferred (a snapshot Saver's: only a resume needs them, in a finalized graph that
    the session extends at this run)."""
    restore = tf_adapter.restore_op_name(saver)
    run(session, restore, {saver.saver_def.filename_tensor_name: path})
