"""Interleaved stages: each device holds v model chunks (Megatron's interleaved 1F1B).

With ``pipeline.num_virtual_stages`` v, the model is cut into v * S *virtual stages*
and device d runs virtual stages d, d + S, d + 2S, ... (TaskGraph t on device t mod
S). A micro-batch then crosses every device v times, each time with 1/v of 1F1B's
work, so the warm-up and cool-down (the bubble) shrink by about v: with equal F and B
times, a step takes ``M + (S - 1) / v`` units of one micro-batch's whole-stage work
instead of 1F1B's ``M + S - 1`` (``timed.makespan``).

Megatron orders each device's forwards in rounds of S micro-batches: the round's
micro-batches through chunk 0, then through chunk 1, ... (backwards the same, chunks in
reverse), warms up with ``(v - 1) * S + 2 * (S - d - 1)`` forwards and then alternates
one forward and one backward. It refuses 2 or fewer stages and micro-batch counts that
S does not divide. Here the last round may be short (M not a multiple of S); with
Megatron's warm-up such an order can stall (S = 5, M = 7, v = 2) or take longer than
1F1B (S = 3, M = 4, v = 2: 18.5 units against 18), so the builder adds the fewest
warm-up forwards, on every device, with which the order runs to the end and takes no
longer than 1F1B with equal F, B and W times (``timed.makespan``; more warm-up costs
activation memory, ``peak_in_flight``). Plain data, no TensorFlow; the plan places the
TaskGraphs (:mod:`epl.parallel.virtual_stages`) and the schedule lowering chains each
row's actions on its device (``pipeline.num_virtual_stages`` > 1).
"""
from epl.strategies.schedule import timed
from epl.strategies.schedule.core import (
    BACKWARD, FORWARD, Action, Schedule, ScheduleError, _check_count, prefer_backward,
    simulate)

INTERLEAVED = "Interleaved1F1B"


def _order(num_stages, num_micro_batch, chunks, device, kind):
    """(virtual stage, micro-batch) of ``device``'s forwards (or backwards) in order:
    rounds of S micro-batches, each round through the chunks in turn."""
    found = []
    for start in range(0, num_micro_batch, num_stages):
        group = range(start, min(start + num_stages, num_micro_batch))
        order = range(chunks) if kind == FORWARD else reversed(range(chunks))
        for chunk in order:
            found += [(chunk * num_stages + device, m) for m in group]
    return found


def _row(num_stages, num_micro_batch, chunks, device, extra):
    """Device ``device``'s actions: the warm-up forwards (Megatron's count plus
    ``extra``), one forward and one backward while forwards remain, then the rest."""
    forwards = _order(num_stages, num_micro_batch, chunks, device, FORWARD)
    backwards = _order(num_stages, num_micro_batch, chunks, device, BACKWARD)
    total = len(forwards)
    warm_up = min(total, (chunks - 1) * num_stages + 2 * (num_stages - device - 1) + extra)
    row = [Action(t, FORWARD, m) for t, m in forwards[:warm_up]]
    for index in range(total - warm_up):
        t, m = forwards[warm_up + index]
        row.append(Action(t, FORWARD, m))
        t, m = backwards[index]
        row.append(Action(t, BACKWARD, m))
    row += [Action(t, BACKWARD, m) for t, m in backwards[total - warm_up:]]
    return row


def interleaved(num_stages, num_micro_batch, num_virtual_stages):
    """The interleaved 1F1B schedule of ``num_virtual_stages`` chunks per device (any
    S, including 2, and any M); v = 1 is PreferBackward's 1F1B."""
    _check_count("num_stages", num_stages)
    _check_count("num_micro_batch", num_micro_batch)
    _check_count("num_virtual_stages", num_virtual_stages)
    one_f_one_b = prefer_backward(num_stages, num_micro_batch)
    if num_virtual_stages == 1:
        return one_f_one_b
    limit = timed.makespan(one_f_one_b) + 1e-9
    for extra in range(num_virtual_stages * num_micro_batch + 1):
        rows = [_row(num_stages, num_micro_batch, num_virtual_stages, d, extra)
                for d in range(num_stages)]
        schedule = Schedule(INTERLEAVED, num_stages, num_micro_batch, rows,
                            num_virtual_stages)
        if simulate(schedule).complete and timed.makespan(schedule) <= limit:
            return schedule
    raise ScheduleError("EPL internal error: no interleaved order for %d stages, %d "
                        "micro-batches, %d virtual stages" % (
                            num_stages, num_micro_batch, num_virtual_stages))


def chunk_in_flight(schedule, stage):
    """Micro-batches whose activations virtual stage ``stage`` holds at once (from its F
    to its B) in its device's order. Summed over a device's chunks this bounds the
    device's activations from above (the chunks' peaks need not coincide)."""
    in_flight = peak = 0
    for action in schedule.stage(stage % schedule.num_stages):
        if action.stage == stage:
            in_flight += 1 if action.kind == FORWARD else (-1 if action.kind == BACKWARD else 0)
            peak = max(peak, in_flight)
    return peak
