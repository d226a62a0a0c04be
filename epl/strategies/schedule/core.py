"""The core of pipeline schedules: actions, schedules, strategies, simulation, the grid.

Plain, immutable data, no TensorFlow (see :mod:`epl.strategies.schedule` for the
why and an example). The checks are :mod:`epl.strategies.schedule.validation`;
pictures and the command line are :mod:`epl.strategies.schedule.picture`, which
build on this module.
"""
import collections
import fractions
import re

from epl.checks import check_count, is_count

FORWARD = "F"
BACKWARD = "B"
WEIGHT = "W"
PREFER_BACKWARD = "PreferBackward"
PREFER_FORWARD = "PreferForward"
ZERO_BUBBLE = "ZeroBubble"

# Strict on purpose: no signs, no leading zeros, no spaces, so that parse(str(a)) == a and
# str(parse(text)) == text for every accepted text (golden files stay canonical).
_ACTION_RE = re.compile(r"(0|[1-9][0-9]*)([FBW])(0|[1-9][0-9]*)")


class ScheduleError(ValueError):
    """A schedule, its text or its parameters are invalid; the message says how to fix it."""


def _is_index(value):
    # bool is an int subclass, but True as a stage number is always a bug.
    return is_count(value, minimum=0)


def _check_count(label, value):
    """Reject counts early so errors name the argument, not a later symptom."""
    return check_count(value, label, ScheduleError)


class Action(collections.namedtuple("Action", "stage kind micro_batch")):
    """One unit of work: stage ``stage`` runs the forward ("F") or backward ("B") of a
    micro-batch. Its text form, e.g. ``1F3``, is what grids and golden files show.

    Schedules that split the backward (ZeroBubble) also have "W" actions: "B" is then
    only the part of the backward the previous stage waits for (the gradients of the
    stage's inputs) and "W" the rest (the weights' gradients and their sums)."""

    __slots__ = ()

    def __new__(cls, stage, kind, micro_batch):
        if not _is_index(stage):
            raise ScheduleError("Action stage must be an integer >= 0, got %r" % (stage,))
        if kind not in (FORWARD, BACKWARD, WEIGHT):
            raise ScheduleError("Action kind must be %r, %r or %r, got %r"
                                % (FORWARD, BACKWARD, WEIGHT, kind))
        if not _is_index(micro_batch):
            raise ScheduleError("Action micro_batch must be an integer >= 0, got %r"
                                % (micro_batch,))
        return super(Action, cls).__new__(cls, stage, kind, micro_batch)

    def __str__(self):
        return "%d%s%d" % (self.stage, self.kind, self.micro_batch)

    @classmethod
    def parse(cls, text):
        """``"12B10"`` -> ``Action(12, "B", 10)``; anything else raises ScheduleError."""
        match = _ACTION_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ScheduleError("cannot parse action %r: expected <stage><F|B|W><micro_batch> "
                                "such as '1F3' or '12B10'" % (text,))
        return cls(int(match.group(1)), match.group(2), int(match.group(3)))


def _as_action(value):
    return value if isinstance(value, Action) else Action.parse(value)


def _as_row(row):
    # A row may be given as text ("0F0 0F1 ...") because that is how schedules are written.
    items = row.split() if isinstance(row, str) else row
    return tuple(_as_action(item) for item in items)


