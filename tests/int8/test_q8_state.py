"""Trained weights stored as int8 (compile(trained_weights="int8"), docs/sparse.md).

The small CNN of test_sparse.py (3x3 conv, 1x1 expansion, depthwise, 1x1 projection, residual
Add, Linear head; both exporters) trains with its channel-sparse scheme and its weights int8.
The oracle is PyTorch: at every step the module holds the plan's weights (int8 code x its
channel's scale, in float32), autograd gives the gradient, and the rule of the docs is applied
in float32 by numpy: code <- clip(rint((code*s - lr*g) / s), -127, 127) (rint: half to even).
The expected codes must equal the plan's exactly, except where PyTorch's value before rounding
lies within TIE of a rounding boundary (float32 summation order may then round either way;
counted and bounded). Biases (float32) match within 1e-4 of their largest magnitude.
"""
from __future__ import annotations

import struct

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as TF

import microtrain
from microtrain import format as F
from microtrain.native import Core, PlanError
from oracle_models import export
from plan_mutations import build
from test_sparse import SCHEME, Block, data, onnx_names, torch_masks

STEPS = 20
LR = 0.05
TIE = 1e-3      # |frac(x) - 0.5| below this: either rounding is right
RTOL = 1e-4


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("q8state")
    module = Block().eval()
    return module, {e: export(module, torch.zeros(1, 3, 6, 6), e, str(d / ("block-%s.onnx" % e)))
                    for e in ("ts13", "dynamo")}


def int8_params(plan):
    """{parameter name: (tensor, scales, axis)} of the plan's int8 parameters."""
    return {t["name"]: t for t in plan.tensors if t["flags"] & F.TFLAGS["PARAM"] and t["dtype"] == "I8"}


def codes(sim, name):
    """A parameter's int8 codes as the state region holds them, in its ONNX shape."""
    return sim.core.param(name).copy().reshape(sim.plan.meta["param_shapes"][name])


def bshape(q, ndim):
    s = [1] * ndim
    s[q.axis] = -1
    return q.scale.reshape(s)


def torch_step(module, names, values, x, y):
    """PyTorch autograd's gradients (float64) of one sample's loss, the module holding `values`
    ({onnx name: array}, the plan's current weights) in place of its own."""
    m = Block().double()
    m.load_state_dict(module.state_dict())
    params = dict(m.named_parameters())
    with torch.no_grad():
        for tn, on in names.items():
            if on in values:
                params[tn].copy_(torch.from_numpy(np.asarray(values[on], np.float64)).reshape(params[tn].shape))
    TF.cross_entropy(m(torch.from_numpy(x[None]).double()), torch.as_tensor([int(y)])).backward()
    return {tn: params[tn].grad.numpy() for tn in names}


def slice_grad(plan, name, grads_onnx):
    """The gradient of parameter `name` in its ONNX shape: a split weight's slice takes its channels
    (input channels, or a depthwise conv's channels: axis 0)."""
    if name.endswith("@trained"):
        base = name[:-len("@trained")]
        split = plan.meta["split"][base]
        return grads_onnx[base][split["channels"]] if split["axis"] == 0 else grads_onnx[base][:, split["channels"]]
    return grads_onnx[name]


