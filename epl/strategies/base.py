"""The two parallel strategies, ``replicate`` and ``split``, as scope objects.

Each strategy object is one segment: the ops created under it (in every entry
of its scope, or while it is the default) form one TaskGraph. A scope's
TaskGraph is created with its first op; ``set_default_strategy`` creates its
TaskGraph at once. Strategy objects carry only what the user said; device
assignment happens in the plan.

Example::

    with epl.replicate(device_count=1, name="stage_0"):
        model_part1()
"""
from epl.checks import is_count
from epl.ir.taskgraph import REPLICATE, SPLIT
from epl.strategies import context as _context
from epl.strategies.context import StrategyError


class Strategy(object):
    """Base of replicate/split: validated arguments plus scope behaviour."""

    kind = None

    def __init__(self, device_count=None, name=None):
        if device_count is not None and not is_count(device_count):
            raise StrategyError("%s(device_count=%r): device_count must be an integer >= 1 "
                                "or None" % (self.kind, device_count))
        if name is not None and not isinstance(name, str):
            raise StrategyError("%s(name=%r): name must be a string or None"
                                % (self.kind, name))
        self.device_count = device_count
        self.name = name

    def __enter__(self):
        require_init("with %r:" % (self,))
        _context.get_context().enter(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        _context.get_context().exit(self)
        return False

    def __repr__(self):
        args = []
        if self.device_count is not None:
            args.append("device_count=%d" % self.device_count)
        if self.name is not None:
            args.append("name=%r" % self.name)
        return "%s(%s)" % (self.kind, ", ".join(args))


class Replicate(Strategy):
    """Data parallelism: the scope's sub-model is copied; each copy gets its own data.

    ``device_count`` is the number of devices ONE copy uses; with more than one,
    each batch is split evenly across those devices.
    """

    kind = REPLICATE


class Split(Strategy):
    """Tensor (operator) parallelism: the scope's sub-model is sharded over devices."""

    kind = SPLIT


def require_init(usage):
    """Refuse a strategy scope or default before ``epl.init()`` (docs/api.md says why an
    error, not a warning): EPL's hooks are not installed, so the model would train as
    plain single-device TensorFlow without a word, and ``epl.init()`` starts the scopes
    over anyway, discarding a default strategy set before it."""
    # Imported here: the IR view needs TensorFlow, and this package must load without it.
    from epl.ir.graph import Graph
    if Graph.introspection is not None and Graph.introspection.initialized():
        return
    raise StrategyError(
        "%s before epl.init(): EPL is not initialized, so this strategy would do nothing "
        "and the model would train as plain single-device TensorFlow. Call epl.init() "
        "first, right after `import epl` (epl.init() also starts the scopes over, so a "
        "strategy set before it is lost)." % usage)


def replicate(device_count=None, name=None):
    """Open a data-parallel scope (seed API: ``epl.replicate``)."""
    return Replicate(device_count=device_count, name=name)


def split(device_count=None, name=None):
    """Open an operator-split scope (seed API: ``epl.split``)."""
    return Split(device_count=device_count, name=name)


def set_default_strategy(strategy):
    """Make ``strategy`` apply to every op created outside explicit scopes.

    The seeds say it sets a default strategy *and its TaskGraph*: the TaskGraph
    is created right away in the default graph (ops created earlier and not yet
    in any TaskGraph join it). Each call with a new strategy object starts a new
    TaskGraph, which is how the BERT tutorial defines pipeline stages with
    repeated ``set_default_strategy(epl.replicate(1))``; passing the same object
    again continues its TaskGraph.
    """
    if not isinstance(strategy, Replicate):
        raise StrategyError("set_default_strategy accepts epl.replicate(...), got %r"
                            % (strategy,))
    require_init("epl.set_default_strategy(%r)" % (strategy,))
    segment = _context.get_context().set_default(strategy)
    from epl.ir.graph import Graph
    Graph.get().open_segment(segment)
    return strategy
