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

Where the backward updates a parameter a replayed op reads before the copy is first read (a
block's bias, updated before the backward reaches that block's masks), the replay runs just before
that update instead.

A tensor is replayed only where the planned arena, plus what the replayed ops add to the runtime
context, gets at least 1% smaller, greedily (the tensors alive where the most bytes are, largest
first), the replayed multiply-accumulates adding up to at most the forward's own (at most one more
forward's work per step). When no single replay pays, compound moves are tried: one replay that
keeps a dead checkpoint as large as the replayed tensor (or 4 times it), which may not pay alone,
taken if the greedy replays it makes possible (the other tensors made again from the same
checkpoint) bring the arena down by 1% in all. The replayed ops run in the TRAIN phase: inference
(the FORWARD phase) is unchanged.

Last, a replayed op's outputs that wait long for their reader (a block's masks, made when the
block was replayed for a later block's backward, read by the block's own backward) are made again
by that op next to their reader, where an equal copy of each input it needs is alive there (the
block's input, replayed for its weight gradient) and no parameter those outputs depend on is
updated in between (ONLY_FOR: the masks do not depend on the block's projection, whose bias the
backward updates first). Any gain over the extra op's record pays: one op, no chain.
"""
from __future__ import annotations

from dataclasses import replace

from . import format as F
from .memory import _roots, arena_buffers, planned_arena
from .lowered import TTensor

NOT_REPLAYED = ("CONV_DW_PW_Q8_TO_PIPE", "CONV_DW_PW_Q8_FROM_PIPE")   # a pipe pair runs as one
CHECKPOINT_SHARE = 4    # a dead tensor at most 1/4 of the replayed one's bytes is kept, not replayed
MAX_CHAIN = 24          # ops replayed for one tensor
MIN_GAIN = 100          # a replay must lower the arena by at least 1/100 of it: no work for a few bytes
KEEPS = (1, 4)          # a compound move's first replay keeps dead tensors up to 1x, 4x its bytes
COMPOUND_TRIES = 8      # compound moves tried in all (each a greedy pass over the candidates): compile time
OP_BYTES = 256          # about what a replayed op adds to the runtime context (its decoded record)
# inputs that only some outputs of an op depend on: a block's masks do not depend on its projection
ONLY_FOR = {"PWDW_W8": {"w2": ("z",), "b2": ("z",)}}


def replay_saved(tensors, ops, io, strategy="greedy", gap=0):
    """The ops with saved activations replayed where that lowers the arena (module docstring);
    appends the copies to tensors. Returns (ops, names of the replayed tensors)."""
    if not any(o.phase != "FORWARD" for o in ops):
        return ops, []
    budget = sum(o.macs for o in ops if o.phase == "FORWARD")
    ops, replayed, spent, best = _greedy(tensors, ops, io, strategy, gap, budget, 0)
    tries = 0
    while tries < COMPOUND_TRIES:   # compound moves: one replay that may not pay alone, then the greedy ones after it
        move = None
        for a in _candidates(tensors, ops, io):
            for clones, first, macs in _wider(tensors, ops, a):
                if spent + macs > budget or tries >= COMPOUND_TRIES:
                    continue
                tries += 1
                trial = tensors + clones
                new_ops, more, total, arena = _greedy(trial, first, io, strategy, gap, budget, spent + macs)
                if _pays(arena, new_ops, best, ops):
                    move = trial, new_ops, total, arena, [trial[a].name] + more
                    break
            if move:
                break
        if move is None:
            break
        tensors[:], ops, spent, best, names = move
        replayed += names
    ops, late = _late_sides(tensors, ops, io, strategy, gap, budget, spent, best)
    return ops, replayed + late


def _wider(tensors, ops, a):
    """The replays of root a that keep a larger checkpoint than the greedy pass's (KEEPS), each chain
    once, none the greedy pass tried."""
    seen, out = {_shape(_replay(tensors, ops, a))}, []
    for k in KEEPS:
        f = _replay(tensors, ops, a, k * tensors[a].nbytes)
        if f is not None and _shape(f) not in seen:
            seen.add(_shape(f))
            out.append(f)
    return out


def _greedy(tensors, ops, io, strategy, gap, budget, spent):
    """Replay one tensor at a time while each lowers the arena, appending the copies to tensors:
    (ops, replayed names, MACs spent, arena)."""
    replayed = []
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
            if _pays(arena, new_ops, best, ops):
                best, spent, ops = arena, spent + macs, new_ops
                tensors.extend(clones)
                replayed.append(tensors[a].name)
                break
        else:
            return ops, replayed, spent, best


def _shape(found):
    """What tells two replays of one tensor apart: their op count and MACs (None: no replay)."""
    return None if found is None else (len(found[1]), found[2])


def _pays(arena, new_ops, best, ops):
    """Whether the arena with new_ops, plus what their extra ops add to the runtime context, is at
    least MIN_GAIN smaller than best with ops."""
    return arena + OP_BYTES * (len(new_ops) - len(ops)) <= best - max(F.ALIGN, best // MIN_GAIN)


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
    written = {roots[t] for o in ops[:n_fwd] for t in _writes(o)}
    out = [r for r, (f, l) in span.items()
           if f < n_fwd <= l and f <= peak <= l and r not in io_roots and r in written]
    return sorted(out, key=lambda r: -tensors[r].nbytes)


def _same_for_good(ops, roots, writers, k, r, at, last_touch, backward_writes):
    """Whether root r holds op k's output from op k on and is read at or after op `at` (a ReLU mask
    the backward keeps), so that the ops from `at` on may read a replay's copy of it instead, and r
    need not live through the backward: op k its only writer, forward or backward (backward_writes:
    the roots the backward writes), and not reading it (nothing in place)."""
    return (writers.get(r) == [k] and last_touch.get(r, -1) >= at
            and not any(roots[t] == r for slot, t in zip(ops[k].spec.slots, ops[k].slots)
                        if t is not None and slot.role != "out")
            and r not in backward_writes)


def _replay(tensors, ops, a, keep=None):
    """(new tensors, new ops, replayed MACs) that recompute root a before its first backward
    toucher, or None where that cannot be exact or needs too many ops."""
    roots = _roots(tensors)
    n_fwd = next(k for k, o in enumerate(ops) if o.phase != "FORWARD")
    at = next(k for k in range(n_fwd, len(ops)) if any(roots[t] == a for t in ops[k].slots if t is not None))
    if at == n_fwd or ops[at].phase != "TRAIN":
        return None     # read by the loss (the first training op), or only at the batch's end
    writes = [[roots[t] for t in _writes(o)] for o in ops]   # the roots each op writes
    writers = {}    # root -> the forward ops writing it
    for k in range(n_fwd):
        for r in writes[k]:
            writers.setdefault(r, []).append(k)
    backward_writes = {r for w in writes[n_fwd:] for r in w}
    last_touch = {}
    for k, o in enumerate(ops):
        for t in o.slots:
            if t is not None:
                last_touch[roots[t]] = k
    keep = tensors[a].nbytes // CHECKPOINT_SHARE if keep is None else keep

    chain, cloned, todo, redirect = set(), {a}, [a], {a}
    while todo:
        r = todo.pop()
        for k in writers.get(r, ()):
            if k in chain:
                continue
            if ops[k].name in NOT_REPLAYED:
                return None
            chain.add(k)
            for w in writes[k]:   # every output of a replayed op is a copy, all its writers replayed
                if _same_for_good(ops, roots, writers, k, w, at, last_touch, backward_writes):
                    redirect.add(w)   # and the backward reads the copy of one it reads later
                if w not in cloned:
                    cloned.add(w)
                    todo.append(w)
            for slot, t in zip(ops[k].spec.slots, ops[k].slots):
                if t is None or slot.role != "in" or roots[t] in cloned:
                    continue
                x = roots[t]
                if (tensors[x].storage != "ARENA" or last_touch.get(x, -1) >= at
                        or tensors[x].nbytes <= keep):
                    continue        # a constant or parameter, alive there anyway, or small: kept
                if x not in writers:
                    return None     # the input, dead by then
                cloned.add(x)       # dead and large: made again too
                todo.append(x)
        if len(chain) > MAX_CHAIN:
            return None
    chain = sorted(chain)
    # exact only if nothing a replayed op reads from outside the chain is written before the replay:
    # where the backward writes it before `at` (a bias updated before its op's mask is read), the
    # replay runs before that write
    for k in chain:
        for t in ops[k].slots:
            if t is None or roots[t] in cloned:
                continue
            w = next((j for j in range(k + 1, at) if roots[t] in writes[j]), at)
            if w <= n_fwd:
                return None
            at = w

    n = len(tensors)
    clones, index = [], {}

    def copy(i):
        if roots[i] not in cloned:
            return i
        if i not in index:
            t = tensors[i]
            view = copy(t.view_of) if t.view_of is not None else None
            clones.append(TTensor("%s@replay%d" % (t.name, n + len(clones)), t.shape, t.dtype, view_of=view,
                                  onnx_shape=t.onnx_shape, quant=t.quant, replay_of=i))
            index[i] = n + len(clones) - 1
        return index[i]

    replays = [replace(ops[k], phase="TRAIN", slots=[None if t is None else copy(t) for t in ops[k].slots],
                       attrs=list(ops[k].attrs)) for k in chain]
    after = [replace(o, slots=[t if t is None or roots[t] not in redirect else copy(t) for t in o.slots])
             for o in ops[at:]]
    return clones, ops[:at] + replays + after, sum(ops[k].macs for k in chain)


def _late_sides(tensors, ops, io, strategy, gap, budget, spent, best):
    """Replayed outputs that wait long for their reader (a block's masks, made with the block's
    output for a later block's backward and read by the block's own) made again next to it instead,
    by the replayed op once more, where a copy equal to each input it needs is alive there
    (_alive_equal) and nothing else it needs is written in between; taken, greedily, where the
    arena gets smaller by more than the op's record. Returns (ops, names of the outputs made again)."""
    moved = []
    while True:
        for p, q, sides in _side_candidates(tensors, ops):
            found = _make_again(tensors, ops, p, q, sides)
            if found is None:
                continue
            clones, new_ops = found
            if spent + ops[p].macs > budget:
                continue
            arena = planned_arena(tensors + clones, new_ops, io, strategy, gap)
            if arena + OP_BYTES < best:   # one op more: any gain over its record (a few ops, no chain)
                best, spent, ops = arena, spent + ops[p].macs, new_ops
                tensors.extend(clones)
                moved += [tensors[t].name for t in sides]
                break
        else:
            return ops, moved


