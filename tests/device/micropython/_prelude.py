# Shared by every test here: tests/device/test_micropython.py writes each test as its
# data, then this file, then the test's own body (the board has no filesystem
# to import from).
import gc
import microtrain
from array import array

TOL = 1e-5


def close(a, b):
    """|a - b| <= TOL * max(1, |b|) everywhere (False for NaN or different lengths)."""
    return len(a) == len(b) and all(abs(u - v) <= TOL * max(1.0, abs(v)) for u, v in zip(a, b))


def worst(a, b):
    """Largest |a - b| / max(1, |b|); inf if the lengths differ or a value is NaN."""
    if len(a) != len(b):
        return float("inf")
    m = 0.0
    for u, v in zip(a, b):
        d = abs(u - v) / max(1.0, abs(v))
        if not d <= m:
            m = d if d == d else float("inf")
    return m


def check(what, err):
    print(what, err <= TOL)
    if not err <= TOL:
        print("  worst relative difference", err)


def check_params(params, host):
    """Every parameter within TOL of the host's; names any that differ."""
    err = 0.0
    for name in sorted(host):
        e = worst(params.get(name, array("f")), array("f", host[name]))
        if not e <= TOL:
            print("  ", name, "differs")
        err = max(err, e) if e == e else float("inf")
    check("params match the host", err)


def same(a, b):
    """Bit for bit."""
    return bytes(a) == bytes(b)


def call(what, f, *args):
    """Print the exception f(*args) raises, by type and message."""
    try:
        r = f(*args)
    except Exception as e:
        print(what + ":", type(e).__name__ + ":", e)
    else:
        print(what + ": no error, returned", r)


def sample(n, seed, step=5, mod=11):
    """n float32 values in [-0.5, 0.5), different for each seed."""
    return array("f", [((i * step + seed) % mod) / mod - 0.5 for i in range(n)])


def allocation(plan):
    """(heap bytes Trainer(plan) took, the Trainer); in a function: its locals allocate nothing (a
    new module global could grow the dict)."""
    gc.collect()
    before = gc.mem_alloc()
    t = microtrain.Trainer(plan)
    gc.collect()
    return gc.mem_alloc() - before, t


def train_full_and_compare():
    """Train PLAN on X, Y for STEPS steps and compare with the host: every loss and parameter
    within TOL, the losses decrease, and every parameter in INIT (the trainable ones) has moved
    (the data header of train_kws.py, train_mobilenet.py and train_sparse.py)."""
    t = microtrain.Trainer(PLAN)
    n = t.input_len
    xs = memoryview(array("f", X))
    losses = array("f", [0.0] * STEPS)
    for i in range(STEPS):
        k = i % N
        losses[i] = t.step(xs[k * n:(k + 1) * n], Y[k])
    print("steps", t.info()["steps"] == STEPS)
    check("losses match the host", worst(losses, array("f", HOST_LOSSES)))
    print("losses decrease", sum(losses[-10:]) < sum(losses[:10]))
    p = t.params()
    print("parameter names match", sorted(p) == sorted(HOST_PARAMS))
    print("every parameter moved", all(bytes(p[k]) != INIT[k] for k in INIT))
    check_params(p, HOST_PARAMS)
