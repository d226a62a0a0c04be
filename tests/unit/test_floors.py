"""The floors of EPL: no import cycle, and no import from a lower floor to a higher one.

Every module of ``epl/`` sits on one floor of ``FLOORS`` (lowest first). A module may
import modules of its own floor and of the floors below it, never above, and imports
inside functions count: a function-local import hides a cycle from Python, not from the
design. Within a floor, modules must not import each other in a circle.

Why: a lower floor that reaches up (a saver reading ``epl.Env``, a unit importing the
rewrite core) cannot be used or tested without everything above it, and its import order
starts to matter. docs/design.md shows the table; regenerate it with
``python tests/unit/test_floors.py``.
"""
import ast
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO_ROOT, "epl")

# (floor, its modules and packages, what it holds), lowest first.
FLOORS = (
    ("base", ("epl.version", "epl.lazy", "epl.checks", "epl.tf_adapter", "epl.tf_adapter_graph",
              "epl.tf_adapter_state", "epl.tf_adapter_version", "epl.tf_adapter_tf1",
              "epl.tf_adapter_tf2", "epl.tf_functions", "epl.buckets", "epl.protocols"),
     "nothing above it: the TF adapter (and its functions module), count checks, bucket "
     "planning, the pass and hook protocols, lazy exports"),
    ("description", ("epl.config", "epl.availability", "epl.cluster"),
     "the typed config, what this build can do, workers and devices"),
    ("graph", ("epl.ir", "epl.communicators", "epl.session"),
     "EPL's view of a tf.Graph, the collectives, the session boundary"),
    ("scopes", ("epl.strategies",), "replicate/split scopes, pipeline schedules"),
    ("units", ("epl.ops", "epl.runtime"),
     "split layers, memory savers, gradient accumulation (passes the core runs)"),
    ("measure", ("epl.profiler",), "profilers and the memory estimate"),
    ("rewrite", ("epl.parallel",), "the plan, the rewrite core, the TF hooks"),
    ("api", ("epl", "epl.env"), "the public API: epl.init, epl.Env"),
    ("tools", ("epl.launcher", "epl.check_build", "epl.plan_cli"),
     "command lines: epl-launch, the build report, the plan printer"),
)


def floor_of(module):
    """Index in FLOORS of ``module`` (a dotted name), or None if no floor holds it."""
    best, found = -1, None
    for index, (_, members, _) in enumerate(FLOORS):
        for member in members:
            matches = module == member or (member != "epl" and module.startswith(member + "."))
            if matches and len(member) > best:
                best, found = len(member), index
    return found


def modules(root=PACKAGE):
    """{dotted module name: path} of every .py file under ``root``."""
    base = os.path.dirname(root)
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                found[dotted[:-9] if dotted.endswith(".__init__") else dotted] = path
    return found


def imports(name, path, known):
    """(imported module, line) of every import in the file, function-local ones too."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(parts + ([module] if module else []))
            targets = [module + "." + alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, node.lineno


def edges(found=None):
    """{module: {imported module: first line}} within the package."""
    found = modules() if found is None else found
    graph = {name: {} for name in found}
    for name, path in found.items():
        for target, line in imports(name, path, found):
            graph[name].setdefault(target, line)
    return graph


def upward_imports(graph):
    """Lines 'a (floor) -> b (floor)  path:line' for every import that climbs."""
    found = []
    for name in sorted(graph):
        for target, line in sorted(graph[name].items()):
            low, high = floor_of(name), floor_of(target)
            if low is not None and high is not None and high > low:
                found.append("%s (%s) -> %s (%s)  line %d" % (
                    name, FLOORS[low][0], target, FLOORS[high][0], line))
    return found


def cycles(graph):
    """Strongly connected groups of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def markdown_table():
    """The floor table of docs/design.md."""
    rows = ["| Floor | Modules | What |", "|---|---|---|"]
    for number, (name, members, what) in reversed(list(enumerate(FLOORS))):
        rows.append("| %d %s | %s | %s |" % (number, name, ", ".join(
            "`%s`" % m for m in members), what))
    return "\n".join(rows)


