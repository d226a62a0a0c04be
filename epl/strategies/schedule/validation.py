"""Validation of pipeline schedules: complete, ordered as EPL's lowering needs, and
running to the end (see :func:`validate`).

Split from :mod:`epl.strategies.schedule.core`, which holds the data, the builders,
the simulation and the grid these checks explain their findings with.
"""
import collections

from epl.strategies.schedule.core import (
    BACKWARD, FORWARD, WEIGHT, Action, Schedule, ScheduleError, _own_stages, _row_of,
    dependencies, simulate, to_grid)


# --------------------------------------------------------------------------- validation

def _check_rows(schedule):
    """Each row holds only its own stage's actions, for existing micro-batches."""
    for s, row in enumerate(schedule.stages):
        for action in row:
            if _row_of(schedule, action.stage) != s:
                return action, ("stage %d's row holds %s, an action of stage %d; a row may "
                                "only hold its own stage's actions" % (s, action, action.stage))
            if action.micro_batch >= schedule.num_micro_batch:
                return action, ("stage %d's row holds %s, but the schedule has only %d "
                                "micro-batches (0..%d)" % (s, action, schedule.num_micro_batch,
                                                           schedule.num_micro_batch - 1))
    return None


_KIND_WORDS = {False: "forward and the backward",
               True: "forward, the input-gradient backward (B) and the weight-gradient "
                     "backward (W)"}


def _check_exactly_once(schedule):
    """Every F and B (and W, when the backward is split) of every micro-batch, once per
    stage: a missing action would leave its gradient uncomputed, a duplicate would run a
    micro-batch twice."""
    for s, row in enumerate(schedule.stages):
        counts = collections.Counter(row)
        for action in row:
            if counts[action] > 1:
                return action, ("%s appears %d times on stage %d; every action must run "
                                "exactly once" % (action, counts[action], s))
        for m, kind, t in ((m, k, t) for m in range(schedule.num_micro_batch)
                           for k in schedule.kinds() for t in _own_stages(schedule, s)):
            action = Action(t, kind, m)
            if action not in counts:
                return action, ("stage %d never runs %s; each stage must run the %s of "
                                "every micro-batch 0..%d exactly once"
                                % (s, action, _KIND_WORDS[schedule.splits_backward],
                                   schedule.num_micro_batch - 1))
    return None


def _check_order(schedule):
    """F(m) before B(m), and micro-batches in increasing order per kind: EPL's lowering
    chains micro-batches in one order shared by all stages."""
    for t in range(schedule.model_stages):  # each (virtual) stage on its own
        row = [a for a in schedule.stages[t % schedule.num_stages] if a.stage == t]
        problem = _check_stage_order(schedule, t, row)
        if problem is not None:
            return problem
    return None


def _check_stage_order(schedule, s, row):
    """_check_order for the actions ``row`` of stage ``s``, in their order."""
    position = {action: i for i, action in enumerate(row)}
    for m in range(schedule.num_micro_batch):
        forward, backward = Action(s, FORWARD, m), Action(s, BACKWARD, m)
        if position[backward] < position[forward]:
            return backward, ("on stage %d, %s runs before %s; a micro-batch's backward "
                              "needs the activations of its forward" % (s, backward, forward))
        weight = Action(s, WEIGHT, m)
        if weight in position and position[weight] < position[backward]:
            return weight, ("on stage %d, %s runs before %s; the weight gradients need "
                            "the gradients B computes" % (s, weight, backward))
    for kind, label in ((FORWARD, "forwards"), (BACKWARD, "backwards"),
                        (WEIGHT, "weight-gradient backwards")):
        same_kind = [action for action in row if action.kind == kind]
        for previous, action in zip(same_kind, same_kind[1:]):
            if action.micro_batch < previous.micro_batch:
                return action, ("on stage %d, %s comes after %s; %s must run in increasing "
                                "micro-batch order, because EPL's lowering assumes every "
                                "stage sees the micro-batches in the same order"
                                % (s, action, previous, label))
    return None


def _where(schedule, dep, blocked):
    """Why ``dep`` has not run: explains one edge of a deadlock in words."""
    row = _row_of(schedule, dep.stage)
    if row is None or dep not in schedule.stages[row]:
        return "%s, which no stage runs" % (dep,)
    if blocked[row] == dep:
        return "%s, stage %d's next action, itself blocked" % (dep, row)
    return "%s, which stage %d only runs after %s" % (dep, row, blocked[row])


def _check_progress(schedule, timeline):
    """The simulation must finish; otherwise name, per blocked stage, what it waits for."""
    if timeline.complete:
        return None
    done = timeline.done()
    reasons = []
    for s, action in enumerate(timeline.blocked):
        if action is not None:
            waits = [_where(schedule, dep, timeline.blocked)
                     for dep in dependencies(action, schedule.model_stages) if dep not in done]
            reasons.append("  stage %d waits at %s for %s" % (s, action, " and ".join(waits)))
    blocked = [action for action in timeline.blocked if action is not None]
    return blocked, ("deadlock after %d slots: no stage can start its next action\n%s"
                     % (timeline.makespan, "\n".join(reasons)))


def validate(schedule):
    """Check that ``schedule`` is complete, ordered as EPL's lowering needs, and runs to
    the end. Returns the simulated Timeline; otherwise raises ScheduleError whose message
    explains the first problem found and shows the grid with the offending action(s)
    marked ``[like this]``. Structural problems are reported before deadlocks because
    they are the more direct explanation."""
    if not isinstance(schedule, Schedule):
        raise ScheduleError("validate() needs a Schedule, got %r" % (schedule,))
    for check in (_check_rows, _check_exactly_once, _check_order):
        problem = check(schedule)
        if problem is not None:
            _fail(schedule, *problem)
    timeline = simulate(schedule)
    problem = _check_progress(schedule, timeline)
    if problem is not None:
        _fail(schedule, *problem)
    return timeline


def _fail(schedule, mark, message):
    raise ScheduleError("invalid pipeline schedule %r: %s\n\n%s\n(offending action marked "
                        "[like this])" % (schedule.name, message, to_grid(schedule, mark)))
