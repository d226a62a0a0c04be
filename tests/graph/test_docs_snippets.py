"""Every shell and Python snippet of README.md and docs/*.md runs, so the docs stay true.

Each fenced block has a language. ``python`` blocks run in this process, each in a
fresh graph with ``tf`` (tf.compat.v1), ``np`` and ``epl`` defined and two virtual
devices; ``bash`` blocks run line by line (a trailing backslash continues a line)
from the repository root with this Python's ``bin`` first on PATH; ``console``
blocks run their ``$`` lines and must print exactly the lines that follow them.
``text``, ``json`` and ``diff`` blocks are output or excerpts, and are not run.

A marker on the line before a block says how to run it:

* ``<!-- snippet: context=NAME -->``: a Python fragment that uses names the page
  defines elsewhere (``loss``, ``train_op``, ``model_fn``) runs after CONTEXTS[NAME],
  a small stand-in that defines them;
* ``<!-- snippet: cwd=tmp -->``: a shell block that writes files runs in a temporary
  directory;
* ``<!-- snippet: skip: REASON -->``: not run here, for the stated reason (a second
  machine, a GPU, minutes of training that a named test runs shorter).

``python -m pytest tests/graph/test_docs_snippets.py -v`` lists every snippet by
file and line.
"""
import collections
import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import user_examples

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODE = ("python", "bash", "console")
NOT_CODE = ("text", "json", "diff")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$")

Snippet = collections.namedtuple("Snippet", ["path", "line", "lang", "body", "marker"])


def snippets(paths=None):
    """Every fenced block of README.md and docs/*.md, in order."""
    paths = paths or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "*.md")))
    found = []
    for path in paths:
        lines = open(path).read().split("\n")
        index = 0
        while index < len(lines):
            match = FENCE.match(lines[index])
            if not match:
                index += 1
                continue
            end = index + 1
            while not FENCE.match(lines[end]) or FENCE.match(lines[end]).group(1):
                end += 1
            previous = lines[index - 1] if index else ""
            marker = MARKER.match(previous)
            found.append(Snippet(os.path.relpath(path, ROOT), index + 1, match.group(1),
                                 "\n".join(lines[index + 1:end]),
                                 marker.group(1) if marker else ""))
            index = end + 1
    return found


def _id(snippet):
    return "%s:%d" % (snippet.path, snippet.line)


ALL = snippets()
RUNNABLE = [s for s in ALL if s.lang in CODE]


def test_every_block_says_what_it_is():
    """An untagged block could be code nobody runs: tag it (or mark it text)."""
    unknown = [(_id(s), s.lang) for s in ALL if s.lang not in CODE + NOT_CODE]
    assert not unknown, "tag these blocks python/bash/console or text/json/diff: %s" % unknown
    skipped = [s for s in RUNNABLE if s.marker.startswith("skip")]
    assert all(len(s.marker.split(":", 1)[1].strip()) > 10 for s in skipped), \
        "a skip needs a reason"
    assert len(RUNNABLE) - len(skipped) >= 50  # the guard against a parser that finds nothing


# ---- stand-ins for the names a fragment uses --------------------------------------------
_INPUTS = '''
rng = np.random.RandomState(0)
x_data = rng.rand(64, 8).astype(np.float32)
y_data = rng.randint(0, 4, 64).astype(np.int64)
global_batch = 64
def _inputs(batch=8, epochs=None):
    data = tf.data.Dataset.from_tensor_slices((x_data, y_data)).repeat(epochs)
    return tf.data.make_one_shot_iterator(data.batch(batch, drop_remainder=True)).get_next()
features, labels = _inputs()
'''

