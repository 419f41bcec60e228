"""The core's own exp and log (mt_math.c) against numpy in double precision, in ulps: the
error divided by the gap between the two float32 values around the true result, so
"within 1 ulp" means the result is one of those two values."""
import numpy as np

from microtrain.native import lib


def ulp_errors(f, xs, ref):
    got = np.array([f(float(v)) for v in xs], np.float64)
    true = ref(xs.astype(np.float64))
    near = true.astype(np.float32)
    # the gap around the true value: below a power of two the float32 nearest may be the power
    # itself, whose spacing upwards is twice the gap the true value sits in
    below = np.abs(true) < np.abs(near).astype(np.float64)
    gap = np.where(below, np.spacing(np.nextafter(np.abs(near), np.float32(0))), np.spacing(np.abs(near)))
    return np.abs(got - true) / gap.astype(np.float64), got


def test_ulp_errors_measures_in_ulps():
    """The measure itself: the float32 rounding of the true value is within half an ulp, and one
    float32 step away from it is more than half."""
    xs = np.linspace(0.1, 50, 1001).astype(np.float32)
    e, _ = ulp_errors(lambda v: float(np.float32(np.exp(np.float64(v)))), xs, np.exp)
    assert e.max() <= 0.5
    e, _ = ulp_errors(lambda v: float(np.nextafter(np.float32(np.exp(np.float64(v))), np.float32(np.inf))), xs, np.exp)
    assert e.min() > 0.5 and e.max() <= 1.5


def test_expf_within_one_ulp():
    rng = np.random.default_rng(0)
    xs = np.concatenate([np.linspace(-87, 88, 100001), -np.logspace(-8, 1.9, 2000), np.logspace(-8, 1.9, 2000),
                         rng.uniform(-87.3, 88.7, 100000)]).astype(np.float32)
    e, _ = ulp_errors(lib.mt_expf, xs, np.exp)
    assert e.max() < 1.0, "%.3f ulp at x = %r" % (e.max(), xs[e.argmax()])


def test_logf_within_one_ulp_also_next_to_one():
    """Near x = 1 log x is tiny, so an absolute bound would let almost anything through there:
    every x within 1e-3 of 1, and the 2000 float32 values next to 1, are held to 1 ulp too."""
    rng = np.random.default_rng(1)
    one = np.float32(1)
    steps = [one]
    for direction in (np.float32(0), np.float32(2)):
        v = one
        for _ in range(1000):
            v = np.nextafter(v, direction)
            steps.append(v)
    xs = np.concatenate([np.logspace(-44, 38, 100001), np.linspace(0.5, 2, 10001), 1 + np.linspace(-1e-3, 1e-3, 20001),
                         np.array(steps), rng.integers(0x00800000, 0x7F800000, 100000).astype(np.uint32)
                         .view(np.float32)]).astype(np.float32)
    xs = xs[xs != 1]
    e, _ = ulp_errors(lib.mt_logf, xs, np.log)
    assert e.max() < 1.0, "%.3f ulp at x = %r" % (e.max(), xs[e.argmax()])


def test_special_values():
    assert lib.mt_expf(float("inf")) == float("inf") and lib.mt_expf(float("-inf")) == 0.0
    assert lib.mt_expf(100.0) == float("inf") and lib.mt_expf(-120.0) == 0.0
    assert np.isnan(lib.mt_expf(float("nan")))
    assert lib.mt_expf(0.0) == 1.0
    assert lib.mt_logf(0.0) == float("-inf") and np.isnan(lib.mt_logf(-1.0))
    assert lib.mt_logf(float("inf")) == float("inf") and lib.mt_logf(1.0) == 0.0
