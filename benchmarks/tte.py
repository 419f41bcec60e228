"""MIT's sparse-update schemes on MIT's networks: the peak RAM of every scheme's training plan.

For each model in shared/models/tte (MCUNet-5fps, MobileNetV2-w0.35) and every scheme in its
.schemes.json: the plan compiled with that scheme (channel-sparse weights, biases, the head),
its frozen prefix int8 (post-training min/max calibration on benchmarks/calibration.py's crops
of scikit-learn's photos), uint8 pixel input, batch 1, plain SGD, the ReLU/ReLU6 outputs the
backward reads only for their mask kept as 1-bit masks (--saved bits), the frozen conv weights of
the float layers int8 (--frozen-weights int8, compile(frozen_weights="int8")). Printed per scheme: the arena,
the trainable state (parameters and optimizer state), the runtime context (* where the board reads it
in place from the plan, flash: then it takes no RAM), peak RAM (arena + state + the context where it
is in RAM: what Trainer() allocates on the board), the peak RAM of the same plan reading its input in
place ("in place": compile(input_in_place=True), int8 pixels, the sample where the caller keeps it, a
ROMFS file in flash on a board, never copied into RAM), MIT's analytic estimate and MIT's measured peak for the
model (NeurIPS 2022 Fig. 10, STM32F746, sparse update + operator reordering), a lower bound
for any engine (the input image plus MIT's own count of the scheme's trained weights and
biases, in RAM together in any engine that keeps them there as MIT's does, whatever it does with
the rest; marked ! where it is over MIT's figure: no such engine can bring that row below it), the plan's flash
bytes (the whole plan, constants included: what a board keeps in flash), the op at the arena's peak and the largest tensors alive there, and the host simulator's time per training step
(the same C as the board; a shared machine's figure, for comparing plans run together). The JSON
also holds live_without_input_bytes: the most arena bytes alive at one op with the input image's
not counted, what the arena could be at least if the image were not in it. With --momentum 0.9 the state column shows
the momentum of channel-sparse weights held for their trained channels only.
Last, how many rows are below MIT's measured peak (image copied, read in place), and for each
row not below in place, by how much, or that MIT's own count of its trained weights is over.

Trained weights are int8 by default (--trained-weights int8, compile(trained_weights="int8"):
int8 codes with a float scale per output channel, updated with the float gradient and rounded,
docs/sparse.md), as MIT keeps them and as MIT's estimate counts them (8 bits per trained weight,
32 per bias: shared/models/tte/README.md); biases and the optimizer state stay float32.
--trained-weights float32 gives the float32 figures.

    python benchmarks/tte.py [--calibration 32] [--momentum 0] [--saved bits] [--json bench/tte.json]
                             [--schemes 49kb,full] [--no-int8-fuse] [--no-recompute] [--frozen-weights int8]
                             [--trained-weights int8|float32]
"""
import argparse
import json
import os
import sys
import time

import microtrain
from microtrain.peak import alive_at_peak

from bench_models import tte_dir
from calibration import int8_options, samples

MODELS = ("mcunet-5fps", "mbv2-w0.35")
MIT_PEAK_KB = {"mcunet-5fps": 173, "mbv2-w0.35": 141}   # Fig. 10: sparse update + operator reordering
STEPS = 3   # timed host steps per plan
MIT_FULL_KB = {"mcunet-5fps": 3650, "mbv2-w0.35": 2939}   # Fig. 10: full update


def kb(n):
    return n / 1024


