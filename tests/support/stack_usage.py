"""Peak C stack use of Trainer(plan) (load and attach), step and predict on a qemu board,
by stack painting: below the current stack pointer the script fills the unused stack
with a pattern (machine.mem32), makes the call, then finds the lowest word that no
longer holds the pattern. Depth = top of the stack (_estack, from the firmware's ELF
symbols) minus that address: everything on the stack at the peak, MicroPython's REPL
and call frames included, which is what the board's stack must hold.

    python tests/support/stack_usage.py [--board mps2_an500] [--update-profiles]

prints a table; --update-profiles writes the figures into boards/<board>.json
("stack_use": {model: {call: bytes}}) for the board measured. tests/device/test_stack.py
measures again and checks them against every board's stack_bytes.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from repo import ROOT  # noqa: E402

import microtrain  # noqa: E402
import models  # noqa: E402
import mprun  # noqa: E402
import mptargets  # noqa: E402

PAINT_BYTES = 32768   # painted below the stack pointer: beyond any board's stack, to see an overflow too
MARGIN = 256          # left unpainted under the painting loop's own C calls (checked: baseline)
ROUND = 512           # the profile's figures: measured + ROUND/2, rounded up to ROUND
CALLS = ("load", "step", "predict", "a call of len()", "painted from")


def reference_plans():
    """{name: plan bytes}: the example digits CNN (as `make demo` compiles it) and the MLP and
    CNN of tests/support/models.py fully trained. MCUNet-5fps needs 652 KB of RAM: not on a qemu heap."""
    c = microtrain.compile
    return {
        "digits_cnn (last-layer)": c(os.path.join(ROOT, "examples", "digits_cnn.onnx"), update="last-layer", lr=0.05,
                                     momentum=0.9).data,
        "mlp (full)": c(models.mlp(n_in=8, hidden=6, n_out=3), update="full", lr=0.05, momentum=0.9).data,
        "cnn (full, mse, batch 2)": c(models.cnn(seed=2, hw=8, n_out=4), update="full", loss="mse", lr=0.02,
                                      momentum=0.9, batch=2).data,
    }


# Painting and scanning are inline loops in the function that makes the call: a helper
# function would run one Python frame deeper than the call it measures and clobber the
# paint with its own frames. MARGIN covers the loop's own C calls (mem32 store and load).
PAINT = """    hi = (TOP - micropython.stack_use() - %(margin)d) & ~3
    for a in range(hi - %(paint)d, hi, 4):
        mem[a] = P
"""
SCAN = """    d = TOP - hi
    for a in range(hi - %(paint)d, hi, 4):
        if mem[a] != P:
            d = TOP - a
            break
"""
SCRIPT = """
import gc, machine, micropython, microtrain
from array import array
TOP = %(top)d
P = 0x2AA5A55A
mem = machine.mem32

def baseline():
""" + PAINT + SCAN + """    return d, TOP - hi

def run(name, plan):
    gc.collect()
""" + PAINT + """    t = microtrain.Trainer(plan)
""" + SCAN + """    d_load = d
    x = array("f", [0.25] * t.input_len)
    y = 1 if t.info()["loss"] == "cross-entropy" else array("f", [0.5] * t.target_len)
    loss = array("f", [0])
    out = array("f", [0] * t.output_len)
    t.step(x, y, loss)
""" + PAINT + """    t.step(x, y, loss)
""" + SCAN + """    d_step = d
""" + PAINT + """    t.predict(x, out)
""" + SCAN + """    d_pred = d
""" + PAINT + """    len(out)
""" + SCAN + """    print("stack", repr(name), d_load, d_step, d_pred, d, TOP - hi)

print("baseline", *baseline())
for name, plan in PLANS:
    run(name, plan)
"""


def stack_top(elf):
    out = subprocess.run(["arm-none-eabi-nm", elf], capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[0], 16) for line in out.splitlines() if line.split()[-1] == "_estack")


def measure(board="mps2_an500"):
    """{model: {call: bytes}} (with "painted from": the depth where the paint started, below the
    call site by MARGIN: a call that reaches no deeper shows that depth), and the baseline:
    (depth found, depth painted from) for painting and scanning with no call in between."""
    target = mptargets.targets()[board]
    why = target.missing()
    if why:
        raise RuntimeError(why)
    plans = reference_plans()
    code = "PLANS = %r\n" % list(plans.items()) + SCRIPT % dict(top=stack_top(target.firmware), margin=MARGIN,
                                                                 paint=PAINT_BYTES)
    out = mprun.run_source(target, code, timeout=900)
    result, baseline = {}, None
    for line in out.splitlines():
        if line.startswith("baseline"):
            baseline = tuple(map(int, line.split()[1:]))
        elif line.startswith("stack"):
            rest = line[len("stack "):]
            name = eval(rest[:rest.rindex("'") + 1])
            result[name] = dict(zip(CALLS, map(int, rest[rest.rindex("'") + 1:].split())))
    if baseline is None or len(result) != len(plans):
        raise RuntimeError("unexpected output from %s:\n%s" % (board, out))
    return result, baseline


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--board", default="mps2_an500")
    ap.add_argument("--update-profiles", action="store_true")
    args = ap.parse_args()
    result, baseline = measure(args.board)
    print("peak stack depth on %s, bytes from the top of the stack (painting with no call in between: found %d, "
          "painted from %d)" % ((args.board,) + baseline))
    print("| model | %s |\n|---|---|---|---|---|---|" % " | ".join(CALLS))
    for name, d in result.items():
        print("| %s | %d | %d | %d | %d | %d |" % ((name,) + tuple(d[c] for c in CALLS)))
    if args.update_profiles:
        path = os.path.join(ROOT, "boards", args.board + ".json")
        profile = json.load(open(path))
        budget = {name: {c: -(-(calls[c] + ROUND // 2) // ROUND) * ROUND for c in ("load", "step", "predict")}
                  for name, calls in result.items()}
        profile["stack_use"] = dict(budget, how="tests/support/stack_usage.py: stack painting on qemu, bytes from the top of "
                                    "the stack at the peak of the call, MicroPython's own frames included, plus %d, "
                                    "rounded up to %d (a garbage collection during the call goes deeper)" % (ROUND // 2, ROUND))
        with open(path, "w") as f:
            json.dump(profile, f, indent=2)
            f.write("\n")
        print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
