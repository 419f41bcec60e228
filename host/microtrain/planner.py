"""Static arena planner: assigns a byte offset to every buffer of a training plan.

Each buffer has a size in bytes and a lifetime ``[first, last]`` (inclusive op
indices).  Two buffers whose lifetimes intersect must not share bytes; buffers
that are never live at the same time may.

Strategies
----------
``"greedy"``
    A re-implementation of the TensorFlow Lite Micro ``GreedyMemoryPlanner``
    (tensorflow/lite/micro/memory_planner/greedy_memory_planner.cc in
    github.com/tensorflow/tflite-micro).  The algorithm, as TFLM runs it:

    1. Order the buffers by size, largest first.  TFLM fills its sort array
       from the tail (the last added buffer lands at position 0) and then runs
       a *stable* descending sort, so among buffers of equal size the one added
       **last** is placed **first**.  :func:`reverse_sort` is that stable sort.
    2. The largest buffer goes to offset 0.
    3. Every following buffer looks at the already-placed buffers whose
       lifetimes intersect its own, in increasing offset order.  Keeping a
       running "candidate" offset (start 0; after looking at a placed buffer it
       becomes max(candidate, that buffer's end)), it takes the first placed
       buffer whose start lies at least ``size`` bytes above the candidate, and
       goes at the candidate.  If none has such a gap, it goes at the
       candidate after the last one (the highest end among them), or at 0 if
       no placed buffer is live at the same time.

    TFLM's planner itself does no alignment; its caller rounds sizes up before
    adding buffers.  Here every size is rounded up to ``align`` before
    planning, so with ``align=1`` (and ``gap=0``) the offsets are exactly
    TFLM's, and for any ``align`` they equal TFLM's offsets for the rounded
    sizes.  All offsets are then multiples of ``align`` because they are 0 or
    the end of another (rounded) buffer.

``"search"``
    The greedy plan first; where it leaves the arena above the lower bound
    (:func:`peak_live_bytes`: the most bytes alive at one op, which no plan can
    go under), the same first-fit placement in other orders: largest
    size x lifetime first, longest lifetime first, then a local search from the
    best of those, swapping a few buffers of the order at a time
    (``SEARCH_STEPS`` tries, a fixed seed, so the plan is the same on every run),
    keeping an order whenever its arena is no larger.  It stops at the lower
    bound.  TFLM's size order leaves gaps where long-lived small buffers (the
    1-bit masks a backward keeps) are placed after short-lived large ones; on
    MIT's networks the search closes them (docs/sparse.md).

``"naive"``
    Every buffer gets its own bytes, in input order (TFLM's
    ``LinearMemoryPlanner``).  Useful as a reference and for debugging.

Guard gaps
----------
With ``gap > 0`` each buffer is planned as a slot of
``round_up(size + gap, align)`` bytes and every offset is shifted up by
``round_up(gap, align)``.  Guarantees:

* the bytes ``[0, round_up(gap, align))`` (below every buffer) are never
  covered by any buffer;
* for a buffer B, its guard region ``[B.end, B.end + gap)`` lies inside the
  arena and is never covered by any buffer that is live at the same time as B
  (so two buffers live at the same time are always at least ``gap`` bytes
  apart).

Because buffers that are never live at the same time share memory (which is
the point of the plan), a buffer *may* cover the guard region of another buffer
while that other buffer is dead.  A guard test should therefore fill B's guard
bytes when B becomes live (before op ``B.first`` runs) and verify them while B
is live (after each op up to and including ``B.last``), not once for the
whole run.

Zero-size buffers get offset 0, take no space, get no guard and never overlap
anything.
"""

from __future__ import annotations

import bisect
import operator
import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = [
    "Buffer",
    "plan",
    "arena_size",
    "naive_size",
    "peak_live_bytes",
    "check",
    "reverse_sort",
    "STRATEGIES",
]

STRATEGIES = ("greedy", "search", "naive")
SEARCH_STEPS = 2000   # orders the local search tries at most (0.4 s for MCUNet's 108 buffers)
SEARCH_WORK = 2000 * 120 * 120   # fewer for more buffers: a first-fit placement costs n**2
SEARCH_MAX = 600      # buffers above which the search is not tried