def _readers(ops):
    """tensor -> the ops that read it (an input slot), in order"""
    out = {}
    for k, o in enumerate(ops):
        for slot, t in zip(o.spec.slots, o.slots):
            if t is not None and slot.role == "in":
                out.setdefault(t, []).append(k)
    return out


def _side_candidates(tensors, ops):
    """(p, q, sides): a replayed op p (TRAIN, writing replay copies) and its outputs that no op right
    after it reads (nor any view), read first at op q."""
    readers = _readers(ops)
    views = {t.view_of for t in tensors if t.view_of is not None}
    for p, o in enumerate(ops):
        if o.phase != "TRAIN":
            continue
        outs = [t for slot, t in zip(o.spec.slots, o.slots) if t is not None and slot.role == "out"]
        if not outs or any(tensors[t].replay_of is None for t in outs):
            continue
        late = [t for t in outs if t not in views and tensors[t].view_of is None and readers.get(t)
                and readers[t][0] > p + 1]
        if late:
            yield p, min(readers[t][0] for t in late), late


def _alive_equal(tensors, ops, t, at, writes, roots):
    """A tensor equal to t (t itself, or another replay copy of the forward tensor t copies) that
    holds it at op `at`: written before `at`, its memory written by nothing else from then to `at`."""
    origin = tensors[t].replay_of if tensors[t].replay_of is not None else t
    best = None
    for c, u in enumerate(tensors):
        if c != origin and u.replay_of != origin:
            continue
        w = [k for k in range(at) if c in ops[k].slots and roots[c] in writes[k]]
        if not w or any(roots[c] in writes[k] for k in range(w[-1] + 1, at)):
            continue
        if best is None or w[-1] > best[1]:
            best = (c, w[-1])
    return None if best is None else best[0]


