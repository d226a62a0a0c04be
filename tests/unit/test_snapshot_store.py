"""Snapshots on disk (epl.session.snapshot_store): no TensorFlow, real files.

A part counts only once its manifest is written (a kill during the write leaves none);
a snapshot is complete with every writer's part; a damaged complete snapshot is
skipped for the previous one, with a warning; pruning keeps the newest complete ones.
"""
import logging
import os
import stat

import pytest

from epl.session import snapshot_store as store


def _part(root, step, worker, writers=(0, 1), content=b"state", commit=True):
    directory = store.begin_part(str(root), step, worker)
    name = "data-%d-0.index" % worker
    with open(os.path.join(directory, name), "wb") as handle:
        handle.write(content + b"-%d-%d" % (step, worker))
    if commit:
        store.commit_part(str(root), step, worker, writers, [name],
                          extra={"inputs": {"it": "data-%d-0" % worker}})
    return os.path.join(directory, name)


def test_a_snapshot_is_complete_only_with_every_writers_part(tmp_path):
    _part(tmp_path, 4, 0)
    assert store.complete(str(tmp_path), 4) is None  # worker 1 still writing
    assert store.choose(str(tmp_path)) == (None, None)
    _part(tmp_path, 4, 1)
    manifests = store.complete(str(tmp_path), 4)
    assert sorted(manifests) == [0, 1]
    assert manifests[1]["inputs"] == {"it": "data-1-0"} and manifests[1]["step"] == 4
    assert store.choose(str(tmp_path))[0] == 4
    assert store.newest_step(str(tmp_path)) == 4


def test_a_part_torn_by_a_kill_is_never_used(tmp_path):
    """Files written, no manifest: the kill came before the commit."""
    for worker in (0, 1):
        _part(tmp_path, 2, worker)
    _part(tmp_path, 4, 0)
    _part(tmp_path, 4, 1, commit=False)
    assert store.choose(str(tmp_path))[0] == 2
    assert store.newest_step(str(tmp_path)) == 2
    assert not [n for n in os.listdir(store.step_dir(str(tmp_path), 4)) if n.endswith(".tmp")]


def test_rewriting_a_step_hides_the_old_part_until_committed(tmp_path):
    """A restarted job writes a step again: its part is absent while it is written, even
    though an earlier attempt committed one for the same step."""
    for worker in (0, 1):
        _part(tmp_path, 6, worker)
    _part(tmp_path, 6, 0, content=b"again", commit=False)
    assert store.complete(str(tmp_path), 6) is None


def test_a_damaged_newest_snapshot_falls_back_to_the_previous_with_a_warning(
        tmp_path, caplog):
    for step in (2, 4):
        for worker in (0, 1):
            path = _part(tmp_path, step, worker)
    with open(path, "r+b") as handle:  # step 4, worker 1: one byte changed, same size
        handle.write(b"X")
    caplog.set_level(logging.WARNING, logger="epl")
    step, manifests = store.choose(str(tmp_path))
    assert step == 2 and sorted(manifests) == [0, 1]
    assert "snapshot of step 4" in caplog.text and "is damaged" in caplog.text
    assert "does not match its manifest" in caplog.text and path in caplog.text
    os.remove(path)
    assert store.problem(str(tmp_path), 4, store.complete(str(tmp_path), 4)).endswith(
        "is missing")


