"""The one HookRegistry of this process: every TF patch EPL installs."""
from epl.parallel import graph_hooks
from epl.parallel.hooks import HookRegistry

HOOKS = HookRegistry(graph_hooks.PATCHES)
