"""The int8 expansion streamed into the float projection that reads it (PWDW_DQ_W8, PWDW_DQ) and a
residual from the int8 prefix added without its float copy (ADD_DQ): dq_conv.py, mt_pwdw_q8.c,
mt_quant.c.

int8_models.Block (stem, 1x1 expansion, depthwise kxk, 1x1 projection with the residual where the
shapes allow, head; both exporters), int8 up to the depthwise output, the projection's bias and the
head training:
* the PWDW_Q8 and the projection's CONV2D_DQ_W8 (CONV2D_DQ with float32 frozen weights) become one
  PWDW_DQ_W8 (PWDW_DQ), and the DEQUANTIZE of the residual and its ADD one ADD_DQ; predictions,
  losses and parameters after 20 steps with momentum are those of the plan with none of the
  DEQUANTIZE fusions, bit for bit, over depthwise kernels, strides, dilations and the number of
  channels dequantized at a time; the arena is smaller;
* a projection the builder ran in place over the float copy (CONV2D_PW_INPLACE) reads the int8
  tensor (CONV2D_DQ) where streaming does not pay, its output in memory of its own; where the
  output of the ADD ran in place over the float copy, it takes the other operand's memory, or
  memory of its own where that is read later (ops as the compiler holds them);
* nothing is fused where the depthwise output has another reader, where the expansion's input is
  written in between, or where the conv is not 1x1;
* a row, float rows or output row of the wrong size are refused at load; so is a 3x3 projection
  fused by a compiler whose own check is switched off;
* MbV2-w0.35 138kb in place: blocks.5's depthwise output and its residual's float copy never exist,
  the forward's most live bytes fall by more than 16 KB, the arena is smaller, and the plan trains
  as the unfused one.
"""
from __future__ import annotations

import numpy as np
import pytest

import int8_models as M
import microtrain
from microtrain import dq_conv, format as F
from microtrain.peak import alive_at_peak
from microtrain.native import Core, PlanError
from microtrain.lowered import TOp, TTensor
from test_dq_conv import block_plans as dq_plans, names, trains_alike_and_moves
from test_pwdw_q8 import _patched
from tte_parity import assert_trains_alike, tte

SHAPE = (1, 3, 12, 12)
BIG = (1, 3, 32, 32)   # for stride 2: the depthwise output then outweighs the expansion's ring rows
SPEC = F.OPS_BY_NAME["PWDW_DQ_W8"]


def block_plans(tmp_path, exporter, k=3, stride=1, pad=1, dil=1, planes=None, frozen_weights="int8", shape=SHAPE):
    """(fused, unfused) plans of the Block (test_dq_conv.block_plans, every fusion); at the BIG shape 4
    channels expanded to 32."""
    size = dict(width=4, expand=32) if shape == BIG else {}
    return dq_plans(tmp_path, exporter, planes, frozen_weights=frozen_weights, streams=True, shape=shape, k=k,
                    stride=stride, pad=pad, dil=dil, **size)


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("k,stride,pad,dil,planes,frozen,shape", [
    (3, 1, 1, 1, None, "int8", SHAPE), (3, 1, 1, 1, 24, "int8", SHAPE), (3, 1, 1, 1, 5, "float32", SHAPE),
    (5, 2, 2, 1, 1, "int8", BIG), (3, 1, 2, 2, 7, "int8", SHAPE), (3, 2, 0, 1, None, "float32", BIG)])
