"""tools/check_nccl.py and tools/build_nccl_ops.sh fail when they should (no compiler run).

`make check-nccl` itself runs in CI; these tests pin the parts that decide failure: the
kernel-registration rules and the build script's strict mode.
"""
import importlib.util
import os
import subprocess

from tensorflow.core.framework import kernel_def_pb2, op_def_pb2, types_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = importlib.util.spec_from_file_location("check_nccl",
                                              os.path.join(ROOT, "tools", "check_nccl.py"))
check_nccl = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check_nccl)
TYPES = (types_pb2.DT_HALF, types_pb2.DT_FLOAT)
NAMES = {types_pb2.DT_HALF: "float16", types_pb2.DT_FLOAT: "float32"}


def _op():
    op = op_def_pb2.OpDef(name="EplNcclAllReduce")
    op.input_arg.add(name="input", type_attr="T")
    op.input_arg.add(name="unique_id", type=types_pb2.DT_INT64)
    op.output_arg.add(name="output", type_attr="T")
    op.attr.add(name="T", type="type").allowed_values.list.type.extend(TYPES)
    return op


def _kernel(dtype, device="GPU", host_memory=("unique_id",)):
    kernel = kernel_def_pb2.KernelDef(op="EplNcclAllReduce", device_type=device,
                                      host_memory_arg=list(host_memory))
    kernel.constraint.add(name="T").allowed_values.list.type.append(dtype)
    return kernel


def _check(kernels):
    return check_nccl.check_kernels(_op(), kernels, NAMES.get)


def test_complete_gpu_registration_passes():
    problems, line = _check([_kernel(t) for t in TYPES])
    assert problems == []
    assert "GPU T: float32 float16" in line


def test_a_missing_type_a_missing_device_and_device_memory_ids_fail():
    assert _check([_kernel(types_pb2.DT_FLOAT)])[0] == [
        "EplNcclAllReduce has no GPU kernel for T in ['float16']"]
    assert _check([_kernel(t, device="CPU") for t in TYPES])[0] == [
        "EplNcclAllReduce has no GPU kernel"]
    problems, _ = _check([_kernel(TYPES[0]), _kernel(TYPES[1], host_memory=())])
    assert len(problems) == 1 and "unique_id in device memory" in problems[0]
    problems, _ = _check([_kernel(t) for t in TYPES + TYPES[:1]])
    assert problems == ["EplNcclAllReduce registers a GPU kernel twice for one type"]


def _build(tmp_path, strict):
    out = tmp_path / "lib"
    out.mkdir(exist_ok=True)
    (out / "libepl_nccl_ops.so").write_text("stale")
    env = dict(os.environ, EPL_CUDA_WHEELS=str(tmp_path / "no_wheels"),
               EPL_NCCL_STRICT="1" if strict else "0")
    proc = subprocess.run(["bash", os.path.join(ROOT, "tools", "build_nccl_ops.sh"), "python",
                           "-DUNUSED", str(out)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=60)
    assert not (out / "libepl_nccl_ops.so").exists(), "a stale library was kept"
    return proc.returncode, proc.stdout.decode()


def test_build_script_skips_quietly_but_fails_in_strict_mode(tmp_path):
    code, output = _build(tmp_path, strict=False)
    assert code == 0 and "cuda_runtime.h) not found in %s" % (tmp_path / "no_wheels") in output
    code, output = _build(tmp_path, strict=True)
    assert code == 1 and "skipping NCCL ops" in output
