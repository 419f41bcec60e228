"""The core's own exp and log (mt_math.c) against numpy in double precision."""
import numpy as np

from microtrain.native import lib

EPS = np.finfo(np.float32).eps


def test_expf_within_one_ulp():
    xs = np.concatenate([np.linspace(-87, 88, 100001), -np.logspace(-8, 1.9, 2000)]).astype(np.float32)
    got = np.array([lib.mt_expf(float(v)) for v in xs], np.float64)
    ref = np.exp(xs.astype(np.float64))
    assert (np.abs(got - ref) / ref).max() < EPS


def test_logf_within_two_ulp():
    xs = np.concatenate([np.logspace(-44, 38, 100001), np.linspace(0.5, 2, 10001)]).astype(np.float32)
    got = np.array([lib.mt_logf(float(v)) for v in xs], np.float64)
    ref = np.log(xs.astype(np.float64))
    assert (np.abs(got - ref) / np.maximum(np.abs(ref), 1.0)).max() < 2 * EPS


def test_special_values():
    assert lib.mt_expf(float("inf")) == float("inf") and lib.mt_expf(float("-inf")) == 0.0
    assert lib.mt_expf(100.0) == float("inf") and lib.mt_expf(-120.0) == 0.0
    assert np.isnan(lib.mt_expf(float("nan")))
    assert lib.mt_logf(0.0) == float("-inf") and np.isnan(lib.mt_logf(-1.0))
    assert lib.mt_logf(float("inf")) == float("inf") and lib.mt_logf(1.0) == 0.0
