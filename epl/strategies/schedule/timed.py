"""Simulation with action costs: how long a schedule takes when F, B and W differ.

:func:`epl.strategies.schedule.core.simulate` counts unit-time slots, where a fused
backward is one unit like a forward; its grids and golden files stay as they are.
Comparing a schedule that splits the backward (ZeroBubble) with one that does not
needs costs: here a fused backward costs ``B + W`` (so does the B of a stage that the
lowering runs unsplit, :func:`~epl.strategies.schedule.memory.split_stages`, and its W
nothing), and every action starts as soon as its stage is free and its dependencies
have finished (the stage's order is the schedule's). Used by the schedule command
line and the pipeline benchmark to report what each schedule should take beside what
it measured.

Example::

    from epl.strategies.schedule import get_schedule, timed
    timed.makespan(get_schedule("ZeroBubble", 2, 4), timed.Costs(1, 1, 1))  # 13
    timed.makespan(get_schedule("PreferBackward", 2, 4), timed.Costs(1, 1, 1))  # 15
"""
import collections

from epl.strategies.schedule.core import FORWARD, WEIGHT, ScheduleError, dependencies
from epl.strategies.schedule.memory import split_stages


class Costs(collections.namedtuple("Costs", "forward backward weight")):
    """Time of one F, one B (input gradients) and one W (weight gradients) action of a
    stage; a backward that is not split costs ``backward + weight``."""

    __slots__ = ()

    def of(self, action, split):
        """The cost of ``action`` on a stage whose backward is ``split`` or fused (then
        its B costs ``backward + weight`` and its W, run inside that B, nothing)."""
        if action.kind == FORWARD:
            return self.forward
        if action.kind == WEIGHT:
            return self.weight if split else 0
        return self.backward if split else self.backward + self.weight


UNIT = Costs(1, 1, 1)


def finish_times(schedule, costs=UNIT):
    """{action: (start, finish)} when each stage runs its row in order and an action
    starts once its stage is free and its dependencies finished. Raises ScheduleError
    when the schedule stalls (``validate`` says why)."""
    split = split_stages(schedule)  # the stages the lowering runs B and W apart
    # an interleaved device's virtual stage is 1/v of the model slice 1F1B gives a stage
    chunks = schedule.num_virtual_stages
    times, free = {}, [0] * schedule.num_stages
    position = [0] * schedule.num_stages
    remaining = sum(len(row) for row in schedule.stages)
    while remaining:
        progressed = False
        for s, row in enumerate(schedule.stages):
            while position[s] < len(row):
                action = row[position[s]]
                deps = dependencies(action, schedule.model_stages)
                if any(dep not in times for dep in deps):
                    break
                start = max([free[s]] + [times[dep][1] for dep in deps])
                cost = costs.of(action, s in split)
                times[action] = (start, start + (cost if chunks == 1 else cost / float(chunks)))
                free[s] = times[action][1]
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ScheduleError("schedule %r stalls; run validate() for the reason"
                                % schedule.name)
    return times


def makespan(schedule, costs=UNIT):
    """The time from the first action's start to the last one's end."""
    times = finish_times(schedule, costs)
    return max(end for _, end in times.values()) if times else 0


def ideal_speedup(schedule, costs=UNIT):
    """Serial time of the step's work on one device (every stage's F, B and W, one after
    another) over the schedule's makespan: what S devices could give at best with this
    schedule and these costs."""
    serial = schedule.num_stages * schedule.num_micro_batch * sum(costs)
    return serial / float(makespan(schedule, costs))
