"""Programs EPL cannot rewrite are refused with what to do, on TF 1.15 and TF 2.x alike:
eager execution (TF 2's default), a training step traced in a tf.function, Keras Model.fit."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl

# A fresh interpreter in eager mode: TF 2's default, and what TF 1.15 gives after
# enable_eager_execution(). epl.init() must say how to get graph mode back.
EAGER_PROGRAM = """
import tensorflow.compat.v1 as tf
tf.enable_eager_execution()
import epl
try:
    epl.init()
except RuntimeError as err:
    print("REFUSED:", err)
"""


def test_init_under_eager_execution_says_what_to_call():
    done = subprocess.run([sys.executable, "-c", EAGER_PROGRAM], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REFUSED:" in done.stdout, done.stdout
    assert "eager execution is enabled" in done.stdout
    assert "tf.compat.v1.disable_v2_behavior()" in done.stdout
    assert "tf.compat.v1.disable_eager_execution()" in done.stdout


def test_training_step_in_tf_function_is_refused():
    epl.init()
    with epl.replicate(1):
        weight = tf.get_variable("w", initializer=1.0, use_resource=True)
        optimizer = tf.train.GradientDescentOptimizer(0.1)

        @tf.function
        def step(x):
            return optimizer.minimize(tf.reduce_sum(weight * x))

        with pytest.raises(RuntimeError) as refused:
            step(tf.constant([1.0, 2.0]))
    message = str(refused.value)
    assert "tf.function" in message and "GradientDescentOptimizer" in message
    assert "remove @tf.function" in message


def test_keras_fit_is_refused_and_plain_keras_works_after_reset():
    def fit():
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        model.compile(optimizer=tf.train.GradientDescentOptimizer(0.1), loss="mse")
        data = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
        return model.fit(*data, epochs=1, verbose=0)

    epl.init()
    with pytest.raises(RuntimeError) as refused:
        fit()
    message = str(refused.value)
    assert "does not parallelize Keras" in message and "fit()" in message
    assert "MonitoredTrainingSession" in message
    epl.env.reset()  # hooks removed: Keras trains as in plain TF
    with tf.Graph().as_default():
        assert fit() is not None
