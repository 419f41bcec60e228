"""Write docs/performance.md from bench/results.json (`make bench` runs this last).

    python benchmarks/perfdoc.py [--results bench/results.json] [--before bench/v0.json] [--out docs/performance.md]

With bench/stream.json beside the results (benchmarks/stream_count.py), a section on constants
streamed from the plan's file; with bench/pico_stream.json (the figures tests/device/test_pico_stock.py
prints), the stock Pico's run in it.

The "before" column is v0 (the core before the kernel rewrite of issue 8),
counted with the same harness and kept in bench/v0.json. The milliseconds at
216 MHz are an estimate from instruction counts, not a measurement.
"""
import argparse
import json
import os
import sys

from bench_models import CALIBRATION
from qemu_count import BOARDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V0_COMMIT = "2b1c39e"   # the source bench/v0.json was counted on
MHZ = 216            # STM32F746, the board of MIT's figures
CPI = 1.0            # assumed cycles per instruction (see the text)
CPI_RANGE = (0.7, 1.5)
# MIT Tiny Training Engine, NeurIPS 2022 Fig. 10: ms per training step on an STM32F746 at
# 216 MHz, int8 networks (shared/models/tte/README.md)
MIT_MS = [("MCUNet-5fps", "TTE, int8, sparse update", "measured", 546),
          ("MCUNet-5fps", "TF-Lite Micro, int8, sparse update", "measured", 5607),
          ("MCUNet-5fps", "TF-Lite Micro, int8, full update", "projected: does not fit in memory", 13398),
          ("MobileNetV2-w0.35", "TTE, int8, sparse update", "measured", 373),
          ("ProxylessNAS-w0.3", "TTE, int8, sparse update", "measured", 443)]
# issue 8's v0 table (qemu MPS2_AN500, -icount shift=0, before this harness existed):
# (model, update, what, instructions, instructions per MAC)
ISSUE_V0 = [("MLP 64-32-10", "full", "step", 98_900, "19.6"), ("MLP 64-32-10", "full", "predict", 21_600, "9.1"),
            ("small CNN 16x16", "full", "step", 6_564_000, "25-30"),
            ("Linear 1-2 (fixed cost)", "full", "step", 5_100, None),
            ("MLP 64-32-10", "full", "baseline", 8_830_000, None)]
FIELD = {"step": "instr_per_step", "predict": "instr_per_predict", "baseline": "baseline_instr_per_step"}


def k(v):
    """Three significant digits: 4.51k, 98.3k, 6.57M, 1.28G."""
    if v is None:
        return "-"
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            x = v / div
            return ("%.2f" if x < 10 else "%.1f" if x < 100 else "%.0f") % x + unit
    return "%d" % v


def num(v, fmt="%.1f"):
    return "-" if v is None else fmt % v


def ms(v):
    """A duration to about three significant digits: 0.021, 4.62, 30.4, 5929."""
    return "-" if v is None else ("%.3f" if v < 1 else "%.2f" if v < 10 else "%.1f" if v < 100 else "%.0f") % v


def ms_at_216(instr, cpi=CPI, board="MPS2_AN500"):
    """The estimate, for counts from a Cortex-M7 board only (the STM32F746's core)."""
    if instr is None or BOARDS.get(board, {}).get("core") != "Cortex-M7":
        return None
    return instr * cpi / (MHZ * 1e3)


def precision(e):
    """What the plan computes in, from the model name bench_models gives int8 plans."""
    return "int8 frozen part, float32 training" if "int8" in e["model"] else "float32"


def int8_cost(results):
    """A sentence comparing the int8 and float32 MCUNet last-layer steps on the Cortex-M7 board, if both counted."""
    m7 = {("int8" in e["model"], e["update"]): e for e in results if e["model"].startswith("MCUNet")
          and e["instr_per_step"] and BOARDS.get(e["board"], {}).get("core") == "Cortex-M7"}
    q, f = m7.get((True, "last-layer")), m7.get((False, "last-layer"))
    if not (q and f):
        return []
    return ["", "With the last layer trained, the int8 plan's step is %.2fx the float32 plan's instructions on the "
            "Cortex-M7 (%.1f against %.1f instructions per MAC). The int8 convolutions run the SIMD kernels of "
            "`modules/microtrain/mt_q8_kernels.c` on Cortex-M4/M7 (two 16-bit multiply-accumulates per "
            "instruction), the same C without them elsewhere; `benchmarks/int8_kernels.py` counts them shape by "
            "shape and `benchmarks/kernel_profile.py` splits a step by C function."
            % (q["instr_per_step"] / f["instr_per_step"], q["instr_per_mac"], f["instr_per_mac"])]


