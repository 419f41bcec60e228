"""Recompute saved activations in the backward instead of keeping them (gradient checkpointing).

A forward tensor the backward reads (a block's input, kept for its weight gradient) lives from
the forward to its backward. Where that is what sets the arena's peak, the forward ops that made
it are run again right before its first backward reader, into fresh tensors ("@replay"), from
tensors that are alive there anyway or are much smaller (a checkpoint: an int8 tensor before a
float region); the backward reads the copy. The copy is bit for bit the original when every
tensor the replayed ops read, parameters included, is unwritten between the original ops and the
replay: the gradients are applied the moment they are computed, backward from the loss, so the
weights of the layers before the one being differentiated are still the forward's. The check is
made for every read, so a weight updated earlier (a shared one) stops the replay. A replayed op's
other outputs that nothing but that op ever writes (a block's ReLU masks) are read from the
replay's copies after it, so that the forward's die with the forward.

A tensor is replayed only where the planned arena, plus what the replayed ops add to the runtime
context, gets at least 1% smaller, greedily (the tensors alive where the most bytes are, largest
first), the replayed multiply-accumulates adding up to at most the forward's own (at most one more
forward's work per step). The replayed ops run in the TRAIN phase: inference (the FORWARD phase)
is unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from . import format as F
from .memory import _roots, arena_buffers, planned_arena
from .training import TTensor

NOT_REPLAYED = ("CONV_DW_PW_Q8_TO_PIPE", "CONV_DW_PW_Q8_FROM_PIPE")   # a pipe pair runs as one
CHECKPOINT_SHARE = 4    # a dead tensor at most 1/4 of the replayed one's bytes is kept, not replayed
MAX_CHAIN = 24          # ops replayed for one tensor
MIN_GAIN = 100          # a replay must lower the arena by at least 1/100 of it: no work for a few bytes
OP_BYTES = 256          # about what a replayed op adds to the runtime context (its decoded record)


def replay_saved(tensors, ops, io, strategy="greedy", gap=0):
    """The ops with saved activations replayed where that lowers the arena (module docstring);
    appends the copies to tensors. Returns (ops, names of the replayed tensors)."""
    if not any(o.phase != "FORWARD" for o in ops):
        return ops, []
    budget = sum(o.macs for o in ops if o.phase == "FORWARD")
    spent, replayed = 0, []
    best = planned_arena(tensors, ops, io, strategy, gap)
    while True:
        for a in _candidates(tensors, ops, io):
            found = _replay(tensors, ops, a)
            if found is None:
                continue
            clones, new_ops, macs = found
            if spent + macs > budget:
                continue
            arena = planned_arena(tensors + clones, new_ops, io, strategy, gap)
            if arena + OP_BYTES * (len(new_ops) - len(ops)) <= best - max(F.ALIGN, best // MIN_GAIN):
                best, spent, ops = arena, spent + macs, new_ops
                tensors.extend(clones)
                replayed.append(tensors[a].name)
                break
        else:
            return ops, replayed


def _writes(o):
    return [t for slot, t in zip(o.spec.slots, o.slots) if t is not None and slot.role != "in"]


def _candidates(tensors, ops, io):
    """Arena roots written in the forward and touched after it, alive at the op where the most
    bytes are alive, largest first."""
    roots = _roots(tensors)
    ids, bufs = arena_buffers(tensors, ops, io, roots)
    span = {r: (b.first, b.last) for r, b in zip(ids, bufs)}
    live = [0] * len(ops)
    for r, (f, l) in span.items():
        for k in range(f, l + 1):
            live[k] += tensors[r].nbytes
    peak = max(range(len(ops)), key=live.__getitem__)
    n_fwd = next(k for k, o in enumerate(ops) if o.phase != "FORWARD")
    io_roots = {roots[i] for i in io} | {r for i, r in enumerate(roots) if tensors[i].flags}
    out = [r for r, (f, l) in span.items()
           if f < n_fwd <= l and f <= peak <= l and r not in io_roots
           and any(roots[t] == r for o in ops[:n_fwd] for t in _writes(o))]
    return sorted(out, key=lambda r: -tensors[r].nbytes)


def _same_for_good(ops, roots, writers, k, r, n_fwd, at, last_touch):
    """Whether root r holds op k's output from op k on and is read at or after op `at` (a ReLU mask
    the backward keeps), so that the ops from `at` on may read a replay's copy of it instead, and r
    need not live through the backward: op k its only writer, forward or backward, and not reading it
    (nothing in place)."""
    return (writers.get(r) == [k] and last_touch.get(r, -1) >= at
            and not any(roots[t] == r for slot, t in zip(ops[k].spec.slots, ops[k].slots)
                        if t is not None and slot.role != "out")
            and not any(roots[u] == r for o in ops[n_fwd:] for u in _writes(o)))


def _replay(tensors, ops, a):
    """(new tensors, new ops, replayed MACs) that recompute root a before its first backward
    toucher, or None where that cannot be exact or needs too many ops."""
    roots = _roots(tensors)
    n_fwd = next(k for k, o in enumerate(ops) if o.phase != "FORWARD")
    at = next(k for k in range(n_fwd, len(ops)) if any(roots[t] == a for t in ops[k].slots if t is not None))
    if at == n_fwd or ops[at].phase != "TRAIN":
        return None     # read by the loss (the first training op), or only at the batch's end
    writers = {}    # root -> the forward ops writing it
    for k, o in enumerate(ops[:n_fwd]):
        for t in _writes(o):
            writers.setdefault(roots[t], []).append(k)
    last_touch = {}
    for k, o in enumerate(ops):
        for t in o.slots:
            if t is not None:
                last_touch[roots[t]] = k
    a_bytes = tensors[a].nbytes

    chain, cloned, todo, redirect = set(), {a}, [a], {a}
    while todo:
        r = todo.pop()
        for k in writers.get(r, ()):
            if k in chain:
                continue
            if ops[k].name in NOT_REPLAYED:
                return None
            chain.add(k)
            for t in _writes(ops[k]):   # every output of a replayed op is a copy, all its writers replayed
                if _same_for_good(ops, roots, writers, k, roots[t], n_fwd, at, last_touch):
                    redirect.add(roots[t])   # and the backward reads the copy of one it reads later
                if roots[t] not in cloned:
                    cloned.add(roots[t])
                    todo.append(roots[t])
            for slot, t in zip(ops[k].spec.slots, ops[k].slots):
                if t is None or slot.role != "in" or roots[t] in cloned:
                    continue
                x = roots[t]
                if (tensors[x].storage != "ARENA" or last_touch.get(x, -1) >= at
                        or tensors[x].nbytes * CHECKPOINT_SHARE <= a_bytes):
                    continue        # a constant or parameter, alive there anyway, or small: kept
                if x not in writers:
                    return None     # the input, dead by then
                cloned.add(x)       # dead and large: made again too
                todo.append(x)
        if len(chain) > MAX_CHAIN:
            return None
    chain = sorted(chain)
    # exact only if nothing a replayed op reads from outside the chain is written before the replay
    for k in chain:
        for t in ops[k].slots:
            if t is None or roots[t] in cloned:
                continue
            if any(roots[u] == roots[t] for o in ops[k + 1:at] for u in _writes(o)):
                return None

    n = len(tensors)
    clones, index = [], {}

    def copy(i):
        if roots[i] not in cloned:
            return i
        if i not in index:
            t = tensors[i]
            view = copy(t.view_of) if t.view_of is not None else None
            clones.append(TTensor("%s@replay%d" % (t.name, n + len(clones)), t.shape, t.dtype, view_of=view,
                                  onnx_shape=t.onnx_shape, quant=t.quant))
            index[i] = n + len(clones) - 1
        return index[i]

    replays = [replace(ops[k], phase="TRAIN", slots=[None if t is None else copy(t) for t in ops[k].slots],
                       attrs=list(ops[k].attrs)) for k in chain]
    after = [replace(o, slots=[t if t is None or roots[t] not in redirect else copy(t) for t in o.slots])
             for o in ops[at:]]
    return clones, ops[:at] + replays + after, sum(ops[k].macs for k in chain)