class Schedule(object):
    """Per stage, the order of its actions. Immutable and compared by value, so schedules
    can be cached, used as dict keys and compared with golden files.

    ``stages`` is one sequence per stage of Actions (or their text). Only the shape is
    checked here; ``validate`` checks the content, so broken schedules can still be built,
    printed and diagnosed.

    With ``num_virtual_stages`` v > 1 (interleaved stages) the model has v * S stages
    (*virtual stages*, an Action's ``stage``) and row d is device d, which runs virtual
    stages d, d + S, d + 2S, ... (virtual stage t on row t mod S).
    """

    __slots__ = ("name", "num_stages", "num_micro_batch", "stages", "num_virtual_stages")

    def __init__(self, name, num_stages, num_micro_batch, stages, num_virtual_stages=1):
        if not isinstance(name, str) or not name:
            raise ScheduleError("schedule name must be a non-empty string, got %r" % (name,))
        _check_count("num_stages", num_stages)
        _check_count("num_micro_batch", num_micro_batch)
        _check_count("num_virtual_stages", num_virtual_stages)
        rows = tuple(_as_row(row) for row in stages)
        if len(rows) != num_stages:
            raise ScheduleError("schedule %r has %d stage rows but num_stages=%d"
                                % (name, len(rows), num_stages))
        for field, value in (("name", name), ("num_stages", num_stages),
                             ("num_micro_batch", num_micro_batch), ("stages", rows),
                             ("num_virtual_stages", num_virtual_stages)):
            object.__setattr__(self, field, value)

    def __setattr__(self, field, value):
        raise AttributeError("Schedule is immutable; build a new one instead")

    def __delattr__(self, field):
        raise AttributeError("Schedule is immutable; build a new one instead")

    def __reduce__(self):
        return (Schedule, self._key())

    def _key(self):
        return (self.name, self.num_stages, self.num_micro_batch, self.stages,
                self.num_virtual_stages)

    def __eq__(self, other):
        return type(other) is Schedule and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return "<Schedule %s: %s x %d micro-batches>" % (
            self.name, _shape(self), self.num_micro_batch)

    def __str__(self):
        return to_grid(self)

    def stage(self, s):
        """The actions of stage ``s``, in the order that stage runs them."""
        if not _is_index(s) or s >= self.num_stages:
            raise ScheduleError("stage must be an integer in 0..%d, got %r"
                                % (self.num_stages - 1, s))
        return self.stages[s]

    @property
    def model_stages(self):
        """How many stages the model has: num_stages, times num_virtual_stages when
        each device holds several (interleaved stages)."""
        return self.num_stages * self.num_virtual_stages

    def compact(self):
        """One line per stage, actions separated by spaces: the golden-file form."""
        return "\n".join(" ".join(str(action) for action in row) for row in self.stages)

    @property
    def splits_backward(self):
        """True when the backward is split into B (input gradients) and W (weight
        gradients) actions: the lowering must then find both parts of each backward."""
        return any(action.kind == WEIGHT for row in self.stages for action in row)

    def kinds(self):
        """The action kinds every stage runs per micro-batch."""
        return (FORWARD, BACKWARD, WEIGHT) if self.splits_backward else (FORWARD, BACKWARD)

    @classmethod
    def parse(cls, text, name="parsed", num_micro_batch=None):
        """Inverse of ``compact``. Blank lines are ignored; when ``num_micro_batch`` is not
        given it is the largest micro-batch index in the text plus one."""
        if not isinstance(text, str):
            raise ScheduleError("Schedule.parse needs a string, got %r" % (text,))
        rows = [_as_row(line) for line in text.splitlines() if line.strip()]
        if not rows:
            raise ScheduleError("cannot parse a schedule from text without actions")
        if num_micro_batch is None:
            num_micro_batch = 1 + max(a.micro_batch for row in rows for a in row)
        return cls(name, len(rows), num_micro_batch, rows)


def _shape(schedule):
    if schedule.num_virtual_stages == 1:
        return "%d stages" % schedule.num_stages
    return "%d devices x %d virtual stages" % (
        schedule.num_stages, schedule.num_virtual_stages)


# --------------------------------------------------------------------------- strategies

def prefer_forward(num_stages, num_micro_batch):
    """GPipe-like: every stage runs all forwards, then all backwards. Simple, but every
    stage holds the activations of all M micro-batches at its peak."""
    _check_count("num_stages", num_stages)
    _check_count("num_micro_batch", num_micro_batch)
    rows = []
    for s in range(num_stages):
        rows.append([Action(s, FORWARD, m) for m in range(num_micro_batch)]
                    + [Action(s, BACKWARD, m) for m in range(num_micro_batch)])
    return Schedule(PREFER_FORWARD, num_stages, num_micro_batch, rows)


def _one_f_one_b(s, num_stages, num_micro_batch):
    """Stage s: min(S - s, M) warm-up forwards (just enough to keep the stages below busy
    until the first backward comes back), then one backward / one forward, then drain."""
    warm_up = min(num_stages - s, num_micro_batch)
    row = [Action(s, FORWARD, m) for m in range(warm_up)]
    next_f, next_b = warm_up, 0
    while next_f < num_micro_batch:
        row += [Action(s, BACKWARD, next_b), Action(s, FORWARD, next_f)]
        next_b, next_f = next_b + 1, next_f + 1
    row += [Action(s, BACKWARD, m) for m in range(next_b, num_micro_batch)]
    return row