def check_step(plan, sim, name, q8, before, before_codes, after, grad):
    """Parameter `name` after one step is PyTorch's step from `before` with gradient `grad`: a
    float32 one within RTOL, an int8 one's codes by the rounding rule (module docstring), except
    near a tie; returns (codes near a tie, codes checked)."""
    if name not in q8:   # a float32 parameter: PyTorch's SGD step
        want = before[name].astype(np.float64) - LR * grad
        assert np.abs(after[name] - want).max() <= RTOL * max(np.abs(want).max(), 1e-6), name
        return 0, 0
    s = bshape(plan.tensors[plan.tensor_index(name)]["quant"], grad.ndim)
    wf = before_codes[name].astype(np.float32) * s
    assert np.array_equal(wf, before[name]), "%s: params() is not code x scale" % name
    xq = (wf - np.float32(LR) * grad.astype(np.float32)) / s
    want = np.clip(np.rint(xq), -127, 127).astype(np.int8)
    got = codes(sim, name)
    tie = np.abs(np.abs(xq - np.floor(xq)) - 0.5) < TIE
    assert np.array_equal(got[~tie], want[~tie]), "%s: codes differ from PyTorch's step" % name
    assert np.all(np.abs(got.astype(int) - want.astype(int)) <= 1), name
    return int(tie.sum()), got.size


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_int8_weights_match_pytorch_step_by_step(paths, exporter):
    module, p = paths
    plan = microtrain.compile(p[exporter], update=SCHEME, lr=LR, trained_weights="int8")
    names = onnx_names(plan)
    q8 = int8_params(plan)
    assert set(q8) == {names[w] + "@trained" for w in ("pw1.weight", "dw.weight", "pw2.weight")} | {names["fc.weight"]}
    sim = microtrain.Simulator(plan)
    masks = torch_masks(module)
    dw = names["dw.weight"]
    dw_mask = masks["dw.weight"].numpy().astype(bool)
    start = {n: codes(sim, n) for n in q8}
    start_dw = plan.onnx_params(sim.params())[dw]
    ties = checked = 0
    xs, ys = data()
    for x, y in zip(xs, ys):
        before = sim.params()
        before_codes = {n: codes(sim, n) for n in q8}
        values = plan.onnx_params(before)
        g_torch = torch_step(module, names, values, x, y)
        g = {}
        for tn, on in names.items():   # torch layout -> ONNX layout (a MatMul head stores W^T)
            shape = tuple(plan.meta["params"].get(on, {"shape": g_torch[tn].shape})["shape"])
            g[on] = g_torch[tn] if g_torch[tn].shape == shape else g_torch[tn].T
        sim.step(x, y)
        after = sim.params()
        for name in before:
            t, c = check_step(plan, sim, name, q8, before, before_codes, after, slice_grad(plan, name, g))
            ties, checked = ties + t, checked + c
    print("%s: %d of %d codes checked were near a tie" % (exporter, ties, checked))
    assert ties <= checked // 200, "%d of %d codes near a tie" % (ties, checked)
    # the depthwise conv trains channels 1, 2, 3, 9, 10 (its slice); the others keep their values
    assert np.array_equal(plan.onnx_params(sim.params())[dw][~dw_mask], start_dw[~dw_mask]), "frozen channels of dw"
    for name in q8:
        assert not np.array_equal(codes(sim, name), start[name]), "%s did not train" % name


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_initial_codes_and_scales(paths, exporter):
    """scale = max|w| / 127 per output channel of the initial float weight, codes rint(w / s)."""
    module, p = paths
    plan = microtrain.compile(p[exporter], update="full", trained_weights="int8")
    names = onnx_names(plan)
    sim = microtrain.Simulator(plan)
    torch_w = {on: dict(module.named_parameters())[tn].detach().numpy() for tn, on in names.items()}
    for name, t in int8_params(plan).items():
        w = torch_w[name]
        q = t["quant"]
        w = w if w.shape == codes(sim, name).shape else w.T
        red = tuple(d for d in range(w.ndim) if d != q.axis)
        assert np.array_equal(q.scale, (np.abs(w).max(axis=red) / np.float32(127)).astype(np.float32)), name
        assert np.array_equal(codes(sim, name), np.clip(np.rint(w / bshape(q, w.ndim)), -127, 127)), name
    assert {n for n in plan.params() if n not in int8_params(plan)} == {names[n] for n in names
                                                                        if n.endswith(".bias")}


