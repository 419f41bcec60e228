"""The memory plan of a training graph: where every tensor lives.

Arena tensors get offsets from the planner (planner.py, TFLite Micro's greedy
algorithm) over their lifetimes, a view or an op run in place sharing its owner's
memory for the owner's whole life; trainable parameters and optimizer state are
packed into the persistent state region; constants and initial values into the
plan's data section.
"""
from __future__ import annotations

import numpy as np

from . import format as F
from . import planner
from .ir import NP_DTYPES


def _align(n, a=F.ALIGN):
    return (n + a - 1) // a * a


def _roots(tensors):
    def root(i):
        while tensors[i].view_of is not None:
            i = tensors[i].view_of
        return i
    return [root(i) for i in range(len(tensors))]


# an op that runs the op before it (mt_cdp_q8.c: the reader of a pipe runs its writer): the
# writer's tensors live through it
RUNS_THE_OP_BEFORE = ("CONV_DW_PW_Q8_FROM_PIPE",)


def op_slots(ops, name=lambda o: o.name, slots=lambda o: o.slots):
    """Each op's tensor slots for lifetimes, a pipe reader's with its writer's."""
    out = []
    for k, o in enumerate(ops):
        s = list(slots(o))
        if name(o) in RUNS_THE_OP_BEFORE and k > 0:
            s += list(slots(ops[k - 1]))
        out.append(s)
    return out


def lifetimes(n_tensors, ops, input_ids=()):
    """(first, last) op index per tensor; -1 where no op touches it. Tensors in
    input_ids are written before op 0. ops: slot lists (op_slots(), which keeps a pipe writer's
    tensors alive through its reader)."""
    first, last = [-1] * n_tensors, [-1] * n_tensors
    for k, op in enumerate(ops):
        for s in op:
            if s is not None and s != F.NO_TENSOR:
                first[s] = k if first[s] < 0 else first[s]
                last[s] = k
    for i in input_ids:
        first[i] = 0
        last[i] = max(last[i], 0)
    return first, last


def arena_buffers(tensors, ops, io, roots=None):
    """(owner tensor ids, planner.Buffers): one buffer per arena memory owner, live from the first op
    that touches it or a view of it to the last."""
    roots = _roots(tensors) if roots is None else roots
    first, last = lifetimes(len(tensors), op_slots(ops), io)
    group = {}
    for i, r in enumerate(roots):
        if tensors[r].storage == "ARENA":
            f, l = group.get(r, (10 ** 9, -1))
            if first[i] >= 0:
                group[r] = (min(f, first[i]), max(l, last[i]))
            else:
                group.setdefault(r, (f, l))
    ids = sorted(group)
    return ids, [planner.Buffer(tensors[r].nbytes, max(0, min(group[r][0], group[r][1])), max(0, group[r][1]))
                 for r in ids]


def planned_arena(tensors, ops, io, strategy="greedy", gap=0):
    """The arena bytes assign_memory would give, nothing assigned."""
    _, bufs = arena_buffers(tensors, ops, io)
    return planner.arena_size(bufs, planner.plan(bufs, align=F.ALIGN, strategy=strategy, gap=gap),
                              align=F.ALIGN, gap=gap)


def assign_memory(tensors, ops, io, strategy="greedy", gap=0, lay=None):
    """Offsets for arena (planned), state (packed) and constant tensors, and the
    quantization records (per-channel scales in the data section). lay: a stream layout
    (stream.planned makes one): the frozen constants the ops read, and the initial values of the
    trainable parameters, are in the stream section instead, each op group's window planned in
    the arena.
    Returns (arena_bytes, state_bytes, naive_bytes, peak_bytes, data_blobs, data_bytes, quant_records,
    stream layout or None)."""
    roots = _roots(tensors)
    ids, bufs = arena_buffers(tensors, ops, io, roots)
    windows = lay.window_buffers() if lay else []
    offsets = planner.plan(bufs + windows, align=F.ALIGN, strategy=strategy, gap=gap)
    arena = planner.arena_size(bufs + windows, offsets, align=F.ALIGN, gap=gap)
    for r, off in zip(ids, offsets):
        tensors[r].offset = off
    if lay:
        lay.set_windows(offsets[len(bufs):])
    state = 0
    blobs = []   # (data offset, bytes)
    data = 0
    for t in tensors:
        if t.view_of is None and t.storage == "STATE":
            t.offset = state
            state += _align(t.nbytes)
        if t.view_of is None and t.data is not None and t.storage != "STREAM" \
                and not (lay and t.flags & F.TFLAGS["PARAM"]):
            t.data_offset = data
            blobs.append((data, np.ascontiguousarray(t.data, NP_DTYPES[t.dtype]).tobytes()))
            data += _align(t.nbytes)
    for i, t in enumerate(tensors):
        if t.view_of is not None:
            root = tensors[roots[i]]
            t.storage, t.offset = root.storage, root.offset
    quants, data = quant_records(tensors, blobs, data, lay.quant if lay else {})
    all_bufs = bufs + windows
    return (arena, state, planner.naive_size(all_bufs, F.ALIGN), planner.peak_live_bytes(all_bufs, F.ALIGN), blobs,
            data, quants, lay)


def quant_records(tensors, blobs, data, streamed=None):
    """One QUANT_FIELDS record per distinct quantization (tensors get .quant_index); per-channel
    scales and nonzero zero points go to the data section after the constants, or for the
    tensors in `streamed` ({tensor index: (scales, zero points or None)}) where the stream
    layout put them (where=QUANT_IN_STREAM)."""
    records, index = [], {}
    streamed = streamed or {}
    for i, t in enumerate(tensors):
        q = t.quant
        t.quant_index = F.NO_QUANT
        if q is None:
            continue
        key = (q.key(), streamed.get(i))
        if key not in index:
            rec = dict(scale=0.0, zero_point=0, axis=F.PER_TENSOR, where=F.QUANT_IN_DATA, reserved=b"\0" * 2,
                       n_channels=1, scales=F.NO_NAME, zero_points=F.NO_NAME)
            if q.axis is None:
                rec.update(scale=float(q.scale), zero_point=int(q.zero_point))
            elif i in streamed:
                s, z = streamed[i]
                rec.update(axis=q.axis, n_channels=q.scale.size, scales=s, where=F.QUANT_IN_STREAM,
                           zero_points=F.NO_NAME if z is None else z)
            else:
                rec.update(axis=q.axis, n_channels=q.scale.size, scales=data)
                blobs.append((data, q.scale.astype("<f4").tobytes()))
                data += _align(q.scale.nbytes)
                if np.any(q.zero_point != 0):
                    rec["zero_points"] = data
                    blobs.append((data, q.zero_point.astype("<i4").tobytes()))
                    data += _align(q.zero_point.nbytes)
            index[key] = len(records)
            records.append(rec)
        t.quant_index = index[key]
    if len(records) >= F.NO_QUANT:
        raise ValueError("model too large for plan format %d: %d quantization records" % (F.VERSION, len(records)))
    return records, data
