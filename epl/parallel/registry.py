"""The HookRegistry of this process: every TF patch EPL installs."""
from epl.ops import hooks as ops_hooks
from epl.parallel import graph_hooks, session_hooks
from epl.protocols.hooks import HookRegistry
from epl.session import faults


def build_registry(provider):
    """Graph-construction, session and split-layer patches bound to ``provider``, and the
    exit code of a worker that stops because of a fault (epl.session.faults)."""
    return HookRegistry(graph_hooks.patches(provider) + session_hooks.patches(provider)
                        + ops_hooks.patches(provider) + faults.patches())
