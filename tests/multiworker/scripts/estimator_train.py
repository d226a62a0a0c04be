"""Worker script for the epl-launch Estimator test.

Usage: estimator_train.py OUT_DIR STEPS BATCH. epl-launch gives every worker a
worker-only TF_CONFIG. Each worker trains a shared-model_dir Estimator on its
rows of each global batch (see eplutil.worker_rows), then evaluates and
predicts on the same data as every other worker, then runs train_and_evaluate
in a second model_dir. It writes OUT_DIR/worker_<i>.json.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..")]

import tensorflow.compat.v1 as tf  # noqa: E402
tf.disable_v2_behavior()  # TF 2.x: graph mode (docs/tf2.md); nothing on TF 1.15

import epl  # noqa: E402
from eplutil import make_data, this_workers_rows  # noqa: E402
from estimator_model import (features_fn, input_fn, make_model_fn,  # noqa: E402
                             run_config)


def main(out_dir, steps, batch):
    epl.init()
    cluster = epl.Env.get().cluster
    workers, devices, index = cluster.worker_num, cluster.gpu_num_per_worker, cluster.worker_index
    x, y = make_data(workers * devices * batch * steps)
    wx, wy = this_workers_rows(batch, steps)
    epl.set_default_strategy(epl.replicate(1))

    estimator = tf.estimator.Estimator(make_model_fn(),
                                       config=run_config(os.path.join(out_dir, "model")))
    estimator.train(input_fn(wx, wy, batch, repeat=True), steps=steps)
    metrics = estimator.evaluate(input_fn(x, y, 8), steps=2)
    logits = [p["logits"].tolist() for p in estimator.predict(features_fn(x[:8], 8))]

    second = tf.estimator.Estimator(make_model_fn(),
                                    config=run_config(os.path.join(out_dir, "tae")))
    tae_metrics, _ = tf.estimator.train_and_evaluate(
        second, tf.estimator.TrainSpec(input_fn(wx, wy, batch, repeat=True), max_steps=steps),
        tf.estimator.EvalSpec(input_fn(x, y, 8), steps=2, throttle_secs=0))

    result = {"tf_config": json.loads(os.environ.get("TF_CONFIG", "{}")),
              "metrics": dict((k, float(v)) for k, v in metrics.items()),
              "logits": logits,
              "tae_metrics": (dict((k, float(v)) for k, v in tae_metrics.items())
                              if tae_metrics else None)}
    with open(os.path.join(out_dir, "worker_%d.json" % index), "w") as out:
        json.dump(result, out)
    print("worker %d done" % index)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
