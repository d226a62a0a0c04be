"""Synthetic SQuAD-shaped features for the BERT tutorials (no download, no tokenizer).

Each example has the layout BERT's ``run_squad.py`` feeds the model::

    [CLS] question ... [SEP] context ... answer ... context ... [SEP] [PAD] ...
    segment_ids:  0 for [CLS], the question and its [SEP]; 1 for the context and its [SEP]
    input_mask:   1 for real tokens, 0 for padding
    start_positions / end_positions: the first and last token of the answer span

The answer is the one run of tokens from a reserved "answer vocabulary" (the top tenth
of the vocabulary) inside the context, 1 to 4 tokens long. Finding its first and last
token needs each token's neighbours, which attention provides, and the task is easy
enough that a tiny BERT's loss falls within a few dozen steps on a CPU.
"""
import numpy as np
import tensorflow as tf

PAD, CLS, SEP = 0, 1, 2
FIRST_WORD = 10  # ids below this are special tokens
FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids", "start_positions", "end_positions")


def _example(rng, vocab_size, seq_length):
    """One example: (ids, mask, segments, start, end) as Python lists and ints."""
    answer_vocab = vocab_size - vocab_size // 10
    question = rng.randint(FIRST_WORD, answer_vocab, rng.randint(4, 9)).tolist()
    length = rng.randint(seq_length // 2, seq_length + 1)          # real tokens
    context_length = length - len(question) - 3                     # [CLS], 2 x [SEP]
    context = rng.randint(FIRST_WORD, answer_vocab, context_length)
    span = rng.randint(1, 5)
    begin = rng.randint(0, context_length - span + 1)
    context[begin:begin + span] = rng.randint(answer_vocab, vocab_size, span)
    ids = [CLS] + question + [SEP] + context.tolist() + [SEP]
    segments = [0] * (len(question) + 2) + [1] * (context_length + 1)
    start = len(question) + 2 + begin
    padding = [PAD] * (seq_length - length)
    return (ids + padding, [1] * length + [0] * len(padding), segments + [0] * len(padding),
            start, start + span - 1)


def synthetic_squad(num_examples, vocab_size, seq_length, seed):
    """A dict of numpy arrays, one per name in FEATURE_NAMES (int32, ``num_examples`` rows)."""
    if seq_length < 32:
        # The shortest example has seq_length // 2 tokens: [CLS], a question of up to 8
        # tokens, 2 x [SEP] and a context that must hold a 4-token answer.
        raise ValueError("seq_length must be at least 32 to hold a question and a context")
    rng = np.random.RandomState(seed)
    rows = [_example(rng, vocab_size, seq_length) for _ in range(num_examples)]
    return {name: np.array([row[i] for row in rows], dtype=np.int32)
            for i, name in enumerate(FEATURE_NAMES)}


def input_fn(arrays, batch_size):
    """Endless batches of features from an iterator: a dict of tensors.

    Batches have a static size (``drop_remainder``) so that every layer sees fixed
    shapes; in a pipeline each micro-batch is one pull from this iterator.
    """
    dataset = tf.data.Dataset.from_tensor_slices(arrays).repeat()
    dataset = dataset.shuffle(1024, seed=0).batch(batch_size, drop_remainder=True)
    return tf.data.make_one_shot_iterator(dataset).get_next()
