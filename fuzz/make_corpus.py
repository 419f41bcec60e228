"""The fuzzer's seed corpus: real plans from the host compiler, covering every op
code and every dtype that format.py defines and the compiler emits.

    python fuzz/make_corpus.py DIR     writes DIR/<name>.mtp, prints op coverage

It fails (exit 1) when some op code of format.OPS appears in no seed, so a new op
(int8, sparse updates...) cannot land without a seed that reaches it: add a model
below that makes the compiler emit it.
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import microtrain
from microtrain import format as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import models  # noqa: E402  tests/support/models.py: the MLP and CNN the tests use

OPSET = 13


def _model(nodes, inits, x_shape, y_shape, name, opset=OPSET):
    init = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], init)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def pools(seed=0):
    """strided dilated conv -> relu -> avgpool (pads, count_include_pad, ceil) -> maxpool (ceil)
    -> matmul (weight [in, out]) + add: the window ops' other branches and the IN_OUT layout."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "c.weight", "c.bias"], ["a"], strides=[2, 1], dilations=[1, 2],
                              pads=[1, 2, 0, 1], name="c"),
             helper.make_node("Relu", ["a"], ["r"], name="r"),
             helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 3], strides=[1, 2], pads=[1, 1, 0, 1],
                              count_include_pad=1, ceil_mode=1, name="avg"),
             helper.make_node("MaxPool", ["p"], ["q"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, name="max"),
             helper.make_node("Flatten", ["q"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "m.weight"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "m.bias"], ["y"], name="add")]
    # x (1,2,7,9): conv -> (1,3,4,8); avgpool -> (1,3,4,5); maxpool (ceil) -> (1,3,2,3)
    return _model(nodes, {"c.weight": w(3, 2, 2, 3), "c.bias": w(3), "m.weight": w(18, 3), "m.bias": w(3)},
                  [1, 2, 7, 9], [1, 3], "pools")


def avg_exclude_pad(seed=1):
    """avgpool without count_include_pad, then the CNN's tail."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "c.weight"], ["a"], pads=[1, 1, 1, 1], name="c"),
             helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              name="avg"),
             helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    return _model(nodes, {"c.weight": w(4, 1, 3, 3), "fc.weight": w(2, 4), "fc.bias": w(2)}, [1, 1, 6, 6], [1, 2],
                  "avg_exclude_pad")


def tied(seed=2):
    """one weight used by two layers: its gradients summed in an accumulator, applied by SGD (batch 1)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Gemm", ["x", "w", "b1"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w", "b2"], ["y"], transB=1, name="fc2")]
    return _model(nodes, {"w": rng.normal(0, 0.5, (4, 4)), "b1": rng.normal(0, 0.1, 4), "b2": rng.normal(0, 0.1, 4)},
                  [1, 4], [1, 4], "tied")


