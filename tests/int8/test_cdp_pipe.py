"""Two streamed int8 blocks in a row as a pipe (q8_fuse.pipe_pairs; CONV_DW_PW_Q8_TO_PIPE and
CONV_DW_PW_Q8_FROM_PIPE, mt_cdp_q8.c).

A stem (3x3 stride-2 conv, depthwise 3x3, 1x1 projection) followed by a second streamed block
whose first conv is a 1x1 expansion (an MCU network's blocks.1) or a 3x3 stride-2 conv (a pipe
of three rows), then a 1x1 conv, pooling and a Linear head; both exporters, int8 with the head
training:
* piped, the first block's output exists as the rows one window of the second's first conv
  spans; outputs and parameters after 30 SGD steps are those of the plan without the pipe, bit
  for bit, and the live arena peak is lower by about that output;
* a pipe read by an op that does not follow its writer, or with a rows attribute that is not
  the writer's, is refused at load (MT_E_OP), as is a reader whose outputs overlap what its
  writer touches (MT_E_ALIAS) and a pipe of the wrong number of rows (MT_E_SHAPE).
"""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

import int8_models as M
import microtrain
import microtrain.q8_fuse
from microtrain import format as F
from microtrain.native import Core, PlanError
from microtrain.peak import alive_at_peak
from test_pwdw_q8 import _patched

SHAPE = (1, 3, 64, 48)


