"""The stream section: a plan's constants laid out in the order the ops read them, cut into groups
that a board reads from the plan's file into a window in the arena just before the ops that need
them (docs/plan-format.md, Streaming; the core's side is modules/microtrain/mt_stream.c).

NNTrainer swaps tensors out to storage and back in just before they are used, in an order known at
compile time; here the frozen constants never need to be in RAM all at once, since they are
read-only and read in a known order. choose() marks the constants that go to the stream section;
layout() places them and the per-channel scales they carry (quantization records), one component
at a time: constants that some op reads together are one component, laid out at its first use in
the order its constants are first read, so that each op's constants are one short range of the
section. Each op with stream constants gets a group, that range, and a window: an arena buffer
alive from the op to the op (a pipe's reader with its writer, and a run of ops reading the same
range, share one), which the memory planner places like any tensor. The trainable parameters'
initial values go last, in the reset group, read into the state region on reset.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import format as F
from . import planner
from .ir import NP_DTYPES, Quant
from .lowered import TTensor, drop_unused
from .memory import RUNS_THE_OP_BEFORE, assign_memory

# compile(constants=...): where a plan's frozen constants live on the board
PLACEMENTS = ("resident", "stream")


def _align(n, a=F.ALIGN):
    return (n + a - 1) // a * a


def _root(tensors, i):
    while tensors[i].view_of is not None:
        i = tensors[i].view_of
    return i


def _per_channel(q):
    return q is not None and q.axis is not None


@dataclass
class Group:
    first: int                    # ops first..last read it; F.RESET_GROUP for the initial values
    last: int
    lo: int                       # bytes [lo, lo + bytes) of the stream section
    bytes: int
    window: int = 0               # arena offset, set by the memory plan


@dataclass
class Layout:
    blobs: list = field(default_factory=list)     # (stream offset, bytes)
    size: int = 0
    groups: list = field(default_factory=list)    # Group, op groups in op order then the reset group
    quant: dict = field(default_factory=dict)     # tensor index -> (scales offset, zero points offset or None)

    def windows(self):
        """The op groups with a window of their own, in order (an op's blocks share the first's)."""
        out = []
        for g in self.groups:
            if g.first != F.RESET_GROUP and not (out and (out[-1].first, out[-1].last) == (g.first, g.last)):
                out.append(g)
        return out

    def window_buffers(self):
        """planner.Buffers for the windows, in windows() order."""
        return [planner.Buffer(g.bytes, g.first, g.last) for g in self.windows()]

    def set_windows(self, offsets):
        """Each window's arena offset (window_buffers() order) into its groups."""
        at = dict(zip([(g.first, g.last) for g in self.windows()], offsets))
        for g in self.groups:
            if g.first != F.RESET_GROUP:
                g.window = at[(g.first, g.last)]


def readers(tensors, ops):
    """{root constant: [op indices reading it]}, a pipe reader counted as reading its writer's too."""
    out = {}
    for k, op in enumerate(ops):
        seen = set()
        for j in ([k - 1] if op.name in RUNS_THE_OP_BEFORE and k > 0 else []) + [k]:
            for s, tid in zip(ops[j].spec.slots, ops[j].slots):
                if tid is None or s.role != "in":
                    continue
                r = _root(tensors, tid)
                if tensors[r].storage == "CONST" and r not in seen:
                    seen.add(r)
                    out.setdefault(r, []).append(k)
    return out


def choose(tensors, ops):
    """Mark every frozen constant an op reads as STREAM (its views follow it); returns how many.
    A trainable parameter's initial values are not a constant: they go to the reset group."""
    n = 0
    for r in readers(tensors, ops):
        t = tensors[r]
        if t.data is not None and not t.flags & F.TFLAGS["PARAM"]:
            t.storage = "STREAM"
            n += 1
    for t in tensors:
        if t.view_of is not None and tensors[_root(tensors, t.view_of)].storage == "STREAM":
            t.storage = "STREAM"
    return n


def _op_reads(tensors, ops, k):
    """The stream roots op k reads (a pipe reader: its writer's too), in slot order, once each."""
    out = []
    for j in ([k - 1] if ops[k].name in RUNS_THE_OP_BEFORE and k > 0 else []) + [k]:
        for tid in ops[j].slots:
            if tid is None:
                continue
            r = _root(tensors, tid)
            if tensors[r].storage == "STREAM" and r not in out:
                out.append(r)
    return out


