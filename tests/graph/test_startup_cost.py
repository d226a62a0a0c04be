"""What EPL does at start-up that a user's script pays for before its first step
(``benchmarks/startup.py`` measures it on a corpus of shapes): ``epl.init`` imports
nothing the script did not. Each case runs in its own process, whose imports are
its own."""
import os
import subprocess
import sys

import pytest
import tensorflow.compat.v1 as tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEW_MODULES = r"""
import sys
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
import epl
before = set(sys.modules)
epl.init()
print("NEW", sorted(m for m in set(sys.modules) - before if m.startswith("tensorflow.contrib")))
"""


@pytest.mark.skipif(not tf.version.VERSION.startswith("1."), reason="TF 2.x has no tf.contrib")
@pytest.mark.timeout(150)
def test_epl_init_does_not_import_tf_contrib():
    """epl.init looks for the functions it patches in every imported module; reading
    them with getattr loaded ``tf.contrib``, which TF 1.15 loads lazily (about 800
    modules, 0.3-0.4 s), in every script that never used it. (On TF 2.x, epl.init
    imports Keras, whose optimizers and models it hooks.)"""
    environ = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", NEW_MODULES], env=environ, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("NEW ")]
    assert lines == ["NEW []"], out.stdout[-2000:]
