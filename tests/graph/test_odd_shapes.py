"""Odd variable sizes through every path that packs or unpacks gradients.

Fused buckets put tensors at arbitrary offsets of one buffer; a bias of 8 or
37 floats used to land at an offset TF's kernels abort on. Every combination
of collective backend, bucket count and fp16 wire format trains the odd-size
model (and the sparse embedding model) like serial training.
"""
import pytest

import corpusutil
from eplutil import MEASURED
from realmodels import OddSizes, WideDeep

TOL, FP16_TOL = 2e-5, 2e-3


def _check(model, config, tol, devices=2):
    arrays = model.data(devices * model.batch * corpusutil.STEPS)
    _, reference = corpusutil.serial_reference(model, arrays, devices, stats="first")
    _, copies = corpusutil.run_dp(model, arrays, devices, config)
    worst, where = corpusutil.max_difference(reference, copies, "first")
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < tol, "%s differs from serial training by %.3g" % (where, worst)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("backend", ["ring", "tf"])
def test_odd_sizes_every_fusion_path(monkeypatch, backend, splits, fp16):
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", backend)
    config = {"communication.max_splits": splits, "communication.fp16": fp16,
              "communication.num_communicators": 1 if splits == 1 else 2}
    _check(OddSizes(), config, FP16_TOL if fp16 else TOL)


@pytest.mark.parametrize("backend", ["ring", "tf"])
def test_sparse_odd_tables(monkeypatch, backend):
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", backend)
    _check(WideDeep(), {"communication.max_splits": 2}, TOL)