def layout(tensors, ops, params):
    """Place the STREAM constants (t.data_offset: their offset in the stream section) and their
    per-channel scales; the groups of the ops, and the reset group of `params` (tensor indices of
    the trainable parameters, in table order: their data_offset becomes the stream offset of their
    initial values). A component with constants in blocks (split_blocks) is laid out once per
    block, every block alike, and an op on blocks gets a group per block. Returns a Layout."""
    reads = [_op_reads(tensors, ops, k) for k in range(len(ops))]
    # components: constants some op reads together
    parent = {}

    def find(a):
        parent.setdefault(a, a)
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a
    for rs in reads:
        for r in rs[1:]:
            parent[find(r)] = find(rs[0])
    members = {}
    for rs in reads:   # in the order first read
        for r in rs:
            c = members.setdefault(find(r), [])
            if r not in c:
                c.append(r)
    out = Layout()
    pos = 0

    def put(data):
        nonlocal pos
        off = pos
        out.blobs.append((off, data))
        pos = _align(off + len(data))
        return off

    def image(ms, k):
        """Block k of a component (k 0 with no blocks): each constant, then its scales. Returns
        {member: (its offset, lo, hi)}, lo..hi it with its scales, and {member: (scales, zero points)}."""
        scales, where, quant = {}, {}, {}
        for m in ms:
            t = tensors[m]
            blocks = getattr(t, "blocks", None)
            data = blocks[k] if blocks else np.ascontiguousarray(t.data, NP_DTYPES[t.dtype]).tobytes()
            off = put(data)
            lo, hi = off, off + t.nbytes
            if _per_channel(t.quant):
                bq = getattr(t, "block_quants", None)
                scale, zp = bq[k] if bq else (t.quant.scale, t.quant.zero_point)
                key = t.quant.key()   # the template's: the same sharing in every block, so one layout
                if key not in scales:
                    s = put(scale.astype("<f4").tobytes())
                    z = put(zp.astype("<i4").tobytes()) if np.any(t.quant.zero_point != 0) else None
                    scales[key] = (s, z)
                s, z = scales[key]
                quant[m] = (s, z)
                lo = min(lo, s)
                hi = max(hi, s + 4 * scale.size, z + 4 * zp.size if z is not None else 0)
            where[m] = (off, lo, hi)
        return where, quant

    placed = set()
    extent = {}   # root -> (lo, hi) of it and its scales (block 0's)
    starts = {}   # component -> the stream offset of each block
    for rs in reads:
        for r in rs:
            c = find(r)
            if c in placed:
                continue
            placed.add(c)
            counts = {len(getattr(tensors[m], "blocks", None) or [None]) for m in members[c]}
            n = max(counts)
            if counts != {n}:
                raise ValueError("internal: stream constants of one component in blocks of different counts")
            starts[c] = []
            for k in range(n):
                pos = _align(pos)
                starts[c].append(pos)
                where, quant = image(members[c], k)
                if k == 0:
                    for m, (off, lo, hi) in where.items():
                        tensors[m].data_offset = off
                        extent[m] = (lo, hi)
                    out.quant.update(quant)
    for i, t in enumerate(tensors):   # views: their root's place
        r = _root(tensors, i)
        if r != i and tensors[r].storage == "STREAM":
            t.data_offset = tensors[r].data_offset
            if r in out.quant and _per_channel(t.quant) and t.quant.key() == tensors[r].quant.key():
                out.quant[i] = out.quant[r]
    # a group per op with stream constants (one per block for an op on blocks); a pipe's writer shares
    # its reader's, and a run of ops reading one range one window
    spans = []
    for k, rs in enumerate(reads):
        if not rs:
            continue
        lo = min(extent[r][0] for r in rs)
        hi = max(extent[r][1] for r in rs)
        first = k - 1 if ops[k].name in RUNS_THE_OP_BEFORE and k > 0 else k
        blocks = ops[k].blocks
        if blocks > 1:
            c = find(rs[0])
            spans.append([k, k, lo, hi, [s - starts[c][0] for s in starts[c]]])
            continue
        if spans and spans[-1][1] >= first:   # the pipe's writer had a group of its own: one for both
            f, _, a, b, _ = spans.pop()
            first, lo, hi = f, min(lo, a), max(hi, b)
        elif spans and spans[-1][1] == k - 1 and spans[-1][2:4] == [lo, hi] and len(spans[-1][4]) == 1:
            first = spans.pop()[0]
        spans.append([first, k, lo, hi, [0]])
    out.groups = [Group(f, l, lo + shift, hi - lo) for f, l, lo, hi, shifts in spans for shift in shifts]
    # the initial values of the trainable parameters, back to back in table order
    if params:
        start = pos
        end = start
        for i in params:
            t = tensors[i]
            t.data_offset = put(np.ascontiguousarray(t.data, NP_DTYPES[t.dtype]).tobytes())
            end = t.data_offset + t.nbytes
        out.groups.append(Group(F.RESET_GROUP, F.RESET_GROUP, start, end - start))
    out.size = pos
    return out