CONTEXTS = {
    "layers": _INPUTS + '''
def head(inputs):
    return tf.layers.dense(inputs, 4)
def classifier():
    return tf.layers.dense(features, 16)
logits = tf.layers.dense(features, 4)
loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
def train_serially():
    return 0.0
''',
    "session": _INPUTS + '''
epl.init()
epl.set_default_strategy(epl.replicate(1))
logits = tf.layers.dense(features, 4)
train_op = tf.train.GradientDescentOptimizer(0.1).minimize(
    tf.losses.sparse_softmax_cross_entropy(labels, logits))
sess = tf.Session()
''',
    "stages": _INPUTS + '''
def model_stage0():
    return tf.layers.dense(features, 16)
def model_stage1():
    return tf.layers.dense(features, 4)
model_part1, model_part2 = model_stage0, model_stage1
epl.init()
''',
    "staged_model": _INPUTS + '''
epl.init()
with epl.replicate(device_count=1, name="stage_0"):
    hidden = tf.layers.dense(features, 16, activation=tf.nn.relu)
with epl.replicate(device_count=1, name="stage_1"):
    loss = tf.losses.sparse_softmax_cross_entropy(labels, tf.layers.dense(hidden, 4))
train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
''',
    "blocks": _INPUTS + '''
def model(features, labels=labels):
    """Four repeated blocks, named like the docs' BERT layers."""
    x = tf.layers.dense(features, 16, name="embed")
    with tf.variable_scope("model"):
        for index in range(4):
            with tf.variable_scope("layer_%d" % index), tf.variable_scope("ffn"):
                h = tf.layers.dense(x, 32, activation=tf.nn.relu, name="inner")
                x = tf.nn.relu(x + tf.layers.dense(h, 16, name="outer"))
    return tf.losses.sparse_softmax_cross_entropy(labels, tf.layers.dense(x, 4, name="head"))
step = tf.train.get_or_create_global_step()
optimizer = tf.train.AdamOptimizer(0.01)
''',
    "auto_built": "__blocks__" + '''
epl.init(epl.Config({"auto.auto_parallel": True, "pipeline.num_stages": 2,
                     "pipeline.num_micro_batch": 2}))
train_op = optimizer.minimize(model(features), global_step=step)
tf.get_default_graph().finalize()
''',
    "bert": '''
sys.path.insert(0, os.path.join(EXAMPLES, "bert"))
import modeling, squad_data
config = modeling.BertConfig.tiny()
features = squad_data.input_fn(squad_data.synthetic_squad(16, config.vocab_size, 32, 0), 4)
global_step = tf.train.get_or_create_global_step()
epl.init()
''',
    "moe": '''
G, S, E, C, M, H = 2, 8, 4, 4, 16, 32
tokens = tf.constant(np.random.RandomState(0).randint(0, 50, (G, S)), tf.int32)
def attention_and_gating(tokens):
    x = tf.nn.embedding_lookup(tf.get_variable("embedding", [50, M]), tokens)
    probabilities = tf.nn.softmax(tf.einsum("GSM,ME->GSE", x, tf.get_variable("gate", [M, E])))
    mask = tf.one_hot(tf.argmax(probabilities, -1, output_type=tf.int32), E)
    slot = tf.cumsum(mask, axis=1, exclusive=True) * mask
    mask *= tf.cast(slot < C, tf.float32)
    dispatch = tf.one_hot(tf.cast(slot, tf.int32), C) * mask[..., None]
    combine = dispatch * tf.reduce_sum(probabilities * mask, -1)[..., None, None]
    return x, dispatch, combine, tf.reduce_mean(probabilities)
def moe_variable_define():
    return tf.get_variable("w_in", [E, M, H]), tf.get_variable("w_out", [E, H, M])
def moe_calculation_define(x, dispatch, combine, w_in, w_out):
    hidden = tf.nn.relu(tf.einsum("EGCM,EMH->EGCH", tf.einsum("GSEC,GSM->EGCM", dispatch, x),
                                  w_in))
    return tf.einsum("GSEC,EGCM->GSM", combine, tf.einsum("EGCH,EHM->EGCM", hidden, w_out))
''',
    "moe_tensors": "__moe__" + '''
x, dispatch, combine, balance = attention_and_gating(tokens)
w_in, w_out = moe_variable_define()
''',
    "resnet": _INPUTS + '''
images = tf.reshape(tf.tile(features, [1, 24]), [-1, 8, 8, 3])
num_classes, total_gpu_num = 10, 2
x = tf.zeros([2, 8, 16])   # tokens [groups, tokens, width] for a MoE layer
def resnet(images):
    h = tf.nn.relu(tf.layers.conv2d(images, 8, 3, padding="same"))
    return tf.reduce_mean(h, [1, 2])
''',
    "resnet_init": "__resnet__" + '''
epl.init()   # a fragment that opens strategies comes after the program's epl.init()
''',
    "training": _INPUTS + '''
features, labels = _inputs(epochs=2)  # 16 steps, then the session stops
logits = tf.layers.dense(tf.layers.dense(features, 16, activation=tf.nn.relu), 4)
loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
train_op = tf.train.AdamOptimizer(0.01).minimize(loss, tf.train.get_or_create_global_step())
def build_model_and_optimizer():
    logits = tf.layers.dense(tf.layers.dense(features, 16, activation=tf.nn.relu), 4)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    return tf.train.AdamOptimizer(0.01).minimize(loss)
def parse(record):
    return tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([8], tf.float32)})
num_layers, x = 3, features
def transformer_layer(x):
    return tf.layers.dense(x, 8, activation=tf.nn.relu)
''',
    "long_training": _INPUTS + '''
features, labels = _inputs(epochs=26)  # 208 steps
loss = tf.losses.sparse_softmax_cross_entropy(labels, tf.layers.dense(features, 4))
train_op = tf.train.AdamOptimizer(0.01).minimize(loss, tf.train.get_or_create_global_step())
''',
    "traced": '''
with tf.device("/cpu:0"):
    product = tf.matmul(tf.ones([64, 64]), tf.ones([64, 64]))
run_metadata = tf.RunMetadata()
with tf.Session() as trace_session:
    trace_session.run(product, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                      run_metadata=run_metadata)
''',
    "estimator": _INPUTS + '''
def model_fn(features, labels, mode):
    logits = tf.layers.dense(features, 4)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.train.AdamOptimizer(0.01).minimize(loss, tf.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
def train_input_fn():
    return tf.data.Dataset.from_tensor_slices((x_data, y_data)).repeat().batch(8)
def eval_input_fn():
    return tf.data.Dataset.from_tensor_slices((x_data, y_data)).batch(8)
''',
}


