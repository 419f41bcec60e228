"""Run an inverted-residual block a channel at a time (PWDW_W8, PWDW_W8_BWD).

In a sparse update of an MCU network the largest float tensors are the expansion 1x1 convs'
outputs and the depthwise convs' outputs of the blocks the gradient passes through, and their
gradients (MCUNet-5fps 49kb: blocks.9's 48 KB and blocks.10's 60 KB, forward and backward).
Channel c of the 1x1 output is made by row c of its weight and read by channel c of the
depthwise conv alone, whose output channel c is input channel c of the next 1x1 conv: each
exists one plane at a time.

  forward   the expansion CONV2D_W8 (frozen, or trained whole; CONV2D if float32) [CONV2D_ACC_W8
            or CONV2D_ACC: a split weight's trained part] CLIP MASK_PACK depthwise-CONV2D_W8
            [CLIP MASK_PACK projection-CONV2D_W8]                                  -> PWDW_W8
  backward  [CONV2D_BWD_INPUT_W8 MASK_BWD [BIAS_BWD]] depthwise-CONV2D_BWD_INPUT_W8 MASK_BWD,
            then what reads that gradient: CONV2D_BWD_INPUT_W8 (the frozen weight),
            CONV2D_BWD_INPUT_Q8 or CONV2D_BWD_INPUT and CONV2D_BWD_WEIGHT (the trained weight),
            BIAS_BWD                                                               -> PWDW_W8_BWD
(the in-place forms of the depthwise convs and of the projection too). Run on the training ops
after w8.py (the frozen weights int8) and q8state.py (trained weights int8 or float32), for
planners that share memory (the naive planner keeps every tensor to read). A block is fused
only where its inner tensors and their gradients have no other reader, the depthwise weight is
frozen, and the ops are consecutive (an op between the backward ones that touches nothing they
touch runs after the fused op), so nothing another op reads moves. The fused kernels sum every
value in the order of the ops they replace (mt_pwdw_w8.c): the results are theirs bit for bit.
"""
from __future__ import annotations

from . import format as F
from .lowered import TTensor

PW_ATTRS = [1, 1, 0, 0, 0, 0, 1, 1, 1]   # a 1x1 conv: stride 1, no padding, dilation 1, one group
DEPTHWISE = ("CONV2D_W8", "CONV2D_DW_INPLACE_W8")
DEPTHWISE_BWD = ("CONV2D_BWD_INPUT_W8", "CONV2D_BWD_INPUT_DW_INPLACE_W8")
POINTWISE = ("CONV2D_W8", "CONV2D_PW_INPLACE_W8")


def stream_blocks(tensors, ops):
    """Fuse every block it can (module docstring); returns the new ops and the fused blocks'
    depthwise convs (their ONNX nodes)."""
    fused = []
    while True:
        found = _find(tensors, ops)
        if found is None:
            break
        ops = _fuse(tensors, ops, *found)
        fused.append(found[0]["dw"].source)
    return ops, fused


def _slot(o, name):
    return o.slots[o.spec.slot_index(name)]


def _root(tensors, i):
    while tensors[i].view_of is not None:
        i = tensors[i].view_of
    return i


def _users(ops, family):
    """The indices of the ops that read or write a tensor of `family`."""
    return {k for k, o in enumerate(ops) if any(t in family for t in o.slots if t is not None)}


def _touches(tensors, ops, role):
    """The memory (roots) that ops read ("in") or write ("out": outputs, parameters and state)."""
    out = set()
    for o in ops:
        for slot, t in zip(o.spec.slots, o.slots):
            if t is not None and (slot.role == "in") == (role == "in"):
                out.add(_root(tensors, t))
    return out


def _sides(tensors, ops, t, cuts):
    """The tensors sharing t's memory (a view points at its memory's owner, however many ops run in
    place over it), split by the op that first touches each: before cuts[0], from cuts[0] to
    cuts[1]... (the 1x1 output's stages; the depthwise output's; the block output's)."""
    first = {}
    for i, o in enumerate(ops):
        for s in o.slots:
            if s is not None:
                first.setdefault(s, i)
    group = [i for i in range(len(tensors)) if _root(tensors, i) == _root(tensors, t)]
    bounds = [-1] + list(cuts) + [len(ops) + 1]
    return [{i for i in group if bounds[n] <= first.get(i, -1) < bounds[n + 1]} for n in range(len(bounds) - 1)]


def _const_i8(t):
    return t.storage == "CONST" and t.dtype == "I8"