def section(lay):
    """The stream section's bytes."""
    buf = bytearray(lay.size)
    for off, data in lay.blobs:
        buf[off:off + len(data)] = data
    return bytes(buf)


# ---- ops whose constants are too large for a window: cut into ops of a few channels each ----

# op name: (the constant slots cut by rows, the constant slot cut by columns, the slots of the block's
# shared tensors a constant of which stays whole in every piece). The kernels run channels
# [c_begin, c_begin + E) of c_total (format.py, mt_pwdw_w8.c).
SPLITS = {
    "PWDW_W8": (("w", "dw"), "w2", ("b", "db", "b2")),
    "PWDW_W8_BWD": (("w", "dw"), "w2", ()),
}
GROUPS_ATTR = F.CONV_ATTRS.index("groups")


def _piece_bytes(tensors, op):
    """(bytes per channel, bytes in every piece) of op's stream constants."""
    rows, cols, whole = SPLITS[op.name]
    spec = op.spec
    per, fixed = 0, 0
    for name in rows + (cols,):
        tid = op.slots[spec.slot_index(name)]
        if tid is None or tensors[_root(tensors, tid)].storage != "STREAM":
            continue
        t = tensors[tid]
        if name == cols:   # a column per channel, the scales of its rows in every piece
            per += t.shape[0] * F.DTYPES[t.dtype][1]
            fixed += 4 * t.shape[0] if _per_channel(t.quant) else 0
        else:
            per += t.nbytes // t.shape[0] + (4 if _per_channel(t.quant) else 0)
    for name in whole:
        tid = op.slots[spec.slot_index(name)]
        if tid is not None and tensors[_root(tensors, tid)].storage == "STREAM":
            fixed += _align(tensors[tid].nbytes)
    return per, fixed


def _slice(tensors, cache, tid, c0, c1, axis):
    """The constant tensor holding channels [c0, c1) of tid along axis (0: rows, 1: columns)."""
    key = (tid, c0, c1)
    if key not in cache:
        t = tensors[tid]
        whole = np.asarray(tensors[_root(tensors, tid)].data).reshape(t.shape)
        data = np.ascontiguousarray(np.take(whole, np.arange(c0, c1), axis=axis))
        q = t.quant
        if _per_channel(q) and q.axis == axis:
            q = Quant(q.scale[c0:c1], q.zero_point[c0:c1], axis)
        tensors.append(TTensor("%s@%d:%d" % (t.name, c0, c1), tuple(data.shape), t.dtype, "STREAM", 0, data,
                               quant=q, onnx_shape=tuple(data.shape)))
        cache[key] = len(tensors) - 1
    return cache[key]


