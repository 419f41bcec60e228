"""CONV_DW_PW_Q8: a frozen int8 conv, the depthwise int8 conv that alone reads it and the 1x1 int8
conv that alone reads that, streamed row by row (host/microtrain/q8_fuse.py,
modules/microtrain/mt_cdp_q8.c): the first conv's output kept as a ring of rows, the depthwise
output as one row. The kernel against the numpy reference of the three convs for random
quantization parameters (tests/support/q8_reference.py); on a stem + block (3x3 stride-2 conv, depthwise,
1x1, as MCUNet and MobileNetV2 begin) and on an inverted-residual block, exported by both PyTorch
exporters: the fused plan's outputs and trained parameters bit for bit the unfused plan's, the
arena smaller by the two streamed tensors, a ring or row of the wrong size refused at load."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import int8_models as M
import microtrain
import q8_cases as Q
from microtrain import format as F
from microtrain.native import Core, PlanError
from microtrain.peak import alive_at_peak
from test_pwdw_q8 import _patched

CASES = {   # C, E, O, H, W, first conv (k, stride, pads t l b r), depthwise (k, stride, pads, dilation)
    "stem 3x3 s2, dw 3x3": (3, 8, 4, 12, 10, (3, 2, (1, 1, 1, 1)), (3, 1, (1, 1, 1, 1), 1)),
    "1x1 expansion, dw 5x5 s2": (4, 12, 4, 9, 9, (1, 1, (0, 0, 0, 0)), (5, 2, (2, 2, 2, 2), 1)),
    "stem 3x3 s1 no pad, dw dilation 2": (2, 5, 3, 11, 9, (3, 1, (0, 0, 0, 0)), (3, 1, (2, 2, 2, 2), 2)),
    "asymmetric pads, dw stride 3": (2, 4, 5, 13, 8, (2, 1, (0, 1, 1, 0)), (2, 3, (0, 0, 1, 1), 1)),
    "wide rows": (3, 6, 2, 5, 70, (3, 1, (1, 1, 1, 1)), (3, 2, (1, 1, 1, 1), 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_the_three_convs_for_any_parameters(case):
    C, E, O, H, W, first, dw = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    for bias in (True, False):
        plan, xs, wants = Q.cdp_q8(rng, C, E, O, H, W, first, dw, bias, samples=2)
        for x, want in zip(xs, wants):
            core = Core(plan.data)
            core.predict(x)
            got = core.array(plan.tensor_index("y")).reshape(want.shape)
            assert np.array_equal(got, want), (case, bias, np.argwhere(got != want)[:5])


class StemBlock(nn.Module):
    """3x3 stride-2 conv -> depthwise 3x3 -> 1x1 projection (MCUNet's and MobileNetV2's start), then
    a 1x1 conv, global average pooling and a Linear head."""

    def __init__(self, cin=3, width=8, out=4):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(nn.Conv2d(cin, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1, groups=width), nn.BatchNorm2d(width), nn.ReLU6())
        self.pw = nn.Sequential(nn.Conv2d(width, out, 1), nn.BatchNorm2d(out))
        self.head = nn.Conv2d(out, 6, 1)
        self.fc = nn.Linear(6, 10)
        M.trained_bn_stats(self, 3)

    def forward(self, x):
        h = torch.relu(self.head(self.pw(self.dw(self.stem(x)))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


def ops(plan):
    return [o["op"] for o in plan.ops]


MODELS = {"stem": (lambda: StemBlock(), (1, 3, 24, 20)),
          "block k5s2": (lambda: M.Block(5, 2, 2, 1, expand=24, cin=3, width=8), (1, 3, 12, 12))}


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_fused_plan_is_the_unfused_plan(tmp_path, model, exporter):
    """Outputs and the parameters after 30 SGD steps on the fused prefix are bit for bit those of
    the unfused plan (and of the plan with only PWDW_Q8); the arena is smaller."""
    make, shape = MODELS[model]
    src = M.export(make().eval(), str(tmp_path / "m.onnx"), exporter, shape=shape)
    rng = np.random.default_rng(1)
    calib = rng.uniform(-1, 1, (16,) + shape[1:]).astype(np.float32)
    xs, ys = rng.uniform(-1, 1, (30,) + shape[1:]).astype(np.float32), rng.integers(0, 10, 30)
    kw = dict(update="last-layer", quantize="int8", calibration=calib, lr=0.05, momentum=0.9)
    plans = {f: microtrain.compile(src, int8_fuse=f, **kw) for f in (True, "pwdw", False)}
    assert ops(plans[True]).count("CONV_DW_PW_Q8") == 1, ops(plans[True])
    assert "CONV_DW_PW_Q8" not in ops(plans["pwdw"]) + ops(plans[False])
    params = {}
    for f, plan in plans.items():
        sim = microtrain.Simulator(plan)
        outs = [sim.predict(x) for x in xs[:5]]
        for x, y in zip(xs, ys):
            sim.step(x, y)
        params[f] = (outs, sim.params())
    for f in ("pwdw", False):
        for a, b in zip(params[True][0], params[f][0]):
            assert np.array_equal(a, b)
        assert params[True][1].keys() == params[f][1].keys()
        for k in params[f][1]:
            assert np.array_equal(params[True][1][k], params[f][1][k]), (f, k)
    live = [alive_at_peak(plans[f])["live_bytes"] for f in (True, "pwdw", False)]
    assert live[0] <= live[1] <= live[2], live


def test_stem_arena_is_its_input_and_output(tmp_path):
    """At 64x64 with 16 channels (MCUNet's stem at a quarter of the area): unfused, the stem's
    input and output (12 + 16 KB; the depthwise conv runs in place) bound the arena; fused, the
    input, the block's output and the ring and row."""
    src = M.export(StemBlock(3, 16, 8).eval(), str(tmp_path / "stem.onnx"), "ts", shape=(1, 3, 64, 64))
    calib = np.random.default_rng(0).uniform(-1, 1, (8, 3, 64, 64)).astype(np.float32)
    kw = dict(update="last-layer", quantize="int8", calibration=calib, input_dtype="int8")
    fused, plain = (microtrain.compile(src, int8_fuse=f, **kw) for f in (True, False))
    stem_out = 16 * 32 * 32
    assert any(size == stem_out for _, size, *_ in alive_at_peak(plain)["tensors"])
    peak = alive_at_peak(fused)
    assert peak["op_name"] == "CONV_DW_PW_Q8" and all(size != stem_out for _, size, *_ in peak["tensors"])
    x_in, y_out, ring, row = 3 * 64 * 64, 8 * 32 * 32, 3 * 16 * 32, 16 * 32
    assert peak["live_bytes"] <= x_in + y_out + ring + row + 64, peak
    assert alive_at_peak(plain)["live_bytes"] >= x_in + stem_out > peak["live_bytes"]


@pytest.mark.parametrize("slot, delta", [("ring", -1), ("ring", +1), ("row", -1), ("row", +1)])
def test_scratch_of_the_wrong_size_is_refused(tmp_path, slot, delta):
    """The ring one row short or long, the row one element short or long (moved to fresh memory at
    the arena's end, so that the size check, not the overlap check, refuses it)."""
    src = M.export(StemBlock().eval(), str(tmp_path / "stem.onnx"), "ts", shape=(1, 3, 24, 20))
    calib = np.random.default_rng(0).uniform(-1, 1, (8, 3, 24, 20)).astype(np.float32)
    plan = microtrain.compile(src, update="none", quantize="int8", calibration=calib)
    op = next(o for o in plan.ops if o["op"] == "CONV_DW_PW_Q8")
    i = op["slots"][F.OPS_BY_NAME["CONV_DW_PW_Q8"].slot_index(slot)]
    shape = plan.tensors[i]["shape"]
    assert shape == ((3, 8, 10) if slot == "ring" else (8, 10))
    end = plan.header["arena_bytes"]
    per = int(np.prod(shape[1:]))
    grown = dict(arena_bytes=end + -(-(shape[0] + 1) * per // F.ALIGN) * F.ALIGN)
    Core(_patched(plan.data, i, grown, offset=end))   # the right size there loads
    bad = _patched(plan.data, i, grown, dim0=shape[0] + delta, bytes=(shape[0] + delta) * per, offset=end)
    with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % plan.ops.index(op)):
        Core(bad)


def test_no_fusion_where_a_gradient_passes(tmp_path):
    """The stem trains: the gradient crosses the block, whose backward reads its int8 outputs."""
    src = M.export(StemBlock().eval(), str(tmp_path / "stem.onnx"), "ts", shape=(1, 3, 24, 20))
    calib = np.random.default_rng(0).uniform(-1, 1, (8, 3, 24, 20)).astype(np.float32)
    plan = microtrain.compile(src, update="full", quantize="int8", calibration=calib)
    assert "CONV_DW_PW_Q8" not in ops(plan) and "PWDW_Q8" not in ops(plan)