def _trained(t, f32):
    """A trainable parameter, float32 (f32) or int8 (q8state.py)."""
    return bool(t.flags & F.TFLAGS["PARAM"]) and t.dtype == ("F32" if f32 else "I8")


def _expansion_weight_ok(w, op, acc):
    """The expansion's weight: frozen int8 (a split weight's frozen part when acc adds the trained
    part), or trained whole (int8 read by CONV2D_W8, float32 by CONV2D)."""
    if op == "CONV2D_W8" and _const_i8(w):
        return True
    return acc is None and _trained(w, f32=op == "CONV2D")


def _clip_mask(ops, k, x):
    """ops k, k+1: a CLIP of x and the MASK_PACK of its output, with the same bounds; or None."""
    if k + 1 >= len(ops):
        return None
    clip, mask = ops[k], ops[k + 1]
    if (clip.name == "CLIP" and mask.name == "MASK_PACK" and _slot(clip, "x") == x
            and _slot(mask, "y") == _slot(clip, "y") and mask.attrs == clip.attrs):
        return clip, mask
    return None


def _find(tensors, ops):
    """The first block to fuse: ({"pw", "acc", "clip", "mask", "dw", "clip2", "mask2", "pw2": op or
    None, "k": the depthwise conv's index, "fwd": op indices}, {backward role: op index}), or None."""
    for k, d in enumerate(ops):
        if d.name not in DEPTHWISE or d.phase != "FORWARD" or k < 3:
            continue
        dw = tensors[_slot(d, "w")]
        if (not _const_i8(dw) or dw.shape[1] != 1 or d.attrs[F.CONV_ATTRS.index("groups")] != dw.shape[0]
                or dw.shape[2] * dw.shape[3] < 2):
            continue
        cm = _clip_mask(ops, k - 2, ops[k - 2].slots[0])
        if cm is None or _slot(cm[0], "y") != _slot(d, "x"):
            continue
        j, acc = k - 3, None
        if ops[j].name in ("CONV2D_ACC_W8", "CONV2D_ACC") and _slot(ops[j], "y") == _slot(cm[0], "x"):
            acc, j = ops[j], j - 1
        pw = ops[j] if j >= 0 else None
        # the 1x1 weight frozen int8 (then maybe a split weight's trained part added: acc), or trained
        # whole (int8 or float32)
        if (pw is None or pw.name not in ("CONV2D_W8", "CONV2D") or pw.attrs != PW_ATTRS
                or not _expansion_weight_ok(tensors[_slot(pw, "w")], pw.name, acc)
                or _slot(pw, "y") != (_slot(acc, "acc") if acc else _slot(cm[0], "x"))
                or (acc is not None and (acc.attrs != PW_ATTRS
                                         or not _trained(tensors[_slot(acc, "w")], acc.name == "CONV2D_ACC")))):
            continue
        block = dict(pw=pw, acc=acc, clip=cm[0], mask=cm[1], dw=d, k=k, clip2=None, mask2=None, pw2=None)
        # the second stage: the depthwise output's CLIP and mask, and the 1x1 conv reading it
        cm2 = _clip_mask(ops, k + 1, _slot(d, "y"))
        pw2 = ops[k + 3] if cm2 is not None and k + 3 < len(ops) else None
        two = (pw2 is not None and pw2.name in POINTWISE and pw2.attrs == PW_ATTRS
               and _slot(pw2, "x") == _slot(cm2[0], "y") and _const_i8(tensors[_slot(pw2, "w")]))
        sides = _sides(tensors, ops, _slot(d, "x"), [k, k + 3] if two else [k])
        if not _users(ops, sides[0]) <= set(range(j, k + 1)):
            continue
        for stage in ((True, False) if two else (False,)):
            if stage:
                y_side = _sides(tensors, ops, _slot(d, "y"), [k, k + 3])[1]
                if not _users(ops, y_side) <= set(range(k, k + 4)):
                    continue
                block.update(clip2=cm2[0], mask2=cm2[1], pw2=pw2)
            else:
                block.update(clip2=None, mask2=None, pw2=None)
            roles = _find_backward(tensors, ops, block)
            if roles is not None:
                block["fwd"] = list(range(j, k + (4 if stage else 1)))
                return block, roles
    return None


