"""Rewrite passes. Each has a ``name``, ``applies(ctx)`` and ``run(ctx)``; the
order in which they run is declared once, in :mod:`epl.parallel.rewriter`."""


class Pass(object):
    """Base class: a named, self-contained graph transformation."""

    name = None

    def applies(self, ctx):
        del ctx
        return True

    def run(self, ctx):
        raise NotImplementedError

    def __repr__(self):
        return "<pass %s>" % self.name
