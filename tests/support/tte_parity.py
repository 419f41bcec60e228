"""MIT's models compiled as benchmarks/tte.py does, and two of their plans trained side by side
(tests/compiler/test_recompute.py, tests/int8/test_ring_channels.py, tests/int8/test_dq_conv.py)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import microtrain


def mcunet(scheme):
    """tte() of MCUNet-5fps."""
    return tte("mcunet-5fps", scheme)


def tte(model, scheme, pixels="uint8"):
    """(ONNX path, compile options) of one of MIT's models with one of its schemes: int8 prefix with
    8 calibration crops, uint8 input (pixels="int8": int8, as an input read in place takes it), saved
    bits, frozen and trained weights int8, momentum 0.9. Skips where the MIT models are not on the
    machine."""
    from repo import ROOT, need_tte
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from calibration import int8_options, samples
    finally:
        sys.path.pop(0)
    d = need_tte()
    return os.path.join(d, model + ".onnx"), dict(
        update=os.path.join(d, model + ".schemes.json"), scheme=scheme, saved="bits", frozen_weights="int8",
        trained_weights="int8", momentum=0.9, **int8_options(samples(8, 128), pixels))


def assert_trains_alike(a, b, steps=2, xs=None, ys=None, predict=1):
    """Plans a and b: the same outputs for the first `predict` inputs, then the same losses over the
    steps (xs and labels ys; by default `steps` random uint8 images labelled i % 10), then the same
    parameters, bit for bit. Returns b's parameters after the steps."""
    if xs is None:
        xs = np.random.default_rng(5).integers(0, 256, (steps, 1, 3, 128, 128)).astype(np.uint8)
        ys = [i % 10 for i in range(steps)]
    got = []
    for plan in (a, b):
        sim = microtrain.Simulator(plan)
        outs = [sim.predict(x) for x in xs[:predict]]
        losses = [sim.step(x, y) for x, y in zip(xs, ys)]
        got.append((outs, losses, sim.params()))
    for u, v in zip(got[0][0], got[1][0]):
        np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(got[0][1], got[1][1])
    assert got[0][2].keys() == got[1][2].keys()
    for name in got[1][2]:
        np.testing.assert_array_equal(got[0][2][name], got[1][2][name], err_msg=name)
    return got[1][2]
