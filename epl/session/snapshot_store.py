"""Snapshots on disk: atomic parts, complete snapshots, the newest valid one, pruning.

No TensorFlow here (``epl-launch`` reads :func:`newest_step` to see an attempt's
progress). A snapshot of global step ``s`` is a directory ``<root>/step-<s>`` holding
the files each writing worker saved (worker 0: the model state; every worker with an
input pipeline: its data position) and one manifest per writer, ``worker-<w>.json``:
its files with their sizes and CRC-32s, and the list of writers. A TF checkpoint's data
file (the model's) has no CRC-32 of its own: its bundle's index, which has one, records
the CRC32C of every tensor, and :func:`choose` has TF read them back (``verify``), so
a write never reads the whole model back (issue 41: 0.5 s CPU and 1.4 s on BERT-base's
1.3 GB). Atomicity:

* a writer first deletes its own manifest (a part being written is absent, even where
  an earlier attempt left one for the same step), saves its files, flushes them to
  disk, then writes its manifest to a temporary name and renames it (atomic on POSIX);
* a snapshot is complete when every writer's manifest is there, and valid when every
  file has the size and CRC-32 its manifest records. A kill during a write leaves no
  manifest (never used) or a file that fails its check (used only if nothing newer is
  valid, with a warning naming it).

Every worker chooses the same snapshot from the same directory (a file system all
workers share), so their model state and data positions match; the session checks
that after restoring (epl.session.resume).
"""
import json
import logging
import os
import re
import shutil
import threading
import zlib

LOG = logging.getLogger("epl")
SNAPSHOT_DIR_VARIABLE = "EPL_CHECKPOINT_SNAPSHOT_DIR"  # checkpoint.snapshot_dir's variable
FORMAT = 2  # 2: files checked by their own format have no CRC-32 (null)
_STEP_DIR = re.compile(r"^step-(\d+)$")
_CHUNK = 1 << 20


class SnapshotDirError(RuntimeError):
    """The snapshot directory cannot be used (named in the message)."""


def step_dir(root, step):
    return os.path.join(root, "step-%012d" % step)


def manifest_path(root, step, worker):
    return os.path.join(step_dir(root, step), "worker-%d.json" % worker)


def check_writable(root, key="checkpoint.snapshot_dir"):
    """Create ``root`` and write a file there, or raise SnapshotDirError naming it: a
    job must learn at start, not at its first snapshot, that it cannot save one."""
    probe = os.path.join(root, ".epl-write-test-%d-%d" % (os.getpid(), threading.get_ident()))
    try:
        os.makedirs(root, exist_ok=True)
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as err:
        raise SnapshotDirError("%s=%r is not a writable directory (%s); EPL writes its "
                               "snapshots there. Give a writable path (EPL_CHECKPOINT_"
                               "SNAPSHOT_DIR) or set checkpoint.snapshot_steps=0 to write "
                               "none" % (key, root, err.strerror or err))


def _checksum(path):
    crc, size = 0, 0
    with open(path, "rb") as handle:
        while True:
            block = handle.read(_CHUNK)
            if not block:
                return size, crc & 0xffffffff
            size += len(block)
            crc = zlib.crc32(block, crc)


