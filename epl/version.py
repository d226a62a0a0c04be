VERSION = "0.1.0"

# What to install when TensorFlow is missing (epl.tf_adapter at epl.init, epl.check_build):
# EPL does not depend on one TensorFlow distribution, because several provide the module.
INSTALL_TENSORFLOW = (
    "install the TensorFlow for your hardware first, e.g. pip install \"tensorflow==1.15.5\" "
    "\"numpy<1.19\" \"protobuf<3.21\" (CPU, Python 3.7), tensorflow-gpu==1.15.5 or NVIDIA's "
    "TF1 build (GPUs), or tensorflow-cpu==2.15.1 (TF 2.x through tf.compat.v1, docs/tf2.md); "
    "then install EPL again (pip install .) so that it builds its C++ op library against that "
    "TensorFlow")