class TwoBlocks(nn.Module):
    """stem 3x3/2 -> depthwise 3x3 -> 1x1 projection, then `second`: a 1x1 expansion or a 3x3/2
    conv -> depthwise 3x3 -> 1x1 projection; then a 1x1 conv, pooling, Linear."""

    def __init__(self, second="expand", out=4):
        super().__init__()
        torch.manual_seed(0)

        def cbr(*args, relu=True, **kw):
            layers = [nn.Conv2d(*args, **kw), nn.BatchNorm2d(args[1])]
            return nn.Sequential(*layers, nn.ReLU6()) if relu else nn.Sequential(*layers)

        first = cbr(8, 12, 1) if second == "expand" else cbr(8, 12, 3, stride=2, padding=1)
        self.body = nn.Sequential(cbr(3, 8, 3, stride=2, padding=1), cbr(8, 8, 3, padding=1, groups=8),
                                  cbr(8, 8, 1, relu=False),
                                  first, cbr(12, 12, 3, padding=1, groups=12), cbr(12, out, 1, relu=False))
        self.head = nn.Conv2d(out, 6, 1)
        self.fc = nn.Linear(6, 10)
        M.trained_bn_stats(self, 3)

    def forward(self, x):
        h = torch.relu(self.head(self.body(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


def ops(plan):
    return [o["op"] for o in plan.ops]


def writer(plan):
    """The index of the pipe's writer (its reader follows it)."""
    return ops(plan).index("CONV_DW_PW_Q8_TO_PIPE")


def compile_pair(tmp_path, second, exporter, monkeypatch):
    src = M.export(TwoBlocks(second).eval(), str(tmp_path / ("two-%s.onnx" % second)), exporter, shape=SHAPE)
    rng = np.random.default_rng(1)
    # uint8 pixels in, as an MCU network takes them: the stem's input and output bound the arena
    kw = dict(update="last-layer", quantize="int8", calibration=rng.uniform(0, 1, (16,) + SHAPE[1:]).astype(np.float32),
              input_dtype="uint8", input_quant=(1 / 255, 0), lr=0.05, momentum=0.9)
    with monkeypatch.context() as m:   # rings of all channels (a ring of one: test_ring_channels.py)
        m.setattr(microtrain.compiler, "one_channel_rings", lambda *a, **k: [])
        piped = microtrain.compile(src, **kw)
        m.setattr(microtrain.q8_fuse, "pipe_pairs", lambda nodes, values, keep=(): nodes)
        plain = microtrain.compile(src, **kw)
    return piped, plain


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("second, rows", [("expand", 1), ("conv3s2", 3)])
def test_piped_plan_is_the_plain_plan(tmp_path, monkeypatch, second, rows, exporter):
    piped, plain = compile_pair(tmp_path, second, exporter, monkeypatch)
    k = writer(piped)
    assert ops(piped)[k:k + 2] == ["CONV_DW_PW_Q8_TO_PIPE", "CONV_DW_PW_Q8_FROM_PIPE"], ops(piped)
    assert ops(plain)[k:k + 2] == ["CONV_DW_PW_Q8", "CONV_DW_PW_Q8"]
    pipe = piped.tensors[piped.ops[k]["slots"][F.OPS_BY_NAME["CONV_DW_PW_Q8_TO_PIPE"].slot_index("y")]]
    assert pipe["shape"] == (rows, 8, 24) and pipe["dtype"] == "I8"
    rng = np.random.default_rng(2)
    xs, ys = rng.integers(0, 256, (30,) + SHAPE[1:]).astype(np.uint8), rng.integers(0, 10, 30)
    got = {}
    for name, plan in (("piped", piped), ("plain", plain)):
        sim = microtrain.Simulator(plan)
        outs = [sim.predict(x) for x in xs[:5]]
        for x, y in zip(xs, ys):
            sim.step(x, y)
        got[name] = (outs, sim.params())
    for a, b in zip(got["piped"][0], got["plain"][0]):
        assert np.array_equal(a, b)
    for k in got["plain"][1]:
        assert np.array_equal(got["piped"][1][k], got["plain"][1][k]), k
    # the first block's output (8 x 32 x 24 int8) is not alive whole any more: beside the input and
    # the first's ring and row, the second's output (4 channels), ring and row, and the pipe
    h, w = (32, 24) if second == "expand" else (16, 12)
    second_scratch = 3 * 12 * w + 12 * w
    saved = alive_at_peak(plain)["live_bytes"] - alive_at_peak(piped)["live_bytes"]
    assert saved >= 8 * 32 * 24 - 4 * h * w - second_scratch - rows * 8 * 24 - 64, saved


def test_no_pipe_where_it_would_raise_the_peak(tmp_path, monkeypatch):
    """A second block with an output larger than the first's: piping would keep the stem's input
    alive beside it, more than the first's output and the input are; the pair stays two ops."""
    src = M.export(TwoBlocks("expand", out=32).eval(), str(tmp_path / "wide.onnx"), "ts", shape=SHAPE)
    rng = np.random.default_rng(1)
    monkeypatch.setattr(microtrain.compiler, "one_channel_rings", lambda *a, **k: [])
    plan = microtrain.compile(src, update="last-layer", quantize="int8", input_dtype="uint8", input_quant=(1 / 255, 0),
                              calibration=rng.uniform(0, 1, (16,) + SHAPE[1:]).astype(np.float32))
    assert "CONV_DW_PW_Q8_TO_PIPE" not in ops(plan) and ops(plan).count("CONV_DW_PW_Q8") == 2, ops(plan)


def _ops_at(data):
    h = dict(zip((f for f, _ in F.HEADER_FIELDS), F.HEADER_STRUCT.unpack_from(data, 0)))
    pos, out = h["ops_off"], []
    for _ in range(h["n_ops"]):
        start = pos
        code, phase, slots, attrs, pos = F.unpack_op(data, pos)
        out.append((start, code, phase, slots, attrs))
    return out


def _with_op(data, k, slots=None, attrs=None):
    """The plan bytes with op k's slots or attributes replaced (same counts), the CRC fixed."""
    b = bytearray(data)
    start, code, phase, s, a = _ops_at(data)[k]
    rec = F.pack_op(code, phase, slots if slots is not None else s, attrs if attrs is not None else a)
    b[start:start + len(rec)] = rec
    crc = F.header_offsets()["crc32"]
    b[crc:crc + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


@pytest.fixture(scope="module")
def piped_plan(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        return compile_pair(tmp_path_factory.mktemp("pipe"), "conv3s2", "ts", mp)[0]
    finally:
        mp.undo()


def test_a_pipe_only_after_its_writer(piped_plan):
    data, k = piped_plan.data, writer(piped_plan)
    Core(data)   # as compiled, it loads
    (ws_at, _, _, ws, _), (rs_at, _, _, rs, ra) = _ops_at(data)[k:k + 2]
    # the reader before its writer (the two records swapped: each op valid on its own)
    b = bytearray(data)
    size = rs_at - ws_at
    b[ws_at:rs_at], b[rs_at:rs_at + size] = data[rs_at:rs_at + size], data[ws_at:rs_at]
    crc = F.header_offsets()["crc32"]
    b[crc:crc + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    with pytest.raises(PlanError, match=r"invalid op record \(op %d\)" % k):
        Core(bytes(b))
    # the reader's rows attribute not the writer's
    with pytest.raises(PlanError, match=r"\(op %d\)" % (k + 1)):
        Core(_with_op(data, k + 1, attrs=ra[:-1] + [ra[-1] + 2]))
    # the reader reading another tensor than the pipe (the writer's ring, of the pipe's dtype)
    ring = ws[F.OPS_BY_NAME["CONV_DW_PW_Q8_TO_PIPE"].slot_index("ring")]
    with pytest.raises(PlanError, match=r"\(op %d\)" % (k + 1)):
        Core(_with_op(data, k + 1, slots=[ring] + rs[1:]))


def test_a_reader_writing_over_its_writers_tensors_is_refused(piped_plan):
    """The reader's output moved onto the writer's input, which the reader runs the writer on: the
    reader on its own is fine (it does not touch that input), the pair is not."""
    spec, k = F.OPS_BY_NAME["CONV_DW_PW_Q8_FROM_PIPE"], writer(piped_plan)
    (_, _, _, ws, _), (_, _, _, rs, _) = _ops_at(piped_plan.data)[k:k + 2]
    x, y = ws[spec.slot_index("x")], rs[spec.slot_index("y")]
    assert piped_plan.tensors[y]["bytes"] <= piped_plan.tensors[x]["bytes"]
    with pytest.raises(PlanError, match=r"tensors overlap in memory where they must not \(op %d\)" % (k + 1)):
        Core(_patched(piped_plan.data, y, offset=piped_plan.tensors[x]["offset"]))


@pytest.mark.parametrize("delta", [-1, +1])
def test_a_pipe_of_the_wrong_size_is_refused(piped_plan, delta):
    """One row short or long (moved to fresh memory at the arena's end)."""
    k = writer(piped_plan)
    i = piped_plan.ops[k]["slots"][F.OPS_BY_NAME["CONV_DW_PW_Q8_TO_PIPE"].slot_index("y")]
    rows, C, W = piped_plan.tensors[i]["shape"]
    end = piped_plan.header["arena_bytes"]
    grown = dict(arena_bytes=end + -(-(rows + 1) * C * W // F.ALIGN) * F.ALIGN)
    Core(_patched(piped_plan.data, i, grown, offset=end))   # the right size there loads
    bad = _patched(piped_plan.data, i, grown, dim0=rows + delta, bytes=(rows + delta) * C * W, offset=end)
    with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % (k + 1)):
        Core(bad)