def key(e):
    return (e["model"], e["update"], e["board"])


# issue 28: a plan's constants streamed from its file (benchmarks/stream_count.py, bench/stream.json). The
# flash read rate is an assumption, not a measurement: the RP2040 reads its QSPI flash through XIP at
# 62.5 MHz (125 MHz system clock / 2), and an 8-byte cache-line fill costs about 28 QSPI cycles (command,
# address and mode 8, dummy 4, data 16): 8 B per 448 ns, 17.9 MB/s, less littlefs's own work
FLASH_MB_S = 15.0


def stream_section(rows):
    """The section on streamed constants, from bench/stream.json's rows; [] without them."""
    if not rows:
        return []
    base = rows[0]["instr_per_step"]
    s = next(r for r in rows if r["where"] == "streamed")
    out = ["## Constants streamed from the plan's file", "",
           "%s, %s, on %s (`benchmarks/stream_count.py`): the same training step with the plan's constants in "
           "RAM or in place (a plan without a stream section; in RAM or in flash the core runs the same "
           "instructions), with a stream section read in place, and streamed: `Trainer(file)` keeps the plan's "
           "head (%s of %s) and reads each op's group of constants into its window in the arena, checking its "
           "CRC, through the stream protocol of an `io.BytesIO` holding the plan (what a littlefs file gives; "
           "a copy from RAM here, qemu does not model flash). Every frozen and trained weight int8, uint8 "
           "pixels, SGD with momentum 0.9, batch 1; losses and outputs checked against the host simulator, and "
           "the bytes the board read against the host's figures." % (
               s["model"], s["update"], s["board"], "{:,} B".format(s["head_bytes"]), "{:,} B".format(s["plan_bytes"])),
           "", "| constants | instr/step | vs in RAM | instr/predict | bytes read/step | bytes read/predict |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            r["what"], "{:,}".format(r["instr_per_step"]), "%+.1f %%" % (100.0 * (r["instr_per_step"] - base) / base),
            "{:,}".format(r["instr_per_predict"]), "{:,}".format(r["read_per_step"]),
            "{:,}".format(r["read_per_predict"])))
    extra = s["instr_per_step"] - base
    flash_ms = s["read_per_step"] / (FLASH_MB_S * 1e6) * 1e3
    out += ["", "Streaming costs %s instructions a step more (%.1f per byte read: the CRC, four bits at a time, "
            "and the copy) and reads %s a step. On a board the file's bytes also take the flash's read time, "
            "which qemu does not model: at an **assumed** %.0f MB/s (an RP2040 reading its QSPI flash through "
            "XIP at 62.5 MHz, about 28 QSPI cycles per 8-byte line: 17.9 MB/s, less littlefs's own work; not "
            "measured) that is %.0f ms a step. For scale, the step's instructions are %s ms on a %d MHz "
            "Cortex-M7 at %.1f cycles per instruction (the estimate above; an RP2040, soft float, runs "
            "others)." % (
                "{:,}".format(extra), extra / max(1, s["read_per_step"]), "{:,} B".format(s["read_per_step"]),
                FLASH_MB_S, flash_ms, ms(ms_at_216(s["instr_per_step"])), MHZ, CPI), ""]
    return out


