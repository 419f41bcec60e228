"""Speed of a training step: guest instructions on qemu, time on the host.

For every model and update mode (benchmarks/bench_models.py): instructions of
one Trainer.step and one Trainer.predict on a qemu board (Cortex-M, RISC-V), counted
exactly (benchmarks/qemu_count.py says how), MACs per step from the plan, the
same MLP step in plain MicroPython on the same board, and the host simulator's
microseconds per step beside PyTorch eager's (same model, batch 1, SGD with
momentum 0.9, one thread each, median of 7). Figures, never verdicts. What the
board computed is checked against the host simulator (loss and output within
1e-4), and the baseline's loss against the core's, so a wrong run is an error,
not a figure.

    python benchmarks/bench.py [--boards MPS2_AN500 ...] [--runs 2] [--only mlp-full ...] [--out ...]

While changing kernels: `make firmware-mps2_an500` and then
    python benchmarks/bench.py --only fixed mlp-full cnn-full --no-host --out build/bench.json
counts those cases on the test firmware in a few seconds.

`make bench` runs it with two runs (the counts must repeat exactly) and then
benchmarks/perfdoc.py, which writes docs/performance.md from the JSON.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import microtrain  # noqa: E402

import bench_models  # noqa: E402
import calibration  # noqa: E402
import qemu_count  # noqa: E402

ROOT = bench_models.ROOT
KEYS = ["model", "update", "board", "instr_per_step", "instr_per_predict", "macs_per_step", "instr_per_mac",
        "baseline_instr_per_step", "host_us_per_step", "torch_us_per_step"]
LR, MOMENTUM, LABEL = 0.01, 0.9, 3
REPS, BIG_REPS, BIG_MACS = 3, 1, 10_000_000   # counted steps per case (one for the big networks: qemu time)
TOL = 1e-4
# MicroPython's qemu port gives the heap 143360 bytes (ports/qemu/Makefile); a plan
# whose RAM needs more runs on a build with a bigger heap (`make bench` builds one).
STANDARD_HEAP = 143360
HEAP_MARGIN = 16 << 10   # the script, the Trainer object and the buffers
BIG_HEAP = 2 << 20
MICROPY_DIR = os.path.abspath(os.path.expanduser(
    os.environ.get("MICROPY_DIR") or os.path.join("~", ".cache", "microtrain", "micropython")))


class Case:
    """One model and update mode, compiled, with its sample and what the host computes for it."""

    def __init__(self, cid, model, update, source, has_baseline, options=None):
        self.id, self.model, self.update, self.has_baseline = cid, model, update, has_baseline
        self.onnx = bench_models.load(source)
        opts = dict(options or {})
        self.from_file = opts.pop("from_file", False)   # the board opens the plan as a file (stream_count.py)
        # with options (int8, a channel-sparse scheme) the plan is not the float model PyTorch trains here:
        # no PyTorch time or first-loss check for it
        self.float_model = not opts
        if "int8" in opts:
            side = self.onnx.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
            opts.update(calibration.int8_options(calibration_samples(opts.pop("int8"), side)))
        self.plan = microtrain.compile(self.onnx, update=opts.pop("update", update), loss="cross-entropy", lr=LR,
                                       momentum=MOMENTUM, **opts)
        self.report = self.plan.report()
        self.in_shape = tuple(self.plan.meta["input"]["shape"][1:])
        self.n_out = int(np.prod(self.plan.meta["output"]["shape"][1:]))
        sim = microtrain.Simulator(self.plan)
        # a float sample; a plan taking integers gets it quantized as its input says (uint8 bytes on the board)
        self.x = sim.quantize_input(np.random.default_rng(7).normal(size=self.in_shape).astype(np.float32))
        self.label = LABEL % self.n_out
        self.reps = BIG_REPS if self.report["macs_per_step"] > BIG_MACS else REPS
        self.trainable = sorted(sim.params())
        losses = [sim.step(self.x, self.label) for _ in range(1 + self.reps)]
        self.expect = {"loss": float(losses[-1]), "out0": float(sim.predict(self.x).reshape(-1)[0]),
                       "baseline_loss": float(losses[-1])}

    def device_input(self, blob):
        """The sample in the blob as Trainer.step reads it: float32, or the plan's int8/uint8 bytes."""
        return blob.add_f32(self.x) if self.x.dtype == np.float32 else blob.add(self.x.tobytes())

    def heap_needed(self):
        return self.report["ram_bytes"] + HEAP_MARGIN


_calibration = {}


def calibration_samples(n, side):
    """benchmarks/calibration.py's images, made once for all the int8 cases."""
    if (n, side) not in _calibration:
        _calibration[(n, side)] = calibration.samples(n, side)
    return _calibration[(n, side)]


# ---- host: the simulator beside PyTorch eager ------------------------------------------------


