"""EplUnpack never hands TensorFlow a tensor it would abort on.

TF's own kernels CHECK that their inputs are aligned to the EIGEN_MAX_ALIGN_BYTES
of TF's build (64) and abort the whole process otherwise. EplUnpack returns
zero-copy views into the fused buffer; a view at an offset that is aligned for
a smaller alignment (16 or 32) killed real models whose variables hold 8 or 37
floats. A crash cannot be caught in-process, so each case runs in a child
process and the test asserts its exit status and its numbers.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from epl.communicators import library

pytestmark = pytest.mark.skipif(library.load() is None,
                                reason="the EPL op library is not built (make setup builds it)")

# Element counts that put later tensors at every offset modulo 64 bytes.
ODD_SIZES = [1, 3, 5, 7, 8, 37, 1000, 2, 16, 9, 64, 13]

_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow.compat.v1 as tf
    tf.disable_v2_behavior()
    from epl.communicators import library
    dtype = tf.as_dtype(sys.argv[1])
    sizes = [int(s) for s in sys.argv[2].split(",")]
    ops = library.load()
    values = [np.arange(n).astype(dtype.as_numpy_dtype) % 7 for n in sizes]
    tensors = [tf.constant(v) for v in values]
    parts = ops.epl_unpack(ops.epl_pack(tensors), shapes=[t.shape for t in tensors],
                           N=len(tensors))
    # Eigen-backed kernels (cwise add, reductions) CHECK their input's alignment.
    doubled = [p + p for p in parts]
    sums = [tf.reduce_sum(p) for p in parts]
    with tf.Session() as sess:
        got, totals = sess.run([doubled, sums])
    for value, want, total in zip(got, values, totals):
        np.testing.assert_array_equal(value, want + want)
        assert total == want.sum(), (total, want.sum())
    print("ok %d tensors" % len(got))
""")


def _run_child(dtype, sizes):
    proc = subprocess.run([sys.executable, "-c", _CHILD, dtype, ",".join(map(str, sizes))],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    return proc.returncode, proc.stdout.decode(errors="replace")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64"])
def test_unpacked_odd_sizes_feed_tf_kernels(dtype):
    code, output = _run_child(dtype, ODD_SIZES)
    assert code == 0, "child exited with %d (134 is the IsAligned abort):\n%s" % (
        code, output[-2000:])
    assert "ok %d tensors" % len(ODD_SIZES) in output


def test_random_odd_sizes_property():
    """Seeded property test: any list of sizes round-trips and feeds TF kernels."""
    rng = np.random.RandomState(1234)
    cases = [list(rng.randint(1, 70, size=rng.randint(2, 12))) for _ in range(6)]
    sizes = [s for case in cases for s in case]
    code, output = _run_child("float32", sizes)
    assert code == 0, output[-2000:]


def test_unpack_bad_buffer_is_a_tf_error_naming_op_and_sizes():
    import tensorflow.compat.v1 as tf
    tf.disable_v2_behavior()
    ops = library.load()
    with tf.Graph().as_default():
        buffer = tf.placeholder(tf.float32, [None])
        parts = ops.epl_unpack(buffer, shapes=[[2, 3], [5]], N=2, name="my_unpack")
        with tf.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"my_unpack.*11 elements.*'packed' has 4"):
                sess.run(parts, {buffer: np.zeros(4, np.float32)})
