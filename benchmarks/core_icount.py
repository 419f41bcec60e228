"""Instruction counts of the C core on qemu MPS2_AN500 (Cortex-M7), a quick
measurement for the core's own work (the project's `make bench` is the full one).

qemu runs with `-icount shift=0`: every guest instruction advances the virtual
clock by exactly 1 ns, and the board's SysTick (25 MHz) is driven by that clock,
so time.ticks_us() on the board counts thousands of instructions, and two runs
give the same figures. Each case runs N calls between two ticks_us() reads and
subtracts the same loop without the call, so a figure is the instructions of
one call from MicroPython (binding and core), to within 1000/N.

    .venv/bin/python benchmarks/core_icount.py [--firmware build/micropython-qemu/firmware.elf]
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import models  # noqa: E402

import microtrain  # noqa: E402

MICROPY_DIR = os.path.expanduser(os.environ.get("MICROPY_DIR") or "~/.cache/microtrain/micropython")
QEMU = "qemu-system-arm -machine mps2-an500 -nographic -monitor null -semihosting -icount shift=0 -serial pty -kernel %s"


def small_cnn(seed=0, c_in=3, c1=8, c2=8, hw=16, n_out=10):
    """two 3x3 convs (pad 1) with relu, global average pool, gemm."""
    rng = np.random.default_rng(seed)
    init = lambda n, *s: numpy_helper.from_array(rng.normal(0, 0.3, s).astype(np.float32), n)  # noqa: E731
    inits = [init("c1.w", c1, c_in, 3, 3), init("c1.b", c1), init("c2.w", c2, c1, 3, 3), init("c2.b", c2),
             init("fc.w", n_out, c2), init("fc.b", n_out)]
    nodes = [helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "c2.w", "c2.b"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("GlobalAveragePool", ["br"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n_out])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def linear(n_in=1, n_out=2):
    w = numpy_helper.from_array(np.array([[0.5], [-0.25]], np.float32), "w")
    b = numpy_helper.from_array(np.zeros(n_out, np.float32), "b")
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "lin",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n_in])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n_out])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def cases():
    """(name, plan, n calls, macs per step, macs per predict)"""
    out = []
    mlp = models.mlp(n_in=64, hidden=32, n_out=10, seed=1)
    for update in ("full", "last-layer"):
        out.append(("mlp 64-32-10 " + update, microtrain.compile(mlp, update=update, lr=0.01, momentum=0.9), 200))
    cnn = small_cnn()
    for update in ("full", "last-layer"):
        out.append(("cnn 3-8-8 16x16 " + update, microtrain.compile(cnn, update=update, lr=0.01, momentum=0.9), 4))
    out.append(("linear 1-2 full", microtrain.compile(linear(), update="full", lr=0.01, momentum=0.9), 500))
    return out


SCRIPT = """
import microtrain, time, array
def run(plan, n, n_in, n_out, label):
    t = microtrain.Trainer(plan)
    x = array.array('f', [((i * 37) % 11) * 0.1 - 0.5 for i in range(n_in)])
    out = array.array('f', [0.0] * n_out)
    loss = array.array('f', [0.0])
    step = t.step
    predict = t.predict
    step(x, label, loss)
    t0 = time.ticks_us()
    for i in range(n):
        pass
    t1 = time.ticks_us()
    for i in range(n):
        step(x, label, loss)
    t2 = time.ticks_us()
    for i in range(n):
        predict(x, out)
    t3 = time.ticks_us()
    empty = time.ticks_diff(t1, t0)
    print('RESULT', (time.ticks_diff(t2, t1) - empty) * 1000 // n, (time.ticks_diff(t3, t2) - empty) * 1000 // n)
"""


def measure(fw, plan, n):
    sys.path.insert(0, os.path.join(MICROPY_DIR, "tools"))
    import pyboard
    r = plan.report()
    n_in = int(np.prod(plan.meta["input"]["shape"]))
    n_out = int(np.prod(plan.meta["output"]["shape"]))
    pyb = pyboard.Pyboard("execpty:" + QEMU % fw)
    try:
        pyb.enter_raw_repl()
        pyb.exec_raw(SCRIPT)
        out, err = pyb.exec_raw("run(%r, %d, %d, %d, 1)" % (plan.data, n, n_in, n_out), timeout=600)
    finally:
        pyb.close()
    if err:
        raise RuntimeError(err.decode())
    line = [ln for ln in out.decode().splitlines() if ln.startswith("RESULT")][0]
    step, pred = map(int, line.split()[1:])
    return step, pred, r["macs_per_step"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--firmware", default=os.path.join(ROOT, "build", "micropython-qemu", "firmware.elf"))
    args = ap.parse_args()
    print("| case | instr/step | instr/predict | MACs/step | instr/MAC (step) | context bytes |")
    print("|---|---|---|---|---|---|")
    for name, plan, n in cases():
        step, pred, macs = measure(args.firmware, plan, n)
        ctx = plan.report().get("context_bytes", "-")
        print("| %s | %d | %d | %d | %.2f | %s |" % (name, step, pred, macs, step / max(macs, 1), ctx))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