def prefer_backward(num_stages, num_micro_batch):
    """1F1B (PipeDream-flush-like), EPL's default: same makespan as GPipe with unit times,
    but a backward frees activations as soon as possible, so stage s holds at most
    min(S - s, M) micro-batches instead of M."""
    _check_count("num_stages", num_stages)
    _check_count("num_micro_batch", num_micro_batch)
    rows = [_one_f_one_b(s, num_stages, num_micro_batch) for s in range(num_stages)]
    return Schedule(PREFER_BACKWARD, num_stages, num_micro_batch, rows)


def _zero_bubble_row(s, num_stages, num_micro_batch, deferred):
    """Stage s of ZB-H1: 1F1B's warm-up, then B, W, F per micro-batch, except that the
    first ``deferred`` W actions wait (they run where 1F1B idles, or at the end). Stage s
    thus holds at most warm-up + deferred micro-batches whose W has not run."""
    warm_up = min(num_stages - s, num_micro_batch)
    row = [Action(s, FORWARD, m) for m in range(warm_up)]
    next_f, next_b, next_w = warm_up, 0, 0
    while next_b < num_micro_batch:
        row.append(Action(s, BACKWARD, next_b))
        next_b += 1
        if next_b - next_w > deferred:
            row.append(Action(s, WEIGHT, next_w))
            next_w += 1
        if next_f < num_micro_batch:
            row.append(Action(s, FORWARD, next_f))
            next_f += 1
    row += [Action(s, WEIGHT, m) for m in range(next_w, num_micro_batch)]
    return row


ZB_MEMORY = ("pipeline", "stage")
# The per-stage bound of ``memory="stage"``: a stage's peak (memory_units) within this
# factor of its own 1F1B peak.
STAGE_MEMORY_BOUND = 1.1
# What a micro-batch whose W waits holds beyond its activations, in units of its
# activations: the gradients of the stage's layer outputs that B hands to W (as large as
# the activations on stacks of dense layers, where W reads every activation B reads).
SAVED_GRADIENTS = 1.0


def _stage_deferral(warm_up):
    """How many W actions a stage holding ``warm_up`` micro-batches under 1F1B may defer
    and stay within STAGE_MEMORY_BOUND of that peak (memory_units' model): each deferred
    W keeps one more micro-batch's activations and its saved output gradients, and a
    split stage holds one more micro-batch's output gradients from B to W: with d
    deferred, warm_up + d + (d + 1) * SAVED_GRADIENTS. Zero (every W right after its B,
    which the lowering fuses) unless a stage holds 30 or more micro-batches."""
    spare = (STAGE_MEMORY_BOUND - 1.0) * warm_up
    return max(0, int((spare - SAVED_GRADIENTS) / (1.0 + SAVED_GRADIENTS) + 1e-9))


def zero_bubble(num_stages, num_micro_batch, memory="pipeline"):
    """ZB-H1 ("Zero Bubble Pipeline Parallelism", ICLR 2024): each backward is split into
    B (the input gradients the previous stage waits for) and W (weight gradients, which
    nothing waits for), and W actions move into 1F1B's bubbles. With equal F, B and W
    times the step takes (M + S - 1) * 3 - 2 * (S - 1) units instead of 1F1B's
    (M + S - 1) * 3 (S = 2, M = 4: 13 against 15).

    A micro-batch counts as in flight on a stage from its F to its W (W still reads the
    stage's saved inputs). ``memory="pipeline"`` (the paper's ZB-H1) keeps the
    pipeline's peak at 1F1B's (S micro-batches, on stage 0): stage s > 0 defers s W
    actions and so holds S micro-batches instead of 1F1B's S - s. ``memory="stage"``
    keeps every stage within STAGE_MEMORY_BOUND of its own 1F1B peak (``memory_units``):
    a stage s defers up to ZB-H1's s Ws only where that bound allows (a stage holding
    30 micro-batches or more); elsewhere each W follows its B, the lowering runs them as one fused
    backward (``split_stages``), and the step takes 1F1B's time."""
    _check_count("num_stages", num_stages)
    _check_count("num_micro_batch", num_micro_batch)
    if memory not in ZB_MEMORY:
        raise ScheduleError("ZeroBubble memory must be one of %s, got %r" % (ZB_MEMORY, memory))
    rows = []
    for s in range(num_stages):
        warm_up = min(num_stages - s, num_micro_batch)
        # ZB-H1's s deferred Ws fill stage s's bubbles; deferring more only delays it
        deferred = s if memory == "pipeline" else min(s, _stage_deferral(warm_up))
        rows.append(_zero_bubble_row(s, num_stages, num_micro_batch, deferred))
    return Schedule(ZERO_BUBBLE, num_stages, num_micro_batch, rows)


