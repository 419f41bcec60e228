"""Trained weights stored as int8 (compile(trained_weights="int8"), docs/sparse.md).

Run on the training plan's (tensors, ops) before memory is assigned. Every trainable conv or
Gemm weight (a whole weight, a channel-sparse one, or a split weight's `W@trained` slice) becomes
an I8 state tensor with one float scale per output channel, fixed here from its initial values:
scale = max|w| / 127 over the channel (a channel of zeros takes the weight's largest scale,
2^-7 if the whole weight is 0), codes = clamp(round_half_even(w / scale), -127, 127). Biases
stay float32. The input gradient reads the int8 weight itself (CONV2D_BWD_INPUT_Q8,
GEMM_BWD_INPUT_Q8, the kernels of frozen int8 layers); so do the forward convolutions whose
filters fit the W8 kernels (CONV2D_W8, CONV2D_ACC_W8, CONV2D_DW_INPLACE_W8, CONV2D_PW_INPLACE_W8,
CONV2D_BWD_INPUT_DW_INPLACE_W8: at most 64 taps, w8.py; the same bits as the float op on the
dequantized weight). Every other op that reads the weight (a Gemm, a larger filter) reads a float
copy that a DEQUANTIZE_W op makes just before it, so the copy lives in the arena for that op only; the
weight-gradient ops' sink updates the codes in place (mt_optim.c):
w <- clamp(round_half_even((w * s - lr * g) / s), -127, 127).
"""
from __future__ import annotations

import numpy as np

from . import format as F
from .ir import Quant
from .lowered import TTensor

GEMM_OPS = ("GEMM", "GEMM_BWD_INPUT", "GEMM_BWD_WEIGHT")
READS_INT8 = {"CONV2D_BWD_INPUT": "CONV2D_BWD_INPUT_Q8", "GEMM_BWD_INPUT": "GEMM_BWD_INPUT_Q8"}   # same slots
READS_W8 = {"CONV2D": "CONV2D_W8", "CONV2D_ACC": "CONV2D_ACC_W8", "CONV2D_DW_INPLACE": "CONV2D_DW_INPLACE_W8",
            "CONV2D_PW_INPLACE": "CONV2D_PW_INPLACE_W8",
            "CONV2D_BWD_INPUT_DW_INPLACE": "CONV2D_BWD_INPUT_DW_INPLACE_W8"}   # same slots, the weight int8
W8_TAPS = 64   # MT_W8_BUF (mt_conv.c): the W8 kernels' filters
ZERO_WEIGHT_SCALE = 2.0 ** -7


def channel_scales(w, axis):
    """float32 scales, one per index of `axis`: max|w| / 127 over the rest."""
    a = np.abs(np.moveaxis(np.asarray(w, np.float32), axis, 0)).reshape(w.shape[axis], -1).max(axis=1)
    s = (a / np.float32(127)).astype(np.float32)
    s[s == 0] = s.max() if s.max() > 0 else np.float32(ZERO_WEIGHT_SCALE)
    return s


def quantize_codes(w, scales, axis):
    """clamp(round_half_even(w / scale), -127, 127), in float32 as the core rounds."""
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.rint(np.asarray(w, np.float32) / scales.reshape(shape))
    return np.clip(q, -127, 127).astype(np.int8)


def trained_weights(tensors, ops):
    """{tensor index: channel axis} of the trainable conv/Gemm weights: parameters read in a
    weight slot `w` by an op that is not a bias gradient or an SGD (biases are float32)."""
    out = {}
    for o in ops:
        if "w" not in [s.name for s in o.spec.slots] or o.name in ("BIAS_BWD", "SGD"):
            continue
        i = o.slots[o.spec.slot_index("w")]
        t = tensors[i]
        if not t.flags & F.TFLAGS["PARAM"]:
            continue
        axis = 1 if o.name in GEMM_OPS and o.attrs[0] == F.W_LAYOUT_IN_OUT else 0
        if out.setdefault(i, axis) != axis:
            raise ValueError("weight %r is read in two layouts; trained_weights='int8' needs one" % t.name)
    return out


def store_int8(tensors, ops):
    """Make the trainable conv/Gemm weights int8 (see the module docstring); returns the ops
    with a DEQUANTIZE_W before each op that reads such a weight as its input."""
    weights = trained_weights(tensors, ops)
    for i, axis in weights.items():
        t = tensors[i]
        w = np.asarray(t.data, np.float32)
        s = channel_scales(w, axis)
        t.data, t.dtype = quantize_codes(w, s, axis), "I8"
        t.quant = Quant(s, np.zeros(len(s), np.int32), axis)
    out = []
    for o in ops:
        w = o.slots[o.spec.slot_index("w")] if "w" in [sl.name for sl in o.spec.slots] else None
        if o.name in READS_INT8 and w in weights:
            o.name = READS_INT8[o.name]
        elif o.name in READS_W8 and w in weights and int(np.prod(tensors[w].shape[2:])) <= W8_TAPS:
            o.name = READS_W8[o.name]
        for k, slot in enumerate(o.spec.slots):
            i = o.slots[k]
            if slot.role != "in" or i not in weights or slot.dtype == "I8":
                continue
            n = sum(1 for t in tensors if t.name.startswith(tensors[i].name + "@f32"))
            f = len(tensors)
            tensors.append(TTensor("%s@f32%s" % (tensors[i].name, "+%d" % n if n else ""), tensors[i].shape,
                                   onnx_shape=tensors[i].onnx_shape))
            out.append(type(o)("DEQUANTIZE_W", o.phase, [i, f], [], o.source))
            o.slots[k] = f
        out.append(o)
    return out