def test_a_file_that_checks_itself_is_recorded_by_size_and_verified_when_chosen(
        tmp_path, monkeypatch):
    """A TF checkpoint's data file (the model's, 1.3 GB on BERT-base) is not read back for
    a CRC-32 at each write: its index records each tensor's CRC32C, and choosing a
    snapshot has TF check them (``verify``). Its size is still checked without TF."""
    read = []
    checksum = store._checksum
    monkeypatch.setattr(store, "_checksum", lambda path: read.append(path) or checksum(path))
    for step in (2, 4):
        directory = store.begin_part(str(tmp_path), step, 0)
        for name in ("model.index", "model.data-00000-of-00001"):
            with open(os.path.join(directory, name), "wb") as handle:
                handle.write(b"tensors-%d" % step)
        store.commit_part(str(tmp_path), step, 0, [0],
                          ["model.index", "model.data-00000-of-00001"],
                          self_checked=["model.data-00000-of-00001"])
    assert [os.path.basename(p) for p in read] == ["model.index"] * 2
    files = store.complete(str(tmp_path), 4)[0]["files"]
    assert files["model.data-00000-of-00001"] == [len(b"tensors-4"), None]
    checked = []

    def verify(path):
        checked.append(os.path.basename(os.path.dirname(path)))
        return "Checksum does not match" if "step-000000000004" in path else None
    chosen = store.choose(str(tmp_path), verify=verify)
    assert chosen[0] == 2 and checked == ["step-000000000004", "step-000000000002"]
    assert store.problem(str(tmp_path), 4, store.complete(str(tmp_path), 4)) is None
    with open(os.path.join(store.step_dir(str(tmp_path), 4), "model.data-00000-of-00001"),
              "ab") as handle:
        handle.write(b"x")
    assert "has 10 bytes, its manifest records 9" in store.problem(
        str(tmp_path), 4, store.complete(str(tmp_path), 4))


def test_a_manifest_that_is_not_json_makes_the_part_absent(tmp_path):
    for worker in (0, 1):
        _part(tmp_path, 2, worker)
    with open(store.manifest_path(str(tmp_path), 2, 1), "w") as handle:
        handle.write("{\"trunc")
    assert store.complete(str(tmp_path), 2) is None


def test_prune_keeps_the_newest_complete_and_what_is_still_written(tmp_path):
    for step in (2, 4, 6, 8):
        for worker in (0, 1):
            _part(tmp_path, step, worker)
    _part(tmp_path, 3, 0)             # torn by an earlier kill, older than the newest
    _part(tmp_path, 10, 0)            # worker 1 is still writing its part
    store.prune(str(tmp_path), keep=2)
    assert store.steps(str(tmp_path)) == [10, 8, 6]


def test_check_writable_names_the_key_and_the_path(tmp_path):
    store.check_writable(str(tmp_path / "new" / "dir"))
    assert os.path.isdir(str(tmp_path / "new" / "dir"))
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(str(locked), stat.S_IRUSR | stat.S_IXUSR)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    try:
        for bad in (str(blocker / "sub"), str(locked / "sub")):
            if bad.startswith(str(locked)) and os.access(str(locked), os.W_OK):
                continue  # root may write anyway
            with pytest.raises(store.SnapshotDirError) as info:
                store.check_writable(bad)
            message = str(info.value)
            assert "checkpoint.snapshot_dir=%r" % bad in message
            assert "not a writable directory" in message
    finally:
        os.chmod(str(locked), stat.S_IRWXU)


def test_no_directory_means_no_progress():
    assert store.newest_step(None) is None
    assert store.newest_step("/nonexistent/epl/snapshots") is None


def test_an_input_left_out_of_snapshots_is_named_with_tfs_reason():
    """Errors that come back from another task of a distributed session start with a line
    naming only the task; the warning about an input that cannot be saved gave that line
    ("FailedPreconditionError: From /job:worker/replica:0/task:1:") instead of TF's reason,
    and an input that was only not yet initialized was warned about as unsaveable."""
    from epl.session.resume import error_reason
    remote = ValueError("From /job:worker/replica:0/task:1:\nSerializeIterator: stateful "
                        "function RandomStandardNormal cannot be serialized\n\t [[node x]]")
    assert error_reason(remote).startswith("SerializeIterator: stateful function")
    assert error_reason(ValueError("GetNext() failed because the iterator has not been "
                                   "initialized.\nmore")).endswith("not been initialized.")
    assert error_reason(ValueError("")) == ""
