"""Streaming int8 convolutions so that their large tensors are never stored.

- A conv (any kernel and stride, groups 1) whose only reader is a depthwise int8 conv whose only
  reader is a 1x1 int8 conv becomes one CONV_DW_PW_Q8 node (modules/microtrain/mt_cdp_q8.c):
  the first conv's output lives as a ring of (k-1)*dilation+1 rows, the depthwise output as one
  row. An MCU network's stem with its first block, and each inverted-residual block (1x1
  expansion, depthwise, 1x1 projection), then hold only their input and output.
- Otherwise a 1x1 int8 conv whose only reader is a depthwise int8 conv becomes one PWDW_Q8 node
  (modules/microtrain/mt_pwdw_q8.c): the expanded tensor, the largest of an MCU network's first
  blocks, lives as its ring of rows only.
- Two CONV_DW_PW_Q8 nodes in a row, the second reading the first's output alone, become a pipe
  (pipe_pairs): the first's output lives as the rows one window of the second's first conv
  spans, and the second runs the first a row at a time (CONV_DW_PW_Q8_TO_PIPE and _FROM_PIPE):
  an MCU network's stem output, the largest int8 tensor it has, is never stored.
The integers are those of the separate convs.

Only where no gradient passes: the streamed tensors would be saved for a backward otherwise
(CLIP_BWD_Q8 reads them), so a block downstream of a trainable layer stays separate ops.
"""
from __future__ import annotations

import numpy as np

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


def _fused3(n, d, p, values):
    """The qcdp node of qconv n (groups 1), depthwise qconv d and 1x1 qconv p."""
    from .ir import Node
    ve, vd = values[n.output], values[d.output]
    dw = {"dw_" + k: d.attrs[k] for k in ("stride_h", "stride_w", "pad_t", "pad_l", "pad_b", "pad_r", "dil_h",
                                           "dil_w")}
    attrs = dict({k: n.attrs[k] for k in POINTWISE}, **dw, act_min0=n.attrs["act_min"], act_max0=n.attrs["act_max"],
                 act_min1=d.attrs["act_min"], act_max1=d.attrs["act_max"], act_min=p.attrs["act_min"],
                 act_max=p.attrs["act_max"],
                 ring=(n.output + "/ring", (_ring_rows(d, values), ve.shape[1], ve.shape[3]), ve.quant),
                 row=(d.output + "/row", (vd.shape[1], vd.shape[3]), vd.quant),
                 macs=ve.size * int(values[n.inputs[1]].data[0].size) + vd.size * int(values[d.inputs[1]].data[0].size))
    ins = [(m.inputs + [None] * 5)[:5] for m in (n, d, p)]   # x w b mult shift
    return Node("qcdp", ins[0] + ins[1][1:] + ins[2][1:], p.output, attrs,
                "+".join(m.onnx_name for m in (n, d, p)), dict(p.parts))


def fuse_pwdw(nodes, values, trainable, keep=(), three=True):
    """nodes with each (qconv, depthwise qconv, 1x1 qconv) chain replaced by a qcdp node (if three) and each
    other (1x1 qconv, depthwise qconv) pair by a qpwdw node, where the streamed tensors are read by
    nothing else (no other node, no view, not in `keep`), no gradient crosses, and the ring is
    shorter than the tensor it stands for (else it saves nothing)."""
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

    def streamable(v, reader):
        """v's only reader is `reader`, and nothing else keeps v."""
        users = readers.get(v, [])
        return len(users) == 1 and users[0] is reader and v not in viewed and v not in keep and v not in grads

    out, skip = [], set()
    for k, n in enumerate(nodes):
        if id(n) in skip:
            continue
        d, p = (nodes[k + j] if k + j < len(nodes) else None for j in (1, 2))
        e = n.output
        if (three and d is not None and n.op == "qconv" and n.attrs["groups"] == 1 and streamable(e, d)
                and _is_depthwise_of(d, e, values) and _ring_rows(d, values) < values[e].shape[2]
                and p is not None and _is_pointwise(p, values) and p.inputs[0] == d.output
                and streamable(d.output, p)):
            out.append(_fused3(n, d, p, values))
            skip.update((id(d), id(p)))
        elif (d is not None and _is_pointwise(n, values) and streamable(e, d) and _is_depthwise_of(d, e, values)
                and _ring_rows(d, values) < values[e].shape[2]):
            out.append(_fused(n, d, values))
            skip.add(id(d))
        else:
            out.append(n)
    return out


def _scratch_bytes(n):
    """The bytes of a qcdp node's ring and row."""
    return sum(int(np.prod(n.attrs[k][1])) for k in ("ring", "row"))


def pipe_pairs(nodes, values, keep=()):
    """Mark each pair of consecutive qcdp nodes whose first output is read by the second alone (not
    in `keep`, no view of it) as a pipe, where that lowers the larger of the two ops' live bytes:
    attrs pipe_out = (name, (rows, C, W), quant) on the first, pipe_in = its rows H on the second.
    Pairs do not overlap (a node is a pipe's writer or its reader); nodes is changed in place."""
    readers = {}
    for n in nodes:
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(n)
    viewed = {v.view_of for v in values.values() if v.view_of is not None}
    k = 0
    while k + 1 < len(nodes):
        a, b = nodes[k], nodes[k + 1]
        v = values.get(a.output)
        if (a.op == "qcdp" and b.op == "qcdp" and "pipe_in" not in a.attrs and b.inputs[0] == a.output
                and [id(r) for r in readers.get(a.output, [])] == [id(b)] and a.output not in viewed
                and a.output not in keep):
            rows = (values[b.inputs[1]].data.shape[2] - 1) * b.attrs["dil_h"] + 1
            # a's input and scratch then live until b has run, beside b's output and scratch: only where
            # that is less than a's output beside a's input or beside b's output (int8 bytes)
            x, mid, y = (values[v_].size for v_ in (a.inputs[0], a.output, b.output))
            sa, sb = _scratch_bytes(a), _scratch_bytes(b)
            if rows < v.shape[2] and x + sa + sb + y + rows * v.shape[1] * v.shape[3] < max(x + sa, y + sb) + mid:
                a.attrs = dict(a.attrs, pipe_out=(a.output + "/pipe", (rows, v.shape[1], v.shape[3]), v.quant))
                b.attrs = dict(b.attrs, pipe_in=v.shape[2])
                k += 2
                continue
        k += 1
    return nodes