def mobile_ops(seed=3):
    """conv -> HardSwish -> squeeze-and-excitation (GlobalAveragePool, 1x1 convs, Relu, HardSigmoid,
    Mul per channel) -> Sigmoid, Tanh, LeakyRelu -> Concat with x * 2 - 1 (Mul, Sub by constants:
    AFFINE) -> BatchNormalization after an Add (frozen AFFINE) -> Flatten -> Gemm: ACT, ACT_BWD,
    MUL, MUL_BWD_CHANNEL, AFFINE, CONCAT, SLICE."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    n = helper.make_node
    nodes = [n("Conv", ["x", "c.weight", "c.bias"], ["a"], pads=[1, 1, 1, 1], name="c"),
             n("HardSwish", ["a"], ["hs"], name="hswish"),
             n("GlobalAveragePool", ["hs"], ["g"], name="gap"),
             n("Conv", ["g", "se1.weight", "se1.bias"], ["s1"], name="se1"),
             n("Relu", ["s1"], ["s1r"], name="se_relu"),
             n("Conv", ["s1r", "se2.weight", "se2.bias"], ["s2"], name="se2"),
             n("HardSigmoid", ["s2"], ["s"], alpha=1.0 / 6, beta=0.5, name="hsig"),
             n("Mul", ["hs", "s"], ["m"], name="se_mul"),
             n("Sigmoid", ["m"], ["sg"], name="sigmoid"),
             n("Tanh", ["sg"], ["th"], name="tanh"),
             n("LeakyRelu", ["th"], ["lr"], alpha=0.1, name="leaky"),
             n("Mul", ["m", "two"], ["m2"], name="times2"),
             n("Sub", ["m2", "one"], ["m3"], name="minus1"),
             n("Concat", ["lr", "m3"], ["cat"], axis=1, name="cat"),
             n("Add", ["cat", "cat"], ["sum"], name="add"),
             n("BatchNormalization", ["sum", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn"], name="bn"),
             n("Flatten", ["bn"], ["f"], name="flat"),
             n("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    C = 3
    return _model(nodes, {"c.weight": w(C, 2, 3, 3), "c.bias": w(C), "se1.weight": w(2, C, 1, 1), "se1.bias": w(2),
                          "se2.weight": w(C, 2, 1, 1), "se2.bias": w(C), "two": np.float32(2.0),
                          "one": np.float32(1.0), "bn.scale": rng.uniform(0.5, 1.5, 2 * C),
                          "bn.bias": w(2 * C), "bn.mean": w(2 * C), "bn.var": rng.uniform(0.5, 2, 2 * C),
                          "fc.weight": w(2, 2 * C * 16), "fc.bias": w(2)}, [1, 2, 4, 4], [1, 2], "mobile_ops",
                  opset=14)   # HardSwish


def mbconv(seed=9):
    """x -> 1x1 expansion -> ReLU6 -> depthwise 3x3 -> ReLU6 -> 1x1 projection -> GAP -> Gemm: with
    frozen weights and int8 saved ReLU6 outputs, the depthwise conv runs in place."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    inits = {"pw1.w": w(6, 2, 1, 1), "pw1.b": w(6), "dw.w": w(6, 1, 3, 3), "dw.b": w(6), "pw2.w": w(3, 6, 1, 1),
             "pw2.b": w(3), "fc.w": w(3, 3), "fc.b": w(3), "lo": 0.0, "hi": 6.0}
    nodes = [helper.make_node("Conv", ["x", "pw1.w", "pw1.b"], ["a"]),
             helper.make_node("Clip", ["a", "lo", "hi"], ["a6"]),
             helper.make_node("Conv", ["a6", "dw.w", "dw.b"], ["b"], pads=[1, 1, 1, 1], group=6),
             helper.make_node("Clip", ["b", "lo", "hi"], ["b6"]),
             helper.make_node("Conv", ["b6", "pw2.w", "pw2.b"], ["c"]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1)]
    return _model(nodes, inits, [1, 2, 6, 6], [1, 3], "mbconv")