def _make_again(tensors, ops, p, q, sides):
    """(new tensors, new ops) with op p run again just before op q, writing fresh copies of `sides`,
    which the ops from q on read instead; None where an input it needs has no equal copy alive at q
    or is written between p and q."""
    o = ops[p]
    roots = _roots(tensors)
    writes = [{roots[t] for t in _writes(u)} for u in ops]
    side_slots = {slot.name for slot, t in zip(o.spec.slots, o.slots) if t in sides}
    only = ONLY_FOR.get(o.name, {})
    slots = list(o.slots)
    for i, (slot, t) in enumerate(zip(o.spec.slots, o.slots)):
        if t is None or slot.role != "in":
            continue
        if slot.name in only and not side_slots & set(only[slot.name]):
            continue   # read only for outputs nobody reads from the new op
        if tensors[roots[t]].storage != "ARENA":
            if any(roots[t] in writes[k] for k in range(p + 1, q)):
                return None   # a parameter updated in between
            continue
        c = _alive_equal(tensors, ops, t, q, writes, roots)
        if c is None:
            return None
        slots[i] = c
    n, clones = len(tensors), []
    new = {}
    for i, (slot, t) in enumerate(zip(o.spec.slots, o.slots)):
        if t is not None and slot.role == "out":
            u = tensors[t]
            clones.append(TTensor("%s@again%d" % (u.name.split("@replay")[0], n + len(clones)), u.shape, u.dtype,
                                  onnx_shape=u.onnx_shape, quant=u.quant, replay_of=u.replay_of))
            new[t] = n + len(clones) - 1
            slots[i] = new[t]
    again = replace(o, slots=slots, attrs=list(o.attrs))
    after = [replace(u, slots=[new.get(t, t) if t in sides else t for t in u.slots]) for u in ops[q:]]
    return clones, ops[:q] + [again] + after
