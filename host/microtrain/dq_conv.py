"""An int8 prefix's last tensor into its first float conv without its float copy whole (CONV2D_DQ_W8,
CONV2D_DQ).

Where the frozen int8 prefix ends, its last int8 tensor is dequantized whole (DEQUANTIZE: 4x its
bytes) for the first float layer. Where that float tensor is read by one conv of groups 1 with a
frozen weight (CONV2D_W8, or CONV2D with frozen_weights="float32") and by nothing else (no
backward reads it), the pair becomes CONV2D_DQ_W8 or CONV2D_DQ, which dequantizes K input
channels at a time into K float planes and sums them on into the output (mt_conv.c). Each output
adds its terms channel after channel, so the output is the pair's bit for bit whatever K. K: the
planes fill at most a quarter of the int8 tensor's bytes (DQ_SHARE), at least one plane.
MbV2-w0.35 138kb: blocks.5's depthwise output was 96 KB as float beside its 24 KB int8 self.
"""
from __future__ import annotations

from .training import TOp, TTensor
from .w8 import MAX_TAPS

DQ_SHARE = 4   # the float planes at most 1/4 of the int8 input's bytes
DQ_FORM = {"CONV2D_W8": "CONV2D_DQ_W8", "CONV2D": "CONV2D_DQ"}   # same attributes; x int8, planes xs last


def planes(channels):
    """K, the input channels dequantized at a time: K*H*W floats at most the int8 tensor's C*H*W
    bytes / DQ_SHARE, at least one plane. Any K gives the same sums; the kernel cuts the filters
    into its stack buffer's chunks itself."""
    return max(1, channels // (DQ_SHARE * 4))


def kernel_takes(w, attrs):
    """What mt_conv.c's CONV2D_DQ(_W8) takes (its load check refuses the rest): groups 1, the
    filters within its stack buffer."""
    return attrs["groups"] == 1 and w.shape[2] * w.shape[3] <= MAX_TAPS


def fuse_dequantize_conv(tensors, ops):
    """ops with each DEQUANTIZE whose output only one groups-1 CONV2D_W8 or CONV2D with a constant
    weight reads fused into it (DQ_FORM); appends the scratch planes to tensors. Returns (ops, the
    fused convs' sources)."""
    touched = {}
    for k, o in enumerate(ops):
        for t in o.slots:
            if t is not None:
                touched.setdefault(t, set()).add(k)
    viewed = {t.view_of for t in tensors if t.view_of is not None}
    drop, fused = set(), []
    ops = list(ops)
    for k, d in enumerate(ops):
        if d.name != "DEQUANTIZE":
            continue
        xq, xf = d.slots
        users = touched.get(xf, set()) - {k}
        if len(users) != 1 or xf in viewed or tensors[xf].flags or tensors[xf].view_of is not None:
            continue
        c = next(iter(users))
        conv = ops[c]
        a = dict(zip(conv.spec.attrs, conv.attrs))
        w = tensors[conv.slots[1]] if conv.name in DQ_FORM else None
        if w is None or w.storage != "CONST" or len(w.shape) != 4 or not kernel_takes(w, a) or c < k \
                or conv.slots[0] != xf or conv.slots.count(xf) != 1 or conv.phase != d.phase:
            continue
        # the int8 tensor is read at the conv now: nothing may write it (or its memory) between
        mem = {xq, tensors[xq].view_of} - {None}
        if any(tensors[t].view_of in mem or t in mem
               for o in ops[k + 1:c] for s, t in zip(o.spec.slots, o.slots) if t is not None and s.role != "in"):
            continue
        x = tensors[xq]
        K = planes(x.shape[1])
        tensors.append(TTensor(tensors[xf].name + "@planes", (K, x.shape[2], x.shape[3])))
        ops[c] = TOp(DQ_FORM[conv.name], conv.phase, [xq] + conv.slots[1:] + [len(tensors) - 1], list(conv.attrs),
                     conv.source, conv.macs)
        drop.add(k)
        fused.append(conv.source)
    return [o for k, o in enumerate(ops) if k not in drop], fused
