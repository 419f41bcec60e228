"""An expansion block's convolutions streamed a channel at a time (dw_stream.py; PWDW_W8 and
PWDW_W8_BWD, mt_pwdw_w8.c).

A small MobileNet block (3x3 conv, 1x1 expansion, depthwise kxk at stride 1 with a residual or
stride 2 without, 1x1 projection, Linear head; both exporters) trains with its frozen weights
int8 (frozen_weights="int8", saved="bits") and its trained weights int8 or float32, its
expansion weight split (some input channels train), trained whole, or frozen with only the
biases training:
* the fused plan is the unfused plan bit for bit (predictions, and every parameter after 20
  steps with momentum, and with batches of 4), and its live arena peak is lower;
* PyTorch autograd, the module holding the plan's weights at each step (the frozen ones
  dequantized, the trained ones code x scale or float), gives the codes the plan's update rule
  gives (test_q8_state.py's oracle) and the float parameters within 1e-4;
* a scratch plane of the wrong size is refused at load;
* no block is fused where the depthwise weight trains, a frozen weight is float32, or with the
  naive planner.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as TF

import microtrain
import microtrain.compiler
from microtrain import format as F
from microtrain.native import Core, PlanError
from microtrain.peak import alive_at_peak
from oracle_models import export
from test_pwdw_q8 import _patched
from test_q8_state import LR, check_step, codes, slice_grad
from test_sparse import onnx_names

STEPS = 20
INT8 = dict(saved="bits", frozen_weights="int8", trained_weights="int8")
WEIGHTS = {"int8": INT8, "float32": dict(INT8, trained_weights="float32")}


class MBBlock(nn.Module):
    """conv3x3 -> [1x1 expand -> depthwise k x k, stride s -> 1x1 project] (+ the input at
    stride 1) -> GAP -> Linear."""

    def __init__(self, stride=1, k=3):
        super().__init__()
        g = torch.Generator().manual_seed(stride * 10 + k)
        self.stride = stride
        self.first = nn.Conv2d(3, 8, 3, padding=1)
        self.pw1 = nn.Conv2d(8, 16, 1)
        self.dw = nn.Conv2d(16, 16, k, stride=stride, padding=k // 2, groups=16)
        self.pw2 = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.4)

    def forward(self, x):
        x = TF.relu6(self.first(x))
        y = TF.relu6(self.dw(TF.relu6(self.pw1(x))))
        y = self.pw2(y) + (x if self.stride == 1 else 0)
        return self.fc(torch.flatten(TF.adaptive_avg_pool2d(y, 1), 1))


BIASES = [{"conv_index": i} for i in range(4)]
SCHEMES = {   # conv_index 0 first, 1 pw1, 2 dw, 3 pw2
    "split": dict(scheme="split", classifier="full", bias_updates=BIASES, weight_updates=[
        {"conv_index": 1, "ratio": 0.5, "channel_axis": 1, "selected_channels": [0, 2, 3, 7]}]),
    "whole": dict(scheme="whole", classifier="full", bias_updates=BIASES, weight_updates=[
        {"conv_index": 1, "ratio": 1.0, "channel_axis": 1}]),
    "biases": dict(scheme="biases", classifier="full", bias_updates=BIASES, weight_updates=[]),
}
BLOCKS = {"s1k3": (1, 3), "s2k5": (2, 5)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dwstream")
    out = {}
    for b, (stride, k) in BLOCKS.items():
        module = MBBlock(stride, k).eval()
        out[b] = module, {e: export(module, torch.zeros(1, 3, 8, 8), e, str(d / ("%s-%s.onnx" % (b, e))))
                          for e in ("ts13", "dynamo")}
    return out


def data(n=STEPS):
    rng = np.random.default_rng(7)
    return rng.normal(size=(n, 3, 8, 8)).astype(np.float32), rng.integers(0, 4, n)


def ops(plan):
    return [o["op"] for o in plan.ops]


def unfused(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(microtrain.compiler, "stream_blocks", lambda tensors, o: (o, []))
        return microtrain.compile(*args, **kw)


def run(plan, xs, ys):
    sim = microtrain.Simulator(plan)
    before = [sim.predict(x) for x in xs[:4]]
    for x, y in zip(xs, ys):
        sim.step(x, y)
    return before + [sim.predict(x) for x in xs[:4]], sim.params()


@pytest.mark.parametrize("trained", sorted(WEIGHTS))
@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("block", sorted(BLOCKS))
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_fused_plan_is_the_unfused_plan(files, monkeypatch, scheme, block, exporter, trained):
    _, paths = files[block]
    xs, ys = data()
    for kw in (dict(momentum=0.9), dict(batch=4)):
        kw.update(WEIGHTS[trained], update=SCHEMES[scheme], lr=LR)
        plan = microtrain.compile(paths[exporter], **kw)
        plain = unfused(monkeypatch, paths[exporter], **kw)
        names = onnx_names(plan)
        assert ops(plan).count("PWDW_W8") == 1 and ops(plan).count("PWDW_W8_BWD") == 1, ops(plan)
        assert "PWDW_W8" not in ops(plain)
        # the whole block is one op each way: no other op reads the three convs' weights (an SGD op
        # applies a batch's accumulated gradient)
        for w in ("pw1.weight", "dw.weight", "pw2.weight"):
            readers = {o["op"] for o in plan.ops for s in o["slots"]
                       if s is not None and plan.tensors[s]["name"].startswith(names[w])}
            assert readers - {"SGD"} == {"PWDW_W8", "PWDW_W8_BWD"}, (w, readers)
        got, want = run(plan, xs, ys), run(plain, xs, ys)
        for a, b in zip(got[0], want[0]):
            assert np.array_equal(a, b)
        assert got[1].keys() == want[1].keys()
        for k in want[1]:
            assert np.array_equal(got[1][k], want[1][k]), (kw, k)
        assert alive_at_peak(plan)["live_bytes"] < alive_at_peak(plain)["live_bytes"]


def torch_grads(module, names, values, x, y):
    """PyTorch autograd's gradients (float64) of one sample's loss, the module holding `values`."""
    m = MBBlock(module.stride, module.dw.kernel_size[0]).double()
    params = dict(m.named_parameters())
    with torch.no_grad():
        for tn, on in names.items():
            params[tn].copy_(torch.from_numpy(np.asarray(values[on], np.float64)).reshape(params[tn].shape))
    TF.cross_entropy(m(torch.from_numpy(x[None]).double()), torch.as_tensor([int(y)])).backward()
    return {on: params[tn].grad.numpy() for tn, on in names.items()}


@pytest.mark.parametrize("trained", sorted(WEIGHTS))
@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("scheme", ["split", "whole"])
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_fused_block_matches_pytorch_step_by_step(files, scheme, block, exporter, trained):
    module, paths = files[block]
    plan = microtrain.compile(paths[exporter], update=SCHEMES[scheme], lr=LR, **WEIGHTS[trained])
    assert "PWDW_W8_BWD" in ops(plan)
    names = onnx_names(plan)
    sim = microtrain.Simulator(plan)
    q8 = {t["name"] for t in plan.tensors if t["flags"] & F.TFLAGS["PARAM"] and t["dtype"] == "I8"}
    start = {n: codes(sim, n) for n in q8}
    ties = checked = 0
    xs, ys = data()
    for x, y in zip(xs, ys):
        before = sim.params()
        # every weight as the plan computes with it: the frozen ones dequantized, the trained ones code x scale
        trained = plan.onnx_params(before)
        values = {on: trained[on] if on in trained else plan.weight(on) for on in names.values()}
        g = torch_grads(module, names, values, x, y)
        before_codes = {n: codes(sim, n) for n in q8}
        sim.step(x, y)
        after = sim.params()
        for name in before:
            t, c = check_step(plan, sim, name, q8, before, before_codes, after, slice_grad(plan, name, g))
            ties, checked = ties + t, checked + c
    assert ties <= checked // 200, "%d of %d codes near a tie" % (ties, checked)
    for name in q8:
        assert not np.array_equal(codes(sim, name), start[name]), "%s did not train" % name
    first = plan.onnx_params(microtrain.Simulator(plan).params())
    for name, v in plan.onnx_params(sim.params()).items():
        assert not np.array_equal(v, first[name]), "%s did not train" % name


@pytest.mark.parametrize("op, slot", [("PWDW_W8", "s"), ("PWDW_W8", "y"), ("PWDW_W8_BWD", "s"),
                                      ("PWDW_W8_BWD", "s2")])
@pytest.mark.parametrize("delta", [-1, +1])
def test_a_plane_of_the_wrong_size_is_refused(files, op, slot, delta):
    """A scratch plane one column short or long (moved to fresh memory at the arena's end, so that
    the shape check, not the overlap check, refuses it)."""
    plan = microtrain.compile(files["s1k3"][1]["ts13"], update=SCHEMES["split"], lr=LR, **INT8)
    k = ops(plan).index(op)
    i = plan.ops[k]["slots"][F.OPS_BY_NAME[op].slot_index(slot)]
    shape = plan.tensors[i]["shape"]
    assert shape == (1, 1, 8, 8)
    end = plan.header["arena_bytes"]
    grown = dict(arena_bytes=end + 4 * 8 * 9)
    Core(_patched(plan.data, i, grown, offset=end))   # the right size there loads
    bad = _patched(plan.data, i, grown, dim3=8 + delta, bytes=4 * 8 * (8 + delta), offset=end)
    with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % k):
        Core(bad)


def test_no_fusion_where_it_would_change_what_an_op_reads(files):
    """A trained depthwise weight reads the expansion's output in its gradient; the fused op reads
    int8 frozen weights only; saved="int8" keeps the ReLU6 outputs the backward reads; the naive
    planner keeps every tensor."""
    path = files["s1k3"][1]["ts13"]
    dw_trains = dict(SCHEMES["biases"], weight_updates=[{"conv_index": 2, "ratio": 1.0, "channel_axis": 0}])
    assert "PWDW_W8" not in ops(microtrain.compile(path, update=dw_trains, **INT8))
    assert "PWDW_W8" not in ops(microtrain.compile(path, update=SCHEMES["split"], saved="bits"))
    assert "PWDW_W8" not in ops(microtrain.compile(path, update=SCHEMES["split"], **dict(INT8, saved="int8")))
    assert "PWDW_W8" not in ops(microtrain.compile(path, update=SCHEMES["split"], planner="naive", **INT8))
    assert "PWDW_W8" in ops(microtrain.compile(path, update=SCHEMES["split"], **INT8))