def pico_paragraph(p):
    """The stock Pico's run of tests/device/test_pico_stock.py (bench/pico_stream.json, its figures as the
    test printed them); [] without it."""
    if not p:
        return []
    us = p["step_us"]
    return ["On the Raspberry Pi Pico as a user has it (`tests/device/test_pico_stock.py`: MicroPython %s's "
            "stock RPI_PICO firmware in rp2040js, microtrain as the armv6m `.mpy` and its package in `/lib` of "
            "the flash filesystem, the plan there as `/plan.mtp`; compiled as for the ROMFS Pico, SGD without "
            "momentum): %s, %s of the %s heap free after boot, %s after `import microtrain` (the `.mpy`'s code "
            "runs from the heap). `Trainer(open(\"/plan.mtp\", \"rb\"))` takes %s with its open file (what "
            "`microtrain report --board rpi_pico` counts: %s), against %s for the plan read into RAM; it reads "
            "%s from the file a training step, and %d steps took %s ms of emulated time (125 MHz, rp2040js's "
            "clock: no flash wait states modelled; %d s of host time for the whole test); %s the host "
            "simulator's bit for bit." % (
                p["micropython"], p["model"] + ", " + p["update"], "{:,} B".format(p["heap_free_boot"]),
                "{:,} B".format(p["heap_total"]), "{:,} B".format(p["heap_free_imported"]),
                "{:,} B".format(p["trainer_heap"]), "{:,} B".format(p["report_heap"]),
                "{:,} B".format(p["in_ram_heap"]), "{:,} B".format(p["read_per_step"]), len(us),
                ", ".join("{:,}".format(round(u / 1000)) for u in us), p["host_s"], p["bit_for_bit"]), ""]


