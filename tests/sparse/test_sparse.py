"""Channel-sparse updates (MIT sparse-update schemes) against PyTorch autograd.

A small CNN with a 3x3 conv, a 1x1 expansion conv, a depthwise conv, a 1x1 projection conv,
a residual Add and a Linear head, exported by both exporters, trains 20 SGD steps with a
scheme that trains some input channels of the 1x1 convs, some channels of the depthwise
conv, two biases and the whole head. The oracle is PyTorch: the same nn.Module in float64,
its autograd gradients multiplied by the same channel masks (computed here from the scheme,
independently of microtrain), stepped by PyTorch's SGD formula. Trained parameters match
within 1e-4 of their largest magnitude; frozen channels keep their bits exactly.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import microtrain
from microtrain.memory import lifetimes
from oracle_models import export

STEPS = 20
RTOL = 1e-4


class Block(nn.Module):
    """conv3x3 -> [1x1 expand -> depthwise 3x3 -> 1x1 project] + residual -> GAP -> Linear."""

    def __init__(self, matmul_head=False, act=F.relu6):
        super().__init__()
        self.act = act
        g = torch.Generator().manual_seed(0)
        self.matmul_head = matmul_head   # the head as x @ W + b (ONNX MatMul, W stored [in, out])
        self.first = nn.Conv2d(3, 8, 3, padding=1)
        self.pw1 = nn.Conv2d(8, 12, 1)
        self.dw = nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.pw2 = nn.Conv2d(12, 8, 1)
        self.fc = nn.Linear(8, 4)
        if matmul_head:
            self.fc.weight = nn.Parameter(torch.zeros(8, 4))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        x = self.act(self.first(x))
        y = self.act(self.pw1(x))
        y = self.act(self.dw(y))
        y = self.pw2(y) + x
        y = torch.flatten(F.adaptive_avg_pool2d(y, 1), 1)
        return y @ self.fc.weight + self.fc.bias if self.matmul_head else self.fc(y)


# conv_index: 0 first, 1 pw1, 2 dw, 3 pw2 (MIT's order: the graph's convs, the head excluded)
SCHEME = {
    "scheme": "test",
    "classifier": "full",
    "bias_updates": [{"conv_index": 2}, {"conv_index": 3}],
    "weight_updates": [
        {"conv_index": 1, "ratio": 0.5, "channel_axis": 1, "selected_channels": [0, 2, 3, 7]},
        {"conv_index": 2, "ratio": 0.5, "channel_axis": 0, "selected_channels": [1, 2, 3, 9, 10]},
        {"conv_index": 3, "ratio": 0.5, "select": "magnitude+", "channel_axis": 1},
    ],
}
TORCH_NAMES = {1: "pw1", 2: "dw", 3: "pw2"}


def torch_masks(model, scheme=SCHEME, whole=("fc.weight", "fc.bias", "dw.bias", "pw2.bias"), by_onnx=None,
                in_out=()):
    """{torch parameter name: 0/1 mask} of what a scheme trains, worked out from the module;
    in_out: weights stored [in, out] (a scheme's axes are [out, in] whatever the storage)."""
    masks = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    for n in whole:
        masks[n][...] = 1
    for e in scheme["weight_updates"]:
        name = TORCH_NAMES[e["conv_index"]] + ".weight" if "conv_index" in e else by_onnx[e["initializer"]]
        w = dict(model.named_parameters())[name].detach().double()
        mask = masks[name].T if name in in_out else masks[name]
        w = w.T if name in in_out else w
        axis = e["channel_axis"]
        if "selected_channels" in e:
            sel = e["selected_channels"]
        else:   # MIT's magnitude+: argsort(-L2 norm over the other axes)[:int(ratio*C)]
            norm = w.transpose(0, axis).reshape(w.shape[axis], -1).norm(dim=1)
            sel = torch.argsort(-norm)[:int(e["ratio"] * w.shape[axis])].tolist()
        idx = [slice(None)] * w.dim()
        idx[axis] = sel
        mask[tuple(idx)] = 1
    return masks


def torch_train(module, masks, xs, ys, lr, momentum, weight_decay, batch, clip_grad=None):
    """PyTorch SGD (g = grad + wd*w; m = mu*m + g; w -= lr*m) on autograd's gradient of the mean
    loss, gradient and weight decay both restricted to the trained channels (mask); clip_grad:
    torch.nn.utils.clip_grad_norm_ of the masked gradients first."""
    model = copy.deepcopy(module).double()
    params = dict(model.named_parameters())
    bufs = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(0, len(xs), batch):
        model.zero_grad()
        out = model(torch.from_numpy(xs[i:i + batch]).double())
        F.cross_entropy(out, torch.as_tensor(ys[i:i + batch])).backward()
        with torch.no_grad():
            for n, p in params.items():
                p.grad *= masks[n]
            if clip_grad:
                torch.nn.utils.clip_grad_norm_([p for n, p in params.items() if masks[n].any()], clip_grad)
            for n, p in params.items():
                g = (p.grad + weight_decay * p) * masks[n]
                bufs[n] = momentum * bufs[n] + g if momentum else g
                p -= lr * bufs[n]
    return {n: p.detach().numpy() for n, p in params.items()}


def data(n=STEPS):
    rng = np.random.default_rng(3)
    return rng.normal(size=(n, 3, 6, 6)).astype(np.float32), rng.integers(0, 4, n)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("sparse")
    out = {}
    for matmul in (False, True):
        module = Block(matmul).eval()
        out[matmul] = module, {e: export(module, torch.zeros(1, 3, 6, 6), e, str(d / ("block%d-%s.onnx" % (matmul, e))))
                               for e in ("ts13", "dynamo")}
    return out


def onnx_names(plan):
    """torch name -> ONNX initializer name, pairing the plan's layers with the module's in order."""
    layers = [(la["weight"], la["bias"]) for la in plan.meta["layers"]]
    out = {}
    for (w, b), t in zip(layers, ("first", "pw1", "dw", "pw2", "fc")):
        out[t + ".weight"], out[t + ".bias"] = w, b
    return out


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("batch,momentum,weight_decay,clip", [(1, 0.9, 0.0, None), (1, 0.0, 0.01, None),
                                                             (4, 0.9, 0.0, None), (1, 0.9, 0.0, 0.5)])
def test_channel_sparse_matches_pytorch(models, exporter, batch, momentum, weight_decay, clip):
    """clip 0.5: gradient clipping, so every gradient goes through a whole-weight accumulator."""
    module, paths = models[False]
    lr = 0.05
    plan = microtrain.compile(paths[exporter], update=SCHEME, lr=lr, momentum=momentum, weight_decay=weight_decay,
                              batch=batch, clip_grad=clip)
    frozen_plan = microtrain.compile(paths[exporter], update="none")
    names = onnx_names(frozen_plan)
    sim = microtrain.Simulator(plan)
    initial = plan.onnx_params(sim.params())
    xs, ys = data()
    for x, y in zip(xs, ys):
        sim.step(x, y)
    masks = torch_masks(module)
    expected = torch_train(module, masks, xs, ys, lr, momentum, weight_decay, batch, clip)
    params = plan.onnx_params(sim.params())
    assert set(params) == {names[n] for n in names if masks[n].any()}
    # the 1x1 convs train on input channels, the depthwise conv on its channels: only those
    # are a parameter (split.py)
    assert set(plan.meta["split"]) == {names["pw1.weight"], names["dw.weight"], names["pw2.weight"]}
    assert sim.params()[names["pw1.weight"] + "@trained"].shape == (12, 4, 1, 1)
    assert sim.params()[names["dw.weight"] + "@trained"].shape == (5, 1, 3, 3)
    for n, m in masks.items():
        if not m.any():
            continue
        got, want, mask = params[names[n]], expected[n], m.numpy().astype(bool)
        scale = max(np.abs(want[mask]).max(), 1e-6)
        assert np.abs(got[mask] - want[mask]).max() <= RTOL * scale, "%s trained channels differ" % n
        assert np.array_equal(got[~mask], initial[n][~mask]), "%s frozen channels changed" % n
        assert not np.array_equal(got[mask], initial[n][mask]), "%s did not train" % n


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_gradient_through_a_split_weight(models, exporter):
    """The first conv's bias trains below pw1, whose input channels 0, 2, 3, 7 are its own
    parameter (split.py): the bias gradient comes back through both parts of pw1, the frozen
    convolution's input gradient plus the trained slice's, added into it (SCATTER_ACC_CH)."""
    module, paths = models[False]
    scheme = dict(SCHEME, bias_updates=[{"conv_index": 0}] + SCHEME["bias_updates"])
    plan = microtrain.compile(paths[exporter], update=scheme, lr=0.05, momentum=0.9)
    assert "SCATTER_ACC_CH" in {o["op"] for o in plan.ops if o["phase"] == "TRAIN"}
    names = onnx_names(plan)
    sim = microtrain.Simulator(plan)
    xs, ys = data()
    for x, y in zip(xs, ys):
        sim.step(x, y)
    whole = ("fc.weight", "fc.bias", "dw.bias", "pw2.bias", "first.bias")
    masks = torch_masks(module, scheme, whole)
    expected = torch_train(module, masks, xs, ys, 0.05, 0.9, 0.0, 1)
    got = plan.onnx_params(sim.params())
    for n in whole + ("pw1.weight", "pw2.weight"):
        m = masks[n].numpy().astype(bool)
        assert np.abs(got[names[n]][m] - expected[n][m]).max() <= RTOL * np.abs(expected[n][m]).max(), n


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("matmul", [False, True])
@pytest.mark.parametrize("axis,sel", [(1, [1, 2, 5]), (0, [0, 2, 3])])
def test_channel_sparse_head(models, exporter, matmul, axis, sel):
    """A head trained on some input features (axis 1) or some output rows (axis 0), as Linear
    (Gemm, W stored [out, in]) and as x @ W (MatMul, W stored [in, out]; axis 1 is still its
    input features)."""
    module, paths = models[matmul]
    names = onnx_names(microtrain.compile(paths[exporter], update="none"))
    scheme = {"classifier": "none", "bias_updates": [{"initializer": names["fc.bias"]}],
              "weight_updates": [{"initializer": names["fc.weight"], "channel_axis": axis, "selected_channels": sel},
                                 SCHEME["weight_updates"][0]]}
    plan = microtrain.compile(paths[exporter], update=scheme, lr=0.05, momentum=0.9)
    sim = microtrain.Simulator(plan)
    initial = {n: np.array(plan.onnx_params(sim.params())[names[n]]) for n in ("fc.weight", "pw1.weight")}
    xs, ys = data()
    for x, y in zip(xs, ys):
        sim.step(x, y)
    masks = torch_masks(module, scheme, ("fc.bias",), {v: k for k, v in names.items()},
                        ("fc.weight",) if matmul else ())
    expected = torch_train(module, masks, xs, ys, 0.05, 0.9, 0.0, 1)
    for n in ("fc.weight", "pw1.weight", "fc.bias"):
        got, want, mask = plan.onnx_params(sim.params())[names[n]], expected[n], masks[n].numpy().astype(bool)
        if got.shape != want.shape:   # a MatMul head stores the weight [in, out]
            got = got.T
            if n in initial:
                initial[n] = initial[n].T
        assert np.abs(got[mask] - want[mask]).max() <= RTOL * np.abs(want[mask]).max(), n
        if n in initial:
            assert np.array_equal(got[~mask], initial[n][~mask]), "%s frozen channels changed" % n


class Int8MaskedRelu6(torch.autograd.Function):
    """ReLU6 whose backward passes dy where the int8 copy of y (scale 6/255, zero point -128,
    rounded half to even as torch.round) lies strictly inside (-128, 127): the gradient of a model
    that keeps its activations as int8."""

    @staticmethod
    def forward(ctx, x):
        y = x.clamp(0, 6)
        q = torch.clamp(torch.round(y / float(np.float32(6 / 255))) - 128, -128, 127)
        ctx.save_for_backward((q > -128) & (q < 127))
        return y

    @staticmethod
    def backward(ctx, dy):
        return dy * ctx.saved_tensors[0]


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_saved_int8_relu6(models, exporter):
    """compile(saved="int8"): ReLU6 outputs that only a frozen-weight layer reads are kept as int8
    for the backward; the parameters after 20 steps match PyTorch with that int8 mask, the arena
    is smaller than with float copies, and the float model's oracle is off (the mask matters)."""
    module, paths = models[False]
    scheme = {"classifier": "full", "bias_updates": [{"conv_index": k} for k in (1, 2, 3)],
              "weight_updates": [SCHEME["weight_updates"][0]]}
    plans = {s: microtrain.compile(paths[exporter], update=scheme, lr=0.2, momentum=0.9, saved=s)
             for s in ("float32", "int8")}
    q8 = [o for o in plans["int8"].ops if o["op"] == "CLIP_BWD_Q8"]
    assert len(q8) == 2   # after pw1 (read by dw, frozen) and after dw (read by pw2, frozen)
    assert plans["int8"].report()["peak_live_bytes"] < plans["float32"].report()["peak_live_bytes"]
    names = onnx_names(plans["float32"])
    xs, ys = data()
    xs = xs * 3   # activations reach the ReLU6 cap, so both ends of the mask matter
    got = {}
    for s, plan in plans.items():
        sim = microtrain.Simulator(plan)
        for x, y in zip(xs, ys):
            sim.step(x, y)
        got[s] = plan.onnx_params(sim.params())
    whole = ("fc.weight", "fc.bias", "pw1.bias", "dw.bias", "pw2.bias")
    masks = torch_masks(module, scheme, whole)
    qmodule = copy.deepcopy(module)
    qmodule.act = Int8MaskedRelu6.apply
    want = {"float32": torch_train(module, masks, xs, ys, 0.2, 0.9, 0.0, 1),
            "int8": torch_train(qmodule, masks, xs, ys, 0.2, 0.9, 0.0, 1)}
    for s in ("float32", "int8"):
        for n in whole + ("pw1.weight",):
            m = masks[n].numpy().astype(bool)
            w = want[s][n][m]
            assert np.abs(got[s][names[n]][m] - w).max() <= RTOL * np.abs(w).max(), (s, n)
    n = "dw.bias"   # the int8 mask changed the training: the float oracle does not match it
    assert np.abs(got["int8"][names[n]] - want["float32"][n]).max() > 10 * RTOL * np.abs(want["float32"][n]).max()


def test_state_only_for_trained_channels(models):
    """With batch 1 the momentum of a channel-sparse weight holds only its trained channels."""
    _, paths = models[False]
    plan = microtrain.compile(paths["ts13"], update=SCHEME, momentum=0.9)
    names = onnx_names(microtrain.compile(paths["ts13"], update="none"))
    mom = {}
    for t in plan.tensors:
        if t["name"].startswith("mom("):
            w = t["name"][4:t["name"].index(")")].replace("@trained", "")
            mom[w] = mom.get(w, 0) + int(np.prod(t["shape"]))
    assert mom[names["pw1.weight"]] == 12 * 4          # 4 of 8 input channels
    assert mom[names["dw.weight"]] == 5 * 9            # 5 of 12 depthwise channels
    assert mom[names["pw2.weight"]] == 8 * 6           # ratio 0.5 of 12 input channels
    assert mom[names["fc.weight"]] == 4 * 8            # the head whole
    assert plan.meta["channels"][names["pw1.weight"]] == {"axis": 1, "channels": [0, 2, 3, 7]}


def test_scheme_file_and_errors(models, tmp_path):
    _, paths = models[False]
    one = tmp_path / "one.json"
    one.write_text(json.dumps(SCHEME))
    many = tmp_path / "many.schemes.json"
    many.write_text(json.dumps({"schemes": [SCHEME, dict(SCHEME, scheme="other", weight_updates=[])]}))
    a = microtrain.compile(paths["ts13"], update=str(one))
    b = microtrain.compile(paths["ts13"], update=str(many), scheme="test")
    assert a.meta["channels"] == b.meta["channels"] and a.meta["channels"]
    broken = tmp_path / "broken.json"
    broken.write_text("{\"schemes\": [")
    with pytest.raises(ValueError, match="scheme file .*broken.json is not valid JSON"):
        microtrain.compile(paths["ts13"], update=str(broken), scheme="test")
    with pytest.raises(ValueError, match="choose one with --scheme"):
        microtrain.compile(paths["ts13"], update=str(many))
    with pytest.raises(ValueError, match="no scheme 'nope'; its schemes are: test, other"):
        microtrain.compile(paths["ts13"], update=str(many), scheme="nope")
    bad = dict(SCHEME, weight_updates=[{"conv_index": 9, "ratio": 0.5}])
    with pytest.raises(ValueError, match="conv_index 9 is out of range: the model has 4 convs"):
        microtrain.compile(paths["ts13"], update=bad)
    bad = dict(SCHEME, weight_updates=[{"initializer": "blocks.8.pointwise1.conv.weight", "ratio": 0.5}])
    with pytest.raises(ValueError, match="'blocks.8.pointwise1.conv.weight' is not a weight or bias"):
        microtrain.compile(paths["ts13"], update=bad)
    bad = dict(SCHEME, weight_updates=[{"conv_index": 1, "selected_channels": [0, 8]}])
    with pytest.raises(ValueError, match=r"out of range: \[8\]; axis 1 has channels 0..7"):
        microtrain.compile(paths["ts13"], update=bad)
    bad = dict(SCHEME, weight_updates=[{"conv_index": 2, "channel_axis": 1, "ratio": 0.5}])
    with pytest.raises(ValueError, match="grouped conv"):
        microtrain.compile(paths["ts13"], update=bad)
    # a head trained on some output rows keeps the whole weight with ranged updates (Layer.runs)
    names = onnx_names(microtrain.compile(paths["ts13"], update="none"))
    rows = dict(SCHEME, weight_updates=[{"initializer": names["fc.weight"], "channel_axis": 0,
                                         "selected_channels": [0, 2, 3]}])
    with pytest.raises(ValueError, match="would decay the frozen channels"):
        microtrain.compile(paths["ts13"], update=rows, batch=4, weight_decay=0.01)


def test_optimizer_meta_lists_every_momentum_part(models):
    _, paths = models[False]
    names = onnx_names(microtrain.compile(paths["ts13"], update="none"))
    # the head on its output rows 0, 2, 3: whole weight, ranged updates, runs [0:1], [2:4]
    rows = dict(SCHEME, weight_updates=SCHEME["weight_updates"] + [
        {"initializer": names["fc.weight"], "channel_axis": 0, "selected_channels": [0, 2, 3]}], classifier="none")
    plan = microtrain.compile(paths["ts13"], update=rows, momentum=0.9)
    parts = plan.meta["optimizer"][names["fc.weight"]]["momentum"]
    assert [plan.tensors[i]["name"] for i in parts] == ["mom(%s)[%s]" % (names["fc.weight"], r)
                                                        for r in ("0:1", "2:4")]
    # split weights (split.py) are parameters of their own, each with one momentum buffer
    for w in ("pw1.weight", "dw.weight", "pw2.weight"):
        assert isinstance(plan.meta["optimizer"][names[w] + "@trained"]["momentum"], int), w


def test_report_names_the_arena_peak_and_channels(models, tmp_path):
    """The tensors alive where the arena peaks add up to peak_live_bytes (the planner's own lower
    bound, computed separately); `microtrain report` prints them and each channel-sparse weight."""
    import subprocess
    import sys
    from microtrain.peak import alive_at_peak
    _, paths = models[False]
    plan = microtrain.compile(paths["ts13"], update=SCHEME, momentum=0.9)
    peak = alive_at_peak(plan)
    assert peak["live_bytes"] == plan.report()["peak_live_bytes"] == sum(t[1] for t in peak["tensors"])
    assert 0 <= peak["op"] < len(plan.ops)
    plan.save(str(tmp_path / "p.mtp"))
    r = subprocess.run([sys.executable, "-m", "microtrain", "report", str(tmp_path / "p.mtp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = onnx_names(microtrain.compile(paths["ts13"], update="none"))
    assert "channels        %s: 4 input channels of 8" % names["pw1.weight"] in r.stdout
    assert "channels        %s: 5 output channels of 12" % names["dw.weight"] in r.stdout
    assert "arena peak      " in r.stdout and peak["tensors"][0][0] in r.stdout


def float_clip_outputs_alive_in_backward(plan):
    """The float Clip outputs whose memory (with what shares it in place) some TRAIN op reads."""
    slots = [o["slots"] for o in plan.ops]
    first, last = lifetimes(len(plan.tensors), slots, [plan.header["input_tensor"], plan.header["target_tensor"]])
    owner = plan.memory_owners()
    train = min(k for k, o in enumerate(plan.ops) if o["phase"] == "TRAIN")
    clip_y = [o["slots"][1] for o in plan.ops if o["op"] == "CLIP" and o["phase"] == "FORWARD"]
    return [plan.tensors[y]["name"] for y in clip_y
            if max(last[t] for t in range(len(plan.tensors)) if owner[t] == owner[y]) >= train]


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("act", ["relu6", "relu"])
def test_saved_bits(models, exporter, act, tmp_path):
    """compile(saved="bits"): Clip outputs (ReLU6, ReLU) that only a frozen-weight layer reads keep
    1 bit per element for the backward (MASK_PACK, MASK_BWD); the mask is the float one, so the
    parameters after 20 steps match PyTorch's float model as saved="float32" does, no float copy
    of those outputs lives into the backward, and the arena is smaller than with int8 copies.
    The ReLU model takes 5x5 images: 12 x 25 = 300 bits, a last mask byte half used."""
    hw = 6 if act == "relu6" else 5
    if act == "relu6":
        module, paths = models[False]
    else:
        module = Block(act=F.relu).eval()
        paths = {exporter: export(module, torch.zeros(1, 3, hw, hw), exporter, str(tmp_path / "relu.onnx"))}
    scheme = {"classifier": "full", "bias_updates": [{"conv_index": k} for k in (0, 1, 2, 3)],
              "weight_updates": [SCHEME["weight_updates"][0]]}
    plans = {s: microtrain.compile(paths[exporter], update=scheme, lr=0.2, momentum=0.9, saved=s, recompute=False)
             for s in ("float32", "int8", "bits")}   # what is saved, not made again (recompute.py)
    ops = [o["op"] for o in plans["bits"].ops]
    # after pw1 (read by dw, frozen) and after dw (read by pw2, frozen); first's output feeds the
    # gradient of the trained pw1 weight, so it stays float and its backward (to first's trained
    # bias) is CLIP_BWD on it
    assert ops.count("MASK_PACK") == 2 and ops.count("MASK_BWD") == 2 and ops.count("CLIP_BWD") == 1
    assert "CLIP_BWD_Q8" not in ops and "QUANTIZE" not in ops
    assert len(float_clip_outputs_alive_in_backward(plans["bits"])) == 1   # first's output only
    assert len(float_clip_outputs_alive_in_backward(plans["float32"])) == 3
    masks = [t for t in plans["bits"].tensors if t["name"].endswith("@mask")]
    assert sorted(t["bytes"] for t in masks) == [-(-12 * hw * hw // 8)] * 2 and {t["dtype"] for t in masks} == {"U8"}
    peak = {s: p.report()["peak_live_bytes"] for s, p in plans.items()}
    if act == "relu6":   # int8 copies only for ReLU6 (a bounded range); the arena's peak may lie
        # where neither is alive (the in-place depthwise conv), so the saved bytes are compared too
        assert peak["bits"] <= peak["int8"] < peak["float32"], peak
        copies = [t["bytes"] for t in plans["int8"].tensors if t["name"].endswith("@int8")]
        assert len(copies) == 2 and sum(t["bytes"] for t in masks) * 7 < sum(copies)
    else:
        assert peak["bits"] < peak["float32"], peak
    names = onnx_names(plans["float32"])
    xs, ys = data()
    xs = xs[:, :, :hw, :hw] * 3   # activations reach the ReLU6 cap, so both ends of the mask matter
    whole = ("fc.weight", "fc.bias", "first.bias", "pw1.bias", "dw.bias", "pw2.bias")
    masks = torch_masks(module, scheme, whole)
    want = torch_train(module, masks, xs, ys, 0.2, 0.9, 0.0, 1)
    got = {}
    for s in ("float32", "bits"):
        sim = microtrain.Simulator(plans[s])
        losses = [sim.step(x, y) for x, y in zip(xs, ys)]
        got[s] = losses, sim.params()
        params = plans[s].onnx_params(sim.params())
        for n in whole + ("pw1.weight",):
            m = masks[n].numpy().astype(bool)
            w = want[n][m]
            assert np.abs(params[names[n]][m] - w).max() <= RTOL * np.abs(w).max(), (s, n)
    # the same C arithmetic on the same values: bits and float32 agree to the bit
    assert got["bits"][0] == got["float32"][0]
    for k, v in got["float32"][1].items():
        assert np.array_equal(got["bits"][1][k], v), k


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_saved_bits_before_split_weights(models, exporter):
    """A Clip output that feeds split weights (pw1's into the depthwise conv trained on 5 of its
    channels, dw's into pw2 trained on half its input channels) is read by the backward only for
    its mask: the weight gradients read the gathered copies. So with saved="bits" no float Clip
    output lives into the backward, and the parameters are bit-identical to saved="float32"."""
    _, paths = models[False]
    plans = {s: microtrain.compile(paths[exporter], update=SCHEME, lr=0.05, momentum=0.9, saved=s, recompute=False)
             for s in ("float32", "bits")}
    assert float_clip_outputs_alive_in_backward(plans["bits"]) == []
    assert len(float_clip_outputs_alive_in_backward(plans["float32"])) == 2
    xs, ys = data()
    got = {}
    for s, plan in plans.items():
        sim = microtrain.Simulator(plan)
        for x, y in zip(xs, ys):
            sim.step(x, y)
        got[s] = plan.onnx_params(sim.params())
    for k, v in got["float32"].items():
        assert np.array_equal(got["bits"][k], v), k


def test_saved_bits_from_the_cli(models, tmp_path):
    """`microtrain compile --saved bits` writes the plan of compile(saved="bits"); an unknown
    mode is refused, naming the choices."""
    import subprocess
    import sys
    _, paths = models[False]
    scheme = tmp_path / "scheme.json"
    scheme.write_text(json.dumps({"classifier": "full", "bias_updates": [{"conv_index": 2}]}))
    out = tmp_path / "bits.mtp"
    cli = [sys.executable, "-m", "microtrain", "compile", paths["ts13"], "-o", str(out), "--update", str(scheme)]
    r = subprocess.run(cli + ["--saved", "bits"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    plan = microtrain.load_plan(str(out))
    api = microtrain.compile(paths["ts13"], update=str(scheme), saved="bits")
    assert [o["op"] for o in plan.ops] == [o["op"] for o in api.ops] and "MASK_BWD" in [o["op"] for o in plan.ops]
    assert plan.tensors == api.tensors
    r = subprocess.run(cli + ["--saved", "bit"], capture_output=True, text=True)
    assert r.returncode != 0 and "float32, int8, bits" in r.stderr.replace("'", "")
    with pytest.raises(ValueError, match="unknown saved 'bit'; use one of float32, int8, bits"):
        microtrain.compile(paths["ts13"], update=str(scheme), saved="bit")
