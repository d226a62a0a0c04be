"""The memory side of schedules that split the backward: which stages stay split when
lowered, and a model of each stage's activation memory.

Plain data, no TensorFlow, like :mod:`epl.strategies.schedule.core`; the timed
simulator and the lowering ask :func:`split_stages`, the tests and docs compare
:func:`memory_units` of ZeroBubble's memory modes with 1F1B's.
"""
from epl.strategies.schedule.core import (
    BACKWARD, FORWARD, SAVED_GRADIENTS, WEIGHT, Action)


def split_stages(schedule):
    """The stages whose backward EPL runs as separate B and W parts: those where some W
    does not directly follow its own B. Where every W does (same stage, same micro-batch,
    nothing between), the stage's B and W are lowered as one fused backward, as
    PreferBackward's: a split backward keeps the gradients of the layer outputs and the
    activations W reads until B ends, where a fused one frees them layer by layer."""
    found = set()
    for s, row in enumerate(schedule.stages):
        for before, action in zip((None,) + row, row):
            if action.kind == WEIGHT and before != Action(action.stage, BACKWARD,
                                                          action.micro_batch):
                found.add(s)
    return frozenset(found)


def memory_units(schedule, saved_gradients=SAVED_GRADIENTS):
    """Per stage, the peak of a model of its activation memory, in units of one
    micro-batch's activations: a micro-batch counts 1 from its F until its backward is
    done (its W where the stage's backward is split), plus ``saved_gradients`` from its
    B until its W on a split stage (the output gradients B hands to W). Stages that
    ``split_stages`` leaves fused count as 1F1B's."""
    split = split_stages(schedule)
    peaks = []
    for s, row in enumerate(schedule.stages):
        held = peak = 0.0
        for action in row:
            if action.kind == FORWARD:
                held += 1
            elif s not in split:
                held -= 1 if action.kind == BACKWARD else 0
            else:
                held += saved_gradients if action.kind == BACKWARD else -1 - saved_gradients
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)