def test_every_int8_weight_learns(paths):
    """Property: with lr 0.05, every int8 weight's codes change (a channel whose ReLU never
    passes a gradient may not), and the loss goes down."""
    _, p = paths
    plan = microtrain.compile(p["ts13"], update="full", lr=LR, trained_weights="int8")
    sim = microtrain.Simulator(plan)
    start = {n: codes(sim, n) for n in int8_params(plan)}
    xs, ys = data(40)
    losses = [sim.step(x, y) for x, y in zip(np.concatenate([xs] * 3), np.concatenate([ys] * 3))]
    for n in int8_params(plan):
        assert np.any(codes(sim, n) != start[n]), "%s: no code changed" % n
    assert np.mean(losses[-40:]) < np.mean(losses[:40])


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_no_float_copy_outlives_its_reader(paths, exporter):
    """The convolutions read their int8 weights themselves (the W8 forms: the depthwise slice's
    CONV2D_W8, the 1x1 slices' CONV2D_ACC_W8); the Gemm head's float copy (DEQUANTIZE_W) is read by
    the next op only; the input gradients read the int8 weight itself (the *_Q8 kernels), so no
    float copy of a weight reaches the backward."""
    _, p = paths
    plan = microtrain.compile(p[exporter], update=SCHEME, lr=LR, trained_weights="int8")
    q8 = {plan.tensor_index(n) for n in int8_params(plan)}
    ops = plan.ops
    forward = [o["op"] for o in ops if o["phase"] == "FORWARD" and set(o["slots"]) & q8]
    assert forward.count("CONV2D_ACC_W8") == 2 and forward.count("CONV2D_W8") == 1, forward
    deq = [k for k, o in enumerate(ops) if o["op"] == "DEQUANTIZE_W"]
    assert [ops[k + 1]["op"] for k in deq] == ["GEMM"]
    for k in deq:
        y = ops[k]["slots"][1]
        assert [j for j, o in enumerate(ops) if y in o["slots"]] == [k, k + 1]
        assert ops[k + 1]["phase"] == "FORWARD" or ops[k + 1]["op"].endswith("DW_INPLACE")
    bwd_input = [o for o in ops if o["op"].startswith(("CONV2D_BWD_INPUT", "GEMM_BWD_INPUT")) and o["slots"][1] in q8]
    assert bwd_input and all(o["op"].endswith("_Q8") for o in bwd_input)


def test_int8_state_is_smaller_and_reported(paths):
    _, p = paths
    f = microtrain.compile(p["ts13"], update="full").report()
    q = microtrain.compile(p["ts13"], update="full", trained_weights="int8").report()
    weights = sum(t["bytes"] for t in f["tensors"] if t["name"].endswith("weight") and t["storage"] == "state")
    assert q["param_bytes"] < f["param_bytes"] - weights // 2
    assert {t["dtype"] for t in q["tensors"] if t["storage"] == "state" and t["name"].endswith("weight")} == {"i8"}


@pytest.mark.parametrize("momentum,batch,wd", [(0.9, 1, 0.0), (0.0, 4, 0.0), (0.9, 4, 0.0), (0.9, 1, 0.01)])
def test_int8_with_momentum_and_batches(paths, momentum, batch, wd):
    """Momentum (float, of the trained elements), batch > 1 (a float accumulator applied at the
    end of the batch) and weight decay (of the value code x scale, trained elements only):
    PyTorch in lockstep for a whole batch, as in the step-by-step test."""
    module, p = paths
    plan = microtrain.compile(p["ts13"], update=SCHEME, lr=LR, momentum=momentum, batch=batch, weight_decay=wd,
                              trained_weights="int8")
    names = onnx_names(plan)
    q8 = int8_params(plan)
    sim = microtrain.Simulator(plan)
    xs, ys = data(12)
    mom = {}
    ties = checked = 0
    for i in range(0, len(xs), batch):
        before, before_codes = sim.params(), {n: codes(sim, n) for n in q8}
        values = plan.onnx_params(before)
        gs = [torch_step(module, names, values, x, y) for x, y in zip(xs[i:i + batch], ys[i:i + batch])]
        g = {on: np.mean([gg[tn] for gg in gs], axis=0) for tn, on in names.items()}
        for x, y in zip(xs[i:i + batch], ys[i:i + batch]):
            sim.step(x, y)
        for name in q8:
            s = bshape(plan.tensors[plan.tensor_index(name)]["quant"], before_codes[name].ndim)
            wf = before_codes[name].astype(np.float32) * s
            grad = slice_grad(plan, name, g).astype(np.float32) + np.float32(wd) * wf
            if momentum:   # PyTorch's buffer: the first gradient, then mu * buf + g
                grad = np.float32(momentum) * mom[name] + grad if name in mom else grad
                mom[name] = grad
            xq = (wf - np.float32(LR) * grad) / s
            want = np.clip(np.rint(xq), -127, 127)
            got = codes(sim, name)
            tie = np.abs(np.abs(xq - np.floor(xq)) - 0.5) < TIE
            assert np.array_equal(got[~tie], want[~tie]), "%s: codes differ from PyTorch's step" % name
            ties += int(tie.sum())
            checked += got.size
    assert ties <= checked // 100