def per_call_us(fn, repeats=7, min_time=0.05):
    """Median over `repeats` timings of a batch of calls, in microseconds per call."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    n = max(1, int(min_time / max(once, 1e-7)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times) * 1e6


def host_speed(case):
    """(simulator us per step, torch eager us per step or None), measured one after the other in this
    process. A plan that is not the float model (int8) has no PyTorch counterpart: None."""
    sim = microtrain.Simulator(case.plan)
    x, y = case.x, case.label
    if not case.float_model:
        return per_call_us(lambda: sim.step(x, y)), None
    import torch
    import torch_eager
    torch.set_num_threads(1)   # the simulator runs on one thread too
    _, tstep = torch_eager.trainer(case.onnx, case.trainable, LR, MOMENTUM)
    tx = torch.from_numpy(case.x[None].copy())
    ty = torch.tensor([case.label])
    first_sim = microtrain.Simulator(case.plan).step(case.x, case.label)
    first_torch = float(tstep(tx, ty))
    if not abs(first_sim - first_torch) <= TOL * max(1.0, abs(first_torch)):
        raise RuntimeError("%s: PyTorch's first loss %r differs from the simulator's %r: not the same model"
                           % (case.id, first_torch, first_sim))
    return per_call_us(lambda: sim.step(x, y)), per_call_us(lambda: tstep(tx, ty))


# ---- qemu: instruction counts ----------------------------------------------------------------


def device_script(board, cases, baseline_cases, blob):
    """The script the board runs, with its data, and the blob it reads."""
    rows = [(c.id, blob.add(c.plan.data), c.device_input(blob), c.label, c.n_out, c.reps, c.from_file) for c in cases]
    baselines = []
    for c in baseline_cases:
        w = {t.name: numpy_helper.to_array(t).reshape(-1) for t in c.onnx.graph.initializer}
        baselines.append((c.id, blob.add_f32(w["fc1.weight"]), blob.add_f32(w["fc1.bias"]),
                          blob.add_f32(w["fc2.weight"]), blob.add_f32(w["fc2.bias"]),
                          blob.add_f32(c.x.reshape(-1)), c.label, LR, MOMENTUM, c.update == "full", c.reps))
    parts = [qemu_count.device_prelude(board), qemu_count.header(dict(CASES=rows, BASELINES=baselines)),
             open(os.path.join(HERE, "plain_mlp.py")).read(), qemu_count.counter_source(board),
             open(os.path.join(HERE, "device_count.py")).read()]
    return "\n".join(parts)


def count_on(board, firmware, cases, baseline_cases, verbose):
    """Count the Trainer cases and the plain-MicroPython baselines of baseline_cases in one qemu session:
    {case id: {"step": n, "predict": n} or {"baseline": n}} and the raw per-window counts."""
    blob = qemu_count.Blob()
    script = device_script(board, cases, baseline_cases, blob)
    echo = (lambda b: sys.stdout.write(b.decode(errors="replace"))) if verbose else None
    t0 = time.monotonic()
    out = qemu_count.run(board, firmware, blob, script, MICROPY_DIR, echo=echo)
    counts, values = qemu_count.parse(out, board)
    if "done" not in out.split():
        raise RuntimeError("the benchmark script on %s stopped early:\n%s" % (board, out))
    empty = counts[("-", "empty")]
    if len(set(empty)) != 1:
        raise RuntimeError("the empty window took %s instructions: the counts do not repeat on %s" % (empty, board))
    overhead = empty[0]
    checks = [(c, what) for c in cases for what in ("loss", "out0")]
    checks += [(c, "baseline_loss") for c in baseline_cases]
    for c, what in checks:
        want, got = c.expect[what], values.get((c.id, what))
        if got is None or not abs(got - want) <= TOL * max(1.0, abs(want)):
            raise RuntimeError("%s on %s: %s is %r, the host simulator says %r" % (c.id, board, what, got, want))
    # with the bytes a plan opened as a file read from it (stream_count.py)
    result = {cid: {what: int(v)} for (cid, what), v in values.items() if what == "stream_read_bytes" and v}
    for (cid, what), v in counts.items():
        if cid != "-":
            result.setdefault(cid, {})[what] = int(statistics.median(v)) - overhead
    print("%s: %d windows counted in %.0f s (the two counter reads themselves: %d instructions, subtracted)"
          % (os.path.relpath(firmware, ROOT), sum(len(v) for v in counts.values()), time.monotonic() - t0, overhead))
    return result, {"%s %s" % k: v for k, v in counts.items()}


def firmware_heap(firmware):
    """The heap a firmware was built with: MICROPY_HEAP_SIZE from its build's settings, else the port default."""
    cfg = os.path.join(os.path.dirname(firmware), "microtrain.config")
    if os.path.exists(cfg):
        for word in open(cfg).read().split():
            if "MICROPY_HEAP_SIZE=" in word:
                return int(word.split("=")[1].strip("'"))
    return STANDARD_HEAP


