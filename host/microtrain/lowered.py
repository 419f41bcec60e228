"""The lowered plan's records: the tensors and ops that autodiff (training.py) emits and every
pass after it (int8 fusion, streaming, recompute, the memory plan) edits, before the plan
writer packs them into the format. Below training.py in the import stack, so that the
passes and training's own rules (q8_rules.py) import them without importing training."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np

from . import format as F


@dataclass
class TTensor:
    name: str
    shape: tuple
    dtype: str = "F32"
    storage: str = "ARENA"          # ARENA, CONST, STATE
    flags: int = 0                  # format.TFLAGS
    data: np.ndarray | None = None  # constant value, or a parameter's initial value
    view_of: int | None = None      # index of the tensor whose memory this one uses
    onnx_shape: tuple = ()
    offset: int = 0                 # in the arena or the state region, set by the memory plan
    data_offset: int = 0            # in the plan's data section, for constants and initial values
    quant: object = None            # ir.Quant of an integer tensor
    replay_of: int | None = None    # a replay's copy: the index of the forward tensor it equals (recompute.py)

    @property
    def nbytes(self):
        return int(math.prod(self.shape)) * F.DTYPES[self.dtype][1]   # math.prod: called very often, np.prod is slow


@dataclass
class TOp:
    name: str                       # format.OPS name
    phase: str                      # FORWARD, TRAIN, BATCH_END
    slots: list                     # tensor index or None, per format slot
    attrs: list = field(default_factory=list)
    source: str = ""                # the ONNX node it came from
    macs: int = 0
    blocks: int = 1                 # its stream constants in this many blocks, the op run once per block (stream.py)

    @property
    def spec(self):
        return F.OPS_BY_NAME[self.name]


def f32_bits(v):
    return struct.unpack("<i", struct.pack("<f", v))[0]


def drop_unused(tensors, ops):
    """Remove the tensors no op touches (what a fusion left behind: dw_stream.py's inner tensors, a
    piped int8 tensor), renumbering the ops' slots and the views, so that the plan neither places
    nor lists them; the input, target and output stay."""
    used = {t for o in ops for t in o.slots if t is not None}
    used |= {i for i, t in enumerate(tensors) if t.flags & (F.TFLAGS["INPUT"] | F.TFLAGS["OUTPUT"] | F.TFLAGS["TARGET"])}
    for i in sorted(used):   # the memory a used view lives in
        while tensors[i].view_of is not None:
            i = tensors[i].view_of
            used.add(i)
    new = {i: n for n, i in enumerate(sorted(used))}
    kept = [tensors[i] for i in sorted(used)]
    for t in kept:
        t.view_of = new[t.view_of] if t.view_of is not None else None
    tensors[:] = kept
    for o in ops:
        o.slots = [new[t] if t is not None else None for t in o.slots]
