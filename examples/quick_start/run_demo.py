"""`make demo`: run the seed quick-start on 2 workers x 2 devices with epl-launch.

Streams the workers' training lines, then prints one summary line: workers,
devices, global batch, first and last loss (worker 0, replica 0) and the
steady-state samples/s measured from the arrival times of worker 0's
iteration lines (start-up excluded).
"""
import os
import re
import subprocess
import sys
import tempfile
import time

WORKERS, DEVICES, BATCH = 2, 2, 10
HERE = os.path.dirname(os.path.abspath(__file__))
ITERATION = re.compile(r"^\[worker (\d+)\] Iteration (\d+) , Loss: ([-\d.e+naif]+) \.")


def launch(log_dir):
    cmd = [sys.executable, "-m", "epl.launcher", "--num_workers", str(WORKERS),
           "--gpu_per_worker", str(DEVICES), "--log_dir", log_dir,
           os.path.join(HERE, "local_model.py")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            universal_newlines=True)


def main():
    log_dir = tempfile.mkdtemp(prefix="epl_demo_")
    proc = launch(log_dir)
    seen = []  # (arrival time, step, loss) of worker 0
    tail = []
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-30:]
        match = ITERATION.match(line)
        if match or "Train Finished" in line or line.startswith("epl-launch"):
            print(line, flush=True)
        if match and match.group(1) == "0":
            seen.append((time.time(), int(match.group(2)), float(match.group(3))))
    code = proc.wait()
    if code != 0 or len(seen) < 2:
        print("\n".join(tail))
        print("demo failed (exit code %d); full logs in %s" % (code, log_dir))
        return code or 1
    global_batch = WORKERS * DEVICES * BATCH
    elapsed = seen[-1][0] - seen[0][0]
    rate = global_batch * (len(seen) - 1) / elapsed if elapsed > 0 else float("nan")
    print("EPL demo: %d workers x %d devices (virtual CPU devices without a GPU), global batch "
          "%d, loss %.4f -> %.4f (worker 0, steps %d-%d), %.1f samples/s; logs in %s"
          % (WORKERS, DEVICES, global_batch, seen[0][2], seen[-1][2], seen[0][1], seen[-1][1],
             rate, log_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