# ---------------------------------------------------------------------------------- tests
def test_every_module_has_a_floor():
    homeless = sorted(m for m in modules() if floor_of(m) is None)
    assert not homeless, ("modules on no floor (add them to FLOORS in %s): %s"
                          % (os.path.relpath(__file__, REPO_ROOT), ", ".join(homeless)))


def test_no_import_climbs_a_floor():
    climbing = upward_imports(edges())
    assert not climbing, ("imports from a lower floor to a higher one (pass what the unit "
                          "needs as an argument, or move the shared part down):\n  "
                          + "\n  ".join(climbing))


def test_no_import_cycle():
    graph = edges()
    found = cycles(graph)
    lines = []
    for group in found:
        lines.append("cycle: " + " ".join(group))
        lines.extend("  %s -> %s (line %d)" % (a, b, graph[a][b])
                     for a in group for b in sorted(graph[a]) if b in group)
    assert not found, "\n".join(lines)


def env_lookups(found=None):
    """'module:line' of every ``Env.get()`` call (or reference) outside the API floor."""
    found = modules() if found is None else found
    api = [index for index, floor in enumerate(FLOORS) if floor[0] == "api"][0]
    lookups = []
    for name, path in sorted(found.items()):
        if floor_of(name) == api:
            continue
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "get"
                    and isinstance(node.value, ast.Name) and node.value.id == "Env"):
                lookups.append("%s:%d" % (name, node.lineno))
    return lookups


def test_only_the_api_reads_the_env():
    """Below the API, units receive config, cluster and plan as arguments."""
    lookups = env_lookups()
    assert not lookups, "Env.get() below the API floor: %s" % ", ".join(lookups)


def test_the_checker_sees_what_it_must(tmp_path):
    """A planted upward import inside a function, a relative import and a cycle are found."""
    root = tmp_path / "epl"
    (root / "ir").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "ir" / "__init__.py").write_text("")
    (root / "ir" / "a.py").write_text("def f():\n    from epl.parallel import b\n")
    (root / "parallel").mkdir()
    (root / "parallel" / "__init__.py").write_text("")
    (root / "parallel" / "b.py").write_text("from ..ir import a\n")
    graph = edges(modules(str(root)))
    assert graph["epl.ir.a"] == {"epl.parallel.b": 2}
    assert graph["epl.parallel.b"] == {"epl.ir.a": 1}
    assert upward_imports(graph) == ["epl.ir.a (graph) -> epl.parallel.b (rewrite)  line 2"]
    assert cycles(graph) == [["epl.ir.a", "epl.parallel.b"]]
    (root / "parallel" / "c.py").write_text("def f(Env):\n    return Env.get().config\n")
    assert env_lookups(modules(str(root))) == ["epl.parallel.c:2"]


def test_planning_imports_no_tensorflow():
    """The plan, the gradient plan with its buckets, the memory estimate and the plan
    printer are pure: they run (and are unit-tested) where TensorFlow is absent."""
    code = ("import sys\n"
            "sys.modules['tensorflow'] = None\n"
            "import epl.buckets, epl.parallel.plan, epl.parallel.gradient_plan\n"
            "import epl.profiler.memory_estimate, epl.plan_cli, epl.strategies.schedule\n"
            "assert epl.buckets.plan_buckets([4, 4, 8], ['float32'] * 3, 2) == [[0, 1], [2]]\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_design_doc_shows_the_floors():
    with open(os.path.join(REPO_ROOT, "docs", "design.md")) as handle:
        docs = handle.read()
    assert markdown_table() in docs, ("docs/design.md does not show the current floor table; "
                                      "regenerate it with: python tests/unit/test_floors.py")


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
