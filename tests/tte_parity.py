"""MIT's MCUNet-5fps compiled as benchmarks/tte.py does, and two of its plans trained side by side
(tests/test_recompute.py, tests/test_ring_channels.py)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import microtrain


def mcunet(scheme):
    """(ONNX path, compile options) of MCUNet-5fps with one of its schemes: int8 prefix with 8
    calibration crops, uint8 input, saved bits, frozen and trained weights int8, momentum 0.9.
    Skips where the MIT models are not on the machine."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    try:
        from bench_models import tte_dir
        from calibration import int8_options, samples
    finally:
        sys.path.pop(0)
    d = tte_dir()
    if d is None:
        pytest.skip("the MIT models are not on this machine (benchmarks/bench_models.py)")
    return os.path.join(d, "mcunet-5fps.onnx"), dict(
        update=os.path.join(d, "mcunet-5fps.schemes.json"), scheme=scheme, saved="bits", frozen_weights="int8",
        trained_weights="int8", momentum=0.9, **int8_options(samples(8, 128)))


def assert_trains_alike(a, b, steps=2):
    """Plans a and b: the same losses over `steps` steps of random uint8 images, then the same
    outputs and parameters, bit for bit."""
    xs = np.random.default_rng(5).integers(0, 256, (steps, 1, 3, 128, 128)).astype(np.uint8)
    got = []
    for plan in (a, b):
        sim = microtrain.Simulator(plan)
        losses = [sim.step(x, i % 10) for i, x in enumerate(xs)]
        got.append((losses, sim.predict(xs[0]), sim.params()))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], got[1][1])
    assert got[0][2].keys() == got[1][2].keys()
    for name in got[1][2]:
        np.testing.assert_array_equal(got[0][2][name], got[1][2][name], err_msg=name)
