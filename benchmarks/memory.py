"""Memory of training plans, from the plans themselves (bytes, not timings).

Compiles each model with each update mode and prints what the board needs:
the planned arena against the naive sum and the peak-live lower bound, and the
RAM for trainable parameters and optimizer state. Default models: the bundled
example and MIT's MCU networks in ../shared/models/tte (float32 copies of the
int8 networks; MIT's published peaks are for int8, so they are listed only as
the target for the int8 work).

    python benchmarks/memory.py [model.onnx ...] [--momentum 0.9] [--batch 1]
"""
import argparse
import os
import sys

import microtrain

from bench_models import ROOT, tte_dir

TTE = tte_dir() or ""
DEFAULTS = [os.path.join(ROOT, "examples", "digits_cnn.onnx")] + [
    os.path.join(TTE, m) for m in ("mcunet-5fps.onnx", "mbv2-w0.35.onnx") if os.path.exists(os.path.join(TTE, m))]
MODES = ["last-layer", "last:2", "bias", "full"]
MIT_INT8_SPARSE_KB = {"mcunet-5fps": 173, "mbv2-w0.35": 141}   # NeurIPS 2022 Fig. 10, STM32F746, int8 sparse update


def kb(n):
    return "%.1f" % (n / 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=DEFAULTS)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    print("%-16s %-11s %10s %10s %10s %8s %10s %10s %12s" % ("model", "update", "arena KB", "peak KB", "naive KB",
                                                             "saved", "params KB", "RAM KB", "MACs/step"))
    for path in args.models:
        name = os.path.splitext(os.path.basename(path))[0]
        for mode in MODES:
            r = microtrain.compile(path, update=mode, momentum=args.momentum, batch=args.batch).report()
            print("%-16s %-11s %10s %10s %10s %7.0f%% %10s %10s %12d" % (
                name, mode, kb(r["arena_bytes"]), kb(r["peak_live_bytes"]), kb(r["naive_bytes"]),
                100 * (1 - r["arena_bytes"] / r["naive_bytes"]), kb(r["param_bytes"]), kb(r["ram_bytes"]),
                r["macs_per_step"]))
        if name in MIT_INT8_SPARSE_KB:
            print("%-16s (MIT TTE int8 sparse update peak: %d KB; float32 here)" % ("", MIT_INT8_SPARSE_KB[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
