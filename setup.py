"""Packaging for EPL (Easy Parallel Library).

TensorFlow is intentionally *not* listed in install_requires: `tensorflow`,
`tensorflow-gpu` and NVIDIA's TF1 builds all provide the `tensorflow` module, and
pinning one distribution would make pip install a second, conflicting copy on GPU
machines. `epl` checks the import at runtime and says what to install.
"""
import os
from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    scope = {}
    with open(os.path.join(HERE, "epl", "version.py")) as f:
        exec(f.read(), scope)  # pylint: disable=exec-used
    return scope["VERSION"]


setup(
    name="pyepl",
    version=_version(),
    description="Easy Parallel Library: distributed training for TensorFlow 1.15 graphs",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["epl", "epl.*"]),
    package_data={"epl": ["lib/*.so"]},
    python_requires=">=3.6",
    install_requires=["numpy"],
    extras_require={"plot": ["matplotlib"]},
    entry_points={"console_scripts": ["epl-launch=epl.launcher:main"]},
    license="Apache-2.0",
)
