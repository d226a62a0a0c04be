"""`make demo`: train a quick-start model on 2 workers x 2 devices with epl-launch.

It runs examples/quick_start/learnable_model.py: the documentation's quick-start
program with labels a fixed linear "teacher" assigns, so that there is something to
learn (the seed's local_model.py draws random labels; its loss rises as often as it
falls). The workers' training lines stream by, then one summary says what ran, the
global mean loss and accuracy (over every replica) at the first and last reported
step, and the steady-state samples/s from the arrival times of worker 0's lines
(start-up excluded). The demo fails (exit 1) if the loss did not fall.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

WORKERS, DEVICES, BATCH = 2, 2, 32
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "learnable_model.py")
ITERATION = re.compile(r"^\[worker (\d+)\] Iteration (\d+) , Loss: ([-\d.e+naif]+) , "
                       r"Accuracy: ([\d.]+) \.")


def command(log_dir):
    return [sys.executable, "-m", "epl.launcher", "--num_workers", str(WORKERS),
            "--gpu_per_worker", str(DEVICES), "--log_dir", log_dir, SCRIPT]


def run(log_dir):
    """[(arrival time, step, loss, accuracy)] of worker 0, exit code, last lines."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(command(log_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, universal_newlines=True)
    seen, tail = [], []
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-30:]
        match = ITERATION.match(line)
        if match or "Train Finished" in line or line.startswith("epl-launch"):
            print(line, flush=True)
        if match and match.group(1) == "0":
            seen.append((time.time(), int(match.group(2)), float(match.group(3)),
                         float(match.group(4))))
    return seen, proc.wait(), tail


def main():
    log_dir = tempfile.mkdtemp(prefix="epl_demo_")
    print("EPL demo: epl-launch --num_workers %d --gpu_per_worker %d %s"
          % (WORKERS, DEVICES, os.path.relpath(SCRIPT)), flush=True)
    seen, code, tail = run(log_dir)
    if code != 0 or len(seen) < 2:
        print("\n".join(tail))
        print("demo failed (exit code %d); full logs in %s" % (code, log_dir))
        return code or 1
    global_batch = WORKERS * DEVICES * BATCH
    (start, first_step, first_loss, first_acc), (end, last_step, last_loss, last_acc) = \
        seen[0], seen[-1]
    rate = global_batch * (last_step - first_step) / (end - start) if end > start else 0.0
    print("EPL demo: ran %s (the quick start with learnable labels) on %d workers x %d devices "
          "(virtual CPU devices without a GPU), global batch %d: global mean loss %.4f -> %.4f, "
          "accuracy %.3f -> %.3f (steps %d-%d), %.1f samples/s; logs in %s"
          % (os.path.basename(SCRIPT), WORKERS, DEVICES, global_batch, first_loss, last_loss,
             first_acc, last_acc, first_step, last_step, rate, log_dir))
    if not last_loss < first_loss:
        print("demo failed: the loss did not fall")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
