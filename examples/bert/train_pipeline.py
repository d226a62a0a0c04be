# train_pipeline.py: the documentation's BERT pipeline tutorial (section 9), sized for a CPU:
# a tiny BERT fine-tuned on synthetic SQuAD-shaped data, its layers placed by hand on two
# pipeline stages, each training step running several micro-batches through the stages.
#
#   epl-launch --num_workers 1 --gpu_per_worker 2 examples/bert/train_pipeline.py
#   epl-launch --num_workers 2 --gpu_per_worker 1 examples/bert/train_pipeline.py
#   epl-launch --num_workers 2 --gpu_per_worker 2 examples/bert/train_pipeline.py
#
# The lines marked "EPL" are the only changes to a single-device script. With more devices
# than stages, EPL runs several copies of the pipeline (data parallelism over pipelines).
"""Fine-tune a tiny BERT on synthetic SQuAD with hand-placed pipeline stages."""
import argparse
import os
import time

import tensorflow as tf
import epl                                                                       # EPL

import modeling
import squad_data

# This example prints its own progress, so it turns TensorFlow's deprecation warnings and C++
# info logs off (its own choice: EPL never changes TensorFlow's logging).
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TF reads it at its first C++ log line


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro_batch_size", type=int, default=8,
                        help="examples per micro-batch (the batch size the model sees)")
    parser.add_argument("--num_micro_batch", type=int, default=4,
                        help="pipeline.num_micro_batch: micro-batches per step")
    parser.add_argument("--num_stages", type=int, default=2)
    parser.add_argument("--schedule", default="PreferBackward",
                        choices=["PreferBackward", "PreferForward"], help="pipeline.strategy")
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--hidden_size", type=int, default=64)
    parser.add_argument("--seq_length", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--print_every", type=int, default=5)
    return parser.parse_args(argv)


def bert_config(args):
    """The tiny BERT, with the sizes given on the command line (4 heads of hidden/4)."""
    return modeling.BertConfig.tiny(num_hidden_layers=args.num_layers,
                                    hidden_size=args.hidden_size,
                                    intermediate_size=4 * args.hidden_size,
                                    max_position_embeddings=max(128, args.seq_length))


def squad_features(args, config, seed):
    """This worker's synthetic SQuAD features, one micro-batch per pull."""
    arrays = squad_data.synthetic_squad(512, config.vocab_size, args.seq_length, seed)
    return squad_data.input_fn(arrays, args.micro_batch_size)


def stage(index):
    """The strategy scope of pipeline stage ``index``: one device per stage."""
    return epl.replicate(device_count=1, name="stage_%d" % index)                # EPL


def train(args, loss, train_op):
    """Run the steps, printing the loss every --print_every steps and at the end."""
    with tf.train.MonitoredTrainingSession() as sess:
        start = None
        for step in range(1, args.steps + 1):
            if step == 2:
                start = time.time()  # step 1 includes graph optimization; leave it out
            step_loss, _ = sess.run([loss, train_op])
            if step == 1 or step % args.print_every == 0 or step == args.steps:
                print("step %d loss %.4f" % (step, step_loss), flush=True)
    seconds = (time.time() - start) / (args.steps - 1) if start else 0.0
    print("final loss %.4f (%.3f s/step after step 1)" % (step_loss, seconds), flush=True)


def main():
    args = parse_args()
    epl.init(epl.Config({"pipeline.num_micro_batch": args.num_micro_batch,      # EPL
                         "pipeline.strategy": args.schedule}))                   # EPL
    config = bert_config(args)
    features = squad_features(args, config, seed=epl.Env.get().cluster.worker_index)
    model = modeling.build_squad_model(features, config, num_stages=args.num_stages,
                                       stage_scope=stage)
    # Fetch the loss averaged over every micro-batch and pipeline copy, not micro-batch 0's.
    epl.add_to_collection(model.loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)        # EPL
    global_step = tf.train.get_or_create_global_step()
    optimizer = tf.train.AdamOptimizer(args.learning_rate)
    train_op = optimizer.minimize(model.loss, global_step=global_step)
    train(args, model.loss, train_op)
    print("Train Finished.")


if __name__ == "__main__":
    main()