def test_streamed_plan_is_the_unfused_plan(tmp_path, exporter, k, stride, pad, dil, planes, frozen, shape):
    fused, plain = block_plans(tmp_path, exporter, k, stride, pad, dil, planes, frozen, shape)
    form = "PWDW_DQ_W8" if frozen == "int8" else "PWDW_DQ"
    residual = stride == 1 and 2 * pad == dil * (k - 1)
    assert form in names(fused) and "PWDW_Q8" in names(plain) and "PWDW_Q8" not in names(fused)
    assert ("ADD_DQ" in names(fused)) == residual and "ADD_DQ" not in names(plain)
    assert "DEQUANTIZE" not in names(fused)
    # no float copy left, not even as the memory an output in place over it lives in
    assert not any(t["name"].endswith("/real") for t in fused.tensors)
    assert any(t["name"].endswith("/real") for t in plain.tensors)
    op = next(o for o in fused.ops if o["op"] == form)
    d = plain.tensors[next(o for o in plain.ops if o["op"] == "PWDW_Q8")["slots"][-1]]   # the depthwise output
    E, OW = d["shape"][1], d["shape"][3]
    row, xs = (fused.tensors[op["slots"][SPEC.slot_index(s)]] for s in ("row", "xs"))
    assert list(row["shape"]) == [E, OW] and row["dtype"] == "I8"
    assert list(xs["shape"]) == [planes or dq_conv.planes(E), OW]
    assert fused.report()["arena_bytes"] < plain.report()["arena_bytes"]
    trains_alike_and_moves(fused, plain, shape)


def test_not_streamed_where_the_ring_outweighs_the_depthwise_output(tmp_path):
    """A stride-2 5x5 depthwise conv on a 12x12 input: its 5 ring rows of the expansion (1,440 B)
    are more than its 6x6 output (864 B). The projection reads it a plane at a time instead."""
    fused, plain = block_plans(tmp_path, "ts", 5, 2, 2)
    assert "PWDW_DQ_W8" not in names(fused) and "CONV2D_DQ_W8" in names(fused)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dq_conv, "_streaming_pays", lambda *a: True)
        forced = block_plans(tmp_path, "ts", 5, 2, 2)[0]
    assert "PWDW_DQ_W8" in names(forced)
    assert forced.report()["arena_bytes"] > fused.report()["arena_bytes"]


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("frozen", ["int8", "float32"])
def test_a_projection_in_place_over_the_float_copy_reads_the_int8_tensor(tmp_path, exporter, frozen):
    """A stride-2 block at 12x12: the builder ran the projection in place over the dequantized
    depthwise output (CONV2D_PW_INPLACE), and streaming does not pay there (the ring's rows outweigh
    the 5x5 output): the projection becomes CONV2D_DQ(_W8), its output in memory of its own."""
    fused, plain = block_plans(tmp_path, exporter, 3, 2, 0, frozen_weights=frozen)
    w8 = "_W8" if frozen == "int8" else ""
    assert "CONV2D_PW_INPLACE" + w8 in names(plain) and "CONV2D_DQ" + w8 in names(fused)
    assert "DEQUANTIZE" not in names(fused) and not any(t["name"].endswith("/real") for t in fused.tensors)
    assert fused.report()["arena_bytes"] < plain.report()["arena_bytes"]
    trains_alike_and_moves(fused, plain, SHAPE, seed=4)


def _ops_of(names_, slots):
    return [TOp(n, "FORWARD", s) for n, s in zip(names_, slots)]


def test_add_output_in_place_over_the_float_copy_moves():
    """ADD(a, xf) -> y ran in place over xf, and z in place over y after it: both move to a's memory,
    or (a read after the ADD) to y's own."""
    def tensors():
        return [TTensor("xq", (1, 4, 3, 3), "I8"), TTensor("xf", (1, 4, 3, 3)), TTensor("a", (1, 4, 3, 3)),
                TTensor("y", (1, 4, 3, 3), view_of=1), TTensor("z", (1, 4, 3, 3), view_of=1),
                TTensor("u", (1, 4, 3, 3))]
    ops = _ops_of(["DEQUANTIZE", "ADD", "RELU"], [[0, 1], [2, 1, 3], [3, 4]])
    t = tensors()
    out, fused = dq_conv.add_dequantized(t, ops)
    assert [o.name for o in out] == ["ADD_DQ", "RELU"] and out[0].slots == [2, 0, 3] and len(fused) == 1
    assert t[3].view_of == 2 and t[4].view_of == 2
    t = tensors()
    out, _ = dq_conv.add_dequantized(t, ops + [TOp("RELU", "FORWARD", [2, 5])])   # a read after the ADD
    assert [o.name for o in out][:2] == ["ADD_DQ", "RELU"] and t[3].view_of is None and t[4].view_of == 3


