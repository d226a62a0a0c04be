"""Worker script for the TFJob evaluator test: tf.estimator.train_and_evaluate, the
same on every task (chief, worker, evaluator), as a TFJob runs it.

Usage: estimator_tae.py OUT_DIR STEPS BATCH. Training tasks train on their rows of
each global batch (see eplutil.worker_rows) into OUT_DIR/model; the evaluator
evaluates the checkpoints there on fixed rows. Each task writes
OUT_DIR/<task type>.json: its EPL cluster and what train_and_evaluate returned.
"""
import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..")]

import tensorflow.compat.v1 as tf  # noqa: E402
tf.disable_v2_behavior()  # TF 2.x: graph mode (docs/tf2.md); nothing on TF 1.15

import epl  # noqa: E402
from eplutil import make_data, this_workers_rows  # noqa: E402
from estimator_model import input_fn, make_model_fn, run_config  # noqa: E402

EVAL_ROWS = make_data(16, seed=7)


def main(out_dir, steps, batch):
    logging.getLogger("epl").addHandler(logging.StreamHandler(sys.stdout))
    logging.getLogger("epl").setLevel(logging.INFO)
    epl.init()
    cluster = epl.Env.get().cluster
    wx, wy = this_workers_rows(batch, steps)
    epl.set_default_strategy(epl.replicate(1))
    estimator = tf.estimator.Estimator(make_model_fn(),
                                       config=run_config(os.path.join(out_dir, "model")))
    result = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn(wx, wy, batch, repeat=True), max_steps=steps),
        tf.estimator.EvalSpec(input_fn(*EVAL_ROWS, batch=8), steps=2, throttle_secs=1,
                              start_delay_secs=0))
    metrics = result[0] if result else None
    report = {"task_type": cluster.task_type, "source": cluster.discovery.source,
              "distributed": cluster.distributed, "workers": cluster.worker_num,
              "run_config_task": [estimator.config.task_type, estimator.config.task_id],
              "metrics": dict((k, float(v)) for k, v in metrics.items()) if metrics else None}
    name = cluster.task_type
    if name == "worker":
        name += "_%d" % cluster.worker_index
    with open(os.path.join(out_dir, name + ".json"), "w") as out:
        json.dump(report, out)
    print("%s done" % name)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
