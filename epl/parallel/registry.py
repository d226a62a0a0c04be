"""The HookRegistry of this process: every TF patch EPL installs."""
from epl.ops import hooks as ops_hooks
from epl.parallel import graph_hooks, session_hooks
from epl.protocols.hooks import HookRegistry


def build_registry(provider):
    """Graph-construction, session and split-layer patches bound to ``provider``."""
    return HookRegistry(graph_hooks.patches(provider) + session_hooks.patches(provider)
                        + ops_hooks.patches(provider))