def test_save_load_state_round_trip(paths):
    _, p = paths
    plan = microtrain.compile(p["ts13"], update=SCHEME, lr=LR, momentum=0.9, trained_weights="int8")
    sim = microtrain.Simulator(plan)
    xs, ys = data()
    for x, y in zip(xs[:5], ys[:5]):
        sim.step(x, y)
    blob = sim.core.save_state()
    assert len(blob) == F.STATE_HEADER_BYTES + plan.header["state_bytes"] + 4
    for x, y in zip(xs[5:], ys[5:]):
        sim.step(x, y)
    first = {n: v.copy() for n, v in sim.params().items()}
    first_blob = sim.core.save_state()
    sim.core.load_state(blob)
    for x, y in zip(xs[5:], ys[5:]):
        sim.step(x, y)
    assert sim.core.save_state() == first_blob
    for n, v in sim.params().items():
        assert np.array_equal(v, first[n]), n


def test_params_and_set_params(paths):
    _, p = paths
    plan = microtrain.compile(p["ts13"], update=SCHEME, lr=LR, trained_weights="int8")
    sim = microtrain.Simulator(plan)
    xs, ys = data()
    for x, y in zip(xs, ys):
        sim.step(x, y)
    q8 = int8_params(plan)
    params = sim.params()
    blob = sim.core.save_state()
    for n in q8:   # params(): code x scale, float32
        assert params[n].dtype == np.float32
        c = codes(sim, n)
        assert np.array_equal(params[n], c.astype(np.float32) * bshape(q8[n]["quant"], c.ndim))
    sim.set_params(params)   # its own values back: nothing changes
    assert sim.core.save_state() == blob
    rng = np.random.default_rng(1)
    new = {}
    for n in q8:
        s = bshape(q8[n]["quant"], params[n].ndim)
        new[n] = (rng.uniform(-126, 126, params[n].shape) * s).astype(np.float32)
    sim.set_params(new)
    for n in q8:   # set_params quantizes with the stored scales, half to even
        s = bshape(q8[n]["quant"], params[n].ndim)
        assert np.array_equal(codes(sim, n), np.clip(np.rint(new[n] / s), -127, 127)), n
    n = next(iter(q8))
    bad = dict(new)
    bad[n] = new[n].copy()
    bad[n].reshape(-1)[0] = 200 * float(bshape(q8[n]["quant"], new[n].ndim).reshape(-1)[0])
    before = sim.core.save_state()
    with pytest.raises(ValueError, match="int8 range"):
        sim.set_params(bad)
    assert sim.core.save_state() == before   # nothing written


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_export_runs_in_onnxruntime(paths, exporter, tmp_path):
    """The exported float ONNX model (trained weights dequantized) run by onnxruntime gives the
    simulator's outputs."""
    _, p = paths
    plan = microtrain.compile(p[exporter], update=SCHEME, lr=LR, trained_weights="int8")
    sim = microtrain.Simulator(plan)
    xs, ys = data()
    for x, y in zip(xs, ys):
        sim.step(x, y)
    out = str(tmp_path / "trained.onnx")
    plan.export(sim.params(), p[exporter], out)
    s = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    for x in xs[:5]:
        want = s.run(None, {s.get_inputs()[0].name: x[None]})[0].reshape(-1)
        assert np.allclose(sim.predict(x).reshape(-1), want, rtol=1e-5, atol=1e-5)