def measure(onnx_path, schemes_path, scheme, calib, momentum, saved="bits", int8_fuse=True, frozen_weights="int8",
            trained_weights="int8", recompute=True):
    """The figures of one scheme's plan. "full" trains every layer, so nothing is frozen to
    quantize: its plan is float32 with float input."""
    q = {} if scheme == "full" else dict(int8_options(calib), int8_fuse=int8_fuse, frozen_weights=frozen_weights)
    t = time.time()
    plan = microtrain.compile(onnx_path, update=schemes_path, scheme=scheme, momentum=momentum, saved=saved,
                              trained_weights=trained_weights, recompute=recompute, **q)
    seconds = time.time() - t
    sim = microtrain.Simulator(plan)
    x = sim.quantize_input(calib[0]) if plan.meta["input"].get("dtype") else calib[0]
    sim.step(x, 0)
    t = time.perf_counter()
    for k in range(STEPS):
        sim.step(x, k % 10)
    step_ms = (time.perf_counter() - t) / STEPS * 1e3
    r = plan.report()
    peak = alive_at_peak(plan)
    tail = alive_at_peak(plan, without=[plan.header["input_tensor"]])
    # the same plan reading its input where the caller keeps it (compile(input_in_place=True)): on a
    # board, a sample in flash (a ROMFS file read as a memoryview) never enters RAM; int8 pixels
    # (pixel - 128, MIT's int8 input), since a uint8 input is flipped to int8 in a copy
    if "input_dtype" in q:
        q.update(int8_options(calib, "int8"))
    flash_in = microtrain.compile(onnx_path, update=schemes_path, scheme=scheme, momentum=momentum, saved=saved,
                                  trained_weights=trained_weights, recompute=recompute, input_in_place=True, **q)
    ri = flash_in.report()
    return {
        "in_place_arena_bytes": ri["arena_bytes"], "in_place_peak_ram_bytes": ri["peak_ram_bytes"],
        "in_place_peak_op": "%d %s (%s)" % (lambda p: (p["op"], p["op_name"], p["phase"]))(alive_at_peak(flash_in)),
        "arena_bytes": r["arena_bytes"], "state_bytes": r["param_bytes"], "context_bytes": r["context_bytes"],
        "context_in_plan": r["context_in_plan"], "context_ram_bytes": r["context_ram_bytes"],
        "peak_ram_bytes": r["peak_ram_bytes"], "peak_live_bytes": r["peak_live_bytes"],
        "input_bytes": plan.tensors[plan.header["input_tensor"]]["bytes"], "flash_bytes": r["flash_bytes"],
        "const_bytes": r["const_bytes"], "const_int8_bytes": r["const_int8_bytes"],
        "w8_weights": len(plan.meta.get("w8", [])), "host_step_ms": round(step_ms, 1), "compile_seconds": round(seconds, 2),
        "sparse_weights": len(plan.meta["channels"]), "trainable": len(plan.params()),
        "peak_op": "%d %s (%s)" % (peak["op"], peak["op_name"], peak["phase"]),
        "alive_at_peak": [{"name": n, "bytes": b, "dtype": d} for n, b, d, _, _ in peak["tensors"]],
        # the largest live arena bytes at one op with the input image's memory not counted: what an
        # arena could be at least if the input were not in it (and where)
        "live_without_input_bytes": tail["live_bytes"],
        "live_without_input_op": "%d %s (%s)" % (tail["op"], tail["op_name"], tail["phase"]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", type=int, default=32, help="calibration images")
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--saved", choices=microtrain.options.SAVED, default="bits",
                    help="how ReLU/ReLU6 outputs are kept for the backward (compile(saved=...)): bits, their 1-bit "
                    "masks; int8, int8 copies; float32, the outputs themselves")
    ap.add_argument("--no-int8-fuse", dest="int8_fuse", action="store_false",
                    help="keep each int8 1x1 conv and its depthwise conv two ops (compile(int8_fuse=False))")
    ap.add_argument("--no-recompute", dest="recompute", action="store_false",
                    help="keep every saved activation to its backward (compile(recompute=False), recompute.py)")
    ap.add_argument("--frozen-weights", choices=("float32", "int8"), default="int8",
                    help="the frozen conv weights of float layers: int8 with per-channel scales (default), or "
                    "float32 (compile(frozen_weights=...))")
    ap.add_argument("--trained-weights", choices=microtrain.options.TRAINED_WEIGHTS, default="int8",
                    help="how trained conv/Gemm weights are stored (compile(trained_weights=...)): int8, codes with "
                    "per-channel scales, as MIT's engine; float32")
    ap.add_argument("--schemes", default=None, help="comma-separated scheme names (default: all)")
    ap.add_argument("--json", metavar="FILE", default=None, help="also write the results here (e.g. bench/tte.json)")
    ap.add_argument("--top", type=int, default=4, help="tensors alive at the peak to print")
    args = ap.parse_args()
    d = tte_dir()
    if d is None:
        print("shared/models/tte not found (set MICROTRAIN_TTE)", file=sys.stderr)
        return 2
    calib = samples(args.calibration, 128)
    want = set(args.schemes.split(",")) if args.schemes else None
    rows = []
    print("%-12s %-12s %9s %9s %8s %9s %9s %10s %8s | %9s %9s %9s | %s" % (
        "model", "scheme", "arena KB", "state KB", "ctx KB", "peak KB", "in place", "flash KB", "step ms", "MIT est",
        "MIT peak", "bound KB", "peak op: largest alive"))
    for model in MODELS:
        onnx_path, schemes_path = (os.path.join(d, model + ext) for ext in (".onnx", ".schemes.json"))
        with open(schemes_path) as f:
            schemes = json.load(f)["schemes"]
        for s in schemes:
            if want and s["scheme"] not in want:
                continue
            r = measure(onnx_path, schemes_path, s["scheme"], calib, args.momentum, args.saved, args.int8_fuse,
                        args.frozen_weights, args.trained_weights, args.recompute)
            r.update(model=model, scheme=s["scheme"], momentum=args.momentum, saved=args.saved,
                     int8_fuse=args.int8_fuse, frozen_weights=args.frozen_weights,
                     trained_weights=args.trained_weights, recompute=args.recompute,
                     mit_estimate_kb=s["mit_analytic_estimate_kb"]["total"],
                     mit_trained_kb=s["mit_analytic_estimate_kb"]["weights_and_biases"],
                     mit_peak_kb=MIT_FULL_KB[model] if s["scheme"] == "full" else MIT_PEAK_KB[model])
            rows.append(r)
            r["bound_kb"] = round(kb(r["input_bytes"]) + r["mit_trained_kb"], 2)
            alive = ", ".join("%s %.0f" % (t["name"], kb(t["bytes"])) for t in r["alive_at_peak"][:args.top])
            print("%-12s %-12s %9.1f %9.1f %7.1f%s %9.1f %9.1f %10.1f %8.1f | %9.1f %9d %8.1f%s | %s: %s" % (
                model, s["scheme"], kb(r["arena_bytes"]), kb(r["state_bytes"]), kb(r["context_bytes"]),
                "*" if r["context_in_plan"] else " ", kb(r["peak_ram_bytes"]), kb(r["in_place_peak_ram_bytes"]),
                kb(r["flash_bytes"]), r["host_step_ms"], r["mit_estimate_kb"], r["mit_peak_kb"],
                r["bound_kb"], "!" if r["bound_kb"] > r["mit_peak_kb"] else " ", r["peak_op"], alive))
            sys.stdout.flush()
    if rows:
        print(summary(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "tte", "microtrain": microtrain.__version__, "calibration": args.calibration,
                       "results": rows}, f, indent=1)
            f.write("\n")
    return 0


def summary(rows):
    """How many rows are below MIT's measured peak, with the image copied and read in place, and
    why each of the others is not (trained weights alone over the figure: no engine that keeps
    them in RAM gets under it)."""
    copied = sum(kb(r["peak_ram_bytes"]) < r["mit_peak_kb"] for r in rows)
    in_place = sum(kb(r["in_place_peak_ram_bytes"]) < r["mit_peak_kb"] for r in rows)
    lines = ["below MIT's measured peak: %d of %d with the image copied into RAM, %d of %d with it read in place"
             % (copied, len(rows), in_place, len(rows))]
    for r in rows:
        if kb(r["in_place_peak_ram_bytes"]) >= r["mit_peak_kb"]:
            why = ("its trained weights and biases alone (MIT's count, %.1f KB) are over %d KB"
                   % (r["mit_trained_kb"], r["mit_peak_kb"]) if r["mit_trained_kb"] > r["mit_peak_kb"]
                   else "over by %.1f KB" % (kb(r["in_place_peak_ram_bytes"]) - r["mit_peak_kb"]))
            lines.append("  not below in place: %s %s, %.1f KB: %s" % (r["model"], r["scheme"],
                                                                       kb(r["in_place_peak_ram_bytes"]), why))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