# ---- the table --------------------------------------------------------------------------------


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "%.1f%s" % (v, unit)
    return "{:,}{}".format(v, unit)


def table(entries):
    head = ("model", "update", "board", "instr/step", "instr/predict", "MACs/step", "instr/MAC", "plain MPy/step",
            "host us", "torch us")
    rows = [(e["model"], e["update"], e["board"], fmt(e["instr_per_step"]), fmt(e["instr_per_predict"]),
             fmt(e["macs_per_step"]), fmt(e["instr_per_mac"]), fmt(e["baseline_instr_per_step"]),
             fmt(e["host_us_per_step"]), fmt(e["torch_us_per_step"])) for e in entries]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def firmware_for(board, given, big):
    """The firmware to count on for a board: --firmware BOARD=PATH, else `make firmware`'s build
    (build/firmware/<board>/) or `make bench`'s big-heap one (build/bench-bigheap/<board>/)."""
    if given.get(board):
        return given[board]
    return os.path.join(ROOT, "build", "bench-bigheap" if big else "firmware", board.lower(), "firmware.elf")


def check_fresh(firmware):
    """A firmware older than the module's sources would count old code."""
    sources = glob.glob(os.path.join(ROOT, "modules", "microtrain", "*.[ch]"))
    newer = sorted(os.path.basename(p) for p in sources if os.path.getmtime(p) > os.path.getmtime(firmware))
    if newer:
        raise RuntimeError("%s is older than modules/microtrain/%s: rebuild it (`make bench` does)"
                           % (os.path.relpath(firmware, ROOT), ", ".join(newer)))


def built_for(firmware):
    """The board named in a firmware build's settings (firmware/micropython.mk writes them), if any."""
    cfg = os.path.join(os.path.dirname(firmware), "microtrain.config")
    if os.path.exists(firmware) and os.path.exists(cfg):
        words = [w.strip("'\"").split("=")[-1] for w in open(cfg).read().split()]
        names = set(words) & set(qemu_count.BOARDS)
        return names.pop() if len(names) == 1 else None
    return None


