"""tools/find_python.sh finds the interpreter `make setup` (3.7) and `make setup-tf2` (3.11)
need, in the documented order, also from a bare environment (CI, `env -i`): no pyenv shims
on PATH, no PYENV_ROOT, possibly no HOME. Each case asks for the version of the interpreter
running the test, installed under a stand-in pyenv root (a symlink to it)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "find_python.sh")
VERSION = "%d.%d" % sys.version_info[:2]
VAR = "PYTHON" if VERSION == "3.7" else "PYTHON3%d" % sys.version_info[1]


@pytest.fixture(name="bare")
def _bare(tmp_path):
    """An empty PATH directory (plus `cat`, for the error message) and a pyenv root holding
    this interpreter as VERSION.99."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink("/bin/cat", str(bin_dir / "cat"))
    interp = tmp_path / "pyenv" / "versions" / (VERSION + ".99") / "bin" / "python"
    interp.parent.mkdir(parents=True)
    os.symlink(sys.executable, str(interp))
    return {"PATH": str(bin_dir)}, tmp_path


def _find(env, version=VERSION):
    return subprocess.run(["/bin/bash", SCRIPT, version], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)


def test_pyenv_root_without_home(bare):
    env, tmp = bare
    env["PYENV_ROOT"] = str(tmp / "pyenv")
    found = _find(env)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(tmp / "pyenv" / "versions" / (VERSION + ".99") / "bin"
                                       / "python")


def test_home_pyenv_in_a_bare_environment(bare):
    env, tmp = bare
    os.rename(str(tmp / "pyenv"), str(tmp / ".pyenv"))
    env["HOME"] = str(tmp)
    found = _find(env)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip().startswith(str(tmp / ".pyenv" / "versions"))


def test_the_variable_comes_first_and_is_checked(bare):
    env, tmp = bare
    env["PYENV_ROOT"] = str(tmp / "pyenv")
    env[VAR] = sys.executable
    assert _find(env).stdout.strip() == sys.executable
    env[VAR] = "/bin/cat"
    refused = _find(env)
    assert refused.returncode == 1
    assert "%s=/bin/cat is not a working Python %s" % (VAR, VERSION) in refused.stderr


def test_nothing_found_says_what_to_install(bare):
    env, _ = bare
    found = _find(env, "3.11" if VERSION == "3.7" else "3.7")
    assert found.returncode == 1 and not found.stdout
    assert "No Python" in found.stderr and "pyenv install" in found.stderr