# Arena offsets are planned with int64 arithmetic; refuse anything that could
# get near overflow.
_MAX_TOTAL = 1 << 62


@dataclass(frozen=True)
class Buffer:
    size: int  # bytes, >= 0
    first: int  # index of the first op that uses it (inclusive)
    last: int  # index of the last op that uses it (inclusive), last >= first


# --------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # accepts int and numpy integers
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None


def _check_align(align: object) -> int:
    a = _as_int(align, "align")
    if a < 1 or (a & (a - 1)) != 0:
        raise ValueError(f"align must be a power of two >= 1, got {a}")
    return a


def _check_gap(gap: object) -> int:
    g = _as_int(gap, "gap")
    if g < 0:
        raise ValueError(f"gap must be >= 0, got {g}")
    return g


def _validated(buffers: Sequence[Buffer]) -> list[tuple[int, int, int]]:
    """(size, first, last) per buffer; ValueError naming the buffer index."""
    if buffers is None:
        raise ValueError("buffers must be a list of Buffer, got None")
    out: list[tuple[int, int, int]] = []
    for i, b in enumerate(buffers):
        try:
            size, first, last = b.size, b.first, b.last
        except AttributeError:
            raise ValueError(
                f"buffer {i}: expected a Buffer(size, first, last), got {b!r}"
            ) from None
        size = _as_int(size, f"buffer {i}: size")
        first = _as_int(first, f"buffer {i}: first")
        last = _as_int(last, f"buffer {i}: last")
        if size < 0:
            raise ValueError(f"buffer {i}: negative size {size}")
        if first < 0:
            raise ValueError(f"buffer {i}: negative first op index {first}")
        if last < first:
            raise ValueError(f"buffer {i}: last ({last}) < first ({first})")
        out.append((size, first, last))
    return out


def _validated_offsets(offsets: Sequence[int], n: int) -> list[int]:
    if offsets is None:
        raise ValueError("offsets must be a list of int, got None")
    if len(offsets) != n:
        raise ValueError(f"got {len(offsets)} offsets for {n} buffers")
    out = []
    for i, o in enumerate(offsets):
        o = _as_int(o, f"buffer {i}: offset")
        if o < 0:
            raise ValueError(f"buffer {i}: negative offset {o}")
        out.append(o)
    return out


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


# --------------------------------------------------------------------------
# planning
# --------------------------------------------------------------------------


