"""What a federated round costs (docs/fleet.md): bytes over each board's link and seconds.

For each plan: the trainable values a round moves each way (microtrain.fleet.layout: float32,
or int8 codes for int8 trained weights, with their scales on the way down). For the digits
plans also measured: a 4-board emulated fleet (3 unix-port boards and 1 qemu MPS2_AN500 on a
serial pty) in Flower's simulation engine, the link bytes of each board per round as the
host's side of the protocol counted them (frames, acknowledgements and commands included) and
the seconds per round (the first round also starts Flower's workers, so it is listed apart).
MCUNet-5fps with MIT's 49kb scheme is compiled and counted, not run (a step takes minutes in
the emulators).

    python benchmarks/fleet_round.py [--rounds 3] [--no-run] [--no-mcunet]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "host"))

import microtrain  # noqa: E402
from microtrain.fleet.layout import Layout  # noqa: E402

DIGITS = os.path.join(ROOT, "examples", "digits_cnn.onnx")
DATA = os.path.join(ROOT, "examples", "digits_user.npz")
# a sparse plan of the digits CNN, in MIT's scheme form: two biases, 4 of the 8 input channels of
# the 1x1 conv, and the classifier
DIGITS_SPARSE = {"bias_updates": [{"conv_index": 1}, {"conv_index": 2}],
                 "weight_updates": [{"conv_index": 2, "channel_axis": 1, "selected_channels": [0, 1, 2, 3]}],
                 "classifier": "full"}


def plans(mcunet=True):
    kw = dict(loss="cross-entropy", lr=0.05, momentum=0.9)
    sparse = dict(kw, lr=0.01)      # lr 0.05 with momentum 0.9 diverges when the convolutions train too
    out = [("digits CNN, last layer", microtrain.compile(DIGITS, update="last-layer", **kw), True),
           ("digits CNN, sparse", microtrain.compile(DIGITS, update=DIGITS_SPARSE, **sparse), True),
           ("digits CNN, sparse, int8 trained weights",
            microtrain.compile(DIGITS, update=DIGITS_SPARSE, trained_weights="int8", **sparse), True)]
    if mcunet:
        from microtrain import thirdparty
        d = thirdparty.tte_dir()
        if d is None:
            print("MCUNet: no shared/models/tte (set MICROTRAIN_TTE); skipped")
        else:
            onnx_path, schemes = os.path.join(d, "mcunet-5fps.onnx"), os.path.join(d, "mcunet-5fps.schemes.json")
            for tw in ("float32", "int8"):
                t = time.time()
                p = microtrain.compile(onnx_path, update=schemes, scheme="49kb", trained_weights=tw, momentum=0.9)
                print("compiled MCUNet-5fps 49kb, trained weights %s, in %.0f s" % (tw, time.time() - t))
                out.append(("MCUNet-5fps, MIT's 49kb scheme%s" % (", int8 trained weights" if tw == "int8" else ""),
                            p, False))
    return out


def measure(plan, rounds, kinds=("unix", "unix", "unix", "qemu")):
    from microtrain.fleet import sim
    d = np.load(DATA)
    x, y = d["x"], d["y"]
    shards = sim.label_skew(y, len(kinds), alpha=0.5, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.mtp")
        plan.save(path)
        with sim.EmulatedFleet(kinds) as boards:
            sim.setup(boards.ports, plan, [(x[s], y[s]) for s in shards], say=lambda line: None)
            fleet = sim.simulate(boards.ports, {"plan": path, "test-data": DATA, "out-dir": os.path.join(tmp, "out"),
                                                "num-rounds": rounds, "min-available-nodes": len(kinds)},
                                 say=lambda line: None)
    rows = [h for h in fleet.history if h["round"] > 0]
    per_board = [(n["port"], n["samples"]) for n in rows[-1]["nodes"].values()]
    return rows, per_board, [len(s) for s in shards]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-run", action="store_true", help="count the bytes only, run no fleet")
    ap.add_argument("--no-mcunet", action="store_true")
    args = ap.parse_args()
    rows = plans(not args.no_mcunet)
    print()
    print("| plan | trainable values | down B per board per round | up B |")
    print("|---|---|---|---|")
    for name, p, _ in rows:
        lay = Layout(p)
        print("| %s | %s (%s) | %s | %s |" % (name, "{:,}".format(sum(q.n for q in lay.params)),
                                               ", ".join(sorted({q.enc for q in lay.params})),
                                               "{:,}".format(lay.down_bytes), "{:,}".format(lay.up_bytes)))
    if args.no_run:
        return 0
    print()
    print("measured, 4 emulated boards (3 unix, 1 qemu), 1 local epoch, %d rounds:" % args.rounds)
    print("| plan | link bytes per board per round, out / in (payload down / up) | seconds, round 1 | seconds, rounds 2..%d |"
          % args.rounds)
    print("|---|---|---|---|")
    for name, p, run in rows:
        if not run:
            continue
        lay = Layout(p)
        hist, per_board, sizes = measure(p, args.rounds)
        n = len(per_board)
        out = [h["bytes_out"] / max(1, len(h["accepted"])) for h in hist]
        inn = [h["bytes_in"] / max(1, len(h["accepted"])) for h in hist]
        secs = [h["seconds"] for h in hist]
        print("| %s | %.0f / %.0f (%d / %d) | %.1f | %s |" % (name, np.mean(out), np.mean(inn), lay.down_bytes,
                                                              lay.up_bytes, secs[0],
                                                              ", ".join("%.2f" % s for s in secs[1:])))
        print("    (%d boards, samples per board %s; global accuracy per round %s)"
              % (n, sizes, ", ".join("%.3f" % h["accuracy"] for h in hist)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