def _find_backward(tensors, ops, blk):
    """The consecutive backward ops of the block (module docstring) as {role: op index}, or None."""
    d, pw, acc = blk["dw"], blk["pw"], blk["acc"]
    # the trained weight and the input its gradient reads: a split weight's trained part, or the 1x1 weight
    frozen = _slot(pw, "w") if _const_i8(tensors[_slot(pw, "w")]) else None
    tw, tx = (_slot(acc, "w"), _slot(acc, "x")) if acc else (None, None) if frozen else (_slot(pw, "w"), _slot(pw, "x"))
    for b, o in enumerate(ops):
        if o.name not in DEPTHWISE_BWD or _slot(o, "w") != _slot(d, "w"):
            continue
        roles, inner = {"bwd_dw": b}, set()
        if blk["pw2"] is not None:   # [pw2's input gradient, MASK_BWD (m2), the depthwise bias's BIAS_BWD]
            i = b - 1
            if i >= 0 and ops[i].name == "BIAS_BWD" and _slot(ops[i], "dy") == _slot(o, "dy"):
                if _slot(d, "b") != _slot(ops[i], "w") or ops[i].attrs != [0, tensors[_slot(ops[i], "w")].shape[0]]:
                    return None
                roles["dw_bias"], i = i, i - 1
            if (i < 1 or ops[i].name != "MASK_BWD" or _slot(ops[i], "m") != _slot(blk["mask2"], "m")
                    or _slot(ops[i], "dx") != _slot(o, "dy") or ops[i - 1].name != "CONV2D_BWD_INPUT_W8"
                    or _slot(ops[i - 1], "w") != _slot(blk["pw2"], "w") or _slot(ops[i - 1], "dx") != _slot(ops[i], "dy")
                    or ops[i - 1].attrs != PW_ATTRS):
                return None
            roles["mask2"], roles["bwd_pw2"] = i, i - 1
            inner = {_slot(ops[i - 1], "dx"), _slot(ops[i], "dx")}
        if b + 1 >= len(ops) or ops[b + 1].name != "MASK_BWD" or _slot(ops[b + 1], "m") != _slot(blk["mask"], "m") \
                or _slot(ops[b + 1], "dy") != _slot(o, "dx"):
            return None
        roles["mask"] = b + 1
        g1, g2 = _slot(o, "dx"), _slot(ops[b + 1], "dx")
        want = {
            "CONV2D_BWD_INPUT_W8": ("dx_frozen", lambda q: frozen is not None and _slot(q, "w") == frozen),
            "CONV2D_BWD_INPUT_Q8": ("dx_trained", lambda q: tw is not None and _slot(q, "w") == tw),
            "CONV2D_BWD_INPUT": ("dx_trained", lambda q: tw is not None and _slot(q, "w") == tw),
            "CONV2D_BWD_WEIGHT": ("weight", lambda q: tw is not None and _slot(q, "w") == tw and _slot(q, "x") == tx),
            "BIAS_BWD": ("bias", lambda q: _slot(pw, "b") is not None and _slot(q, "w") == _slot(pw, "b")),
        }
        # the readers of that gradient; other ops between them (a residual's gradient ADD) run after the
        # fused op when they read nothing the readers after them write and write nothing those touch
        inner |= {g1, g2}
        family = {i for i in range(len(tensors)) if i in inner or tensors[i].view_of in inner}
        last = max(_users(ops, family))
        between = []
        for k in range(b + 2, last + 1):
            q = ops[k]
            if q.name in want and _slot(q, "dy") == g2:
                role, ok = want[q.name]
                if role in roles or not ok(q) or (role != "bias" and q.attrs[:len(PW_ATTRS)] != PW_ATTRS):
                    return None
                roles[role] = k
            else:
                between.append(k)
        for k in between:
            later = [ops[i] for i in roles.values() if i > k]
            if (_touches(tensors, [ops[k]], "in") & _touches(tensors, later, "out")
                    or _touches(tensors, [ops[k]], "out") & (_touches(tensors, later, "in")
                                                             | _touches(tensors, later, "out"))):
                return None
        if "weight" in roles:
            w = tensors[_slot(ops[roles["weight"]], "w")]
            if ops[roles["weight"]].attrs[len(PW_ATTRS):] != [0, w.shape[0], 0, w.shape[1]]:
                return None
        if "bias" in roles and ops[roles["bias"]].attrs != [0, tensors[_slot(ops[roles["bias"]], "w")].shape[0]]:
            return None
        if ("dx_trained" in roles and "weight" not in roles) or not {"dx_frozen", "weight", "bias"} & set(roles):
            return None
        # the inner gradients (and their views) are read by these ops alone
        if not _users(ops, family) <= set(roles.values()):
            return None
        return roles
    return None


