"""CONV2D_PW_INPLACE_W8: the in-place float 1x1 conv (CONV2D_PW_INPLACE) with its frozen weight int8
(compile(frozen_weights="int8"), w8.py), computing on W' = float32(q) * scale[o].

* A model whose frozen 1x1 projection (70 -> 4 channels: a 64-float chunk of each weight row and
  a 6-float one) writes over its dead input, exported with both exporters: the plan runs
  CONV2D_PW_INPLACE_W8 with the weight int8 and no float copy of it, predicts what PyTorch predicts
  on the dequantized weights, and trains bit for bit as the same plan with planner="naive" (which
  runs nothing in place: CONV2D_W8, itself checked against CONV2D in tests/int8/test_w8.py).
* The op alone against CONV2D_PW_INPLACE on a float32 weight holding float32(q) * scale[o], its
  output over its input: the same bits, over one, two and three chunks, O == C, with and without
  a bias (and PyTorch's result within float32 rounding).
* A weight whose scales are not one positive normal float per output channel is refused at load.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import microtrain
from microtrain.ir import Quant
from microtrain.native import PlanError
from microtrain.lowered import TTensor

from int8_models import export
from test_inplace_q8_pointwise import Block, data, same_bits
from test_w8 import const, dequantized, quantized, run, single_op

EXPORTERS = ("dynamo", "ts")


def projection_block():
    """test_inplace_q8_pointwise.Block with a 70-channel expansion: its frozen 1x1 projection 70 -> 4
    writes over its dead input where the live bytes peak (only the projection's bias and the Linear
    train). The depthwise biases > 0 keep the projection's inputs mostly above 0, so that every
    chunk of a weight row counts."""
    model = Block(expand=70)
    with torch.no_grad():
        model.dw.bias.uniform_(0.5, 1.0)
    return model.eval()


def plans(tmp_path, exporter):
    path = export(projection_block(), str(tmp_path / ("projection-%s.onnx" % exporter)), exporter)
    names = microtrain.compile(path, update="full").params()
    update = [n for n in names if n.endswith("pw2.bias") or n.startswith("fc.")]
    return {p: microtrain.compile(path, update=update, saved="bits", frozen_weights="int8", lr=0.05, momentum=0.9,
                                  planner=p) for p in ("greedy", "naive")}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_frozen_int8_projection_runs_in_place_with_conv2d_w8_bits(tmp_path, exporter):
    p = plans(tmp_path, exporter)
    ops = [o["op"] for o in p["greedy"].ops]
    assert ops.count("CONV2D_PW_INPLACE_W8") == 1 and "CONV2D_PW_INPLACE" not in ops
    assert "CONV2D_PW_INPLACE_W8" not in [o["op"] for o in p["naive"].ops]
    pw = next(o for o in p["greedy"].ops if o["op"] == "CONV2D_PW_INPLACE_W8")
    t, owner = p["greedy"].tensors, p["greedy"].memory_owners()
    x, w, y = pw["slots"][0], pw["slots"][1], pw["slots"][4]
    assert owner[y] == owner[x] and t[y]["offset"] == t[x]["offset"] and t[y]["bytes"] < t[x]["bytes"]
    # the weight is int8 in the constants and nothing else holds it: no float32 tensor of its shape
    assert t[w]["dtype"] == "I8" and t[w]["storage"] == "CONST" and t[w]["name"] in p["greedy"].meta["w8"]
    assert not [u for u in t if u["shape"] == t[w]["shape"] and u["dtype"] == "F32"]
    # what PyTorch predicts with the frozen conv weights dequantized (w8.py's rule, worked out in torch)
    model = projection_block()
    with torch.no_grad():
        for m in (model.conv, model.pw1, model.dw, model.pw2):
            m.weight.copy_(dequantized(m.weight))
    xs, _ = data()
    sim = microtrain.Simulator(p["greedy"])
    want = model(torch.from_numpy(xs[0])).detach().numpy()
    assert np.abs(sim.predict(xs[0]).reshape(want.shape) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert same_bits(p)


# name: (C, O, H, W)
SHAPES = {
    "one chunk": (12, 4, 5, 6),
    "two chunks": (70, 5, 4, 7),      # 64 + 6 floats of each row
    "three chunks, O = C": (130, 130, 2, 3),
    "one channel": (1, 1, 3, 3),
}


def pointwise_pair(C, O, H, W, bias, seed=0):
    """CONV2D_PW_INPLACE on float32(q) * scale and CONV2D_PW_INPLACE_W8 on (q, scale), each alone in
    a plan whose output takes its input's memory (the first O planes)."""
    rng = np.random.default_rng(seed)
    q, quant, wf = quantized(rng, (O, C, 1, 1))
    b = rng.normal(size=O).astype(np.float32) if bias else None
    out = []
    for op, w, dt, qu in (("CONV2D_PW_INPLACE", wf, "F32", None), ("CONV2D_PW_INPLACE_W8", q, "I8", quant)):
        y = TTensor("y", (1, O, H, W), view_of=0)
        out.append(single_op(op, [TTensor("x", (1, C, H, W)), const("w", w, dt, qu), const("b", b) if bias else None],
                             y, [1, 1, 0, 0, 0, 0, 1, 1, 1], TTensor("s", (C,))))
    return rng, wf, b, out


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_pw_inplace_w8_is_pw_inplace_on_the_dequantized_weight(shape, bias):
    C, O, H, W = SHAPES[shape]
    rng, wf, b, plans_ = pointwise_pair(C, O, H, W, bias)
    for plan in plans_:
        t = plan.tensors
        pw = plan.ops[0]
        assert t[pw["slots"][4]]["offset"] == t[pw["slots"][0]]["offset"], "y over x"
    assert plans_[1].ops[0]["op"] == "CONV2D_PW_INPLACE_W8"
    for _ in range(2):
        x = rng.normal(size=(1, C, H, W)).astype(np.float32)
        want, got = run(plans_[0], x)[0], run(plans_[1], x)[0]
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), shape
    t = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(wf).double(),
                  torch.from_numpy(b).double() if bias else None).numpy()
    assert np.abs(got.reshape(t.shape) - t).max() <= 1e-5 * max(1.0, np.abs(t).max())