def test_add_not_fused_where_the_copy_has_another_reader_or_the_int8_is_written():
    t = [TTensor("xq", (1, 4, 3, 3), "I8"), TTensor("xf", (1, 4, 3, 3)), TTensor("a", (1, 4, 3, 3)),
         TTensor("y", (1, 4, 3, 3)), TTensor("z", (1, 4, 3, 3))]
    deq, add = TOp("DEQUANTIZE", "FORWARD", [0, 1]), TOp("ADD", "FORWARD", [2, 1, 3])
    assert [o.name for o in dq_conv.add_dequantized(list(t), [deq, add])[0]] == ["ADD_DQ"]
    other = TOp("RELU", "FORWARD", [1, 4])
    assert [o.name for o in dq_conv.add_dequantized(list(t), [deq, add, other])[0]] == ["DEQUANTIZE", "ADD", "RELU"]
    over = TOp("QUANTIZE", "FORWARD", [4, 0])
    assert [o.name for o in dq_conv.add_dequantized(list(t), [deq, over, add])[0]] == ["DEQUANTIZE", "QUANTIZE",
                                                                                      "ADD"]


def _stream_case(conv_k=1, extra=None, write_x=False):
    """PWDW_Q8 (x -> d) then CONV2D_DQ_W8 (d -> y), as the compiler holds them."""
    t = [TTensor("x", (1, 4, 6, 6), "I8"), TTensor("w1", (8, 4, 1, 1), "I8", "CONST"),
         TTensor("w", (8, 1, 3, 3), "I8", "CONST"), TTensor("ring", (3, 8, 6), "I8"), TTensor("d", (1, 8, 6, 6), "I8"),
         TTensor("w2", (2, 8, conv_k, conv_k), "I8", "CONST"), TTensor("y", (1, 2, 6, 6)),
         TTensor("xs", (1, 6, 6)), TTensor("q", (1, 4, 6, 6), "I8")]
    pwdw = TOp("PWDW_Q8", "FORWARD", [0, 1, None, None, None, 2, None, None, None, 3, 4], [1, 1, 1, 1, 1, 1, 1, 1, 8])
    pad = conv_k // 2
    conv = TOp("CONV2D_DQ_W8", "FORWARD", [4, 5, None, 6, 7], [1, 1, pad, pad, pad, pad, 1, 1, 1])
    ops = [pwdw] + ([TOp("QUANTIZE", "FORWARD", [6, 0])] if write_x else []) + [conv] + (extra or [])
    return t, ops


def test_streamed_only_where_the_projection_alone_reads_a_pointwise_conv():
    t, ops = _stream_case()
    out, fused = dq_conv.stream_into_projection(t, ops)
    assert [o.name for o in out] == ["PWDW_DQ_W8"] and len(fused) == 1

    def slot(s):
        return t[out[0].slots[SPEC.slot_index(s)]]
    assert [slot(s).name for s in ("x", "ring", "row", "w2", "xs", "yrow", "y")] == \
        ["x", "ring", "d/row", "w2", "d/row@f32", "y/row", "y"]
    assert slot("row").shape == (8, 6) and slot("row").dtype == "I8" and slot("yrow").shape == (2, 6)
    for case in (dict(conv_k=3), dict(write_x=True), dict(extra=[TOp("DEQUANTIZE", "FORWARD", [4, 7])])):
        t, ops = _stream_case(**case)
        out, fused = dq_conv.stream_into_projection(t, ops)
        assert "PWDW_DQ_W8" not in [o.name for o in out] and fused == [], case


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    return block_plans(tmp_path_factory.mktemp("pwdw_dq"), "ts")[0]


@pytest.mark.parametrize("slot,change", [("row", (0, +1)), ("row", (1, -1)), ("xs", (1, +1)), ("xs", (0, 25)),
                                         ("yrow", (0, +1))])
