"""Streaming the int8 inverted-residual expansion: a 1x1 int8 conv whose only reader is a
depthwise int8 conv becomes one PWDW_Q8 node (modules/microtrain/mt_pwdw_q8.c), so the
expanded tensor, the largest of an MCU network's first blocks, is never stored: the depthwise
reads its rows from a ring of (k-1)*dilation+1 rows. The integers are those of the two convs.

Only where no gradient passes: the expanded tensor would be saved for a backward otherwise
(CLIP_BWD_Q8 reads it), so a block downstream of a trainable layer stays two ops.
"""
from __future__ import annotations

POINTWISE = dict(stride_h=1, stride_w=1, pad_t=0, pad_l=0, pad_b=0, pad_r=0, dil_h=1, dil_w=1, groups=1)


def _is_pointwise(n, values):
    return n.op == "qconv" and values[n.inputs[1]].data.shape[2:] == (1, 1) \
        and all(n.attrs[k] == v for k, v in POINTWISE.items())


def _is_depthwise_of(n, e, values):
    E = values[e].shape[1]
    return n.op == "qconv" and n.inputs[0] == e and n.attrs["groups"] == E \
        and values[n.inputs[1]].data.shape[:2] == (E, 1)


def _ring_rows(d, values):
    """Rows of the expanded tensor one depthwise window spans: (k-1)*dilation+1."""
    return (values[d.inputs[1]].data.shape[2] - 1) * d.attrs["dil_h"] + 1


def _fused(n, d, values):
    """The qpwdw node of 1x1 qconv n and depthwise qconv d."""
    from .ir import Node
    ve = values[n.output]
    attrs = dict(d.attrs, act_min1=n.attrs["act_min"], act_max1=n.attrs["act_max"],
                 ring=(n.output + "/ring", (_ring_rows(d, values), ve.shape[1], ve.shape[3]), ve.quant),
                 macs=ve.size * values[n.inputs[1]].data.shape[1])
    ins1, ins2 = ((m.inputs + [None] * 5)[:5] for m in (n, d))   # x w b mult shift
    return Node("qpwdw", ins1 + ins2[1:], d.output, attrs, n.onnx_name + "+" + d.onnx_name, dict(d.parts))


def fuse_pwdw(nodes, values, trainable, keep=()):
    """nodes with each (1x1 qconv, depthwise qconv) pair whose expanded tensor nothing else reads
    (no other node, no view, not in `keep`) and no gradient crosses replaced by a qpwdw node,
    where the ring is shorter than the expanded tensor (else it saves nothing)."""
    def root(name):
        while values[name].view_of is not None:
            name = values[name].view_of
        return name

    grads = set(trainable)   # values downstream of a trainable parameter (their nodes pass gradients)
    readers = {}
    for n in nodes:
        if any(i in grads or root(i) in grads for i in n.inputs if i):
            grads.add(n.output)
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(n)
    viewed = {v.view_of for v in values.values() if v.view_of is not None}
    out, skip = [], set()
    for k, n in enumerate(nodes):
        if id(n) in skip:
            continue
        d, e = nodes[k + 1] if k + 1 < len(nodes) else None, n.output
        users = readers.get(e, [])
        if (d is not None and _is_pointwise(n, values) and len(users) == 1 and users[0] is d
                and _is_depthwise_of(d, e, values) and e not in viewed and e not in keep and e not in grads
                and _ring_rows(d, values) < values[e].shape[2]):
            out.append(_fused(n, d, values))
            skip.add(id(d))
        else:
            out.append(n)
    return out
