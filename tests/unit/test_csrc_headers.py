"""The C++ ops include only headers every supported TensorFlow ships: TF 2.21's include
directory has no third_party/eigen3 wrapper (the build failed there with
"third_party/eigen3/Eigen/Core: No such file or directory"); Eigen/Core is in 1.15, 2.15
and 2.21 alike."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def test_no_include_of_tensorflows_third_party_wrappers():
    sources = glob.glob(os.path.join(ROOT, "csrc", "*", "*.cc"))
    sources += glob.glob(os.path.join(ROOT, "csrc", "*", "*.h"))
    assert sources
    found = []
    for path in sources:
        with open(path) as source:
            found += [(os.path.relpath(path, ROOT), name)
                      for name in INCLUDE.findall(source.read())
                      if name.startswith("third_party/")]
    assert not found, found