def test_rows_of_the_wrong_size_are_refused(streamed, slot, change):
    """Each moved to fresh memory at the arena's end, so that the size check, not the overlap check,
    refuses it. xs: 25 float rows for 24 channels, or rows one value too long."""
    k = names(streamed).index("PWDW_DQ_W8")
    op = streamed.ops[k]
    i = op["slots"][SPEC.slot_index(slot)]
    t = streamed.tensors[i]
    shape = list(t["shape"])
    size = F.DTYPES[t["dtype"]][1]
    end = streamed.header["arena_bytes"]
    grown = dict(arena_bytes=end + -(-size * 64 * (shape[0] + 32) * (shape[1] + 1) // F.ALIGN) * F.ALIGN)
    Core(_patched(streamed.data, i, grown, offset=end))   # the right size there loads
    axis, by = change
    shape[axis] = by if axis == 0 and by > 1 and slot == "xs" else shape[axis] + by
    bad = _patched(streamed.data, i, grown, offset=end, bytes=size * int(np.prod(shape)),
                   **{"dim%d" % a: n for a, n in enumerate(shape)})
    with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % k):
        Core(bad)


def test_a_projection_that_is_not_1x1_is_refused(tmp_path):
    """A 3x3 projection fused by a compiler whose pointwise check is switched off."""
    import torch

    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU6())
            self.pw1 = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1), torch.nn.ReLU6())
            self.dw = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.ReLU6())
            self.proj = torch.nn.Conv2d(16, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 10)

        def forward(self, x):
            h = self.proj(self.dw(self.pw1(self.stem(x))))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(h, 1), 1))

    torch.manual_seed(0)
    src = M.export(Wide(), str(tmp_path / "wide.onnx"), "ts", shape=SHAPE)
    layers = microtrain.compile(src, update="last-layer").meta["layers"]
    rng = np.random.default_rng(1)
    kw = dict(quantize="int8", input_dtype="uint8", input_quant=(1 / 255, 0), frozen_weights="int8",
              calibration=rng.uniform(0, 1, (8,) + SHAPE[1:]).astype(np.float32),
              update=[layers[-2]["bias"], layers[-1]["weight"], layers[-1]["bias"]])
    plan = microtrain.compile(src, **kw)
    assert "PWDW_Q8" in names(plan) and "CONV2D_DQ_W8" in names(plan) and "PWDW_DQ_W8" not in names(plan)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dq_conv, "_pointwise", lambda shape, attrs: True)
        with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op \d+\)"):
            microtrain.compile(src, **kw)


def _forward_live(plan):
    """The most arena bytes alive at one op of the forward."""
    return alive_at_peak(plan, phase="FORWARD")["live_bytes"]


def test_mbv2_138kb_in_place_streams_block_5():
    path, kw = tte("mbv2-w0.35", "138kb", pixels="int8")
    kw.update(input_in_place=True)
    fused = microtrain.compile(path, **kw)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(microtrain.compiler, "stream_into_projection", lambda tensors, ops: (ops, []))
        m.setattr(microtrain.compiler, "add_dequantized", lambda tensors, ops: (ops, []))
        plain = microtrain.compile(path, **kw)
    assert "PWDW_DQ_W8" in names(fused) and "ADD_DQ" in names(fused)
    def used(plan):
        return {plan.tensors[i]["name"] for o in plan.ops for i in o["slots"] if i is not None}
    # blocks.5's depthwise output (24 KB int8) and the residual's float copy (16 KB) never exist
    assert {"blocks.5.depthwise.out", "blocks.4.out/real"} <= used(plain)
    assert not {"blocks.5.depthwise.out", "blocks.4.out/real"} & used(fused)
    assert _forward_live(fused) < _forward_live(plain) - 16 * 1024
    assert fused.report()["arena_bytes"] < plain.report()["arena_bytes"]
    rng = np.random.default_rng(3)
    assert_trains_alike(fused, plain, xs=rng.integers(-128, 128, (2, 1, 3, 128, 128)).astype(np.int8), ys=[3, 7])