def _plane(tensors, name, shape):
    tensors.append(TTensor(name, (1, 1) + tuple(shape[2:])))
    return len(tensors) - 1


def _own_memory(tensors, ops, t, cuts, side):
    """Give t (an output that ran in place over the block's inner tensors) memory of its own, and the
    tensors that ran in place over it its memory."""
    if tensors[t].view_of is None:
        return
    for i in _sides(tensors, ops, t, cuts)[side]:
        tensors[i].view_of = t if i != t else None


def _fuse(tensors, ops, blk, roles):
    fwd = blk["fwd"]
    pw, acc, d, pw2 = blk["pw"], blk["acc"], blk["dw"], blk["pw2"]
    k = blk["k"]
    e = tensors[_slot(d, "x")]
    if pw2 is None:
        y, z = _slot(d, "y"), None
        _own_memory(tensors, ops, y, [k], 1)
    else:
        z = _slot(pw2, "y")
        _own_memory(tensors, ops, z, [k, k + 3], 2)
        y = _plane(tensors, "%s@plane" % tensors[_slot(d, "y")].name, tensors[_slot(d, "y")].shape)
    s = _plane(tensors, "%s@plane" % e.name, e.shape)
    clip2 = blk["clip2"].attrs if pw2 is not None else [0, 0]
    # the trained weight (a split weight's trained part, or the weight trained whole over xg = x)
    frozen = _slot(pw, "w") if _const_i8(tensors[_slot(pw, "w")]) else None
    xg, wt = (_slot(acc, "x"), _slot(acc, "w")) if acc else (None, None) if frozen else (_slot(pw, "x"), _slot(pw, "w"))
    f32 = wt is not None and tensors[wt].dtype == "F32"
    fo = type(pw)("PWDW_W8", "FORWARD",
                  [_slot(pw, "x"), frozen, _slot(pw, "b"), xg, None if f32 else wt, wt if f32 else None,
                   _slot(blk["mask"], "m"), _slot(d, "w"), _slot(d, "b"), s, y,
                   _slot(blk["mask2"], "m") if pw2 else None, _slot(pw2, "w") if pw2 else None,
                   _slot(pw2, "b") if pw2 else None, z],
                  list(d.attrs) + list(blk["clip"].attrs) + list(clip2) + [tensors[_slot(d, "w")].shape[0]],
                  d.source,
                  macs=sum(ops[i].macs for i in fwd))
    bd = ops[roles["bwd_dw"]]
    slot = dict(dw=_slot(bd, "w"), m=_slot(ops[roles["mask"]], "m"),
                s=_plane(tensors, "%s@plane" % tensors[_slot(bd, "dx")].name, tensors[_slot(bd, "dx")].shape))
    if "bwd_pw2" in roles:
        q = ops[roles["bwd_pw2"]]
        slot.update(dy=_slot(q, "dy"), w2=_slot(q, "w"), m2=_slot(ops[roles["mask2"]], "m"),
                    s2=_plane(tensors, "%s@plane" % tensors[_slot(q, "dx")].name, tensors[_slot(q, "dx")].shape))
    else:
        slot.update(dy=_slot(bd, "dy"))
    for role, names in (("dw_bias", dict(db="w", mdb="m", accdb="acc")), ("dx_frozen", dict(w="w", dx="dx")),
                        ("weight", dict(xg="x", wt="w", mt="m", acct="acc")), ("dx_trained", dict(dxg="dx")),
                        ("bias", dict(b="w", mb="m", accb="acc"))):
        if role in roles:
            slot.update((ours, _slot(ops[roles[role]], theirs)) for ours, theirs in names.items())
    spec = F.OPS_BY_NAME["PWDW_W8_BWD"]
    bwd = set(roles.values())
    bo = type(pw)("PWDW_W8_BWD", "TRAIN", [slot.get(sl.name) for sl in spec.slots],
                  list(bd.attrs) + [tensors[slot["dw"]].shape[0]], bd.source,
                  macs=sum(ops[i].macs for i in bwd))
    out = []
    for i, o in enumerate(ops):
        if i == fwd[0]:
            out.append(fo)
        elif i == min(bwd):   # the ops between the fused ones (_find_backward) follow it
            out.append(bo)
        elif i not in fwd and i not in bwd:
            out.append(o)
    return out
