"""The plan ops of the int8 IR nodes (quantize.py makes them): one forward rule and,
where a gradient passes through a frozen int8 node, one backward rule per node kind.

Gradients are float32 and belong to the real (dequantized) values: DEQUANTIZE passes
its gradient on; QUANTIZE and every clamped int8 output pass it where the saved int8
output lies strictly inside its clamp (CLIP_BWD_Q8: ReLU, ReLU6, saturation, as
PyTorch's hardtanh); convolutions and Gemms send it back through their int8 weights
times the per-channel scales (CONV2D_BWD_INPUT_Q8, GEMM_BWD_INPUT_Q8). Their weights
and biases never train here: a trainable layer is float32 (quantize.py keeps it so).
"""
from __future__ import annotations

import numpy as np

from . import format as F
from .lowered import TTensor

QMIN, QMAX = -128, 127


def _conv_attrs(a):
    return [a[k] for k in F.CONV_ATTRS]


def _pool_attrs(a):
    return [a[k] for k in F.POOL_ATTRS]


def quantize(b, n, ins, y):
    return b.op("QUANTIZE", "FORWARD", [ins[0], y], [], n.onnx_name)


def dequantize(b, n, ins, y):
    return b.op("DEQUANTIZE", "FORWARD", [ins[0], y], [], n.onnx_name)


def qconv(b, n, ins, y):
    w, ys = b.tensors[ins[1]], b.tensors[y].shape
    macs = ys[1] * ys[2] * ys[3] * int(np.prod(w.shape[1:]))
    return b.op("CONV2D_Q8", "FORWARD", ins + [y], _conv_attrs(n.attrs) + [n.attrs["act_min"], n.attrs["act_max"]],
                n.onnx_name, macs)


def qpwdw(b, n, ins, y):
    """A 1x1 conv streamed into a depthwise conv (q8_fuse.py): the expanded tensor exists as its
    ring of rows only, an arena tensor of this op alone."""
    name, shape, q = n.attrs["ring"]
    ring = b.tensor(TTensor(name, shape, dtype="I8", quant=q))
    w, ys = b.tensors[ins[5]], b.tensors[y].shape
    macs = n.attrs["macs"] + ys[1] * ys[2] * ys[3] * int(np.prod(w.shape[1:]))
    attrs = _conv_attrs(n.attrs) + [n.attrs[k] for k in ("act_min", "act_max", "act_min1", "act_max1")]
    return b.op("PWDW_Q8", "FORWARD", ins + [ring, y], attrs, n.onnx_name, macs)


def qcdp(b, n, ins, y):
    """A conv streamed into a depthwise conv streamed into a 1x1 conv (q8_fuse.py): the first
    conv's output exists as its ring of rows, the depthwise output as one row, arena tensors of
    this op alone."""
    scratch = [b.tensor(TTensor(name, shape, dtype="I8", quant=q)) for name, shape, q in (n.attrs["ring"],
                                                                                       n.attrs["row"])]
    w, ys = b.tensors[ins[9]], b.tensors[y].shape
    macs = n.attrs["macs"] + ys[1] * ys[2] * ys[3] * int(np.prod(w.shape[1:]))
    spec = F.OPS_BY_NAME["CONV_DW_PW_Q8"]
    attrs = [n.attrs[k] for k in spec.attrs]
    name = "CONV_DW_PW_Q8"
    if n.attrs.get("pipe_in"):   # x exists as the pipe the op before writes (q8_fuse.pipe_pairs)
        ins = [b.pipes.pop(n.inputs[0])] + ins[1:]
        name, attrs = "CONV_DW_PW_Q8_FROM_PIPE", attrs + [n.attrs["pipe_in"]]
    if n.attrs.get("pipe_out"):   # y exists as a pipe of its last rows, which the next op reads
        pname, shape, q = n.attrs["pipe_out"]
        b.pipes[n.output] = b.tensor(TTensor(pname, shape, dtype="I8", quant=q))
        name, attrs, y = "CONV_DW_PW_Q8_TO_PIPE", attrs + [ys[2]], b.pipes[n.output]
    return b.op(name, "FORWARD", ins + scratch + [y], attrs, n.onnx_name, macs)