def render(results, before, run, stream=None, pico=None):
    prev = {key(e): e for e in before}
    out = ["# Performance", "",
           "Generated by `benchmarks/perfdoc.py` from `bench/results.json` (and `bench/v0.json`, "
           "`bench/results.run.json`); `make bench` measures and rewrites all three files except v0.json. "
           "Instruction counts are exact and repeat run after run; times on the host are figures from a "
           "shared machine, good to a few tens of percent.", "",
           "## One training step", "",
           "Cross-entropy, SGD with momentum 0.9, batch 1. *v0* is the core before the kernel rewrite of "
           "issue 8 (commit %s), counted with the same harness (`bench/v0.json`). *est. ms* is an **estimate** for a 216 MHz Cortex-M7 "
           "(instructions x %.1f cycle / 216 MHz), not a measurement, given for the Cortex-M7 board only. "
           "Boards: %s." % (V0_COMMIT, CPI, "; ".join("%s = %s, %s" % (b, BOARDS[b]["core"], BOARDS[b]["fpu"])
                                            for b in run.get("boards", ["MPS2_AN500"]) if b in BOARDS)), "",
           "| model | update | board | instr/step v0 | instr/step | instr/predict | MACs/step | instr/MAC | "
           "plain MicroPython instr/step | x fewer than plain | est. ms/step at 216 MHz | host us/step | "
           "PyTorch us/step |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in results:
        p = prev.get(key(e), {})
        ratio = (e["baseline_instr_per_step"] / e["instr_per_step"]
                 if e["baseline_instr_per_step"] and e["instr_per_step"] else None)
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            e["model"], e["update"], e["board"], k(p.get("instr_per_step")), k(e["instr_per_step"]),
            k(e["instr_per_predict"]), k(e["macs_per_step"]), num(e["instr_per_mac"]),
            k(e["baseline_instr_per_step"]), num(ratio, "%.0f"), ms(ms_at_216(e["instr_per_step"], board=e["board"])),
            ms(e["host_us_per_step"]), ms(e["torch_us_per_step"])))
    for what, note in sorted(run.get("notes", {}).items()):
        out += ["", "%s: %s." % (what, note)]
    out += ["", "Exact figures: `bench/results.json` (keys `model`, `update`, `board`, `instr_per_step`, "
            "`instr_per_predict`, `macs_per_step`, `instr_per_mac`, `baseline_instr_per_step`, `host_us_per_step`, "
            "`torch_us_per_step`).", ""]

    out += ["## Beside MIT's measured figures", "",
            "MIT measured one training step of int8 networks on an STM32F746 (Cortex-M7, 216 MHz) with their Tiny "
            "Training Engine (NeurIPS 2022, Fig. 10). Beside them, **estimates** for microtrain's MCUNet-5fps "
            "plans from their instruction counts on qemu: the float32 plan with the last layer trained; the int8 "
            "plan with the last layer trained (everything before it int8, calibrated as `benchmarks/tte.py` "
            "does, uint8 pixel input); and the int8 plan with MIT's 49kb sparse-update scheme (the biases of the last "
            "20 convolutions, a quarter or half of the input channels of three 1x1 convolutions' weights and the "
            "classifier trained; ReLU6 outputs saved as int8 for the backward), the nearest case to MIT's 546 ms. "
            "In microtrain's int8 plans only the frozen part before the first trained layer is int8; from there "
            "on the forward, the backward and the update are float32, where MIT's engine trains in int8; and "
            "the steps here use SGD with momentum 0.9 like every row above. The estimate assumes %.1f cycle per "
            "instruction: the M7 issues two instructions "
            "per cycle in the best case, and load-use stalls, branches, flash wait states and data-cache misses "
            "on a real board pull the other way; the range gives %.1f to %.1f cycles per instruction."
            % (CPI, CPI_RANGE[0], CPI_RANGE[1]), "",
            "| network | what | ms per step |", "|---|---|---:|"]
    for net, what, how, mit_ms in MIT_MS:
        out.append("| %s | %s (MIT, %s) | %d |" % (net, what, how, mit_ms))
    for e in results:
        if e["model"].startswith("MCUNet") and ms_at_216(e["instr_per_step"], board=e["board"]):
            lo, hi = (ms_at_216(e["instr_per_step"], c) for c in CPI_RANGE)
            out.append("| %s | microtrain, %s, %s (**estimate** from %s instructions on qemu %s) | %.0f "
                       "(%.0f-%.0f) |" % (e["model"], precision(e), e["update"],
                                          "{:,}".format(e["instr_per_step"]), e["board"],
                                          ms_at_216(e["instr_per_step"]), lo, hi))
            p = prev.get(key(e))
            if p and p.get("instr_per_step") and abs(p["instr_per_step"] / e["instr_per_step"] - 1) > 0.01:
                out.append("| %s | microtrain v0, %s, %s (estimate) | %.0f |"
                           % (e["model"], precision(e), e["update"], ms_at_216(p["instr_per_step"])))
    out += int8_cost(results)
    out += ["", "A float32 MCUNet needs more RAM than the STM32F746 has (see `benchmarks/memory.py`), so its "
            "row says what the arithmetic costs, not that it would run there. The RAM each int8 plan needs is in the notes under the first "
            "table; `benchmarks/tte.py` prints it for every MIT scheme.", ""]

    out += ["## Method", "",
            "**Instruction counts** (`benchmarks/qemu_count.py`, `benchmarks/device_count.py`). The MicroPython "
            "firmware with the microtrain module runs on qemu's %s boards (%s) with `-icount shift=%d`: each guest "
            "instruction advances qemu's virtual clock by exactly 2^%d ns, and the board's timers run on that "
            "clock. The script on the board reads the CMSDK timer 0 (25 MHz, 3.2 ticks per instruction, so the "
            "rounded tick count is the exact instruction count) before and after `t.step(x, y, loss_out)` or "
            "`t.predict(x, out)`; the dual timer, prescaled by 256, counts the fine timer's wraps for windows "
            "longer than 335 M instructions. The same two reads with nothing between them (%s) are "
            "subtracted, so a count is everything the call costs from MicroPython: bytecode dispatch, argument "
            "checks and the core's step. SysTick's interrupt (the only one the qemu port enables) is off while "
            "counting, `gc.collect()` runs before each window and the calls allocate nothing, so the counts are "
            "a pure function of code and data. Each figure is the median of three consecutive steps after a "
            "first uncounted one, one step for MCUNet (%s). Plans and samples are loaded by qemu's "
            "generic loader into RAM the firmware does not use and read in place; a plan that takes uint8 pixels "
            "gets its sample as those bytes (a `bytearray`), as an application would pass them."
            % (" and ".join(b for b in run.get("boards", ["MPS2_AN500"]) if BOARDS.get(b, {}).get("counter") != "csr"),
               run.get("qemu", "qemu"), shift_of(run, "MPS2_AN500"), shift_of(run, "MPS2_AN500"), overhead(run),
               spread(run))] + rv32_method(run) + ["",
            "**Where a step's instructions go** (`benchmarks/kernel_profile.py`): the same device script under "
            "qemu's execution log (`-d in_asm,exec,nochain`), each executed translation block's instructions "
            "attributed to the firmware symbol that holds it, one step isolated as the difference between runs "
            "of 1 and 1+K steps; it prints one step's instructions per C function (and the convolution kernels "
            "against the plan's convolution MACs). Run it by hand while changing kernels; `make bench` does not.",
            "",
            "**Repeatability.** `make bench` runs qemu twice and compares every window's count: %s." % repeat(run),
            "",
            "**Checked, not assumed.** The loss the board reports after the counted steps and the first output "
            "of the counted predict are compared with the host simulator's (within 1e-4); the plain-MicroPython "
            "baseline's loss with the core's; PyTorch's first loss with the simulator's (float32 plans of the "
            "whole model only: see *Host*). A mismatch stops the benchmark.", "",
            "**Baseline** (`benchmarks/plain_mlp.py`): the same MLP step (forward, softmax cross-entropy, "
            "backward, SGD with momentum) in plain MicroPython, weights in `array('f')` rows, run on the same "
            "board in a qemu session of its own. Its count includes the garbage collections its float objects "
            "cause in the standard 140 KB heap, so it depends on what the heap holds: it moves by a percent or "
            "two when the script around it changes, and MicroPython's conservative stack scan can make it differ "
            "by a few instructions between runs (a stale word on the stack, left by the serial polling loop, "
            "can keep a dead block alive). The Trainer counts have no such dependence.", "",
            "**Host** (`benchmarks/bench.py`): `Simulator.step` (the same C core through cffi, with its Python "
            "wrapper) against PyTorch eager on the CPU, the same ONNX weights run op by op "
            "(`benchmarks/torch_eager.py`) with only the trained parameters requiring gradients, "
            "`torch.optim.SGD(momentum=0.9)`, batch 1, one thread each; median of 7 timings of a batch of steps, "
            "measured one after the other in one process. The int8 MCUNet plans have no PyTorch figure (`-`, "
            "`null` in the JSON): they are not the float model PyTorch runs (int8 frozen layers with their "
            "rounding, uint8 input, and for the 49kb scheme weights trained on some input channels only), so "
            "neither the time nor the first-loss check would compare like with like; their host figure is the "
            "simulator's alone.", "",
            "**Models** (`benchmarks/bench_models.py`): Linear 1-2 (what a step call costs with no arithmetic); "
            "MLP Gemm 64-32 Relu Gemm 32-10; small CNN: 1x16x16 input, Conv 3x3 1-8 pad 1, Relu, MaxPool 2, "
            "Conv 3x3 8-16 pad 1, Relu, GlobalAveragePool, Gemm 16-10; `examples/digits_cnn.onnx`; MCUNet-5fps "
            "at 128x128 from `shared/models/tte/` (float32 copy of MIT's int8 network); the same MCUNet with its "
            "frozen part int8 (`quantize=\"int8\"`, min/max calibration on %d images of "
            "`benchmarks/calibration.py`, uint8 pixel input with scale 1/127.5 and zero point 128, as "
            "`benchmarks/tte.py` compiles it), with the last layer trained and with MIT's 49kb scheme "
            "(`update=mcunet-5fps.schemes.json`, `scheme=\"49kb\"`, `saved=\"bits\"`). Each sample is the "
            "same seeded normal noise, quantized for the uint8 plans. MACs per step come from the plan's report "
            "(forward and backward, as planned; int8 MACs counted like float ones)." % CALIBRATION, ""]

    out += stream_section(stream)
    out += pico_paragraph(pico)
    out += ["## v0 against the issue's table", "",
            "Issue 8's table was measured on the same qemu board before this harness existed, with `-icount "
            "shift=0`; v0 here is the same source counted by this harness.", "",
            "| case | issue 8 | v0 here | here / issue |", "|---|---:|---:|---:|"]
    for model, update, what, instr, per_mac in ISSUE_V0:
        p = next((e for e in before if (e["model"], e["update"], e["board"]) == (model, update, "MPS2_AN500")), None)
        mine = p and p[FIELD[what]]
        out.append("| %s, %s, %s | %s | %s | %s |" % (
            model, update, "plain MicroPython step" if what == "baseline" else what,
            "{:,}".format(instr) + (" (%s/MAC)" % per_mac if per_mac else ""),
            "-" if not mine else "{:,}".format(mine) + (" (%.1f/MAC)" % (mine / p["macs_per_step"])
                                                         if per_mac and what == "step" else ""),
            "-" if not mine else "%.2f" % (mine / instr)))
    out += ["", ISSUE_NOTE, ""]
    return "\n".join(out)


