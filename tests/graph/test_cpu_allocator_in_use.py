"""After epl.init, TensorFlow allocates a CPU job's tensors with its BFC allocator, and
with its default (malloc) when the user set TF_CPU_ALLOCATOR_USE_BFC=0 or does not use
EPL: the allocator named in a traced step's memory records. Each case runs in its own
process, since TensorFlow picks its CPU allocator once per process."""
import os
import subprocess
import sys

import pytest

from epl.cluster.cpu_allocator import BFC_VARIABLE, LIMIT_VARIABLE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = r"""
import os, sys
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
if sys.argv[1] == "epl":
    import epl
    epl.init()
x = tf.random.normal([64, 64])
options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
meta = tf.RunMetadata()
with tf.Session() as sess:
    sess.run(tf.matmul(x, x), options=options, run_metadata=meta)
names = sorted(set(record.allocator_name for device in meta.step_stats.dev_stats
                   for node in device.node_stats for record in node.memory))
print("ALLOCATORS", ",".join(names))
print("LIMIT", os.environ.get("%s"))
""" % LIMIT_VARIABLE


def _run(mode, **env):
    environ = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    for name in (BFC_VARIABLE, LIMIT_VARIABLE):
        environ.pop(name, None)
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=environ, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines()
                 if line.startswith(("ALLOCATORS ", "LIMIT ")))
    return lines["ALLOCATORS"].split(","), lines["LIMIT"]


@pytest.mark.timeout(150)
def test_an_epl_cpu_job_allocates_with_bfc_up_to_the_machines_memory():
    allocators, limit = _run("epl")
    assert allocators == ["bfc_cpu_allocator_for_gpu"]
    assert int(limit) > 512


@pytest.mark.timeout(150)
def test_the_users_choice_of_malloc_is_kept():
    allocators, limit = _run("epl", **{BFC_VARIABLE: "0"})
    assert allocators == ["cpu"] and limit == "None"


@pytest.mark.timeout(150)
def test_tensorflow_without_epl_keeps_its_default():
    assert _run("plain") == (["cpu"], "None")
