"""An install builds the op library against the TensorFlow it is installed next to.

``pip install`` of the sdist into a fresh virtual environment (which sees this
checkout's TensorFlow through a .pth file) runs setup.py's ``build_ext``, which
runs tools/build_ops.sh with that environment's TensorFlow flags. The compiler is
a stand-in that checks those flags and copies the library ``make setup`` built
with the same script: a real compile costs 30 s of CPU per install, and the
compile itself is what ``make setup`` does on every fresh checkout. Then
``python -m epl.check_build`` in the new environment must find the library loaded,
or say why it was not built.
"""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from epl.communicators import library

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What `make setup` (`make setup-tf2`) built for this TensorFlow: epl/lib/ for TF 1.15,
# epl/lib/tf2/ for TF 2.x (tools/build_ops.sh); an installed EPL keeps its own in epl/lib/.
BUILT = library.LIBRARY_PATH
# The site-packages directory that holds this TensorFlow (TF 1.15's code is in
# tensorflow_core/ there, TF 2.x's in tensorflow/).
SITE = [p for p in sys.path if p.endswith("site-packages") and any(
    os.path.isdir(os.path.join(p, name)) for name in ("tensorflow_core", "tensorflow"))][0]

FAKE_CXX = """#!/bin/bash
# Stand-in C++ compiler: record the command, check TF's flags, copy the real library.
echo "$@" >> "{log}"
out=""; prev=""
for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done
cp "{lib}" "$out"
"""


def _run(argv, env=None, timeout=240, cwd=None):
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          universal_newlines=True, timeout=timeout, cwd=cwd)
    assert done.returncode == 0, "%s failed:\n%s" % (argv, done.stdout[-3000:])
    return done.stdout


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sdist"))
    _run([sys.executable, "setup.py", "-q", "sdist", "-d", out], cwd=ROOT)
    return glob.glob(os.path.join(out, "pyepl-*.tar.gz"))[0]


def _venv(path):
    """A virtual environment without pip of its own that sees this one's packages
    (TensorFlow, pip, setuptools) through a .pth file, after its own site-packages."""
    base = os.path.join(sys.base_prefix, "bin", "python3")
    _run([base, "-m", "venv", "--without-pip", str(path)])
    site = glob.glob(os.path.join(str(path), "lib", "python3*", "site-packages"))[0]
    with open(os.path.join(site, "zz_outer.pth"), "w") as pth:
        pth.write(SITE + "\n")
    return os.path.join(str(path), "bin", "python"), site


def _clean_env(**extra):
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("EPL_"))
    env.update(extra, TF_CPP_MIN_LOG_LEVEL="2")
    return env


@pytest.mark.timeout(600)
def test_installing_the_sdist_builds_the_op_library_for_this_tensorflow(tmp_path, sdist):
    """Before: the wheel held no library, and EPL ran on TF's collectives without a word."""
    assert os.path.exists(BUILT), "make setup builds epl/lib/libepl_ops.so"
    python, site = _venv(tmp_path / "venv")
    log = tmp_path / "cxx.log"
    cxx = tmp_path / "fake-cxx"
    cxx.write_text(FAKE_CXX.format(log=log, lib=BUILT))
    cxx.chmod(0o755)
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
          "--no-build-isolation", sdist], env=_clean_env(CXX=str(cxx)))
    command = log.read_text()
    for flag in _expected_flags() + ["libtensorflow_framework", "ring_ops.cc"]:
        assert flag in command
    installed = os.path.join(site, "epl", "lib", "libepl_ops.so")
    assert os.path.exists(installed)
    report = _run([python, "-m", "epl.check_build"], env=_clean_env(), timeout=120,
                  cwd=str(tmp_path))   # not this checkout's epl
    assert "EPL 0.1.0 (%s" % os.path.join(site, "epl") in report
    assert "Op library:   [X] loaded (%s)" % installed in report, report
    assert "[X] epl_ring" in report and "TensorFlow %s" % tf.version.VERSION in report


def _expected_flags():
    """TF's compile flags (its include directory and ABI: ``-D_GLIBCXX_USE_CXX11_ABI=0`` on
    1.15, ``=1`` on 2.x), its C++ standard (TF 2.x passes ``--std=c++17``; TF 1.15 passes
    none and needs ``-std=c++14``) and Eigen's alignment, which TF 1.15 does not pass on."""
    flags = tf.sysconfig.get_compile_flags()
    standard = [f for f in flags if "-std=c++" in f] or ["-std=c++14"]
    aligned = [f for f in flags if f.startswith("-DEIGEN_MAX_ALIGN_BYTES=")] or \
        ["-DEIGEN_MAX_ALIGN_BYTES=64"]
    return flags + standard + aligned


@pytest.mark.timeout(600)
def test_an_install_without_a_compiler_says_why_there_is_no_library(tmp_path, sdist):
    python, site = _venv(tmp_path / "venv")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
          "--no-build-isolation", sdist], env=_clean_env(CXX="/nonexistent/g++"))
    assert not os.path.exists(os.path.join(site, "epl", "lib", "libepl_ops.so"))
    report = _run([python, "-m", "epl.check_build"], env=_clean_env(), timeout=120,
                  cwd=str(tmp_path))
    assert "Op library:   [ ] not built" in report and "/nonexistent/g++ not found" in report
    assert "[ ] epl_ring" in report and "[X] tf" in report