def sessions_for(board, fw, big, cases):
    """The qemu sessions of one board, [(firmware, Trainer cases, baseline cases)], and notes by case id.
    A plan runs on the standard firmware if its RAM fits the heap, else on the big-heap build.
    Each plain-MicroPython baseline gets a session of its own: its count includes garbage
    collections, which depend on what the heap holds."""
    groups, notes = {}, {}
    for c in cases:
        fits = [f for f in (fw, big) if os.path.exists(f) and c.heap_needed() <= firmware_heap(f)]
        if not fits:
            found = [os.path.relpath(f, ROOT) for f in (fw, big) if os.path.exists(f)]
            notes[c.id] = "not counted: the plan needs %d KB of RAM, more than the heap of %s" % (
                c.report["ram_bytes"] >> 10, " or ".join(found) or "any qemu build (none found)")
            continue
        groups.setdefault(fits[0], []).append(c)
        if fits[0] == big:
            notes[c.id] = "counted on the same board built with a %d KB heap (MICROPY_HEAP_SIZE; `make bench` " \
                          "builds it): the plan needs %d KB of RAM, the standard build's heap is %d KB" % (
                              firmware_heap(big) >> 10, c.report["ram_bytes"] >> 10, STANDARD_HEAP >> 10)
    sessions = [(f, group, []) for f, group in groups.items()]
    sessions += [(fw, [], [c]) for c in cases if c.has_baseline and os.path.exists(fw)]
    return sessions, notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--boards", nargs="+", default=os.environ.get("BENCH_BOARDS", "MPS2_AN500").split(),
                    help="qemu boards (%s)" % ", ".join(qemu_count.BOARDS))
    ap.add_argument("--firmware", action="append", default=[], metavar="BOARD=PATH",
                    help="firmware.elf for a board (default build/firmware/<board>/firmware.elf)")
    ap.add_argument("--big-firmware", action="append", default=[], metavar="BOARD=PATH",
                    help="a build with a bigger heap, for plans that need it "
                         "(default build/bench-bigheap/<board>/firmware.elf)")
    ap.add_argument("--runs", type=int, default=1, help="qemu runs; with 2 or more the counts must be identical")
    ap.add_argument("--only", nargs="*", help="case ids (%s)" % " ".join(c[0] for c in bench_models.cases()))
    ap.add_argument("--no-qemu", action="store_true", help="host figures only")
    ap.add_argument("--no-host", action="store_true", help="instruction counts only (no simulator or PyTorch timing)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results.json"))
    ap.add_argument("-v", "--verbose", action="store_true", help="echo what the board prints")
    args = ap.parse_args()
    for b in args.boards:
        qemu_count.board(b)
    args.boards = [b.upper() for b in args.boards]
    given = {k: {b.upper(): f for b, f in (a.split("=", 1) for a in v)}
             for k, v in (("std", args.firmware), ("big", args.big_firmware))}

    cases = [Case(*c) for c in bench_models.cases() if not args.only or c[0] in args.only]
    host = {}
    for c in ([] if args.no_host else cases):
        host[c.id] = host_speed(c)
        print("%-16s host %8.1f us/step, torch eager %s us/step" % (c.id, host[c.id][0], fmt(host[c.id][1])))

    counted, notes, raw_runs = {}, {}, [{} for _ in range(args.runs)]
    for board in ([] if args.no_qemu else args.boards):
        fw, big = firmware_for(board, given["std"], False), firmware_for(board, given["big"], True)
        for f in (fw, big):
            if os.path.exists(f) and built_for(f) not in (None, board):
                raise ValueError("%s was built for %s, not %s: pass --firmware %s=PATH" % (f, built_for(f), board, board))
        sessions, board_notes = sessions_for(board, fw, big, cases)
        for f in set(s[0] for s in sessions):
            check_fresh(f)
        notes.update({(board, cid): n for cid, n in board_notes.items()})
        for run in range(args.runs):
            for f, group, baselines in sessions:
                res, counts = count_on(board, f, group, baselines, args.verbose)
                if run == 0:
                    for cid, r in res.items():
                        counted.setdefault((board, cid), {}).update(r)
                tag = "%s %s" % (board, "big heap" if f == big else "standard")
                raw_runs[run].update({"%s %s" % (tag, k): v for k, v in counts.items()})
    # The Trainer windows must repeat exactly. The plain-MicroPython baseline's include garbage
    # collections, and MicroPython's collector scans the stack conservatively: a stale word
    # left by the serial polling loop (whose iteration count depends on host timing) can keep
    # a dead block alive, so its counts may move by a few instructions between runs.
    identical = baseline_identical = None
    if args.runs > 1 and raw_runs[0]:
        core_keys = [k for k in raw_runs[0] if not k.endswith(" baseline")]
        base_keys = [k for k in raw_runs[0] if k.endswith(" baseline")]
        differ = lambda keys: [k for k in keys if any(r.get(k) != raw_runs[0][k] for r in raw_runs[1:])]  # noqa
        identical, baseline_identical = not differ(core_keys), not differ(base_keys)
        print("determinism: %d qemu runs, %d Trainer windows each: %s" % (
            args.runs, sum(len(raw_runs[0][k]) for k in core_keys),
            "identical counts" if identical else "COUNTS DIFFER"))
        if base_keys:
            print("plain-MicroPython baseline windows (garbage collection included): %s" % (
                "identical" if baseline_identical else "differ by at most %d instructions" % max(
                    abs(a - b) for k in differ(base_keys) for r in raw_runs[1:] for a, b in zip(r[k], raw_runs[0][k]))))
        for k in differ(core_keys):
            print("  %s: %s" % (k, [r.get(k) for r in raw_runs]))
        if not identical:
            return 1

    out = []
    for board in args.boards:
        for c in cases:
            r = counted.get((board, c.id), {})
            macs = int(c.report["macs_per_step"])
            step = r.get("step")
            out.append(dict(model=c.model, update=c.update, board=board, instr_per_step=step,
                            instr_per_predict=r.get("predict"), macs_per_step=macs,
                            instr_per_mac=round(step / macs, 1) if step is not None and macs else None,
                            baseline_instr_per_step=r.get("baseline"),
                            host_us_per_step=round(host[c.id][0], 1) if c.id in host else None,
                            torch_us_per_step=round(host[c.id][1], 1) if host.get(c.id, (0, None))[1] else None))
    print()
    print(table(out))
    named = {c.id: "%s / %s" % (c.model, c.update) for c in cases}
    for (board, cid), n in notes.items():
        print("%s on %s: %s" % (cid, board, n))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    run_facts = dict(boards=args.boards, qemu=qemu_version(), runs=args.runs,
                     icount_shift={b: qemu_count.board(b)["shift"] for b in args.boards},
                     identical=identical, baseline_identical=baseline_identical, windows=raw_runs[0],
                     notes={"%s on %s" % (named[cid], board): n for (board, cid), n in notes.items()},
                     commit=git_head(), lr=LR, momentum=MOMENTUM)
    with open(os.path.splitext(args.out)[0] + ".run.json", "w") as f:
        json.dump(run_facts, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote %s" % os.path.relpath(args.out, ROOT))
    return 0


def qemu_version():
    try:
        return subprocess.run(["qemu-system-arm", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    except OSError:
        return None


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                              text=True).stdout.strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
