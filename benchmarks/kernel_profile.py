"""Where a training step's instructions go, per C function, on qemu MPS2_AN500 (Cortex-M7).

`make bench` counts whole steps; this splits one step by function. qemu logs every
translation block it translates (`-d in_asm`: the block's instructions) and every block it
executes (`-d exec,nochain`: one line per execution, no chaining, so none is skipped); a
block's instructions are attributed to the firmware symbol that holds its start address
(`arm-none-eabi-nm -S`). The script runs the same device script twice, with 1 and with 1+K
steps, and prints the difference divided by K: the plan's loading, MicroPython's parser and
the first step's setup cancel out, and what is left is exactly one step. The conv line sums
the convolution kernels (forward, input and weight gradients) against the convolution MACs
of the plan.

    .venv/bin/python benchmarks/kernel_profile.py [--model small_cnn] [--update full] [--steps 5]
        [--firmware build/firmware/mps2_an500/firmware.elf]

The log of one run is a few hundred MB in a temporary directory, deleted afterwards.
"""
import argparse
import bisect
import collections
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

import microtrain
import bench_models
from qemu_count import pyboard_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICROPY_DIR = os.path.expanduser(os.environ.get("MICROPY_DIR") or "~/.cache/microtrain/micropython")
QEMU = ("qemu-system-arm -machine mps2-an500 -nographic -monitor null -semihosting -icount shift=0 -serial pty "
        "-d in_asm,exec,nochain -D %s -kernel %s")
CONV_KERNELS = ("CONV2D", "CONV2D_BWD_INPUT", "CONV2D_BWD_WEIGHT")
# the functions of modules/microtrain/mt_conv.c (static, so each keeps its own symbol unless inlined)
CONV_FUNCTIONS = ("conv_", "pass_", "axpy", "tap_gradient", "pw_product", "pw_grads")

SCRIPT = """
import microtrain, array
def run(plan, n, n_in, label):
    t = microtrain.Trainer(plan)
    x = array.array('f', [((i * 37) % 11) * 0.1 - 0.5 for i in range(n_in)])
    loss = array.array('f', [0.0])
    for i in range(n):
        t.step(x, label, loss)
    print('DONE', n)
"""


def symbols(firmware):
    """(sorted start addresses, [(start, size, name)]) of the firmware's functions."""
    out = subprocess.run(["arm-none-eabi-nm", "-S", firmware], capture_output=True, text=True, check=True).stdout
    syms = sorted((int(p[0], 16), int(p[1], 16), p[3]) for p in map(str.split, out.splitlines())
                  if len(p) == 4 and p[2] in "tTwW")
    return [s[0] for s in syms], syms


def per_function(log, firmware):
    """{function: instructions executed} from a qemu in_asm + exec log."""
    starts, syms = symbols(firmware)
    tb_len, runs, cur, first = {}, collections.Counter(), None, False
    addr = re.compile(r"0x([0-9a-f]{8}):\s")
    trace = re.compile(r"Trace \d+: \S+ \[[0-9a-f]+/([0-9a-f]+)/")
    with open(log, errors="replace") as f:
        for ln in f:
            if ln.startswith("IN:"):
                first, cur = True, None
                continue
            m = addr.match(ln)
            if m:
                if first:
                    cur, first = int(m.group(1), 16), False
                    tb_len[cur] = 0
                if cur is not None:
                    tb_len[cur] += 1
                continue
            m = trace.match(ln)
            if m:
                runs[int(m.group(1), 16)] += 1
                cur = None
    out = collections.Counter()
    for a, n in runs.items():
        i = bisect.bisect_right(starts, a) - 1
        name = syms[i][2] if i >= 0 and a < syms[i][0] + syms[i][1] else "?"
        out[name] += n * tb_len.get(a, 0)
    return out


def conv_macs_of(plan, op):
    """MACs of a float conv op: every element of its output (forward) or output gradient
    (backward), times the weight's elements per output channel (its trained range for a
    channel-sparse weight gradient is ignored: these plans train whole weights)."""
    shape = lambda k: plan.tensors[op["slots"][k]]["shape"]   # noqa: E731
    w = shape(1) if op["op"] != "CONV2D_BWD_WEIGHT" else shape(2)
    y = shape(3) if op["op"] == "CONV2D" else shape(0)
    return int(np.prod(y)) * int(np.prod(w[1:]))


def run(firmware, plan, steps, workdir):
    pyboard = pyboard_module(MICROPY_DIR)
    log = os.path.join(workdir, "exec%d.log" % steps)
    pyb = pyboard.Pyboard("execpty:" + QEMU % (log, firmware))
    try:
        pyb.enter_raw_repl()
        pyb.exec_raw(SCRIPT)
        out, err = pyb.exec_raw("run(%r, %d, %d, 1)" % (plan.data, steps, int(np.prod(plan.meta["input"]["shape"]))),
                                timeout=1800)
    finally:
        pyb.close()
    if err or b"DONE" not in out:
        raise RuntimeError("device script failed: %s" % (err or out).decode(errors="replace"))
    try:
        return per_function(log, firmware)
    finally:
        os.remove(log)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small_cnn", help="a model function of benchmarks/bench_models.py")
    ap.add_argument("--update", default="full")
    ap.add_argument("--steps", type=int, default=5, help="K: steps whose difference is divided out")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--firmware", default=os.path.join(ROOT, "build", "firmware", "mps2_an500", "firmware.elf"))
    args = ap.parse_args()
    if not os.path.exists(args.firmware):
        sys.exit("no firmware at %s: `make firmware-mps2_an500` builds it" % args.firmware)
    plan = microtrain.compile(getattr(bench_models, args.model)(), update=args.update, lr=0.01, momentum=0.9)
    with tempfile.TemporaryDirectory() as d:
        one = run(args.firmware, plan, 1, d)
        more = run(args.firmware, plan, 1 + args.steps, d)
    step = {k: (more[k] - one[k]) / args.steps for k in set(one) | set(more)}
    total = sum(step.values())
    macs = plan.report()["macs_per_step"]
    conv_macs = sum(conv_macs_of(plan, o) for o in plan.ops if o["op"] in CONV_KERNELS)
    # the core's functions run only inside steps, so their counts are exact; the total also holds
    # MicroPython's serial polling and allocations while the REPL reads the script, which differ
    # between the two runs (`make bench` counts whole steps exactly)
    print("%s, update %s, MPS2_AN500: %d instructions per step by this difference (REPL polling included), "
          "%d MACs" % (args.model, args.update, total, macs))
    print("%-28s %12s %7s" % ("function", "instr/step", "share"))
    for name, n in sorted(step.items(), key=lambda kv: -kv[1])[:args.top]:
        print("%-28s %12.0f %6.1f%%" % (name, n, 100 * n / total))
    conv = sum(n for name, n in step.items() if name.startswith(CONV_FUNCTIONS))
    print("convolution kernels (mt_conv.c): %.0f instructions for %d conv MACs: %.2f per MAC"
          % (conv, conv_macs, conv / max(conv_macs, 1)))


if __name__ == "__main__":
    main()