ISSUE_NOTE = (
    "The issue does not give its CNN's layers; the one defined here lands on its count, so it is taken to be "
    "the same network. Figures here leave out the two timer reads themselves. The plain-MicroPython step is a different program from the issue's, which "
    "the issue does not show: this one keeps weights in `array('f')`, so each weight read makes a float "
    "object and the garbage collector runs inside the step.")


def spread(run):
    """How much the three counted steps of a case differ, from the raw windows."""
    steps = [v for kk, v in run.get("windows", {}).items() if kk.endswith(" step") and v]
    if not steps:
        return "no windows recorded"
    worst = max((max(v) - min(v)) / min(v) for v in steps)
    n_equal = sum(len(set(v)) == 1 for v in steps)
    return ("equal in %d of %d cases; where data-dependent branches (ReLU masks, max-pool choices, and on a "
            "soft-float board the float routines themselves) change as the weights learn, they differ by at most "
            "%.2f %%" % (n_equal, len(steps), 100 * worst))


def repeat(run):
    if not run.get("identical"):
        return "not checked in the last run (one run only)"
    n = sum(len(v) for k, v in run.get("windows", {}).items() if not k.endswith(" baseline"))
    return "the last `make bench` gave identical counts in both runs for all %d Trainer windows%s" % (
        n, "" if "baseline_identical" not in run else ", and %s for the plain-MicroPython baseline" % (
            "identical ones" if run["baseline_identical"] else "counts within a few instructions"))