def int8_net(seed=7):
    """conv-relu, depthwise conv-relu6 with a residual add, 3x3 max pooling, 2x2 average pooling,
    global average pooling, Gemm-relu-Gemm: every int8 op and, trained through, their backward."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "c.weight", "c.bias"], ["a"], pads=[1, 1, 1, 1], name="c"),
             helper.make_node("Relu", ["a"], ["ar"], name="r1"),
             helper.make_node("Conv", ["ar", "dw.weight", "dw.bias"], ["d"], pads=[1, 1, 1, 1], group=4, name="dw"),
             helper.make_node("Clip", ["d", "lo", "hi"], ["d6"], name="relu6"),
             helper.make_node("Add", ["ar", "d6"], ["s"], name="res"),
             helper.make_node("MaxPool", ["s"], ["m"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="max"),
             helper.make_node("AveragePool", ["m"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="avg"),
             helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc1.weight", "fc1.bias"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["hr"], name="r2"),
             helper.make_node("Gemm", ["hr", "fc2.weight", "fc2.bias"], ["y"], transB=1, name="fc2")]
    return _model(nodes, {"c.weight": w(4, 1, 3, 3), "c.bias": w(4), "dw.weight": w(4, 1, 3, 3), "dw.bias": w(4),
                          "lo": np.float32(0), "hi": np.float32(6), "fc1.weight": w(6, 4), "fc1.bias": w(6),
                          "fc2.weight": w(3, 6), "fc2.bias": w(3)}, [1, 1, 6, 6], [1, 3], "int8_net")


def int8_block(seed=9, proj=3):
    """An inverted residual: 1x1 expansion-ReLU6, 3x3 stride-2 depthwise-ReLU6 (the int8 lowering
    streams the two as PWDW_Q8), 1x1 projection to proj channels, global average pooling, Gemm."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    n = helper.make_node
    nodes = [n("Conv", ["x", "pw1.weight", "pw1.bias"], ["e"], name="pw1"),
             n("Clip", ["e", "lo", "hi"], ["e6"], name="relu6_1"),
             n("Conv", ["e6", "dw.weight", "dw.bias"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2], group=6, name="dw"),
             n("Clip", ["d", "lo", "hi"], ["d6"], name="relu6_2"),
             n("Conv", ["d6", "pw2.weight", "pw2.bias"], ["p"], name="pw2"),
             n("GlobalAveragePool", ["p"], ["g"], name="gap"),
             n("Flatten", ["g"], ["f"], name="flat"),
             n("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    return _model(nodes, {"pw1.weight": w(6, 2, 1, 1), "pw1.bias": w(6), "dw.weight": w(6, 1, 3, 3), "dw.bias": w(6),
                          "pw2.weight": w(proj, 6, 1, 1), "pw2.bias": w(proj), "lo": np.float32(0),
                          "hi": np.float32(6), "fc.weight": w(2, proj), "fc.bias": w(2)}, [1, 2, 5, 7], [1, 2], "int8_block")