_STRATEGIES = collections.OrderedDict([
    (PREFER_BACKWARD.lower(), prefer_backward),
    (PREFER_FORWARD.lower(), prefer_forward),
    (ZERO_BUBBLE.lower(), zero_bubble),
])


def get_schedule(name, num_stages, num_micro_batch, **options):
    """The schedule for the ``pipeline.strategy`` config value (case-insensitive, like the
    config itself); ``options`` go to the builder (``memory`` for ZeroBubble)."""
    builder = _STRATEGIES.get(name.lower()) if isinstance(name, str) else None
    if builder is None:
        raise ScheduleError("unknown pipeline schedule %r; expected one of %s "
                            "(case-insensitive)" % (name, ", ".join((
                                PREFER_BACKWARD, PREFER_FORWARD, ZERO_BUBBLE))))
    return builder(num_stages, num_micro_batch, **options)


# --------------------------------------------------------------------------- simulation

def dependencies(action, num_stages):
    """The actions that must finish before ``action`` may start (data dependencies only;
    the order within a stage is the schedule's business)."""
    s, kind, m = action
    if kind == FORWARD:
        return (Action(s - 1, FORWARD, m),) if s > 0 else ()
    if kind == WEIGHT:
        return (Action(s, BACKWARD, m),)
    deps = [Action(s, FORWARD, m)]
    if s < num_stages - 1:
        deps.append(Action(s + 1, BACKWARD, m))
    return tuple(deps)


class Timeline(collections.namedtuple("Timeline", "slots blocked")):
    """Result of ``simulate``. ``slots[t][s]`` is the Action stage s runs in slot t, or None
    when idle. ``blocked[s]`` is the action stage s could not start when the simulation
    stalled (None for stages that finished, and for all stages when complete)."""

    __slots__ = ()

    @property
    def complete(self):
        return all(action is None for action in self.blocked)

    @property
    def makespan(self):
        return len(self.slots)

    def done(self):
        """Every action that ran, for explaining what a blocked action still needs."""
        return {action for slot in self.slots for action in slot if action is not None}


def simulate(schedule):
    """Unit-time simulation: in each slot every stage starts its next action if all of that
    action's dependencies finished in an EARLIER slot. Deterministic. A slot in which no
    stage can start while actions remain can never change, so the simulation stops there
    and reports the stall in ``Timeline.blocked`` instead of raising, so that callers can
    still draw the partial timeline."""
    rows, num_stages = schedule.stages, schedule.model_stages
    position = [0] * len(rows)
    done, slots = set(), []
    remaining = sum(len(row) for row in rows)
    while remaining:
        slot = []
        for s, row in enumerate(rows):
            action = row[position[s]] if position[s] < len(row) else None
            ready = action is not None and all(
                dep in done for dep in dependencies(action, num_stages))
            slot.append(action if ready else None)
        if all(action is None for action in slot):
            break
        for s, action in enumerate(slot):
            if action is not None:
                position[s] += 1
                remaining -= 1
                done.add(action)
        slots.append(tuple(slot))
    blocked = tuple(row[position[s]] if position[s] < len(row) else None
                    for s, row in enumerate(rows))
    return Timeline(tuple(slots), blocked)


def bubble_fraction(schedule):
    """Idle cells / all cells of the simulated grid, as an exact Fraction. For both built-in
    strategies with unit times this is (S - 1) / (M + S - 1)."""
    timeline = simulate(schedule)
    if not timeline.complete:
        raise ScheduleError("schedule %r stalls, so it has no bubble fraction; run "
                            "validate() for the reason" % schedule.name)
    total = timeline.makespan * schedule.num_stages
    if not total:
        raise ScheduleError("schedule %r has no actions, so it has no bubble fraction"
                            % schedule.name)
    idle = sum(action is None for slot in timeline.slots for action in slot)
    return fractions.Fraction(idle, total)


