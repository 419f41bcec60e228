"""Memory of int8 plans beside float32 ones (bytes from the plans themselves, no timing).

For each model and update mode: the float32 plan and the plan whose frozen part the compiler
quantized to int8 (post-training, min/max calibration on the images of
benchmarks/calibration.py: crops of scikit-learn's two bundled photos), taking its input as
uint8 pixels (x = (pixel - 128) / 127.5, MIT's int8 input up to half a step). Columns: arena,
peak RAM (arena + trainable state + runtime context: what Trainer() allocates) and flash (the
plan read in place from ROMFS, constants included), in KB, and how many times smaller int8 is.

    python benchmarks/int8_memory.py [model.onnx ...] [--modes last-layer,bias] [--json]
"""
import argparse
import json
import os
import sys

import microtrain

from bench_models import tte_dir
from calibration import samples

TTE = tte_dir() or ""
DEFAULTS = [os.path.join(TTE, m) for m in ("mcunet-5fps.onnx", "mbv2-w0.35.onnx")
            if os.path.exists(os.path.join(TTE, m))]
MIT_INT8_SPARSE_KB = {"mcunet-5fps": 173, "mbv2-w0.35": 141}   # NeurIPS 2022 Fig. 10, STM32F746, sparse update


def kb(n):
    return "%.1f" % (n / 1024)


def figures(path, mode, calib, momentum=0.9, int8_fuse=True):
    """{"float32": report, "int8": report} of one model and update mode (int8_fuse=False: every int8
    conv its own op, the same tensors as the float plan)."""
    f = microtrain.compile(path, update=mode, momentum=momentum).report()
    q = microtrain.compile(path, update=mode, momentum=momentum, quantize="int8", calibration=calib,
                           input_dtype="uint8", input_quant=(1 / 127.5, 128), int8_fuse=int8_fuse).report()
    keep = ("arena_bytes", "param_bytes", "context_bytes", "context_ram_bytes", "peak_ram_bytes", "flash_bytes",
            "const_bytes")
    return {"float32": {k: f[k] for k in keep}, "int8": {k: q[k] for k in keep}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=DEFAULTS)
    ap.add_argument("--modes", default="last-layer,none")
    ap.add_argument("--calibration", type=int, default=64, help="calibration images")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.models:
        print("no models: ../shared/models/tte not found; give ONNX files", file=sys.stderr)
        return 2
    size = 128
    results = []
    if not args.json:
        print("%-12s %-10s | %9s %9s %9s | %9s %9s %9s | %6s %6s" % (
            "model", "update", "f32 arena", "f32 RAM", "f32 flash", "i8 arena", "i8 RAM", "i8 flash",
            "arena", "RAM"))
    for path in args.models:
        name = os.path.splitext(os.path.basename(path))[0]
        calib = samples(args.calibration, size)
        for mode in args.modes.split(","):
            r = figures(path, mode, calib)
            results.append(dict(model=name, update=mode, **r))
            if args.json:
                continue
            f, q = r["float32"], r["int8"]
            print("%-12s %-10s | %9s %9s %9s | %9s %9s %9s | %5.1fx %5.1fx" % (
                name, mode, kb(f["arena_bytes"]), kb(f["peak_ram_bytes"]), kb(f["flash_bytes"]),
                kb(q["arena_bytes"]), kb(q["peak_ram_bytes"]), kb(q["flash_bytes"]),
                f["arena_bytes"] / q["arena_bytes"], f["peak_ram_bytes"] / q["peak_ram_bytes"]))
        if not args.json and name in MIT_INT8_SPARSE_KB:
            print("%-12s (MIT TTE int8, sparse update: %d KB peak; issue 10 goes there)" % ("", MIT_INT8_SPARSE_KB[name]))
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
