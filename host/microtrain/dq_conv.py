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

A 1x1 conv the builder ran in place over the float copy (CONV2D_PW_INPLACE(_W8)) is fused the
same way, its output then in memory of its own. Where the int8 tensor is the output of a streamed
expansion (PWDW_Q8, q8_fuse.py) that nothing else reads and the conv is 1x1, the two become
PWDW_DQ_W8 or PWDW_DQ (mt_pwdw_q8.c) where that holds fewer bytes: the depthwise output is made
a row at a time, dequantized and projected before the next row, so it never exists whole
(MbV2-w0.35 138kb: blocks.5's 24 KB int8 depthwise output beside the 16 KB float projection was
the forward's peak). A DEQUANTIZE only an ADD reads becomes ADD_DQ (mt_quant.c): the prefix's
residual into the first float block (MbV2 blocks.5's, 16 KB as float) added from its int8 self.
"""
from __future__ import annotations

from .lowered import TOp, TTensor
from .w8 import MAX_TAPS

DQ_SHARE = 4   # the float planes at most 1/4 of the int8 input's bytes
DQ_FORM = {"CONV2D_W8": "CONV2D_DQ_W8", "CONV2D": "CONV2D_DQ"}   # same attributes; x int8, planes xs last
# a 1x1 conv the builder ran in place over the float copy (its scratch s dropped; y memory of its own)
IN_PLACE_FORM = {"CONV2D_PW_INPLACE_W8": "CONV2D_DQ_W8", "CONV2D_PW_INPLACE": "CONV2D_DQ"}
ROW_FORM = {"CONV2D_DQ_W8": "PWDW_DQ_W8", "CONV2D_DQ": "PWDW_DQ"}   # PWDW_Q8's slots, the row, then the conv's


def planes(channels):
    """K, the input channels dequantized at a time: K*H*W floats at most the int8 tensor's C*H*W
    bytes / DQ_SHARE, at least one plane. Any K gives the same sums; the kernel cuts the filters
    into its stack buffer's chunks itself."""
    return max(1, channels // (DQ_SHARE * 4))


def kernel_takes(w, attrs):
    """What mt_conv.c's CONV2D_DQ(_W8) takes (its load check refuses the rest): groups 1, the
    filters within its stack buffer."""
    return attrs["groups"] == 1 and w.shape[2] * w.shape[3] <= MAX_TAPS


def _users(ops):
    """tensor index -> the indices of the ops that name it"""
    touched = {}
    for k, o in enumerate(ops):
        for t in o.slots:
            if t is not None:
                touched.setdefault(t, set()).add(k)
    return touched


def _written_between(tensors, ops, t, k, c):
    """Whether an op after k and before c writes tensor t or its memory."""
    mem = {t, tensors[t].view_of} - {None}
    return any(tensors[u].view_of in mem or u in mem
               for o in ops[k + 1:c] for s, u in zip(o.spec.slots, o.slots) if u is not None and s.role != "in")


def _pointwise(shape, attrs):
    """A conv of this weight shape and these attributes is 1x1, stride 1, no padding, groups 1 (the
    kernel's; dilation does not matter for 1x1)."""
    return tuple(shape[2:]) == (1, 1) and attrs["stride_h"] == attrs["stride_w"] == attrs["groups"] == 1 \
        and not any(attrs[p] for p in ("pad_t", "pad_l", "pad_b", "pad_r"))


def _streaming_pays(tensors, touched, p, conv, c, rows):
    """Whether the fused op holds fewer bytes at once than the two ops did at their larger: the
    expansion's input and ring, then beside the conv's output its row buffers (rows), against the
    depthwise output beside the expansion's input and ring, or beside the conv's planes and output
    (and the input, where something reads it after the conv: a residual). A small depthwise output
    (a stride-2 block at low resolution) can be less than the ring's rows it would keep alive."""
    x, ring, d = p.slots[0], p.slots[9], p.slots[-1]
    y, planes = conv.slots[3], conv.slots[4]
    b = {i: tensors[i].nbytes for i in (x, ring, d, y, planes)}
    later = b[x] if any(j > c for j in touched.get(x, ())) else 0
    return b[x] + b[ring] + rows + b[y] < max(b[x] + b[ring] + b[d], b[d] + b[planes] + b[y] + later)


def stream_into_projection(tensors, ops):
    """ops with each PWDW_Q8 whose int8 output only a 1x1 CONV2D_DQ_W8 or CONV2D_DQ reads fused into
    it (ROW_FORM) where that holds fewer bytes (_streaming_pays), at the conv's place; appends the
    row, its float copy and the output row to tensors. Returns (ops, the fused convs' sources)."""
    touched = _users(ops)
    viewed = {t.view_of for t in tensors if t.view_of is not None}
    ops, drop, fused = list(ops), set(), []
    for k, p in enumerate(ops):
        if p.name != "PWDW_Q8":
            continue
        d = p.slots[-1]
        users = touched.get(d, set()) - {k}
        if len(users) != 1 or d in viewed or tensors[d].flags or tensors[d].view_of is not None:
            continue
        c = next(iter(users))
        conv = ops[c]
        if conv.name not in ROW_FORM or c < k or conv.phase != p.phase or conv.slots[0] != d \
                or conv.slots.count(d) != 1:
            continue
        w2, b2, y = conv.slots[1], conv.slots[2], conv.slots[3]
        if not _pointwise(tensors[w2].shape, dict(zip(conv.spec.attrs, conv.attrs))) \
                or _written_between(tensors, ops, p.slots[0], k, c):
            continue
        E, OW, O = tensors[d].shape[1], tensors[d].shape[3], tensors[y].shape[1]
        if not _streaming_pays(tensors, touched, p, conv, c, E * OW + 4 * planes(E) * OW + 4 * O * OW):
            continue
        name = tensors[d].name
        tensors.append(TTensor(name + "/row", (E, OW), dtype="I8", quant=tensors[d].quant))
        tensors.append(TTensor(name + "/row@f32", (planes(E), OW)))
        tensors.append(TTensor(tensors[y].name + "/row", (O, OW)))
        n = len(tensors)
        ops[c] = TOp(ROW_FORM[conv.name], conv.phase, p.slots[:-1] + [n - 3, w2, b2, n - 2, n - 1, y], list(p.attrs),
                     conv.source, p.macs + conv.macs)
        drop.add(k)
        fused.append(conv.source)
    return [o for k, o in enumerate(ops) if k not in drop], fused


def _root(tensors, i):
    while tensors[i].view_of is not None:
        i = tensors[i].view_of
    return i


def _single_reader(tensors, ops, touched):
    """(k, xq, xf, c) for each DEQUANTIZE k (xq int8 -> xf float) whose float output one op c after
    it, in its phase, reads, once, and nothing else touches (no view, not the plan's input or
    output), with nothing writing xq between the two (the fused op reads it at c)."""
    for k, d in enumerate(ops):
        if d.name != "DEQUANTIZE":
            continue
        xq, xf = d.slots
        users = touched.get(xf, set()) - {k}
        if len(users) != 1 or tensors[xf].flags or tensors[xf].view_of is not None:
            continue
        c = next(iter(users))
        if c > k and ops[c].phase == d.phase and ops[c].slots.count(xf) == 1 \
                and not _written_between(tensors, ops, xq, k, c):
            yield k, xq, xf, c


def add_dequantized(tensors, ops):
    """ops with each DEQUANTIZE whose float output only one ADD of two float tensors of its size
    reads fused into it: ADD_DQ, at the ADD's place (a residual from the int8 prefix added to a
    float block's output, never dequantized whole). Where the ADD ran in place over the float copy,
    its output (and what runs in place over it after) takes the other operand's memory if nothing
    reads that after the ADD, else memory of its own. Returns (ops, the fused ADDs' sources)."""
    touched = _users(ops)
    viewed = {t.view_of for t in tensors if t.view_of is not None}
    ops, drop, fused = list(ops), set(), []
    for k, xq, xf, c in _single_reader(tensors, ops, touched):
        add = ops[c]
        if add.name != "ADD" or add.slots[2] == xf:
            continue
        a, y = add.slots[1] if add.slots[0] == xf else add.slots[0], add.slots[2]
        if tensors[a].dtype != "F32" or not tensors[a].nbytes == tensors[y].nbytes == tensors[xf].nbytes:
            continue
        if xf in viewed:   # the ADD's output (and later ops in place over it) lived in the float copy
            ra = _root(tensors, a)
            last = max(j for t, ks in touched.items() if _root(tensors, t) == ra for j in ks)
            free = last == c and tensors[ra].storage == "ARENA" and tensors[ra].nbytes >= tensors[xf].nbytes
            _rehome(tensors, xf, y, ra if free else None)
            viewed = {t.view_of for t in tensors if t.view_of is not None}
        ops[c] = TOp("ADD_DQ", add.phase, [a, xq, y], [], add.source, add.macs)
        drop.add(k)
        fused.append(add.source)
    return [o for k, o in enumerate(ops) if k not in drop], fused


def _rehome(tensors, xf, y, to=None):
    """y and what ran in place over xf after it (the views of xf) take to's memory instead (None:
    y's own)."""
    for t in tensors:
        if t.view_of == xf:
            t.view_of = y if to is None else to
    tensors[y].view_of = to


def fuse_dequantize_conv(tensors, ops):
    """ops with each DEQUANTIZE whose output only one groups-1 CONV2D_W8 or CONV2D with a constant
    weight reads fused into it (DQ_FORM; IN_PLACE_FORM: a 1x1 conv the builder ran over it, whose
    output, and what runs in place over it after, then gets memory of its own); appends the scratch
    planes to tensors. Returns (ops, the fused convs' sources)."""
    touched = _users(ops)
    viewed = {t.view_of for t in tensors if t.view_of is not None}
    ops, drop, fused = list(ops), set(), []
    for k, xq, xf, c in _single_reader(tensors, ops, touched):
        conv = ops[c]
        in_place = conv.name in IN_PLACE_FORM
        if conv.name not in DQ_FORM and not in_place:
            continue
        y = conv.slots[conv.spec.slot_index("y")]
        if xf in viewed and not (in_place and tensors[y].view_of == xf):
            continue
        a = dict(zip(conv.spec.attrs, conv.attrs))
        w = tensors[conv.slots[1]]
        if w.storage != "CONST" or len(w.shape) != 4 or not kernel_takes(w, a) or conv.slots[0] != xf:
            continue
        if in_place:
            _rehome(tensors, xf, y)
            viewed = {t.view_of for t in tensors if t.view_of is not None}
        x = tensors[xq]
        K = planes(x.shape[1])
        tensors.append(TTensor(tensors[xf].name + "@planes", (K, x.shape[2], x.shape[3])))
        ops[c] = TOp(IN_PLACE_FORM[conv.name] if in_place else DQ_FORM[conv.name], conv.phase,
                     [xq] + conv.slots[1:3] + [y, len(tensors) - 1], list(conv.attrs), conv.source, conv.macs)
        drop.add(k)
        fused.append(conv.source)
    return [o for k, o in enumerate(ops) if k not in drop], fused