W8_SCALES = r"needs one scale per output channel .* recompile the plan \(op 0"


@pytest.mark.parametrize("scales, error", [
    ([0.0, 0.01, 0.02, 0.03], "invalid tensor record"),
    ([0.01, np.nan, 0.02, 0.03], "invalid tensor record"),
    ([0.01, 0.02, -0.03, 0.04], "invalid tensor record"),
    ([0.01, 0.02, np.inf, 0.04], "invalid tensor record"),
    (None, W8_SCALES),
    (0.01, W8_SCALES),
    ("axis 1", W8_SCALES),
    ("zero point", W8_SCALES),
])
def test_bad_scales_are_refused_at_load(scales, error):
    """Scales that are not positive normal floats are refused by the quantization record's check
    (every int8 tensor's, before any op's); a weight without one scale per output channel (no
    record, one scale, scales along the input channels, a nonzero zero point) by the op's (W8_SCALES)."""
    C, O = 6, 4
    q = np.random.default_rng(1).integers(-127, 128, size=(O, C, 1, 1)).astype(np.int8)
    if scales is None:
        quant = None
    elif scales == "axis 1":
        quant = Quant(np.full(C, 0.01, np.float32), np.zeros(C, np.int32), 1)
    elif scales == "zero point":
        quant = Quant(np.full(O, 0.01, np.float32), np.array([0, 1, 0, 0], np.int32), 0)
    elif np.ndim(scales) == 0:
        quant = Quant(np.float32(scales), 0)
    else:
        quant = Quant(np.array(scales, np.float32), np.zeros(O, np.int32), 0)
    with pytest.raises(PlanError, match=error):
        single_op("CONV2D_PW_INPLACE_W8", [TTensor("x", (1, C, 3, 3)), const("w", q, "I8", quant), None],
                  TTensor("y", (1, O, 3, 3), view_of=0), [1, 1, 0, 0, 0, 0, 1, 1, 1], TTensor("s", (C,)))