def shift_of(run, board):
    """The -icount shift a board was counted with (bench/results.run.json: one number, or one per board)."""
    shift = run.get("icount_shift", 7)
    return shift.get(board, BOARDS.get(board, {}).get("shift", 7)) if isinstance(shift, dict) else shift


def rv32_method(run):
    """How the RISC-V board counts, when it was counted."""
    rv = [b for b in run.get("boards", []) if BOARDS.get(b, {}).get("counter") == "csr"]
    if not rv:
        return []
    return ["%s (qemu-system-riscv32's virt machine: %s, %s, the ESP32-C3/C6's instruction set) runs with "
            "`-icount shift=%d`, and the script reads the instret counter (CSRs minstret and minstreth, "
            "`benchmarks/count_csr.py`) instead of a timer: under icount qemu answers with its virtual clock, "
            "2^%d ns per instruction, so the difference of two reads is the instruction count, 64 bits wide; "
            "the port enables no interrupt there. Its float plans take about twice the Cortex-M3's (MPS2_AN385) "
            "instructions per MAC (libgcc's soft float is C on RISC-V, assembly on ARM); the int8 kernels' "
            "integer arithmetic takes about what it takes on the Cortex-M boards." % (" and ".join(rv), BOARDS[rv[0]]["core"],
                                                               BOARDS[rv[0]]["fpu"], shift_of(run, rv[0]),
                                                               shift_of(run, rv[0]))]


def overhead(run):
    vals = sorted(set(v[0] for kk, v in run.get("windows", {}).items() if kk.endswith(" - empty") and v))
    return " or ".join("{:,}".format(v) for v in vals) + " instructions, depending on the board" if len(vals) > 1 \
        else "{:,} instructions".format(vals[0]) if vals else "a few hundred instructions"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results.json"))
    ap.add_argument("--before", default=os.path.join(ROOT, "bench", "v0.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "performance.md"))
    args = ap.parse_args()
    results = json.load(open(args.results))
    before = json.load(open(args.before)) if os.path.exists(args.before) else []
    run_path = os.path.splitext(args.results)[0] + ".run.json"
    run = json.load(open(run_path)) if os.path.exists(run_path) else {}
    stream_path = os.path.join(os.path.dirname(args.results), "stream.json")
    stream = json.load(open(stream_path)) if os.path.exists(stream_path) else None
    pico_path = os.path.join(os.path.dirname(args.results), "pico_stream.json")
    pico = json.load(open(pico_path)) if os.path.exists(pico_path) else None
    with open(args.out, "w") as f:
        f.write(render(results, before, run, stream, pico))
    print("wrote %s" % os.path.relpath(args.out, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