def split_blocks(tensors, ops, window):
    """Each op of SPLITS whose stream constants are over `window` bytes made to consume them in blocks
    of E channels, E as large as keeps a block within the window (at least one): the op's constant
    slots point at tensors shaped as one block (the template), which carry every block's bytes
    (t.blocks; the last padded with zeros, its scales with ones: t.block_quants) for layout(), and
    the op runs once per block (op.blocks). An expansion block's forward and backward are cut alike,
    so that their blocks are the same bytes. Returns (ops, how many were cut); the whole constants are
    left unused."""
    by_dw = {}
    for op in ops:
        if op.name in SPLITS:
            dw = _root(tensors, op.slots[op.spec.slot_index("dw")])
            if tensors[dw].storage != "STREAM":
                continue
            per, fixed = _piece_bytes(tensors, op)
            n = max(1, (window - fixed) // per) if per else tensors[dw].shape[0]
            by_dw[dw] = min(by_dw.get(dw, n), n)
    cache, cut = {}, 0
    for op in ops:
        dw = _root(tensors, op.slots[op.spec.slot_index("dw")]) if op.name in SPLITS else None
        total = tensors[dw].shape[0] if dw is not None else 0
        if dw not in by_dw or by_dw[dw] >= total:
            continue
        blocks = -(-total // by_dw[dw])
        e = -(-total // blocks)   # as even as the blocks go: the last padded least
        rows, cols, whole = SPLITS[op.name]
        for name, axis in [(r, 0) for r in rows] + [(cols, 1)]:
            k = op.spec.slot_index(name)
            if op.slots[k] is not None:
                op.slots[k] = _template(tensors, cache, op.slots[k], axis, e, blocks)
        for name in whole:   # whole constants: the same bytes in every block
            k = op.spec.slot_index(name)
            tid = op.slots[k]
            if tid is not None and tensors[_root(tensors, tid)].storage == "STREAM":
                op.slots[k] = _template(tensors, cache, tid, None, e, blocks)
        op.attrs[GROUPS_ATTR] = e
        op.blocks = blocks
        cut += 1
    return ops, cut


def _template(tensors, cache, tid, axis, e, blocks):
    """The tensor shaped as one block of e channels of tid along axis (0: rows, 1: columns; None: tid
    whole), with every block's bytes and scales."""
    key = (tid, axis, e)
    if key not in cache:
        t = tensors[tid]
        whole = np.asarray(tensors[_root(tensors, tid)].data).reshape(t.shape)
        q = t.quant
        if axis is None:
            parts, quants = [whole] * blocks, [(q.scale, q.zero_point)] * blocks if _per_channel(q) else None
            shape = t.shape
        else:
            total = t.shape[axis]
            parts, quants = [], []
            for b in range(blocks):
                idx = np.arange(b * e, min((b + 1) * e, total))
                part = np.take(whole, idx, axis=axis)
                pad = [(0, 0)] * part.ndim
                pad[axis] = (0, e - len(idx))
                parts.append(np.pad(part, pad))   # zeros
                if _per_channel(q) and q.axis == axis:
                    quants.append((np.pad(q.scale[idx], (0, e - len(idx)), constant_values=1.0),
                                   np.pad(q.zero_point[idx], (0, e - len(idx)))))
                elif _per_channel(q):
                    quants.append((q.scale, q.zero_point))
            shape = parts[0].shape
        dt = NP_DTYPES[t.dtype]
        tmpl_q = Quant(quants[0][0], quants[0][1], q.axis) if _per_channel(q) else q
        n = TTensor("%s@blocks%d" % (t.name, e) if axis is not None else t.name + "@blocks", tuple(shape), t.dtype,
                    "STREAM", 0, np.ascontiguousarray(parts[0], dt), quant=tmpl_q, onnx_shape=tuple(shape))
        n.blocks = [np.ascontiguousarray(p, dt).tobytes() for p in parts]
        n.block_quants = quants if _per_channel(q) else None
        tensors.append(n)
        cache[key] = len(tensors) - 1
    return cache[key]


# the window sizes compile(stream=True) tries when it chooses one (stream_window=None)
WINDOWS = (4096, 8192, 12288, 16384, 20480, 24576, 32768, 49152, 65536)


def _cut(tensors, ops, window):
    """split_blocks on the tensors and ops, then the unused ones dropped; returns (ops, cut)."""
    ops, cut = split_blocks(tensors, ops, window)
    if cut:
        drop_unused(tensors, ops)
    return ops, cut


def windowed(tensors, ops, io_flags, window=None, gap=0):
    """The STREAM constants chosen, and the ops whose constants are over the window cut into blocks
    (split_blocks), in place. window None: the one of WINDOWS (or none) that gives the least RAM on a
    board that streams the plan, arena (with the windows, TFLite Micro's greedy placement) plus the
    group table, the larger on a tie (fewer reads). Returns (ops, window chosen or None, ops cut)."""
    import copy
    choose(tensors, ops)
    if window is None:
        largest = max((_piece_bytes(tensors, o)[1] + _piece_bytes(tensors, o)[0] * 1 for o in ops if o.name in SPLITS
                       and tensors[_root(tensors, o.slots[o.spec.slot_index("dw")])].storage == "STREAM"),
                      default=0)
        if largest == 0:
            return ops, None, 0
        best = None
        for w in (None,) + WINDOWS:
            t, o = copy.deepcopy(tensors), copy.deepcopy(ops)
            if w is not None:
                o, cut = _cut(t, o, w)
                if not cut:
                    continue
            io = [next(i for i, x in enumerate(t) if x.flags & F.TFLAGS[f]) for f in io_flags]
            arena, *_, lay = planned(t, o, io, "greedy", gap)
            cost = (arena + F.GROUP_BYTES * len(lay.groups), -(w or 1 << 30))
            if best is None or cost < best[0]:
                best = (cost, w)
        window = best[1]
        if window is None:
            return ops, None, 0
    ops, cut = _cut(tensors, ops, window)
    return ops, window, cut


def planned(tensors, ops, io, strategy="greedy", gap=0):
    """memory.assign_memory for a plan that streams its constants: the STREAM constants chosen,
    their groups laid out, the windows planned in the arena with the tensors. Same result tuple."""
    choose(tensors, ops)
    lay = layout(tensors, ops, [i for i, t in enumerate(tensors) if t.flags & F.TFLAGS["PARAM"]])
    return assign_memory(tensors, ops, io, strategy, gap, lay=lay)