def _setup_module():
    spec = importlib.util.spec_from_file_location("epl_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hider(tmp_path):
    """A directory whose sitecustomize hides site-packages (TensorFlow) from a Python that
    has it on PYTHONPATH, as pip's build isolation does."""
    hider = tmp_path / "isolation"
    hider.mkdir(exist_ok=True)
    (hider / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        sys.path[:] = [p for p in sys.path if not p.endswith("site-packages")]
    """))
    return hider


def test_the_build_reads_the_flags_of_the_target_environment_under_build_isolation(tmp_path):
    """pip builds in an environment that hides the user's packages (PYTHONNOUSERSITE and a
    sitecustomize on PYTHONPATH); build_ops asks a fresh interpreter without them."""
    hider = _hider(tmp_path)
    isolated = _clean_env(PYTHONPATH=str(hider), PYTHONNOUSERSITE="1", CXX="/nonexistent/g++")
    hidden = subprocess.run(["bash", os.path.join(ROOT, "tools", "build_ops.sh"),
                             sys.executable, str(tmp_path / "plain")], env=isolated,
                            stdout=subprocess.PIPE, universal_newlines=True).stdout
    assert "TensorFlow not importable" in hidden   # what a naive build sees
    report = _setup_module().build_ops(str(tmp_path / "out"), sys.executable, isolated)
    assert "/nonexistent/g++ not found" in report   # got past TensorFlow's flags
    assert "/nonexistent/g++ not found" in (tmp_path / "out" / "build_status.txt").read_text()


def test_epl_without_tensorflow_says_what_to_install():
    """Before: `pip install .` succeeded without TensorFlow, then epl.init() raised a bare
    "ModuleNotFoundError: No module named 'tensorflow'" from deep inside EPL."""
    code = ("import sys\nsys.modules['tensorflow'] = None  # as in a Python without it\n"
            "import epl\nprint('EPL', epl.VERSION)\nepl.init()\n")
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=_clean_env(),
                          timeout=120)
    assert done.returncode == 1 and done.stdout == "EPL 0.1.0\n"   # `import epl` works
    error = done.stderr.strip().split("\n")[-1]
    assert error.startswith("ModuleNotFoundError: EPL needs TensorFlow, and this Python (%s) "
                            "cannot import it" % sys.executable)
    assert 'pip install "tensorflow==1.15.5"' in error and "tensorflow-cpu==2.15.1" in error
    assert "install EPL again (pip install .)" in error


def _stale_library_dir(tmp_path, stamp):
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    shutil.copy(BUILT, str(lib_dir / "libepl_ops.so"))
    if stamp is not None:
        (lib_dir / library.STAMP).write_text(stamp)
    return str(lib_dir)


@pytest.mark.parametrize("stamp,said", [
    ("tensorflow 2.99.0 v2.99.0-0-g0\n", "built for TensorFlow 2.99.0 v2.99.0-0-g0, but this "
                                         "is TensorFlow %s" % tf.version.VERSION),
    (None, "built for an unknown TensorFlow (no built_for.txt)")])
def test_a_library_built_for_another_tensorflow_is_never_loaded(
        tmp_path, monkeypatch, stamp, said):
    """Before: any libepl_ops.so in epl/lib/ was loaded; one built against another
    TensorFlow can crash the process instead of failing to load."""
    lib_dir = _stale_library_dir(tmp_path, stamp)
    monkeypatch.setattr(library, "LIB_DIR", lib_dir)
    monkeypatch.setattr(library, "LIBRARY_PATH", os.path.join(lib_dir, "libepl_ops.so"))
    monkeypatch.setattr(library, "_STATE", {})
    assert library.load() is None
    assert said in library.load_error() and "pip install . again" in library.load_error()
    assert library.stale_reason(os.path.dirname(BUILT)) is None   # make setup's own build


def test_a_build_that_cannot_run_leaves_no_library_of_an_earlier_build(tmp_path):
    """Before: a second `pip install .` from the same tree, into an environment where the
    build could not run, installed the library build/ kept from the first environment."""
    for name in ("hidden", "no_compiler"):
        out = tmp_path / name
        out.mkdir()
        for stale in ("libepl_ops.so", "libepl_nccl_ops.so", library.STAMP):
            (out / stale).write_text("from another environment")
        environ = _clean_env(CXX="/nonexistent/g++")
        if name == "hidden":    # TensorFlow not importable: the build stops early
            environ["PYTHONPATH"] = str(_hider(tmp_path))
            subprocess.run(["bash", os.path.join(ROOT, "tools", "build_ops.sh"),
                            sys.executable, str(out)], env=environ, stdout=subprocess.PIPE)
        else:
            _setup_module().build_ops(str(out), sys.executable, environ)
        assert sorted(os.listdir(str(out))) == ["build_status.txt"], name
    out = tmp_path / "skipped"
    out.mkdir()
    (out / "libepl_ops.so").write_text("from another environment")
    _setup_module().remove_libraries(str(out))     # EPL_BUILD_OPS=0
    assert os.listdir(str(out)) == []
