"""Every benchmark gets TensorFlow through ``common.graph_mode_tf()``.

EPL needs graph mode; on TF 2.x a child that imports ``tensorflow.compat.v1``
and forgets ``disable_v2_behavior()`` builds eager-era graphs (resource
variables, v2 control flow) and measures something else, silently. The scripts
are read, not run: a new benchmark that imports TensorFlow itself fails here.
"""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
HELPER = "common.py"
# Private modules a benchmark may reach for instrumentation (not for building graphs).
INSTRUMENTATION = ("tensorflow.python.",)


def _tree(path):
    with open(path) as source:
        return ast.parse(source.read(), path)


def _tensorflow_imports(tree):
    """(line, module) of every import of TensorFlow's public modules in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            public = name == "tensorflow" or name.startswith("tensorflow.")
            if public and not (name + ".").startswith(INSTRUMENTATION):
                found.append((node.lineno, name))
    return found


def _calls(tree, attribute):
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == attribute]


def _scripts():
    scripts = sorted(glob.glob(os.path.join(BENCHMARKS, "*.py")))
    assert len(scripts) > 20, scripts
    return [path for path in scripts if os.path.basename(path) != HELPER]


def test_no_benchmark_imports_tensorflow_itself():
    offenders = ["%s:%d imports %s" % (os.path.basename(path), line, name)
                 for path in _scripts() for line, name in _tensorflow_imports(_tree(path))]
    assert not offenders, "use tf = common.graph_mode_tf() instead: %s" % offenders


def test_no_benchmark_turns_v2_behaviour_off_itself():
    offenders = ["%s:%d" % (os.path.basename(path), line)
                 for path in _scripts() for line in _calls(_tree(path), "disable_v2_behavior")]
    assert not offenders, offenders


def test_the_children_call_the_helper():
    callers = [os.path.basename(path) for path in _scripts()
               if _calls(_tree(path), "graph_mode_tf")]
    assert {"dp_worker.py", "pipeline.py", "startup.py", "sparse.py"} <= set(callers), callers


def test_the_helper_imports_tensorflow_only_when_called():
    tree = _tree(os.path.join(BENCHMARKS, HELPER))
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not _tensorflow_imports(ast.Module(body=top_level)), "common.py imports TF at load"
    helper = [node for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name == "graph_mode_tf"]
    assert helper, "benchmarks/common.py has no graph_mode_tf()"
    assert [name for _, name in _tensorflow_imports(helper[0])] == ["tensorflow.compat.v1"]
    assert _calls(helper[0], "disable_v2_behavior")