def peak_in_flight(schedule):
    """Per stage, the most micro-batches whose forward ran but whose backward has not (its
    W, when the backward is split: W still reads the saved inputs): a proxy for
    activation memory. Follows each stage's own order, so no simulation."""
    frees = WEIGHT if schedule.splits_backward else BACKWARD
    peaks = []
    for row in schedule.stages:
        in_flight = peak = 0
        for action in row:
            in_flight += 1 if action.kind == FORWARD else (-1 if action.kind == frees else 0)
            peak = max(peak, in_flight)
        peaks.append(peak)
    return tuple(peaks)


def _row_of(schedule, stage):
    """The row that runs (virtual) stage ``stage``, None if the model has no such stage."""
    return stage % schedule.num_stages if stage < schedule.model_stages else None


def _own_stages(schedule, s):
    """The (virtual) stages row ``s`` runs: s alone, or s, s + S, ... when interleaved."""
    return range(s, schedule.model_stages, schedule.num_stages)


# --------------------------------------------------------------------------- text grid

def _as_marks(mark):
    if mark is None:
        return frozenset()
    if isinstance(mark, (Action, str)):
        return frozenset([_as_action(mark)])
    return frozenset(_as_action(item) for item in mark)


def _cell(action, marks, width):
    if action is None:
        text = "."
    elif action in marks:
        text = "[%s]" % (action,)
    else:
        text = str(action)
    return text.center(width)


def _footer(schedule, timeline):
    if not timeline.complete:
        total = sum(len(row) for row in schedule.stages)
        ran = sum(action is not None for slot in timeline.slots for action in slot)
        return ("STALLED after %d slots: %d of %d actions never started (no stage can "
                "start its next action)" % (timeline.makespan, total - ran, total))
    cells = timeline.makespan * schedule.num_stages
    if not cells:
        return "0 slots: the schedule has no actions"
    idle = sum(action is None for slot in timeline.slots for action in slot)
    return ("%d slots, bubble fraction (idle cells / all cells) = %d/%d = %.1f%%"
            % (timeline.makespan, idle, cells, 100.0 * idle / cells))


def to_grid(schedule, mark=None):
    """The simulated timeline as fixed-width text: one column per time slot, one row per
    stage, ``.`` where a stage idles. ``mark`` (an Action, its text, or several) is shown
    ``[like this]``; a marked action missing from the schedule is named at the end of its
    stage's row. If the simulation stalls, each stage's actions that never started follow
    ``||`` so that every action of the schedule is visible somewhere."""
    timeline = simulate(schedule)
    marks = _as_marks(mark)
    present = {action for row in schedule.stages for action in row}
    width = 2 + max([len(str(action)) for action in present]
                    + [len(str(timeline.makespan - 1))])
    label = "stage %d" if schedule.num_virtual_stages == 1 else "device %d"
    label_width = len(label % (schedule.num_stages - 1))
    header = "slot".ljust(label_width) + " |" + "".join(
        str(t).center(width) for t in range(timeline.makespan))
    if not timeline.complete:
        header += " ||  not run"
    lines = ["%s: %s x %d micro-batches" % (
        schedule.name, _shape(schedule), schedule.num_micro_batch), header.rstrip()]
    for s, row in enumerate(schedule.stages):
        line = (label % s).ljust(label_width) + " |" + "".join(
            _cell(slot[s], marks, width) for slot in timeline.slots)
        if not timeline.complete:
            started = sum(slot[s] is not None for slot in timeline.slots)
            line += " || " + "".join(_cell(action, marks, width) for action in row[started:])
        missing = sorted(m for m in marks if _row_of(schedule, m.stage) == s
                         and m not in present)
        if missing:
            line += "  <- %s missing" % " ".join("[%s]" % (action,) for action in missing)
        lines.append(line.rstrip())
    for action in sorted(m for m in marks - present if _row_of(schedule, m.stage) is None):
        lines.append("marked [%s]: not in this schedule, which has stages 0..%d"
                     % (action, schedule.model_stages - 1))
    lines.append(_footer(schedule, timeline))
    return "\n".join(lines)
