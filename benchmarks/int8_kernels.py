"""Instructions per multiply-accumulate of the int8 convolution kernels, one layer shape at a time,
counted exactly on qemu (benchmarks/qemu_count.py's method: `-icount`, the board's own timers).

Each case is a network of one int8 convolution (the shapes of MIT's MCU networks: 1x1 expansions
and projections, depthwise 3x3/5x5/7x7 at stride 1 and 2, the 3x3 stride-2 stem on RGB), then a
global average pool and a float Linear head; the frozen part is quantized by the compiler, calibrated
on random samples, uint8 pixels in. The board runs `Trainer.predict`, and the count of the head alone
on an input the shape of the convolution's output is subtracted, so what is left is the convolution
op (and the copy of its larger or smaller input): its instructions divided by its MACs. The board's
outputs are checked against the host simulator's.

    python benchmarks/int8_kernels.py [--boards MPS2_AN500 MPS2_AN385] [--only pw48 dw3s1 ...]
        [--firmware MPS2_AN500=PATH ...]

Figures, never verdicts: `make bench` and docs/performance.md use whole steps.
"""
import argparse
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench  # noqa: E402
import bench_models  # noqa: E402

# id: (input channels, size, output channels, kernel, stride, groups = input channels?)
SHAPES = {
    "pw16-48": (16, 32, 48, 1, 1, False),    # MCUNet block 1 expansion, 32x32
    "pw48-16": (48, 32, 16, 1, 1, False),    # its projection
    "pw96-384": (96, 4, 384, 1, 1, False),   # the 4x4 blocks' expansion
    "pw576-160": (576, 4, 160, 1, 1, False),  # the last projection
    "dw3s1": (48, 32, 48, 3, 1, True),
    "dw3s2": (48, 32, 48, 3, 2, True),
    "dw5s1": (160, 8, 160, 5, 1, True),
    "dw7s1": (48, 16, 48, 7, 1, True),
    "dw7s2": (48, 32, 48, 7, 2, True),
    "stem3s2": (3, 64, 16, 3, 2, False),      # 3x3 stride 2 on RGB (64x64 here; MCUNet's is 128x128)
}


def model(cin, side, cout, k, stride, depthwise, conv=True, seed=0):
    """Conv (k x k, stride, pad k//2, groups cin when depthwise) -> ReLU6 -> GAP -> Linear 10; without
    conv, an input of the conv's output shape goes to the pool directly (the head alone, subtracted)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    x = "x"
    width = cin
    if not conv:
        cin, side, width = cout, out_side(side, k, stride), cout
    else:
        groups = cin if depthwise else 1
        w = (rng.normal(size=(cout, cin // groups, k, k)) / np.sqrt(cin // groups * k * k)).astype(np.float32)
        inits += [numpy_helper.from_array(w, "c.weight"),
                  numpy_helper.from_array(rng.normal(size=cout).astype(np.float32) * 0.1, "c.bias")]
        nodes += [helper.make_node("Conv", ["x", "c.weight", "c.bias"], ["h"], kernel_shape=[k, k],
                                   strides=[stride, stride], pads=[k // 2] * 4, group=groups, name="c"),
                  helper.make_node("Clip", ["h", "lo", "hi"], ["r"], name="relu6")]
        inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6, np.float32), "hi")]
        x, width = "r", cout
    inits += [numpy_helper.from_array(rng.normal(size=(10, width)).astype(np.float32) * 0.1, "fc.weight"),
              numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["g"], name="gap"),
              helper.make_node("Flatten", ["g"], ["f"], name="flat"),
              helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "k", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def out_side(side, k, stride):
    return (side + 2 * (k // 2) - k) // stride + 1


def conv_macs(cin, side, cout, k, stride, depthwise):
    out = out_side(side, k, stride)
    return out * out * cout * (1 if depthwise else cin) * k * k


class KernelCase(bench.Case):
    """bench.Case on a generated model, int8 frozen part (random calibration samples), last layer trained."""

    def __init__(self, cid, onnx_model, side, cin):
        rng = np.random.default_rng(1)
        bench.calibration_samples = lambda n, s: rng.uniform(0, 1, size=(n, cin, side, side)).astype(np.float32)
        super().__init__(cid, cid, "last-layer", onnx_model, False, dict(int8=16))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--boards", nargs="+", default=["MPS2_AN500"])
    ap.add_argument("--firmware", action="append", default=[], metavar="BOARD=PATH")
    ap.add_argument("--only", nargs="*", help="shape ids (%s)" % " ".join(SHAPES))
    args = ap.parse_args()
    given = dict(f.split("=", 1) for f in args.firmware)
    shapes = {k: v for k, v in SHAPES.items() if not args.only or k in args.only}
    cases, macs = [], {}
    for sid, (cin, side, cout, k, stride, dw) in shapes.items():
        cases.append(KernelCase(sid, model(cin, side, cout, k, stride, dw), side, cin))
        cases.append(KernelCase(sid + "-head", model(cin, side, cout, k, stride, dw, conv=False),
                                out_side(side, k, stride), cout))
        macs[sid] = conv_macs(cin, side, cout, k, stride, dw)
    print("%-10s %-11s %12s %10s %9s" % ("shape", "board", "instr", "MACs", "instr/MAC"))
    for board in args.boards:
        fw = bench.firmware_for(board, given, False)
        res, _ = bench.count_on(board, fw, cases, [], False)
        for sid in shapes:
            n = res[sid]["predict"] - res[sid + "-head"]["predict"]
            print("%-10s %-11s %12d %10d %9.2f" % (sid, board, n, macs[sid], n / macs[sid]))


if __name__ == "__main__":
    main()
