"""Instructions per training step of MCUNet-5fps with MIT's 49kb scheme on qemu MPS2_AN500 with its
constants in RAM or in place, and streamed from the plan's file (issue 28; docs/performance.md).

Three plans of benchmarks/bench.py's "MCUNet-5fps 128x128 int8 / sparse 49kb (MIT)" case (int8
frozen part, uint8 pixels, SGD momentum 0.9, batch 1) with every frozen weight int8 and the trained
ones too (frozen_weights="int8", trained_weights="int8", as benchmarks/pico_romfs.py and
tests/core/test_stream.py compile it: with float32 weights after the int8 part a window must hold
a float32 layer), counted as bench.py counts (qemu -icount,
benchmarks/qemu_count.py; the losses and first outputs checked against the host simulator's):
  resident    the plan without a stream section, read in place from the blob (in RAM or in flash
              the core runs the same instructions: its constants are read where they are)
  in place    the plan with a stream section (compile(stream=True)), read in place: the stream
              section's constants read where they are, the groups never read
  streamed    the same plan opened as a file, Trainer(io.BytesIO(plan)): only its head kept by the
              Trainer, each group read through the stream protocol into its window, its CRC checked
The BytesIO holds the plan in the heap, so reading it costs what a memcpy from RAM costs; a file
on flash adds the flash's read time, which qemu does not model (docs/performance.md estimates it).
The big-heap firmware is needed for the BytesIO and the momentum buffers (`make bench` builds it).
Writes bench/stream.json, which benchmarks/perfdoc.py turns into a section of docs/performance.md.

    python benchmarks/stream_count.py [--firmware build/bench-bigheap/mps2_an500/firmware.elf]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench  # noqa: E402
import bench_models  # noqa: E402

BOARD = "MPS2_AN500"
WHERE = (("resident", "constants in RAM or in place (no stream section)", {}),
         ("in-place", "stream section read in place", dict(stream=True)),
         ("streamed", "streamed from the plan's file (io.BytesIO)", dict(stream=True, from_file=True)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--firmware", default=os.path.join(ROOT, "build", "bench-bigheap", BOARD.lower(), "firmware.elf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "stream.json"))
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    bench.check_fresh(args.firmware)
    case = next(c for c in bench_models.cases() if c[0] == "mcunet-int8-49kb")
    cid, model, update, source, _, options = case
    options = dict(options, frozen_weights="int8", trained_weights="int8")
    cases = [bench.Case("%s-%s" % (cid, w), model, update, source, False, dict(options, **extra))
             for w, _, extra in WHERE]
    counted, _ = bench.count_on(BOARD, args.firmware, cases, [], args.verbose)
    rows = []
    for (w, what, _), c in zip(WHERE, cases):
        r, n = c.report, counted[c.id]
        reps = c.reps + 1   # the uncounted first step and the counted ones read alike
        rows.append(dict(model=model, update=update, board=BOARD, where=w, what=what,
                         instr_per_step=n["step"], instr_per_predict=n["predict"],
                         plan_bytes=r["plan_bytes"], head_bytes=r["head_bytes"], ram_bytes=r["ram_bytes"],
                         read_per_step=r["read_per_step"] if w == "streamed" else 0,
                         read_per_predict=r["read_per_predict"] if w == "streamed" else 0,
                         device_read_bytes=n.get("stream_read_bytes", 0), steps_and_predicts=(reps, c.reps)))
        print("%-9s %-50s instr/step %13s  instr/predict %13s  read/step %9s B"
              % (w, what, "{:,}".format(n["step"]), "{:,}".format(n["predict"]), "{:,}".format(rows[-1]["read_per_step"])))
    # what the board read is what the host's figures say: attach (each group once), reset (the initial
    # values), the steps and the predicts
    s = rows[-1]
    plan = cases[-1].plan
    once = sum(g["bytes"] for g in plan.groups)
    want = once + s["steps_and_predicts"][0] * s["read_per_step"] + s["steps_and_predicts"][1] * s["read_per_predict"]
    if s["device_read_bytes"] != want:
        raise RuntimeError("the board read %d bytes from the plan's file, the host's figures say %d"
                           % (s["device_read_bytes"], want))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    print("wrote %s" % os.path.relpath(args.out, ROOT))


if __name__ == "__main__":
    main()
