"""Packaging for EPL (Easy Parallel Library).

TensorFlow is intentionally *not* listed in install_requires: `tensorflow`,
`tensorflow-gpu` and NVIDIA's TF1 builds all provide the `tensorflow` module, and
pinning one distribution would make pip install a second, conflicting copy on GPU
machines. `epl` checks the import at runtime and says what to install.

The C++ op library (csrc/: fused gradient buffers, EPL's CPU ring, the NCCL op
definitions; NCCL kernels where CUDA and NCCL headers exist) is built at install
time, by `build_ext`, against the TensorFlow of the environment EPL is installed
into: `pip install .`, a wheel built from the repository and an sdist all build it
when a C++ compiler is there (`CXX`, default g++). It must be built with that
TensorFlow's flags and ABI, so it is never shipped prebuilt. When it cannot be
built (no compiler, TensorFlow not importable), the install still succeeds, EPL
runs on TensorFlow's collectives and `python -m epl.check_build` says why
(`epl/lib/build_status.txt` keeps the build's own words). `EPL_BUILD_OPS=0` skips
the build (`make setup` does, for its editable install: it builds the library itself).

pip builds in an isolated environment without the user's packages, so the
TensorFlow flags are read by a fresh interpreter of the target environment (the
same python, with pip's isolation variables removed); `--no-build-isolation`
works too. A library is only ever installed and loaded with the TensorFlow it was built
for: a build removes the libraries an earlier build left in its directory (pip reuses
./build/ between installs into different environments), and the library is stamped with
its TensorFlow's version (built_for.txt), which EPL checks before loading it.
"""
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# A placeholder: tools/build_ops.sh compiles csrc/ (setuptools' compiler knows no TF flags).
OPS = Extension("epl.lib.libepl_ops", sources=[])
STATUS_FILE = "build_status.txt"
LIBRARIES = ("libepl_ops.so", "libepl_nccl_ops.so", "built_for.txt")
ISOLATION_VARIABLES = ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")


def _version():
    scope = {}
    with open(os.path.join(HERE, "epl", "version.py")) as f:
        exec(f.read(), scope)  # pylint: disable=exec-used
    return scope["VERSION"]


def target_environment(environ):
    """The environment in which ``sys.executable`` sees the packages of the environment
    EPL is installed into (pip's build isolation hides them through these variables)."""
    return dict((k, v) for k, v in environ.items() if k not in ISOLATION_VARIABLES)


def build_ops(out_dir, python=sys.executable, environ=None):
    """Run tools/build_ops.sh into ``out_dir``; return its report, which it also
    writes to ``out_dir/build_status.txt`` (never raises on a failed or skipped
    build: EPL works without the library)."""
    environ = target_environment(os.environ if environ is None else environ)
    os.makedirs(out_dir, exist_ok=True)
    script = os.path.join(HERE, "tools", "build_ops.sh")
    try:
        done = subprocess.run(["bash", script, python, out_dir], env=environ,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)
        return done.stdout.strip()
    except OSError as err:
        report = "build_ops: could not run %s (%s)" % (script, err)
        with open(os.path.join(out_dir, STATUS_FILE), "w") as out:
            out.write(report + "\n")
        return report


def remove_libraries(out_dir):
    """Remove the op libraries (and their TensorFlow stamp) of an earlier build from
    ``out_dir``: pip reuses ./build/, which may hold a build for another environment's
    TensorFlow. tools/build_ops.sh does the same before it builds."""
    for name in LIBRARIES:
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            os.remove(path)


class BuildOps(build_ext):
    """``build_ext`` that builds the op library next to the installed ``epl`` package."""

    def get_ext_filename(self, fullname):
        if fullname == OPS.name:
            return os.path.join("epl", "lib", "libepl_ops.so")
        return build_ext.get_ext_filename(self, fullname)

    def build_extension(self, ext):
        if ext.name != OPS.name:
            return build_ext.build_extension(self, ext)
        out_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
        if os.environ.get("EPL_BUILD_OPS", "1") == "0":
            remove_libraries(out_dir)   # never install one a previous build left in build/
            sys.stderr.write("epl: EPL_BUILD_OPS=0: not building the op library\n")
            return None   # `make setup` builds it itself (tools/build_ops.sh)
        for line in build_ops(out_dir).splitlines():
            sys.stderr.write("epl: %s\n" % line)
        return None

    def copy_extensions_to_source(self):
        """Editable installs: copy what was built (the library may be absent)."""
        if os.path.exists(self.get_ext_fullpath(OPS.name)):
            build_ext.copy_extensions_to_source(self)


SETUP = dict(
    name="pyepl",
    version=_version(),
    description="Easy Parallel Library: distributed training for TensorFlow 1.15 graphs",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["epl", "epl.*"]),
    ext_modules=[OPS],
    cmdclass={"build_ext": BuildOps},
    python_requires=">=3.6",
    install_requires=["numpy"],
    extras_require={"plot": ["matplotlib"]},
    entry_points={"console_scripts": ["epl-launch=epl.launcher:main"]},
    license="Apache-2.0",
)

if __name__ == "__main__":   # pip and setuptools run this file as __main__; tests import it
    setup(**SETUP)
