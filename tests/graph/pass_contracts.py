"""Record what each rewrite pass really reads and writes of the RewriteContext.

``record(view, config, cluster, passes)`` runs ``parallelize`` with every pass wrapped:
while a pass runs, each attribute it (or a context method it calls) reads on the
context or on the ParallelProgram is noted under its field name (``FIELD_OF`` maps
private attributes to the field they belong to), and the fields it changed are found
by comparing snapshots taken before and after it (identity of values, one level into
containers, two into tables of tables). ``graph`` is written when the serialized
GraphDef changed (ops, inputs, devices, attributes, functions).
"""
import collections

from epl.parallel import rewriter
from epl.parallel.context import FIELD_OF, Communicators, RewriteContext
from epl.parallel.program import FetchMap, ParallelProgram
from epl.parallel.repeat.record import Instance, Repetition

Observed = collections.namedtuple("Observed", ["name", "reads", "writes"])
_STATE = {"pass": None, "log": None}


def _field(prefix, name):
    if name.startswith("__") or (prefix, name) == ("", "program"):
        return None   # the program itself: its fields are noted as program.<field>
    key = prefix + name
    if key in FIELD_OF:
        return FIELD_OF[key]
    return None if name.startswith("_") else key


def _note(prefix, owner, name):
    if _STATE["pass"] is None:
        return
    attribute = getattr(type(owner), name, None)
    if callable(attribute) or isinstance(attribute, property):
        return   # methods and properties: what they read inside is noted instead
    field = _field(prefix, name)
    if field is not None:
        _STATE["log"].add(field)


class _RecordingProgram(ParallelProgram):
    def __getattribute__(self, name):
        _note("program.", self, name)
        return object.__getattribute__(self, name)


class _RecordingContext(RewriteContext):
    def __init__(self, *args, **kwargs):
        super(_RecordingContext, self).__init__(*args, **kwargs)
        program = object.__getattribute__(self, "program")
        program.__class__ = _RecordingProgram

    def __getattribute__(self, name):
        _note("", self, name)
        return object.__getattribute__(self, name)


def _fingerprint(value, depth=3):
    if isinstance(value, (Communicators, Repetition, Instance, FetchMap)):
        value = _state(value)  # the unit's records: what is in them, not their identity
    if isinstance(value, dict):
        if depth == 0:
            return ("dict", id(value), len(value))
        return ("dict", frozenset((k, _fingerprint(v, depth - 1)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        if depth == 0:
            return ("seq", id(value), len(value))
        return ("seq", tuple(_fingerprint(v, depth - 1) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(id(v) if not isinstance(v, (str, int, tuple)) else v
                                 for v in value))
    if isinstance(value, (str, int, float, bool)) or value is None:
        return ("value", value)
    return ("object", id(value))


def _state(value):
    """The public attributes of an object that holds part of the context's state (its
    private ones are caches)."""
    if isinstance(value, Instance):
        return dict((name, getattr(value, name)) for name in Instance.__slots__)
    return dict((name, item) for name, item in vars(value).items() if not name.startswith("_"))


def _snapshot(ctx):
    fields = {}
    for prefix, owner in (("", ctx), ("program.", ctx.program)):
        for name, value in vars(owner).items():
            if name.startswith("_"):
                continue   # caches (the sharded variables of the view) fill as they are read
            field = _field(prefix, name)
            if field is not None:
                fields.setdefault(field, []).append(_fingerprint(value))
    return fields


def _graph_fingerprint(tf_graph):
    """The serialized GraphDef: ops, inputs, devices, attributes and the function library
    (IO slicing rewrites file lists inside dataset functions)."""
    return tf_graph.as_graph_def().SerializeToString(deterministic=True)


class _Recorded(object):
    """A pass, run with its context accesses noted."""

    def __init__(self, inner, observed):
        self.inner = inner
        self.name, self.phase = inner.name, inner.phase
        self._observed = observed

    def applies(self, ctx):
        return self.inner.applies(ctx)

    def run(self, ctx):
        before, graph_before = _snapshot(ctx), _graph_fingerprint(ctx.tf_graph)
        _STATE["pass"], _STATE["log"] = self.name, set()
        try:
            self.inner.run(ctx)
        finally:
            reads = _STATE["log"]
            _STATE["pass"], _STATE["log"] = None, None
        after = _snapshot(ctx)
        writes = set(f for f in set(before) | set(after) if before.get(f) != after.get(f))
        if _graph_fingerprint(ctx.tf_graph) != graph_before:
            writes.add("graph")
        self._observed.append(Observed(self.name, frozenset(reads), frozenset(writes)))


def record(view, config, cluster, passes=rewriter.PASSES):
    """Run the passes on ``view``; return [Observed] of each pass that applied, in order."""
    observed = []
    original = rewriter.RewriteContext
    rewriter.RewriteContext = _RecordingContext
    try:
        rewriter.parallelize(view, config, cluster,
                             passes=[_Recorded(p, observed) for p in passes])
    finally:
        rewriter.RewriteContext = original
    return observed
