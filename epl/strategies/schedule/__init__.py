"""Pipeline schedules as data: the order in which each stage runs its micro-batches.

A pipeline of ``S`` stages runs ``M`` micro-batches per step. Stage ``s`` runs a
forward ``F(s, m)`` and a backward ``B(s, m)`` for every micro-batch ``m``. The data
dependencies are fixed by the model; the only freedom is the ORDER in which each stage
runs its ``2M`` actions, and that order alone decides the idle time (the "bubble") and the
activation memory. So a schedule is nothing more than that order, one tuple per stage.

Keeping it as plain, immutable data (no TensorFlow here) means a schedule can be printed,
diffed against golden files, simulated and validated before EPL lowers it into control
dependencies, and a broken order is reported as a readable grid instead of a hung step.

Example::

    from epl.strategies import schedule
    sched = schedule.get_schedule("PreferBackward", num_stages=4, num_micro_batch=8)
    schedule.validate(sched)     # raises ScheduleError with a marked grid if broken
    print(sched)                 # the simulated time-slot grid
    schedule.save_png(sched, "1f1b.png")

Command line: ``python -m epl.strategies.schedule --stages 4 --micro-batches 8``.

The package is split so that no module imports one that imports it back:
:mod:`~epl.strategies.schedule.core` holds the data, :mod:`~epl.strategies.schedule.validation`
the checks,
:mod:`~epl.strategies.schedule.memory` which stages the lowering splits and a model
of their memory, :mod:`~epl.strategies.schedule.interleaved` interleaved stages,
:mod:`~epl.strategies.schedule.timed` the simulation with action costs,
:mod:`~epl.strategies.schedule.picture` the picture and the command line;
this module only gathers their names.
"""
from epl.strategies.schedule.core import (  # noqa: F401
    BACKWARD, FORWARD, PREFER_BACKWARD, PREFER_FORWARD, WEIGHT, ZERO_BUBBLE, Action, Schedule,
    ScheduleError, Timeline, bubble_fraction, dependencies, get_schedule, peak_in_flight,
    prefer_backward, prefer_forward, simulate, to_grid, zero_bubble)
from epl.strategies.schedule.validation import validate  # noqa: F401
from epl.strategies.schedule.memory import memory_units, split_stages  # noqa: F401
from epl.strategies.schedule.interleaved import (  # noqa: F401
    INTERLEAVED, chunk_in_flight, interleaved)
from epl.strategies.schedule import timed  # noqa: F401
from epl.strategies.schedule.picture import main, save_png  # noqa: F401
