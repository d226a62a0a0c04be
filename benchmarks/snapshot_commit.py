"""What a snapshot's model save costs, per shape, and EPL's commit of it (issue 41).

A job with snapshots writes one of its starting point at its first training run. Its
model part is one TF ``SaveV2`` of the whole state (TF's own cost, which a plain TF
program with ``checkpoint_dir`` pays too), then EPL's commit: each file flushed to
disk, checksums, the manifest. Until issue 41 the commit read the model's data file
back for a CRC-32; now that file is recorded by its size (its bundle's index records
each tensor's CRC32C) and a resume has TF read the tensors back. For each shape of
``shapes.py`` (plain TF graph, EPL's model Saver: every saveable), this measures how
the costs grow with the state's bytes:

* the save run: CPU and wall, its first run (a new set of fetches) and the same save
  again;
* the commit with a CRC-32 of every file (``crc32 all``, the code before) and with the
  model's data file by size (``size only``), alternated ``--repeats`` times on fresh
  saves of the same state;
* the check at resume of each kind (CRC-32 of the file, or TF reading every tensor).

CPU seconds are the process's (every thread), the load-independent measure; wall
times move with the load and the disk. No EPL rewrite runs here (``epl`` is imported
only for its snapshot store and TF adapter).

    .venv/bin/python benchmarks/snapshot_commit.py                  # resnet, mid, bert
    .venv/bin/python benchmarks/snapshot_commit.py --shapes resnet --repeats 2

Writes benchmarks/results/snapshot_commit.{json,md}.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

MODEL_DATA = "model.data-"


def _timed(work):
    """(result, wall s, process CPU s) of ``work()``."""
    wall, cpu = time.time(), time.process_time()
    result = work()
    return result, time.time() - wall, time.process_time() - cpu


def _save(sess, saver, store, root, step):
    """Save the model as step ``step``'s part; returns (files, wall, cpu)."""
    directory = store.begin_part(root, step, 0)
    definition = saver.saver_def
    _, wall, cpu = _timed(lambda: sess.run(definition.save_tensor_name, {
        definition.filename_tensor_name: os.path.join(directory, "model")}))
    files = [n for n in os.listdir(directory) if n.startswith("model.") and "tempstate" not in n]
    return files, wall, cpu


def measure_shape(tf, name, repeats, root):
    """One shape: its state's bytes, the save, both commits and both resume checks."""
    import shapes
    from epl import tf_adapter
    from epl.session import snapshot_store as store
    with tf.Graph().as_default():
        shapes.build(tf, name, shapes.SHAPES[name].micro_batch * 4)
        saver = tf.train.Saver(tf_adapter.all_saveable_objects(), max_to_keep=None)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            saves, commits = [], {"crc32 all": [], "size only": []}
            for step in range(2 * repeats):
                files, wall, cpu = _save(sess, saver, store, root, step)
                saves.append((wall, cpu))
                kind = "size only" if step % 2 else "crc32 all"
                checked = [n for n in files if n.startswith(MODEL_DATA)] if step % 2 else []
                _, wall, cpu = _timed(lambda: store.commit_part(root, step, 0, [0], files,
                                                                self_checked=checked))
                commits[kind].append((wall, cpu))
            size = sum(os.path.getsize(os.path.join(store.step_dir(root, 0), n)) for n in files)
            verify = lambda path: tf_adapter.checkpoint_problem(path.rsplit(".data-", 1)[0])
            checks = {}
            for kind, step in (("crc32 all", 0), ("size only", 1)):
                trouble, wall, cpu = _timed(lambda: store.problem(
                    root, step, store.complete(root, step), verify))
                assert trouble is None, trouble
                checks[kind] = (wall, cpu)
    shutil.rmtree(root, ignore_errors=True)
    return dict(shape=name, bytes=size, first_save=saves[0], saves=saves[1:],
                commits=commits, checks=checks)


def _median(pairs, index):
    return statistics.median(pair[index] for pair in pairs) if pairs else float("nan")


def _range(pairs, index):
    values = [pair[index] for pair in pairs]
    return "%.2f-%.2f" % (min(values), max(values)) if values else "-"


def markdown(payload):
    info = payload["runs"][0]
    lines = ["# A snapshot's model save and EPL's commit of it, per shape", "",
             "- `%s`; %s; EPL git %s; %s, %s CPUs; load average at start %s" % (
                 info["command"], info["date"], info["git_revision"], info["cpu_model"],
                 info["cpu_count"], info["loadavg_start"]),
             "- plain TF graph of each shape of `shapes.py`, a Saver over every saveable (as "
             "EPL's snapshot has); CPU s = the process's, all threads; ranges over %d "
             "alternated commits of each kind on fresh saves of the same state; crc32 all = "
             "the commit before issue 41d (the model's data file read back for a CRC-32), "
             "size only = after (TF checks that file's tensors at resume)" % payload["repeats"],
             ""]
    rows = []
    for r in payload["records"]:
        rows.append([r["shape"], "%.0f" % (r["bytes"] / 1e6),
                     "%.2f / %.2f" % (r["first_save"][1], _median(r["saves"], 1)),
                     "%.2f" % _median(r["saves"], 0),
                     _range(r["commits"]["crc32 all"], 1), _range(r["commits"]["size only"], 1),
                     _range(r["commits"]["crc32 all"], 0), _range(r["commits"]["size only"], 0),
                     "%.2f" % r["checks"]["crc32 all"][1], "%.2f" % r["checks"]["size only"][1]])
    lines.append(common.markdown_table(
        ["shape", "state MB", "save CPU s: first / again", "save wall s",
         "commit CPU s: crc32 all", "size only", "commit wall s: crc32 all", "size only",
         "resume check CPU s: crc32", "TF reads tensors"], rows))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=common.csv_list(str), default=["resnet", "mid", "bert"])
    parser.add_argument("--repeats", type=common.positive_int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    tf = common.graph_mode_tf()
    started = time.time()
    scratch = tempfile.mkdtemp(prefix="epl_bench_snapshot_")
    try:
        records = []
        for name in args.shapes:
            records.append(measure_shape(tf, name, args.repeats, os.path.join(scratch, name)))
            print("%s: %.0f MB" % (name, records[-1]["bytes"] / 1e6), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    payload = dict(records=records, repeats=args.repeats,
                   runs=[common.environment_info(sys.argv)])
    return common.publish(args.out, "snapshot_commit", payload, markdown(payload),
                          time.time() - started)


if __name__ == "__main__":
    sys.exit(main())
