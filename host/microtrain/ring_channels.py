"""Run a streamed int8 block a channel at a time where its ring sets the arena's peak.

CONV_DW_PW_Q8 (and its pipe forms, mt_cdp_q8.c) keeps the last R rows of its first conv's
output, all E channels, for its depthwise conv (R = the depthwise window's rows). With a ring of
one channel (R x 1 x W1) the op makes each row of the depthwise output a channel at a time: the
window's R rows of channel c, then that channel's row. The first conv's rows are then made
again for every depthwise row whose window holds them (3 times as many sums for a 3x3 depthwise
conv at stride 1, 1.5 at stride 2), for E times less ring; a pipe into the op then holds the
rows of x that R rows span, not one window's. The integers are the same.

MCU networks' stem and first blocks, piped (q8_fuse.pipe_pairs), hold the 48 KB input beside
their rings: this is where a sparse update's arena peaks. A ring is made one channel only where
the live bytes at the peak drop by at least 1% and the planned arena does not grow, and is kept
so only where the arena needs it in the end (prune; the extra sums are in the op's MACs).
"""
from __future__ import annotations

from . import format as F
from . import planner
from .memory import arena_buffers, planned_arena

STREAMED = ("CONV_DW_PW_Q8", "CONV_DW_PW_Q8_TO_PIPE", "CONV_DW_PW_Q8_FROM_PIPE")
MIN_GAIN = 100          # at least 1/100 of the live bytes at the peak (recompute.py: of the arena)


def one_channel_rings(tensors, ops, io, strategy="greedy", gap=0):
    """Make rings one channel (module docstring) where that lowers the live bytes at the arena's
    peak by at least 1% without raising the planned arena (the arena itself may wait for a replay,
    recompute.py, that lowers another peak: prune() then undoes what did not pay); changes
    tensors and ops in place, the ops' MACs counted again. Returns the ops changed."""
    changed = []
    arena, live = _planned(tensors, ops, io, strategy, gap)
    todo = [o for o in ops if o.name in STREAMED and not _one(tensors, o)]
    for o in sorted(todo, key=lambda o: -_ring(tensors, o).nbytes):
        if not _set(tensors, o, True):
            continue
        a, lv = _planned(tensors, ops, io, strategy, gap)
        if a <= arena and lv <= live - max(8, live // MIN_GAIN):
            arena, live = a, lv
            changed.append(o)
        else:
            _set(tensors, o, False)
    return changed


def prune(tensors, ops, io, changed, strategy="greedy", gap=0):
    """Give back their rings of all channels to the ops in `changed` whose one-channel ring the
    planned arena does not need (last changed first). Returns the ops kept one channel."""
    arena = _planned(tensors, ops, io, strategy, gap)[0]
    kept = []
    for o in reversed(changed):
        _set(tensors, o, False)
        if _planned(tensors, ops, io, strategy, gap)[0] > arena:
            _set(tensors, o, True)
            kept.append(o)
    return kept[::-1]


def _planned(tensors, ops, io, strategy, gap):
    """(planned arena, live bytes at the peak)."""
    _, bufs = arena_buffers(tensors, ops, io)
    return planned_arena(tensors, ops, io, strategy, gap), planner.peak_live_bytes(bufs, F.ALIGN)


def _one(tensors, o):
    """Op o's ring holds one channel of its E > 1 (its row tensor holds E x OW)."""
    return _ring(tensors, o).shape[1] == 1 < tensors[_slot(o, "row")].shape[0]


def _set(tensors, o, one):
    """Op o's ring one channel (one) or all channels, its pipe and MACs to match; False if it
    cannot be one channel (a single channel, or a pipe shorter than R rows of its first conv span)."""
    if one == _one(tensors, o):
        return True     # as asked already
    ring, E = _ring(tensors, o), tensors[_slot(o, "row")].shape[0]
    R, W1 = ring.shape[0], ring.shape[2]
    pipe = tensors[_slot(o, "x")] if o.name == "CONV_DW_PW_Q8_FROM_PIPE" else None
    rows = _x_span(tensors, o, R if one else 1)
    if one and (E == 1 or (pipe is not None and rows > o.attrs[-1])):
        return False
    ring.shape = (R, 1 if one else E, W1)
    if pipe is not None:
        pipe.shape = (rows,) + tuple(pipe.shape[1:])
    o.macs += (1 if one else -1) * _extra_macs(tensors, o, E, W1)
    return True


def _slot(o, name):
    return o.slots[o.spec.slot_index(name)]


def _ring(tensors, o):
    return tensors[_slot(o, "ring")]


def _x_span(tensors, o, n):
    """Rows of x that n consecutive rows of the first conv's output read."""
    a, kh = o.attrs, tensors[_slot(o, "w0")].shape[2]
    return (n - 1) * a[0] + (kh - 1) * a[6] + 1      # stride_h, dil_h (format.CONV_ATTRS)


def _extra_macs(tensors, o, E, W1):
    """The first conv's sums made again: rows of it per depthwise row, beyond each row once."""
    a, w0 = o.attrs, tensors[_slot(o, "w0")]
    H1 = _first_rows(tensors, o)
    sh, pt, kh, dh = a[9], a[11], tensors[_slot(o, "w1")].shape[2], a[15]   # the depthwise's (DW_ATTRS)
    made = 0
    for oy in range(_dw_rows(tensors, o)):
        by = oy * sh - pt
        made += sum(1 for ky in range(kh) if 0 <= by + ky * dh < H1)
    return max(0, made - H1) * E * W1 * w0.shape[1] * w0.shape[2] * w0.shape[3]


def _first_rows(tensors, o):
    """H1: rows of the first conv's output."""
    a, x, kh = o.attrs, tensors[_slot(o, "x")], tensors[_slot(o, "w0")].shape[2]
    h = o.attrs[-1] if o.name == "CONV_DW_PW_Q8_FROM_PIPE" else x.shape[2]
    return (h + a[2] + a[4] - (kh - 1) * a[6] - 1) // a[0] + 1


def _dw_rows(tensors, o):
    """Rows of the op's output (the depthwise conv's)."""
    y = tensors[_slot(o, "y")]
    return o.attrs[-1] if o.name == "CONV_DW_PW_Q8_TO_PIPE" else y.shape[2]