for _name, _source in list(CONTEXTS.items()):  # "__base__" + more: base's source first
    if _source.startswith("__"):
        _base, _, _rest = _source[2:].partition("__")
        CONTEXTS[_name] = CONTEXTS[_base] + _rest


def _marker(snippet, key):
    for part in snippet.marker.split(";"):
        name, _, value = part.partition("=")
        if name.strip() == key:
            return value.strip()
    return None


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EPL_NUM_VIRTUAL_DEVICES", "2")
    tf.reset_default_graph()
    yield tmp_path
    tf.reset_default_graph()


def _run_python(snippet, examples):
    namespace = {"tf": tf, "np": np, "epl": epl, "os": os, "sys": sys, "EXAMPLES": examples,
                 "__name__": "snippet"}
    context = _marker(snippet, "context")
    if context is not None:
        exec(compile(CONTEXTS[context], "context:" + context, "exec"), namespace)
    exec(compile(snippet.body, _id(snippet), "exec"), namespace)


def _commands(body):
    """Logical lines of a shell block (backslash continuations joined, comments kept)."""
    commands, current = [], ""
    for line in body.split("\n"):
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip() and not current.strip().startswith("#"):
            commands.append(current.strip())
        current = ""
    return commands


def _shell_env():
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("EPL_"))
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    return env


def _shell(command, cwd):
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=_shell_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=400)
    assert done.returncode == 0, "`%s` exited %d:\n%s" % (command, done.returncode,
                                                          done.stdout[-3000:])
    return done.stdout


def _run_console(snippet, cwd, examples):
    """``$ command`` lines (with continuations) and the exact output that follows each."""
    blocks, current = [], None
    for line in snippet.body.split("\n"):
        if line.startswith("$ "):
            current = [line[2:], []]
            blocks.append(current)
        elif current[0].rstrip().endswith("\\") and not current[1]:
            current[0] = current[0].rstrip()[:-1] + " " + line.strip()
        else:
            current[1].append(line.rstrip())
    for command, expected in blocks:
        output = [line.rstrip() for line in
                  _shell(_with_examples(command, examples), cwd).strip("\n").split("\n")]
        assert output == expected, "`%s` printed:\n%s" % (command, "\n".join(output))


# The seeds' example programs (examples/) are TF 1 programs (`import tensorflow as tf`). On
# TF 2.x a user first switches them to tf.compat.v1 (docs/tf2.md), and so do the snippets:
# they run the switched copy (eplutil.user_examples) where they name examples/. `make demo`
# sets up .venv with TF 1.15 itself, so it is TF-1-only.
TF1 = tf.version.VERSION.startswith("1.")
EXAMPLES_PATH = re.compile(r"(?<![\w/.])examples/")


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return user_examples(tmp_path_factory)


def _with_examples(command, examples):
    """``command`` with its examples/ paths pointing at ``examples``."""
    return EXAMPLES_PATH.sub(examples.replace("\\", "/") + "/", command)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("snippet", RUNNABLE, ids=_id)
def test_snippet_runs(snippet, fresh, examples):
    if snippet.marker.startswith("skip"):
        pytest.skip(snippet.marker)
    if not TF1 and "make demo" in snippet.body:
        pytest.skip("`make demo` sets up and runs the TF 1.15 virtualenv (.venv)")
    cwd = str(fresh) if _marker(snippet, "cwd") == "tmp" else ROOT
    if snippet.lang == "python":
        _run_python(snippet, examples)
    elif snippet.lang == "bash":
        for command in _commands(snippet.body):
            _shell(_with_examples(command, examples), cwd)
    else:
        _run_console(snippet, cwd, examples)