def _fsync(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def begin_part(root, step, worker):
    """Prepare worker ``worker``'s part of snapshot ``step``; returns the directory its
    files go to. Its manifest is removed first, so the part counts as absent until
    :func:`commit_part`."""
    directory = step_dir(root, step)
    os.makedirs(directory, exist_ok=True)
    try:
        os.remove(manifest_path(root, step, worker))
    except FileNotFoundError:
        pass
    return directory


def commit_part(root, step, worker, writers, files, extra=None, self_checked=()):
    """Record worker ``worker``'s part of snapshot ``step`` (its ``files``, names in the
    step directory) after flushing them to disk. ``writers``: every worker that writes a
    part of this snapshot; ``extra``: more entries of the manifest (which file holds
    which input's position); ``self_checked``: files whose own format checks their
    bytes (a TF checkpoint's data file), recorded with their size only."""
    directory = step_dir(root, step)
    entries = {}
    for name in sorted(files):
        path = os.path.join(directory, name)
        _fsync(path)
        entries[name] = [os.path.getsize(path), None] if name in self_checked \
            else list(_checksum(path))
    manifest = dict(extra or {})
    manifest.update({"format": FORMAT, "step": int(step), "worker": int(worker),
                     "writers": sorted(int(w) for w in writers), "files": entries})
    final = manifest_path(root, step, worker)
    temporary = final + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(manifest, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)
    _fsync(directory, directory=True)


def steps(root):
    """Steps of every snapshot directory under ``root``, newest first."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = [int(m.group(1)) for m in map(_STEP_DIR.match, names) if m]
    return sorted(found, reverse=True)


def _read_manifest(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def complete(root, step):
    """{writer: manifest} when every writer of snapshot ``step`` recorded its part, else
    None (a snapshot being written, or torn by a kill)."""
    first = None
    directory = step_dir(root, step)
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        if name.startswith("worker-") and name.endswith(".json"):
            first = _read_manifest(os.path.join(directory, name))
            if first is not None:
                break
    if first is None:
        return None
    manifests = {}
    for writer in first.get("writers", ()):
        manifest = _read_manifest(manifest_path(root, step, writer))
        if manifest is None or manifest.get("writers") != first["writers"]:
            return None
        manifests[writer] = manifest
    return manifests


def problem(root, step, manifests, verify=None):
    """What is wrong with the files of a complete snapshot, or None when every file
    has the size and CRC-32 its manifest records. A file recorded without a CRC-32
    (its format checks itself) has its size checked and then ``verify(path)``: what is
    wrong with it, or None (without ``verify``, its size only)."""
    directory = step_dir(root, step)
    for writer, manifest in sorted(manifests.items()):
        for name, (size, crc) in sorted(manifest["files"].items()):
            path = os.path.join(directory, name)
            if not os.path.exists(path):
                return "worker %d's file %s is missing" % (writer, path)
            if crc is None:
                found = os.path.getsize(path)
                trouble = ("it has %d bytes, its manifest records %d" % (found, size)
                           if found != size else verify and verify(path))
                if trouble:
                    return "worker %d's file %s does not match its manifest (%s)" % (
                        writer, path, trouble)
            elif _checksum(path) != (size, crc):
                return "worker %d's file %s does not match its manifest" % (writer, path)
    return None


def newest_step(root):
    """Step of the newest complete snapshot (files unchecked), or None: the launcher's
    measure of an attempt's progress."""
    if not root:
        return None
    for step in steps(root):
        if complete(root, step) is not None:
            return step
    return None


def choose(root, verify=None):
    """(step, {writer: manifest}) of the newest complete snapshot whose files are intact,
    or (None, None). A newer snapshot that is complete but damaged is skipped with a
    warning (the previous one is used); incomplete ones are skipped silently (a kill
    during their write, they were never committed). ``verify``: see :func:`problem`."""
    for step in steps(root):
        manifests = complete(root, step)
        if manifests is None:
            continue
        trouble = problem(root, step, manifests, verify)
        if trouble is None:
            return step, manifests
        LOG.warning("EPL: snapshot of step %d in %s is damaged (%s); using the previous "
                    "one", step, root, trouble)
    return None, None


def prune(root, keep):
    """Delete all but the ``keep`` newest complete snapshots, and incomplete ones older
    than the newest complete one (torn by a kill). Only worker 0 prunes, after its own
    part of a snapshot; a snapshot newer than the newest complete one may still be
    written by other workers and is left alone."""
    kept = 0
    newest_complete = None
    for step in steps(root):
        whole = complete(root, step) is not None
        if whole and kept < keep:
            kept += 1
            newest_complete = step if newest_complete is None else newest_complete
            continue
        if newest_complete is None:
            continue
        shutil.rmtree(step_dir(root, step), ignore_errors=True)
