"""Learning on an int8 backbone, on data nobody here made: the digits example of examples/
(a CNN trained on a PC on scikit-learn's clean 8x8 digits; the user's sensor mirrors them)
with its backbone quantized to int8 by the compiler, calibrated on 200 of scikit-learn's
clean digits (what the PC had), against the same CNN with its float32 backbone. The last
layer (float32 in both) retrains in the simulator on the user's 400 mirrored digits; the
accuracy on the 297 held-out mirrored digits before and after, averaged over data orders.

    python benchmarks/int8_digits.py [--epochs 5] [--orders 5]
"""
import argparse
import os
import sys

import numpy as np

import microtrain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "examples", "digits_cnn.onnx")
DATA = os.path.join(ROOT, "examples", "digits_user.npz")
SETTINGS = dict(update="last-layer", lr=0.05, momentum=0.0)


def clean_digits(n=200):
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.images[:n] / 16.0).astype(np.float32)[:, None]


def run(quantize, epochs=5, orders=5):
    """(accuracy before, mean accuracy after, [after per order], report) for the float32 or int8 backbone."""
    d = np.load(DATA)
    kw = dict(SETTINGS, quantize="int8", calibration=clean_digits()) if quantize else dict(SETTINGS)
    plan = microtrain.compile(MODEL, **kw)
    sim = microtrain.Simulator(plan)
    before = sim.evaluate(d["x_test"], d["y_test"])
    after = []
    for seed in range(orders):
        sim.reset()
        sim.fit(d["x"], d["y"], epochs=epochs, seed=seed, progress=False)
        after.append(sim.evaluate(d["x_test"], d["y_test"]))
    return before, float(np.mean(after)), after, plan.report()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--orders", type=int, default=5)
    a = ap.parse_args()
    rows = {name: run(q, a.epochs, a.orders) for name, q in (("float32 backbone", False), ("int8 backbone", True))}
    print("%-17s %8s %8s %8s %10s %10s %10s" % ("", "before", "after", "gain", "arena B", "RAM B", "flash B"))
    for name, (before, after, _, r) in rows.items():
        print("%-17s %8.3f %8.3f %+8.3f %10d %10d %10d" % (name, before, after, after - before, r["arena_bytes"],
                                                         r["peak_ram_bytes"], r["flash_bytes"]))
    (fb, fa, _, _), (qb, qa, _, _) = rows["float32 backbone"], rows["int8 backbone"]
    print("int8 recovers %.1f%% of the float backbone's gain (%d epochs, mean of %d data orders)"
          % (100 * (qa - qb) / (fa - fb), a.epochs, a.orders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