def int8_residual_block(seed=13):
    """A stem (3x3 conv-ReLU6) and an inverted residual on it (1x1 expansion-ReLU6, depthwise
    3x3-ReLU6, 1x1 projection, the stem's output added), global average pooling, Gemm: with the
    projection's bias trained, the expansion streams into it (PWDW_DQ_W8, PWDW_DQ) and the int8
    residual is added undequantized (ADD_DQ)."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    n = helper.make_node
    nodes = [n("Conv", ["x", "s.weight", "s.bias"], ["a"], pads=[1, 1, 1, 1], name="stem"),
             n("Clip", ["a", "lo", "hi"], ["a6"], name="r1"),
             n("Conv", ["a6", "e.weight", "e.bias"], ["d"], name="e"),
             n("Clip", ["d", "lo", "hi"], ["d6"], name="r2"),
             n("Conv", ["d6", "dw.weight", "dw.bias"], ["f"], pads=[1, 1, 1, 1], group=12, name="dw"),
             n("Clip", ["f", "lo", "hi"], ["f6"], name="r3"),
             n("Conv", ["f6", "p.weight", "p.bias"], ["g"], name="p"),
             n("Add", ["g", "a6"], ["r"], name="residual"),
             n("GlobalAveragePool", ["r"], ["h"], name="gap"),
             n("Flatten", ["h"], ["k"], name="flat"),
             n("Gemm", ["k", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    return _model(nodes, {"s.weight": w(2, 1, 3, 3), "s.bias": w(2), "e.weight": w(12, 2, 1, 1), "e.bias": w(12),
                          "dw.weight": w(12, 1, 3, 3), "dw.bias": w(12), "p.weight": w(2, 12, 1, 1), "p.bias": w(2),
                          "lo": np.float32(0), "hi": np.float32(6), "fc.weight": w(2, 2), "fc.bias": w(2)},
                  [1, 1, 8, 8], [1, 2], "int8_residual_block")


def int8_two_blocks(seed=11):
    """A stem (3x3 stride-2 conv-ReLU6, depthwise 3x3-ReLU6, 1x1 projection) and an inverted
    residual (1x1 expansion-ReLU6, depthwise 3x3-ReLU6, 1x1 projection to 2 channels), global
    average pooling, Gemm: int8 with uint8 input, the stem's block piped into the next
    (CONV_DW_PW_Q8_TO_PIPE, _FROM_PIPE)."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.4, s)   # noqa: E731
    n = helper.make_node
    nodes = [n("Conv", ["x", "s.weight", "s.bias"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2], name="stem"),
             n("Clip", ["a", "lo", "hi"], ["a6"], name="r1"),
             n("Conv", ["a6", "dw0.weight", "dw0.bias"], ["b"], pads=[1, 1, 1, 1], group=8, name="dw0"),
             n("Clip", ["b", "lo", "hi"], ["b6"], name="r2"),
             n("Conv", ["b6", "p0.weight", "p0.bias"], ["c"], name="p0"),
             n("Conv", ["c", "e.weight", "e.bias"], ["d"], name="e"),
             n("Clip", ["d", "lo", "hi"], ["d6"], name="r3"),
             n("Conv", ["d6", "dw1.weight", "dw1.bias"], ["f"], pads=[1, 1, 1, 1], group=6, name="dw1"),
             n("Clip", ["f", "lo", "hi"], ["f6"], name="r4"),
             n("Conv", ["f6", "p1.weight", "p1.bias"], ["g"], name="p1"),
             n("GlobalAveragePool", ["g"], ["h"], name="gap"),
             n("Flatten", ["h"], ["k"], name="flat"),
             n("Gemm", ["k", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")]
    return _model(nodes, {"s.weight": w(8, 3, 3, 3), "s.bias": w(8), "dw0.weight": w(8, 1, 3, 3), "dw0.bias": w(8),
                          "p0.weight": w(8, 8, 1, 1), "p0.bias": w(8), "e.weight": w(6, 8, 1, 1), "e.bias": w(6),
                          "dw1.weight": w(6, 1, 3, 3), "dw1.bias": w(6), "p1.weight": w(2, 6, 1, 1), "p1.bias": w(2),
                          "lo": np.float32(0), "hi": np.float32(6), "fc.weight": w(2, 2), "fc.bias": w(2)},
                  [1, 3, 24, 16], [1, 2], "int8_two_blocks")


def masked(seed=9):
    """conv (trains) -> Relu -> 1x1 conv (frozen) -> Clip(0, 6) -> 3x3 conv (frozen): with saved="bits" each
    activation's backward reads a 1-bit mask (MASK_PACK, MASK_BWD); 5 channels of 3x3, 45 bits, so the
    last mask byte is partly used."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.5, s)   # noqa: E731
    n = helper.make_node
    nodes = [n("Conv", ["x", "c.weight", "c.bias"], ["a"], pads=[1, 1, 1, 1], name="c"),
             n("Relu", ["a"], ["r"], name="relu"),
             n("Conv", ["r", "p.weight", "p.bias"], ["b"], name="p"),
             n("Clip", ["b", "lo", "hi"], ["b6"], name="relu6"),
             n("Conv", ["b6", "q.weight", "q.bias"], ["q"], name="q"),
             n("Flatten", ["q"], ["y"], name="flat")]
    return _model(nodes, {"c.weight": w(5, 1, 3, 3), "c.bias": w(5), "p.weight": w(5, 5, 1, 1), "p.bias": w(5),
                          "lo": np.float32(0), "hi": np.float32(6), "q.weight": w(2, 5, 3, 3), "q.bias": w(2)},
                  [1, 1, 3, 3], [1, 2], "masked")


def int8_seeds(c):
    """int8 plans of int8_net (docs/quantization.md): trained through every frozen int8 layer, and
    an int8 prefix with uint8 input ahead of a float last layer; int8_block streamed: the expansion,
    depthwise and projection as one op (CONV_DW_PW_Q8), and the expansion into the depthwise alone
    (PWDW_Q8)."""
    calib = np.random.default_rng(0).normal(0, 1, (16, 1, 6, 6)).astype(np.float32)
    q = dict(quantize="int8", calibration=calib)
    return {
        "int8_through_frozen": c(int8_net(), update=["c.weight", "c.bias", "fc2.weight", "fc2.bias"], lr=0.05,
                                 int8_scope="frozen", **q),
        "int8_prefix_uint8_input": c(int8_net(seed=8), update="last-layer", lr=0.05, momentum=0.9,
                                     input_dtype="uint8", input_quant=(1 / 255, 0), **q),
        "int8_input_in_place": c(int8_net(seed=9), update="last-layer", lr=0.05, input_dtype="int8",
                                 input_quant=(1 / 127, 0), input_in_place=True, **q),
        "int8_streamed_block": c(int8_block(), update="last-layer", lr=0.05, quantize="int8",
                                 calibration=np.random.default_rng(1).normal(0, 1, (16, 2, 5, 7)).astype("f4")),
        "int8_streamed_expansion": c(int8_block(), update="last-layer", lr=0.05, quantize="int8", int8_fuse="pwdw",
                                     calibration=np.random.default_rng(1).normal(0, 1, (16, 2, 5, 7)).astype("f4")),
        # the pipe's ops with rings of one channel (ring_channels.py)
        "int8_piped_blocks": c(int8_two_blocks(), update="last-layer", lr=0.05, quantize="int8", input_dtype="uint8",
                               input_quant=(1 / 255, 0),
                               calibration=np.random.default_rng(3).uniform(0, 1, (16, 3, 24, 16)).astype("f4")),
        # the int8 prefix's last tensor read by the projection (its bias training) a channel at a time
        # (dq_conv.py: CONV2D_DQ_W8; 8 outputs from 6 channels, so not CONV2D_PW_INPLACE_W8 instead)
        "int8_block_dq_projection": c(int8_block(proj=8), update=["pw2.bias", "fc.weight", "fc.bias"], lr=0.05, momentum=0.9,
                                      quantize="int8", frozen_weights="int8",
                                      calibration=np.random.default_rng(1).normal(0, 1, (16, 2, 5, 7)).astype("f4")),
        # and with its weight float32 (CONV2D_DQ)
        "int8_block_dq_projection_f32": c(int8_block(proj=8), update=["pw2.bias", "fc.weight", "fc.bias"], lr=0.05,
                                          quantize="int8", calibration=np.random.default_rng(1).normal(0, 1, (16, 2, 5, 7))
                                          .astype("f4")),
        # the expansion streamed into the projection a row at a time, the residual added from int8 (dq_conv.py)
        "int8_block_streamed_projection": c(int8_residual_block(), update=["p.bias", "fc.weight", "fc.bias"], lr=0.05,
                                            quantize="int8", frozen_weights="int8",
                                            calibration=np.random.default_rng(4).normal(0, 1, (16, 1, 8, 8))
                                            .astype("f4")),
        "int8_block_streamed_projection_f32": c(int8_residual_block(seed=14), update=["p.bias", "fc.weight", "fc.bias"],
                                                lr=0.05, momentum=0.9, quantize="int8",
                                                calibration=np.random.default_rng(4).normal(0, 1, (16, 1, 8, 8))
                                                .astype("f4")),
        # unfused, the int8 depthwise conv runs over its input (CONV2D_Q8_DW_INPLACE)
        "int8_depthwise_in_place": c(mbconv(), update="last-layer", lr=0.05, quantize="int8", int8_fuse=False,
                                     calibration=np.random.default_rng(2).normal(0, 1, (16, 2, 6, 6)).astype("f4")),
    }


def out_update(name):
    """The int8-weight seeds' selections: a channel-sparse scheme, or everything."""
    if name.endswith("batch2"):
        return "full"
    return {"classifier": "full", "weight_updates": [
        {"initializer": "c1.weight", "channel_axis": 1, "selected_channels": [1]},
        {"initializer": "dw.weight", "channel_axis": 0, "selected_channels": [0, 2]}]}


def seeds():
    """{name: Plan}"""
    mlp, cnn = models.mlp, models.cnn
    c = microtrain.compile
    out = {
        "mlp_ce_full_mom": c(mlp(n_in=8, hidden=6, n_out=3), update="full", lr=0.05, momentum=0.9),
        "mlp_ce_full_sgd_wd": c(mlp(n_in=6, hidden=5, n_out=4, seed=1), update="full", lr=0.1, weight_decay=0.01),
        "mlp_mse_batch2": c(mlp(n_in=5, hidden=4, n_out=2, seed=2), update="full", loss="mse", lr=0.05, batch=2),
        "mlp_mse_batch3_mom_wd": c(mlp(n_in=4, hidden=3, n_out=1, seed=3), update="full", loss="mse", lr=0.05,
                                   momentum=0.5, weight_decay=0.001, batch=3),
        "mlp_bias_only": c(mlp(seed=4), update="bias", lr=0.05),
        "mlp_naive_planner": c(mlp(seed=5), update="full", lr=0.05, planner="naive"),
        "cnn_mse_full_batch2": c(cnn(seed=2, hw=6, n_out=3), update="full", loss="mse", lr=0.02, momentum=0.9,
                                 batch=2),
        "cnn_ce_last_layer": c(cnn(seed=3, hw=6, n_out=3), update="last-layer", lr=0.05),
        "cnn_input_in_place": c(cnn(seed=4, hw=6, n_out=3), update="full", lr=0.05, input_in_place=True),
        "cnn_ce_last2_mom": c(cnn(seed=4, hw=6, n_out=3), update="last:2", lr=0.05, momentum=0.9),
        "cnn_ce_full": c(cnn(seed=5, hw=4, n_out=2), update="full", lr=0.05),   # the first conv replayed
        # every saved activation kept to its backward (no forward op in the TRAIN phase: recompute.py)
        "cnn_ce_full_kept": c(cnn(seed=5, hw=4, n_out=2), update="full", lr=0.05, recompute=False),
        "pools_ce_full": c(pools(), update="full", lr=0.05, momentum=0.9),
        "pools_mse_batch2": c(pools(seed=3), update="full", loss="mse", lr=0.05, batch=2),
        "avg_exclude_pad": c(avg_exclude_pad(), update="full", lr=0.05),
        "tied_batch1": c(tied(), update="full", lr=0.05, momentum=0.9),
        "tied_batch2": c(tied(seed=4), update="full", loss="mse", lr=0.05, batch=2),
        "mlp_clip_grad": c(mlp(n_in=6, hidden=5, n_out=3, seed=6), update="full", lr=0.1, momentum=0.9, clip_grad=0.5),
        "cnn_mse_clip_grad_batch2": c(cnn(seed=6, hw=4, n_out=2), update="last:2", loss="mse", lr=0.05, batch=2,
                                      clip_grad=1.0),
        "mobile_ops_full_mom": c(mobile_ops(), update="full", lr=0.05, momentum=0.9),
        "mobile_ops_mse_batch2": c(mobile_ops(seed=4), update="full", loss="mse", lr=0.05, batch=2),
        # frozen weights: the depthwise conv and its input gradient run in place (CONV2D_DW_INPLACE,
        # CONV2D_BWD_INPUT_DW_INPLACE)
        "mbconv_bias_saved_int8": c(mbconv(), update="bias", lr=0.05, momentum=0.9, saved="int8"),
        # the 1x1 projection, frozen, writes over its input where the live bytes peak (CONV2D_PW_INPLACE)
        "mbconv_projection_in_place": c(mbconv(seed=10), update=["pw2.b", "fc.w", "fc.b"], lr=0.05, momentum=0.9),
        # and with its weight int8 (CONV2D_PW_INPLACE_W8)
        "mbconv_projection_in_place_w8": c(mbconv(seed=10), update=["pw2.b", "fc.w", "fc.b"], lr=0.05, momentum=0.9,
                                           frozen_weights="int8"),
        "digits_cnn_last_layer": c(os.path.join(ROOT, "examples", "digits_cnn.onnx"), update="last-layer",
                                   lr=0.05, momentum=0.9),
        # channel-sparse: c1 and pw train on some input channels, dw on some of its channels
        # (GATHER_CH, SCATTER_ACC_CH)
        "cnn_channel_sparse": c(cnn(seed=7, hw=6, n_out=3), lr=0.05, momentum=0.9, update={
            "classifier": "full", "bias_updates": [{"initializer": "dw.bias"}],
            "weight_updates": [{"initializer": "c1.weight", "channel_axis": 1, "selected_channels": [1]},
                               {"initializer": "dw.weight", "channel_axis": 0, "selected_channels": [0, 2, 3]},
                               {"initializer": "pw.weight", "channel_axis": 1, "selected_channels": [3, 0]}]}),
    }
    # a split conv behind a view: its gathered channels' gradient through SCATTER_CH and ADD
    out["split_behind_view"] = c(models.conv_view_conv(), update=models.SPLIT_VIEW_SCHEME, lr=0.05)
    out["masks_bits_mom"] = c(masked(), update=["c.weight", "c.bias"], lr=0.05, momentum=0.9, saved="bits")
    # frozen conv weights int8 (w8.py): CONV2D_W8, the depthwise in place and the input gradients
    out["mbconv_bias_w8"] = c(mbconv(), update="bias", lr=0.05, momentum=0.9, saved="int8", frozen_weights="int8")
    # the block streamed a channel at a time (dw_stream.py: PWDW_W8, PWDW_W8_BWD), the expansion split
    out["mbconv_streamed"] = c(mbconv(), lr=0.05, momentum=0.9, saved="bits", frozen_weights="int8",
                               trained_weights="int8", update={
                                   "classifier": "full", "bias_updates": [{"initializer": "pw1.b"}, {"initializer": "dw.b"}],
                                   "weight_updates": [{"initializer": "pw1.w", "channel_axis": 1, "selected_channels": [1]}]})
    # trained weights int8 (DEQUANTIZE_W, int8 parameters in the sinks and in an SGD op with batch 2)
    for name, kw in (("int8_weights_sparse_mom", dict(momentum=0.9)), ("int8_weights_full_batch2", dict(batch=2))):
        out[name] = c(cnn(seed=8, hw=6, n_out=3), lr=0.05, trained_weights="int8",
                      update=out_update(name), **kw)
    out.update(int8_seeds(c))
    # the piped blocks with rings of every channel (ring_channels.py off: int8_piped_blocks has one)
    real = microtrain.compiler.one_channel_rings
    microtrain.compiler.one_channel_rings = lambda *a, **k: []
    try:
        out["int8_piped_blocks_all_channels"] = c(
            int8_two_blocks(), update="last-layer", lr=0.05, quantize="int8", input_dtype="uint8",
            input_quant=(1 / 255, 0), calibration=np.random.default_rng(3).uniform(0, 1, (16, 3, 24, 16)).astype("f4"))
    finally:
        microtrain.compiler.one_channel_rings = real
    return out


def op_codes(plan):
    """The op codes and tensor dtypes a plan holds."""
    codes, pos, h = set(), plan.header["ops_off"], plan.header
    for _ in range(h["n_ops"]):
        code, _, _, _, pos = F.unpack_op(plan.data, pos)
        codes.add(code)
    dtypes = {F.unpack_tensor(plan.data, h["tensors_off"] + i * F.TENSOR_BYTES)["dtype"] for i in range(h["n_tensors"])}
    return codes, dtypes


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    seen, dtypes = set(), set()
    for name, plan in seeds().items():
        with open(os.path.join(out_dir, name + ".mtp"), "wb") as f:
            f.write(plan.data)
        c, d = op_codes(plan)
        seen |= c
        dtypes |= d
    names = {v[0]: k for k, v in F.DTYPES.items()}
    print("seed corpus: %d plans in %s; ops %s; dtypes %s" % (
        len(seeds()), out_dir, ", ".join(F.OPS_BY_CODE[k].name for k in sorted(seen)),
        ", ".join(names[k] for k in sorted(dtypes))))
    missing = sorted(set(F.OPS_BY_CODE) - seen)
    if missing:
        print("no seed reaches op(s) %s: add a model to fuzz/make_corpus.py"
              % ", ".join(F.OPS_BY_CODE[k].name for k in missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "fuzz", "seeds")))