def qgemm(b, n, ins, y):
    return b.op("GEMM_Q8", "FORWARD", ins + [y], [n.attrs["w_layout"], n.attrs["act_min"], n.attrs["act_max"]],
                n.onnx_name, b.tensors[ins[1]].nbytes)


def qadd(b, n, ins, y):
    spec = F.OPS_BY_NAME["ADD_Q8"]
    return b.op("ADD_Q8", "FORWARD", [ins[0], ins[1], y], [n.attrs[k] for k in spec.attrs], n.onnx_name)


def qmaxpool(b, n, ins, y):
    return b.op("MAXPOOL_Q8", "FORWARD", [ins[0], y], _pool_attrs(n.attrs), n.onnx_name)


def qavgpool(b, n, ins, y):
    return b.op("AVGPOOL_Q8", "FORWARD", ins + [y], _pool_attrs(n.attrs), n.onnx_name)


def qgap(b, n, ins, y):
    return b.op("GAP_Q8", "FORWARD", [ins[0], y], [n.attrs["mult"], n.attrs["shift"]], n.onnx_name)


FORWARD = {"quantize": quantize, "dequantize": dequantize, "qconv": qconv, "qpwdw": qpwdw, "qcdp": qcdp, "qgemm": qgemm,
           "qadd": qadd, "qmaxpool": qmaxpool, "qavgpool": qavgpool, "qgap": qgap}


# ---- backward through frozen int8 nodes ----

def _mask(b, n, y, dy, lo, hi):
    """dy where the int8 output y lies strictly inside (lo, hi); dy itself when nothing clamps."""
    d = b.grad_tensor(n.output + "@clamp", y)
    b.op("CLIP_BWD_Q8", "TRAIN", [y, dy, d], [lo, hi], n.onnx_name)
    return d


def back_dequantize(b, n, dy, ins):
    b.contribute(n.inputs[0], dy)


def back_quantize(b, n, dy, ins):
    b.contribute(n.inputs[0], _mask(b, n, b.index[n.output], dy, QMIN, QMAX))


def back_layer(b, n, dy, ins):
    """qconv, qgemm: the input's gradient through the int8 weight (the layer itself is frozen)."""
    x = n.inputs[0]
    if x not in b.needs:
        return
    d = _mask(b, n, b.index[n.output], dy, n.attrs["act_min"], n.attrs["act_max"])
    dx = b.grad_tensor(x, ins[0])
    if n.op == "qconv":
        b.op("CONV2D_BWD_INPUT_Q8", "TRAIN", [d, ins[1], dx], _conv_attrs(n.attrs), n.onnx_name, b.fwd[n.output].macs)
    else:
        b.op("GEMM_BWD_INPUT_Q8", "TRAIN", [d, ins[1], dx], [n.attrs["w_layout"]], n.onnx_name)
    b.contribute(x, dx)


def back_qadd(b, n, dy, ins):
    d = _mask(b, n, b.index[n.output], dy, n.attrs["act_min"], n.attrs["act_max"])
    for name in n.inputs:
        b.contribute(name, d)


def back_pool(b, n, dy, ins):
    """Average pooling's gradient does not depend on the values: the float kernels serve, after
    the mask of the output's saturation."""
    x = n.inputs[0]
    if x not in b.needs:
        return
    d = _mask(b, n, b.index[n.output], dy, QMIN, QMAX)
    dx = b.grad_tensor(x, ins[0])
    if n.op == "qavgpool":
        b.op("AVGPOOL_BWD", "TRAIN", [d, dx], _pool_attrs(n.attrs), n.onnx_name)
    else:
        b.op("GAP_BWD", "TRAIN", [d, dx], [], n.onnx_name)
    b.contribute(x, dx)


def back_maxpool(b, n, dy, ins):
    """Each output's gradient to its window's first maximum (the output keeps the input's scale, so
    it never saturates where the input did not)."""
    x = n.inputs[0]
    if x in b.needs:
        dx = b.grad_tensor(x, ins[0])
        b.op("MAXPOOL_BWD_Q8", "TRAIN", [ins[0], dy, dx], _pool_attrs(n.attrs), n.onnx_name)
        b.contribute(x, dx)


BACKWARD = {"dequantize": back_dequantize, "quantize": back_quantize, "qconv": back_layer, "qgemm": back_layer,
            "qadd": back_qadd, "qavgpool": back_pool, "qgap": back_pool, "qmaxpool": back_maxpool}
