# train_auto_pipeline.py: the BERT pipeline tutorial without hand-placed stages. The model
# has no strategy scope at all; with auto.auto_parallel on, EPL cuts the encoder into
# pipeline.num_stages stages (by its repeated layer_N blocks) and runs data parallelism over
# the pipelines when the job has more devices than stages.
#
#   epl-launch --num_workers 1 --gpu_per_worker 2 examples/bert/train_auto_pipeline.py
#   epl-launch --num_workers 2 --gpu_per_worker 1 examples/bert/train_auto_pipeline.py
#   epl-launch --num_workers 2 --gpu_per_worker 2 examples/bert/train_auto_pipeline.py
#
# The lines marked "EPL" are the only changes to a single-device script. The model, data and
# training loop are the hand-placed tutorial's (train_pipeline.py), called without stages.
"""Fine-tune a tiny BERT on synthetic SQuAD; EPL finds the pipeline stages itself."""
import os

import tensorflow as tf
import epl                                                                       # EPL

import modeling
from train_pipeline import bert_config, parse_args, squad_features, train

# This example prints its own progress, so it turns TensorFlow's deprecation warnings and C++
# info logs off (its own choice: EPL never changes TensorFlow's logging).
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TF reads it at its first C++ log line


def main():
    args = parse_args()
    epl.init(epl.Config({"auto.auto_parallel": True,                             # EPL
                         "pipeline.num_stages": args.num_stages,                 # EPL
                         "pipeline.num_micro_batch": args.num_micro_batch,       # EPL
                         "pipeline.strategy": args.schedule}))                   # EPL
    config = bert_config(args)
    features = squad_features(args, config, seed=epl.Env.get().cluster.worker_index)
    model = modeling.build_squad_model(features, config)   # one device's model, no scopes
    # Fetch the loss averaged over every micro-batch and pipeline copy, not micro-batch 0's.
    epl.add_to_collection(model.loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)        # EPL
    global_step = tf.train.get_or_create_global_step()
    optimizer = tf.train.AdamOptimizer(args.learning_rate)
    train_op = optimizer.minimize(model.loss, global_step=global_step)
    train(args, model.loss, train_op)
    part = epl.Graph.get().auto_partition
    if part is not None and epl.Env.get().cluster.worker_index == 0:
        print("auto partition by %s: %s layers per stage"
              % (part.method, part.blocks_per_stage()), flush=True)
    print("Train Finished.")


if __name__ == "__main__":
    main()