def test_cli_option(paths, tmp_path):
    from microtrain.cli import main
    out = str(tmp_path / "plan.mtp")
    assert main(["compile", paths[1]["ts13"], "-o", out, "--update", "full", "--trained-weights", "int8"]) in (0, None)
    plan = microtrain.load_plan(out)
    assert int8_params(plan) and plan.meta["trained_weights"] == "int8"


def test_bad_option(paths):
    with pytest.raises(ValueError, match="trained_weights"):
        microtrain.compile(paths[1]["ts13"], update="full", trained_weights="int4")


# ---- bad plans: an int8 parameter's quantization record is checked at load ----

def _mutated(data, name, change):
    """The plan with the quantization record of parameter `name` changed by change(record, plan)."""
    plan = microtrain.Plan(data)
    i = plan.tensor_index(name)
    h = plan.header
    tpos = h["tensors_off"] + i * F.TENSOR_BYTES
    qi = F.unpack_tensor(data, tpos)["quant"]
    b = bytearray(data)
    change(b, h, tpos, h["quant_off"] + qi * F.QUANT_BYTES)
    return build(bytes(b), -1, True, [])


def _set_scale(value, k=0):
    def change(b, h, tpos, qpos):
        q = F.unpack_quant(b, qpos)
        struct.pack_into("<f", b, h["data_off"] + q["scales"] + 4 * k, value)
    return change


def _set_field(field, value):
    def change(b, h, tpos, qpos):
        q = F.unpack_quant(b, qpos)
        q[field] = value
        b[qpos:qpos + F.QUANT_BYTES] = F.pack_quant(**q)
    return change


def _zero_points(plan):
    """Zero points of 0 (in range, so only the int8-parameter rule refuses them): a frozen
    float constant's bytes zeroed, and the record pointing there."""
    const = next(t for t in plan.tensors if t["storage"] == "CONST" and t["dtype"] == "F32" and t["bytes"] >= 64)

    def change(b, h, tpos, qpos):
        at = h["data_off"] + const["offset"]
        b[at:at + const["bytes"]] = bytes(const["bytes"])
        _set_field("zero_points", const["offset"])(b, h, tpos, qpos)
    return change


def _no_quant(b, h, tpos, qpos):
    struct.pack_into("<H", b, tpos + F.tensor_offsets()["quant"], F.NO_QUANT)


@pytest.mark.parametrize("case", ["zero scale", "nan scale", "inf scale", "negative scale", "scale count",
                                  "per-tensor record", "zero points", "no record"])
def test_bad_int8_param_records_refused(paths, case):
    _, p = paths
    plan = microtrain.compile(p["ts13"], update=SCHEME, trained_weights="int8")
    name = next(iter(int8_params(plan)))
    change = {"zero scale": _set_scale(0.0, 1), "nan scale": _set_scale(float("nan"), 2),
              "inf scale": _set_scale(float("inf")), "negative scale": _set_scale(-0.01, 3),
              "scale count": _set_field("n_channels", plan.tensors[plan.tensor_index(name)]["shape"][0] + 1),
              "per-tensor record": lambda b, h, t, q: b.__setitem__(slice(q, q + F.QUANT_BYTES), F.pack_quant(
                  scale=0.01, zero_point=0, axis=F.PER_TENSOR, where=F.QUANT_IN_DATA, reserved=b"\0" * 2,
                  n_channels=1, scales=F.NO_NAME,
                  zero_points=F.NO_NAME)),
              "zero points": _zero_points(plan),
              "no record": _no_quant}[case]
    Core(plan.data)   # the plan as compiled loads
    with pytest.raises(PlanError, match="invalid tensor record"):
        Core(_mutated(plan.data, name, change))
