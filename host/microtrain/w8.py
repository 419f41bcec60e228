"""Frozen weights of float layers stored as int8 (compile(frozen_weights="int8"), "W8").

With quantize="int8" the frozen layers before the first trainable one run int8; every layer
from there on runs float32, with its weight in float32 even where only its bias trains (MIT's
schemes train many biases) or where it is the frozen part of a split weight (split.py). Those
weights are most of a sparse plan's bytes (MCUNet-5fps 49kb: 1.65 of 1.84 MB). This pass, run
on the training ops, stores each such frozen conv weight as int8 with one symmetric scale per
output channel (the quantizer's weights, max |w| / 127, quantize.weight_quant) and switches
every op that reads it to its int8-weight form: the activations and gradients stay float32 and
each op computes exactly the float op on the dequantized weight W' = float32(q) * scale[o]
(mt_conv.c, the W8 ops). A weight is left float when any reader has no such form (a Gemm, a
weight-gradient op) or its filters are larger than the kernels' buffer.
"""
from __future__ import annotations

import numpy as np

from .quantize import quantize_weight, weight_quant

# the float op -> its int8-weight form (same slots and attributes)
W8_FORM = {
    "CONV2D": "CONV2D_W8",
    "CONV2D_DW_INPLACE": "CONV2D_DW_INPLACE_W8",
    "CONV2D_PW_INPLACE": "CONV2D_PW_INPLACE_W8",
    "CONV2D_BWD_INPUT": "CONV2D_BWD_INPUT_W8",
    "CONV2D_BWD_INPUT_DW_INPLACE": "CONV2D_BWD_INPUT_DW_INPLACE_W8",
}
MAX_TAPS = 64   # MT_W8_BUF in mt_conv.c: the dequantized filters on the stack


def dequantize(q, quant):
    """The float32 weight the W8 kernels compute with: float32(q) * scale[o] in float32."""
    scale = np.asarray(quant.scale, np.float32).reshape((-1,) + (1,) * (np.ndim(q) - 1))
    return np.asarray(q, np.float32) * scale


def int8_frozen_weights(tensors, ops):
    """Turn every frozen float32 conv weight whose readers all have an int8-weight form into int8
    (tensors and ops changed in place); the names of the weights turned."""
    readers = {}
    for k, o in enumerate(ops):
        for s, t in zip(o.spec.slots, o.slots):
            if t is not None and tensors[t].storage == "CONST":
                readers.setdefault(t, []).append((k, s.name))
    turned = []
    for t, uses in sorted(readers.items()):
        w = tensors[t]
        if w.dtype != "F32" or w.view_of is not None or len(w.shape) != 4 or w.shape[2] * w.shape[3] > MAX_TAPS:
            continue
        if not all(slot == "w" and ops[k].name in W8_FORM for k, slot in uses):
            continue
        q = weight_quant(w.data, axis=0)
        w.data, w.dtype, w.quant = quantize_weight(w.data, q), "I8", q
        for k, _ in uses:
            ops[k].name = W8_FORM[ops[k].name]
        turned.append(w.name)
    return turned
