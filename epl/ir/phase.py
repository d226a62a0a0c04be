"""What part of a training step an op belongs to."""


class Phase(object):
    """Phase constants (plain strings so they print and compare simply).

    FORWARD, BACKWARD and APPLY ops make up a training step and are the ones
    EPL clones for replicas (and, forward/backward only, for micro-batches).
    SESSION ops (savers, scaffold init/ready ops) and EPL ops (what the rewrite
    adds: collectives, accumulators, the schedule) are never cloned.
    """

    FORWARD = "forward"
    BACKWARD = "backward"
    APPLY = "apply"
    SESSION = "session"
    EPL = "epl"

    STEP = (FORWARD, BACKWARD, APPLY)
    ALL = (FORWARD, BACKWARD, APPLY, SESSION, EPL)