def reverse_sort(values: Sequence[int], ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """Stable sort of (value, id) pairs by value, largest first.

    Same result as TFLM's ``ReverseSortInPlace`` (a stable bubble sort): pairs
    with equal values keep their relative order.  Returns new lists.
    """
    if len(values) != len(ids):
        raise ValueError(f"got {len(values)} values but {len(ids)} ids")
    order = sorted(range(len(values)), key=lambda k: -values[k])  # sorted() is stable
    return [values[k] for k in order], [ids[k] for k in order]


def _greedy_virtual(slots: list[int], firsts: list[int], lasts: list[int], ids: list[int]) -> dict[int, int]:
    """TFLM greedy placement of the buffers ``ids`` (all with slot > 0).

    Returns {buffer id: offset}.  Placed buffers are kept in numpy arrays; for
    each new buffer the ones live at the same time are selected, sorted by
    offset, and the first big-enough gap is found with a running maximum of
    their ends -- the same scan TFLM does over its offset-ordered linked list.
    """
    # TFLM's order: sort array filled from the tail (reversed input order),
    # then a stable descending sort by size.
    rev = ids[::-1]
    _, order = reverse_sort([slots[i] for i in rev], rev)

    n = len(order)
    p_off = np.empty(n, dtype=np.int64)
    p_end = np.empty(n, dtype=np.int64)
    p_first = np.empty(n, dtype=np.int64)
    p_last = np.empty(n, dtype=np.int64)
    result: dict[int, int] = {}

    for count, i in enumerate(order):
        size, first, last = slots[i], firsts[i], lasts[i]
        offset = 0
        if count:
            live = (p_first[:count] <= last) & (p_last[:count] >= first)
            if live.any():
                offs = p_off[:count][live]
                ends = p_end[:count][live]
                by_offset = np.argsort(offs, kind="stable")
                offs = offs[by_offset]
                ends = ends[by_offset]
                # candidate offset when looking at the k-th live buffer:
                # max(0, ends of the live buffers before it).  Ends are > 0.
                candidate = np.zeros_like(offs)
                if len(offs) > 1:
                    np.maximum.accumulate(ends[:-1], out=candidate[1:])
                fits = np.flatnonzero(offs - candidate >= size)
                if fits.size:
                    offset = int(candidate[fits[0]])
                else:
                    offset = int(ends.max())
        p_off[count] = offset
        p_end[count] = offset + size
        p_first[count] = first
        p_last[count] = last
        result[i] = offset
    return result


def plan(buffers: list[Buffer], align: int = 8, strategy: str = "greedy", gap: int = 0) -> list[int]:
    """Offsets (multiples of align), one per buffer, such that buffers whose
    [first, last] intervals intersect never overlap in memory.

    strategy "greedy": TFLM's GreedyMemoryPlanner (see module docstring).
    strategy "search": the greedy plan, or a first-fit order's with a smaller arena (see the
    module docstring); never larger than the greedy one.
    strategy "naive": every buffer at its own offset, in input order.
    gap >= 0: guard bytes left free before the first buffer and after every
    buffer; two buffers live at the same time are always >= gap bytes apart
    and a buffer's guard is never covered by a buffer live at the same time.
    Zero-size buffers get offset 0 and take no space.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    align = _check_align(align)
    gap = _check_gap(gap)
    items = _validated(buffers)

    base = _round_up(gap, align)
    slots = [_round_up(size + gap, align) if size > 0 else 0 for size, _, _ in items]
    if base + sum(slots) >= _MAX_TOTAL:
        raise ValueError("buffers too large to plan (total size exceeds 2**62 bytes)")
    offsets = [0] * len(items)

    if strategy == "naive":
        cursor = base
        for i, slot in enumerate(slots):
            if slot:
                offsets[i] = cursor
                cursor += slot
        return offsets

    placed = [i for i, slot in enumerate(slots) if slot]
    if placed:
        virtual = _greedy_virtual(
            slots, [f for _, f, _ in items], [l for _, _, l in items], placed
        )
        if strategy == "search":
            virtual = _search(slots, items, placed, virtual)
        for i, v in virtual.items():
            offsets[i] = base + v
    return offsets


def _first_fit(slots, items, order):
    """(top, {buffer: offset}): each buffer in `order` at the lowest offset where it overlaps no
    placed buffer live at the same time (the greedy planner's scan, any order)."""
    placed: list[tuple[int, int, int, int]] = []   # (offset, end, first, last), kept in order
    result, top = {}, 0
    for i in order:
        size, (_, first, last) = slots[i], items[i]
        candidate = 0
        for off, end, f, l in placed:
            if f > last or l < first:
                continue    # not live at the same time
            if off - candidate >= size:
                break
            if end > candidate:
                candidate = end
        bisect.insort(placed, (candidate, candidate + size, first, last))
        result[i] = candidate
        top = max(top, candidate + size)
    return top, result


def _search(slots, items, ids, greedy):
    """The greedy offsets, or those of a first-fit order with a smaller arena ("search")."""
    top = max(greedy[i] + slots[i] for i in ids)
    bound = peak_live_bytes([Buffer(slots[i], items[i][1], items[i][2]) for i in ids], align=1)
    if top <= bound or len(ids) > SEARCH_MAX:
        return greedy
    rev = ids[::-1]
    best, order, offs = top, reverse_sort([slots[i] for i in rev], rev)[1], greedy   # the greedy planner's order
    for key in (lambda i: (-slots[i] * (items[i][2] - items[i][1] + 1), i),
                lambda i: (-(items[i][2] - items[i][1]), -slots[i], i)):
        o = sorted(ids, key=key)
        t, f = _first_fit(slots, items, o)
        if t < best:
            best, order, offs = t, o, f
    rng = random.Random(0)
    for _ in range(min(SEARCH_STEPS, SEARCH_WORK // len(ids) ** 2)):
        if best <= bound:
            break
        o = order[:]
        for _ in range(rng.randint(1, 4)):
            a, b = rng.randrange(len(o)), rng.randrange(len(o))
            o[a], o[b] = o[b], o[a]
        t, f = _first_fit(slots, items, o)
        if t <= best:
            best, order, offs = t, o, f
    return greedy if best >= top else offs   # the winner's offsets as first placed


# --------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------


def arena_size(buffers: list[Buffer], offsets: list[int], align: int = 8, gap: int = 0) -> int:
    """End of the highest non-empty buffer, plus gap, rounded up to align; 0 if none."""
    align = _check_align(align)
    gap = _check_gap(gap)
    items = _validated(buffers)
    offs = _validated_offsets(offsets, len(items))
    top = max((o + size for (size, _, _), o in zip(items, offs) if size > 0), default=None)
    if top is None:
        return 0
    return _round_up(top + gap, align)


def naive_size(buffers: list[Buffer], align: int = 8) -> int:
    """Sum of the buffer sizes, each rounded up to align."""
    align = _check_align(align)
    return sum(_round_up(size, align) for size, _, _ in _validated(buffers))


def peak_live_bytes(buffers: list[Buffer], align: int = 8) -> int:
    """Max over op index of the sum of aligned sizes of the buffers live there.

    No plan can use a smaller arena.  Computed with an event sweep.
    """
    align = _check_align(align)
    delta: dict[int, int] = {}
    for size, first, last in _validated(buffers):
        a = _round_up(size, align)
        if a:
            delta[first] = delta.get(first, 0) + a
            delta[last + 1] = delta.get(last + 1, 0) - a
    peak = live = 0
    for t in sorted(delta):
        live += delta[t]
        peak = max(peak, live)
    return peak


# --------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------


def check(buffers: list[Buffer], offsets: list[int], align: int = 8, gap: int = 0) -> None:
    """Raise ValueError if the plan is invalid.

    Invalid means: an offset is negative or not a multiple of align, or two
    non-empty buffers live at the same time overlap in memory (the message
    names both buffer indices).  With gap > 0, additionally every non-empty
    buffer must start at >= gap and two non-empty buffers live at the same
    time must be >= gap bytes apart.
    """
    align = _check_align(align)
    gap = _check_gap(gap)
    items = _validated(buffers)
    offs = _validated_offsets(offsets, len(items))

    for i, o in enumerate(offs):
        if o % align:
            raise ValueError(f"buffer {i}: offset {o} is not a multiple of align {align}")
        if gap and items[i][0] > 0 and o < gap:
            raise ValueError(f"buffer {i}: offset {o} leaves less than gap={gap} guard bytes below it")

    idx = [i for i, (size, _, _) in enumerate(items) if size > 0]
    if len(idx) < 2:
        return
    # Sweep in order of first use: buffer i (k-th by first) can only meet the
    # buffers sorted after it whose first <= last_i.
    idx.sort(key=lambda i: (items[i][1], i))
    size = np.array([items[i][0] for i in idx], dtype=np.int64)
    first = np.array([items[i][1] for i in idx], dtype=np.int64)
    last = np.array([items[i][2] for i in idx], dtype=np.int64)
    start = np.array([offs[i] for i in idx], dtype=np.int64)
    end = start + size
    for k in range(len(idx) - 1):
        stop = int(np.searchsorted(first, last[k], side="right"))
        if stop <= k + 1:
            continue
        s = slice(k + 1, stop)
        # j live at the same time as k (first_j >= first_k, first_j <= last_k);
        # they clash if their gap-widened extents intersect.
        clash = (start[s] < end[k] + gap) & (start[k] < end[s] + gap)
        if clash.any():
            j = k + 1 + int(np.flatnonzero(clash)[0])
            a, b = sorted((idx[k], idx[j]))
            oa, ob = offs[a], offs[b]
            (sa, fa, la), (sb, fb, lb) = items[a], items[b]
            what = "overlap" if (oa < ob + sb and ob < oa + sa) else f"are closer than gap={gap} bytes"
            raise ValueError(
                f"buffers {a} and {b} {what}: buffer {a} is [{oa}, {oa + sa}) live ops {fa}..{la}, "
                f"buffer {b} is [{ob}, {ob + sb}) live ops {fb}..{lb}"
            )
