"""Two more convolutions run over their input (training.py, in_place): CONV2D_Q8_DW_INPLACE, an int8
depthwise conv whose input nothing reads afterwards (one int8 plane of scratch), and
CONV2D_PW_INPLACE, a float 1x1 conv with O <= C outputs writing over the first O planes of its
dead input (one pixel, C floats, of scratch), kept where it lowers the peak of live arena bytes.

Models exported from PyTorch with both exporters; each in-place plan against the same model with
planner="naive" (which runs nothing in place, so keeps CONV2D_Q8 and CONV2D): the same bits after
training steps. The core refuses a scratch of the wrong size at load.
"""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import microtrain
from microtrain.plan import Plan

from int8_models import export
from test_ops_kernels import patched

EXPORTERS = ("dynamo", "ts")


class Stem(nn.Module):
    """3x3 conv, ReLU6, depthwise 3x3, ReLU6, 1x1 projection, GAP, Linear: trained in its last
    layer only, every conv is frozen int8 and the depthwise conv's input dies at it (unless the
    three are streamed as one op, CONV_DW_PW_Q8)."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.pw = nn.Conv2d(6, 3, 1)
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        x = self.pw(F.relu6(self.dw(F.relu6(self.conv(x)))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Block(nn.Module):
    """An inverted residual block (1x1 expansion 4 -> 12, depthwise, 1x1 projection 12 -> 4, add):
    with the projection's bias and the head training, the projection's input dies at it, where
    the live bytes peak (block input, expansion and projection output alive). `expand` channels
    wide (tests/int8/test_pw_inplace_w8.py: 70)."""
    def __init__(self, expand=12):
        super().__init__()
        torch.manual_seed(4)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pw1 = nn.Conv2d(4, expand, 1)
        self.dw = nn.Conv2d(expand, expand, 3, padding=1, groups=expand)
        self.pw2 = nn.Conv2d(expand, 4, 1)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        x = F.relu6(self.conv(x))
        x = self.pw2(F.relu6(self.dw(F.relu6(self.pw1(x))))) + x
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def data(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, size=(n, 1, 1, 8, 8)).astype(np.float32), rng.integers(0, 4, n)


def compiled(tmp_path, model, exporter, **kw):
    path = export(model.eval(), str(tmp_path / ("%s-%s.onnx" % (type(model).__name__, exporter))), exporter)
    return {p: microtrain.compile(path, lr=0.05, momentum=0.9, planner=p, **kw) for p in ("greedy", "naive")}


def same_bits(plans):
    xs, ys = data()
    out = {}
    for k, plan in plans.items():
        sim = microtrain.Simulator(plan)
        losses = [sim.step(x, y) for x, y in zip(xs, ys)]
        out[k] = (np.array(losses, np.float32).tobytes(), [sim.predict(x).tobytes() for x in xs],
                  {n: v.tobytes() for n, v in sim.params().items()})
    return out["greedy"] == out["naive"]


def int8_plans(tmp_path, exporter):
    """Unfused: the int8 fusions would stream this conv, depthwise and 1x1 as one op (CONV_DW_PW_Q8)."""
    return compiled(tmp_path, Stem(), exporter, update="last-layer", quantize="int8", calibration=data(32)[0][:, 0],
                    int8_fuse=False)


def pointwise_plans(tmp_path, exporter):
    path = export(Block().eval(), str(tmp_path / "names.onnx"), exporter)
    names = microtrain.compile(path, update="full").params()
    update = [n for n in names if n.endswith("pw2.bias") or n.startswith("fc.")]
    return compiled(tmp_path, Block(), exporter, update=update, saved="bits")


def ops_of(plan):
    return [o["op"] for o in plan.ops]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_int8_depthwise_in_place_gives_conv2d_q8_bits(tmp_path, exporter):
    p = int8_plans(tmp_path, exporter)
    assert ops_of(p["greedy"]).count("CONV2D_Q8_DW_INPLACE") == 1
    assert "CONV2D_Q8_DW_INPLACE" not in ops_of(p["naive"]) and ops_of(p["naive"]).count("CONV2D_Q8") == 3
    dw = next(o for o in p["greedy"].ops if o["op"] == "CONV2D_Q8_DW_INPLACE")
    owner = p["greedy"].memory_owners()
    assert owner[dw["slots"][6]] == owner[dw["slots"][0]], "y takes x's memory"
    assert same_bits(p)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_pointwise_in_place_gives_conv2d_bits(tmp_path, exporter):
    p = pointwise_plans(tmp_path, exporter)
    assert ops_of(p["greedy"]).count("CONV2D_PW_INPLACE") == 1
    assert "CONV2D_PW_INPLACE" not in ops_of(p["naive"])
    pw = next(o for o in p["greedy"].ops if o["op"] == "CONV2D_PW_INPLACE")
    owner, t = p["greedy"].memory_owners(), p["greedy"].tensors
    x, y = pw["slots"][0], pw["slots"][4]
    assert owner[y] == owner[x] and t[y]["offset"] == t[x]["offset"] and t[y]["bytes"] < t[x]["bytes"]
    assert same_bits(p)


def test_pointwise_in_place_lowers_the_live_peak():
    """Kept only where it lowers the peak: the same plan with the op refused has a higher one."""
    import microtrain.training as T
    import tempfile
    import os
    with tempfile.TemporaryDirectory() as d:
        path = export(Block().eval(), os.path.join(d, "b.onnx"), "ts")
        names = microtrain.compile(path, update="full").params()
        update = [n for n in names if n.endswith("pw2.bias") or n.startswith("fc.")]
        with_pw = microtrain.compile(path, update=update, saved="bits")
        keep = T.Builder.pointwise_candidates
        T.Builder.pointwise_candidates = lambda self: []
        try:
            without = microtrain.compile(path, update=update, saved="bits")
        finally:
            T.Builder.pointwise_candidates = keep
    assert "CONV2D_PW_INPLACE" in ops_of(with_pw) and "CONV2D_PW_INPLACE" not in ops_of(without)
    assert with_pw.report()["peak_live_bytes"] < without.report()["peak_live_bytes"]


@pytest.mark.parametrize("op, slot, dtype, plane", [("CONV2D_Q8_DW_INPLACE", 5, "I8", 64),
                                                    ("CONV2D_PW_INPLACE", 3, "F32", 4 * 12)])
def test_a_scratch_of_the_wrong_size_is_refused_at_load(tmp_path, op, slot, dtype, plane):
    """Every arena tensor of the scratch's dtype but another size, put in the scratch slot, is
    refused: by the shape check, or by the overlap check where it shares the op's memory."""
    plan = (int8_plans if dtype == "I8" else pointwise_plans)(tmp_path, "ts")["greedy"]
    microtrain.Simulator(plan)
    messages = []
    for i, t in enumerate(plan.tensors):
        if t["storage"] != "ARENA" or t["dtype"] != dtype or t["bytes"] == plane:
            continue
        with pytest.raises(ValueError) as e:
            microtrain.Simulator(Plan(patched(plan, op, slot=slot, value=i)))
        messages.append(str(e.value))
    assert messages and any("tensor shapes do not fit the op" in m for m in messages), messages
