"""Frozen weights of float layers stored as int8 (compile(frozen_weights="int8"), w8.py).

A frozen conv weight of a float layer (a layer whose bias trains, the frozen part of a split
weight, a depthwise conv the gradient passes through) is stored as int8 with one symmetric scale
per output channel, and its layer computes in float32 on W' = float32(q) * scale[o].

* Training against PyTorch autograd (both exporters): the module of tests/sparse/test_sparse.py with its
  frozen weights replaced by their dequantized values, worked out here in torch from the rule
  (max |w| / 127 per output channel, round half to even), trains as the plan does within 1e-4;
  the frozen parts the plan reports are those values bit for bit; onnxruntime runs the exported
  model as the simulator does.
* Each W8 op, alone in a plan, gives the bits of its float op on the dequantized weight (and
  PyTorch's result within float32 rounding), over 1x1 (chunks of input or output channels, pairs
  of channels), 3x3, strided 5x5, dilated, grouped, depthwise and 8x8 geometries.
* An int8 weight without one scale per output channel is refused at load, naming the problem.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import microtrain
import microtrain.compiler
from microtrain import format as F
from microtrain.ir import Quant
from microtrain.memory import assign_memory
from microtrain.native import Core, PlanError
from microtrain.plan import Plan, write_plan
from microtrain.lowered import TOp, TTensor
from test_sparse import SCHEME, Block, data, export, onnx_names, torch_masks, torch_train

RTOL = 1e-4
# pw1 and pw2 train on some input channels (split: W@frozen is a frozen weight), dw and the first conv
# train their biases only; the first conv's bias makes the gradient pass back through pw2, dw, pw1
W8_SCHEME = dict(SCHEME, bias_updates=[{"conv_index": 0}] + SCHEME["bias_updates"],
                 weight_updates=[e for e in SCHEME["weight_updates"] if e["conv_index"] != 2])
W8_WHOLE = ("fc.weight", "fc.bias", "dw.bias", "pw2.bias", "first.bias")


def dequantized(w):
    """torch float32 weight -> the weight a W8 layer computes with: q = round(w / s) in [-128, 127]
    with s = max |w| / 127 per output channel (1 where the channel is all zeros), then q * s."""
    w = w.detach().float()
    m = w.abs().reshape(w.shape[0], -1).amax(dim=1)
    s = torch.where(m > 0, m / 127, torch.ones_like(m)).reshape(-1, 1, 1, 1)
    q = torch.clamp(torch.round(w.double() / s.double()), -128, 127)
    return q.float() * s


def w8_module(module, masks):
    """The module whose frozen conv weights are their dequantized values: a weight that trains on
    some channels keeps those channels and has the rest (zeros where it trains) dequantized."""
    out = type(module)()
    out.load_state_dict(module.state_dict())
    with torch.no_grad():
        for name in ("first", "pw1", "dw", "pw2"):
            w = getattr(out, name).weight
            m = masks[name + ".weight"].bool()
            if m.all():
                continue
            frozen = dequantized(torch.where(m, torch.zeros_like(w), w))
            w.copy_(torch.where(m, w, frozen))
    return out.eval()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("w8")
    module = Block().eval()
    return module, {e: export(module, torch.zeros(1, 3, 6, 6), e, str(d / ("block-%s.onnx" % e)))
                    for e in ("ts13", "dynamo")}


def ops(plan):
    return [o["op"] for o in plan.ops]


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_training_matches_pytorch_on_the_dequantized_model(paths, exporter, tmp_path, monkeypatch):
    module, files = paths
    lr, momentum = 0.05, 0.9
    # the W8 ops themselves: the block not streamed a channel at a time (tests/sparse/test_dw_stream.py)
    monkeypatch.setattr(microtrain.compiler, "stream_blocks", lambda tensors, ops: (ops, []))
    # saved="bits": the ReLU6 outputs dw and pw2 read are kept as masks, so dw runs in place
    plan = microtrain.compile(files[exporter], update=W8_SCHEME, lr=lr, momentum=momentum, saved="bits",
                              frozen_weights="int8")
    names = onnx_names(plan)
    # the first conv and dw: frozen weight, trained bias; pw1, pw2: the frozen part of a split weight
    assert sorted(plan.meta["w8"]) == sorted([names["first.weight"], names["dw.weight"],
                                              names["pw1.weight"] + "@frozen", names["pw2.weight"] + "@frozen"])
    for w in plan.meta["w8"]:
        t = plan.tensors[plan.tensor_index(w)]
        assert t["dtype"] == "I8" and t["storage"] == "CONST" and t["quant"].scale.shape == (t["shape"][0],)
    got_ops = set(ops(plan))
    assert {"CONV2D_W8", "CONV2D_DW_INPLACE_W8", "CONV2D_BWD_INPUT_DW_INPLACE_W8", "CONV2D_BWD_INPUT_W8"} <= got_ops
    assert not {"CONV2D", "CONV2D_DW_INPLACE", "CONV2D_BWD_INPUT_DW_INPLACE"} & got_ops   # no float frozen weight left
    # the float CONV2D_BWD_INPUT left: only the trained slices' (parameters)
    assert all(plan.tensors[o["slots"][1]]["storage"] == "STATE" for o in plan.ops if o["op"] == "CONV2D_BWD_INPUT")
    float_plan = microtrain.compile(files[exporter], update=W8_SCHEME, lr=lr, momentum=momentum, saved="bits")
    assert plan.report()["const_bytes"] < float_plan.report()["const_bytes"] / 3
    assert plan.report()["arena_bytes"] == float_plan.report()["arena_bytes"]

    masks = torch_masks(module, W8_SCHEME, W8_WHOLE)
    oracle = w8_module(module, masks)
    sim = microtrain.Simulator(plan)
    initial = plan.onnx_params(sim.params())
    xs, ys = data()
    for x, y in zip(xs, ys):
        sim.step(x, y)
    expected = torch_train(oracle, masks, xs, ys, lr, momentum, 0.0, 1)
    want0 = {n: p.detach().numpy() for n, p in oracle.named_parameters()}
    got = plan.onnx_params(sim.params())
    for n, m in masks.items():
        m = m.numpy().astype(bool)
        if n in ("pw1.weight", "pw2.weight"):   # split: trained channels, and the frozen ones dequantized
            assert np.array_equal(got[names[n]][~m], want0[n][~m]), "%s frozen channels" % n
            assert np.array_equal(initial[names[n]][~m], want0[n][~m])
        if not m.any():
            assert np.array_equal(plan.weight(names[n]), want0[n]), "%s is not the dequantized weight" % n
            continue
        scale = max(np.abs(expected[n][m]).max(), 1e-6)
        assert np.abs(got[names[n]][m] - expected[n][m]).max() <= RTOL * scale, "%s trained part differs" % n
        assert not np.array_equal(got[names[n]][m], initial[names[n]][m]), "%s did not train" % n

    # the exported model holds the dequantized weights and computes what the simulator does
    out = tmp_path / "trained.onnx"
    trained = plan.export(sim.params(), files[exporter], str(out))
    inits = {i.name: numpy_helper.to_array(i) for i in trained.graph.initializer}
    assert np.array_equal(inits[names["dw.weight"]], want0["dw.weight"])
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for x in xs[:4]:
        want = sim.predict(x).reshape(-1)
        y = sess.run(None, {sess.get_inputs()[0].name: x[None]})[0].reshape(-1)
        assert np.abs(y - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_float32_stays_the_default_and_bad_values_are_refused(paths):
    _, files = paths
    plan = microtrain.compile(files["ts13"], update=W8_SCHEME)
    assert plan.meta["w8"] == [] and not [o for o in ops(plan) if o.endswith("_W8")]
    with pytest.raises(ValueError, match="unknown frozen_weights 'int4'; use one of float32, int8"):
        microtrain.compile(files["ts13"], update=W8_SCHEME, frozen_weights="int4")


# ---- each W8 op alone against its float op on the dequantized weight ----

def quantized(rng, shape):
    """(int8 weight, its per-output-channel Quant, the dequantized float32 weight)"""
    q = rng.integers(-127, 128, size=shape).astype(np.int8)
    scale = rng.uniform(1e-3, 0.1, shape[0]).astype(np.float32)
    return q, Quant(scale, np.zeros(shape[0], np.int32), 0), q.astype(np.float32) * scale.reshape(-1, 1, 1, 1)


def single_op(op, inputs, y, attrs, scratch=None):
    """A forward plan of one op: inputs[0] the float input, the rest constants in slot order (None for
    an absent optional slot), an optional arena scratch, y the output."""
    x = inputs[0]
    x.flags |= F.TFLAGS["INPUT"]
    y.flags |= F.TFLAGS["OUTPUT"]
    target = TTensor("target", (1,), dtype="I32", flags=F.TFLAGS["TARGET"])
    tensors = [t for t in inputs if t is not None] + ([scratch] if scratch is not None else []) + [y, target]
    index = {id(t): i for i, t in enumerate(tensors)}
    slots = [index[id(t)] if t is not None else None for t in inputs] + \
        ([index[id(scratch)]] if scratch is not None else []) + [index[id(y)]]
    ops_ = [TOp(op, "FORWARD", slots, list(attrs))]
    io = (0, len(tensors) - 1, index[id(y)])
    arena, state, naive, peak, blobs, size, quants, _ = assign_memory(tensors, ops_, io[:2], "naive")
    return Plan(write_plan(tensors, ops_, arena=arena, state=state, naive=naive, blobs=blobs, data_size=size, io=io,
                           loss="cross-entropy", batch=1, lr=0.0, momentum=0.0, weight_decay=0.0, macs=0,
                           meta={"input": {"shape": list(x.shape)}, "output": {"shape": list(y.shape)}},
                           quants=quants, input_dtype="F32"))


def const(name, data, dtype="F32", quant=None):
    return TTensor(name, tuple(data.shape), dtype=dtype, storage="CONST", data=np.asarray(data), quant=quant)


def extent(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


# name: (C, O, H, W, k, stride, pad, dil, groups)
GEOMETRIES = {
    "1x1 wide": (70, 5, 4, 7, 1, 1, 0, 1, 1),   # chunks of 32 input channels, pairs of outputs and one alone
    "1x1 tall": (5, 70, 3, 5, 1, 1, 0, 1, 1),   # the input gradient: chunks of 32 output channels
    "1x1 grouped": (12, 6, 5, 5, 1, 1, 0, 1, 3),
    "1x1 strided": (9, 4, 6, 6, 1, 2, 0, 1, 1),
    "3x3": (10, 4, 6, 7, 3, 1, 1, 1, 1),        # chunks of 7 input channels
    "5x5 s2": (5, 3, 9, 8, 5, 2, 2, 1, 1),
    "3x3 d2 grouped": (6, 4, 7, 7, 3, 1, 2, 2, 2),
    "8x8": (3, 2, 9, 9, 8, 1, 1, 1, 1),         # 64 taps: one filter per chunk
    "depthwise 3x3": (6, 6, 5, 5, 3, 1, 1, 1, 6),
    "depthwise 5x5 s2": (4, 4, 9, 9, 5, 2, 2, 1, 4),
    "depthwise 5x5 d2": (3, 3, 8, 9, 5, 1, 4, 2, 3),
}


def conv_case(name, seed=0):
    C, O, H, W, k, s, p, d, g = GEOMETRIES[name]
    rng = np.random.default_rng(seed)
    q, quant, wf = quantized(rng, (O, C // g, k, k))
    attrs = dict(stride_h=s, stride_w=s, pad_t=p, pad_l=p, pad_b=p, pad_r=p, dil_h=d, dil_w=d, groups=g)
    oh, ow = extent(H, k, s, p, d), extent(W, k, s, p, d)
    return rng, q, quant, wf, [attrs[a] for a in F.CONV_ATTRS], (1, C, H, W), (1, O, oh, ow)


def run(plan, x):
    core = Core(plan.data)
    return np.array(core.predict(x)), core


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_conv2d_w8_is_conv2d_on_the_dequantized_weight(geometry, bias):
    rng, q, quant, wf, attrs, xs, ys = conv_case(geometry)
    b = rng.normal(size=ys[1]).astype(np.float32) if bias else None
    plans = [single_op(op, [TTensor("x", xs), const("w", w, dt, qu), const("b", b) if bias else None],
                       TTensor("y", ys), attrs)
             for op, w, dt, qu in (("CONV2D", wf, "F32", None), ("CONV2D_W8", q, "I8", quant))]
    assert [o["op"] for o in plans[1].ops] == ["CONV2D_W8"]
    for _ in range(2):
        x = rng.normal(size=xs).astype(np.float32)
        want, got = run(plans[0], x)[0], run(plans[1], x)[0]
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), geometry
    # and what PyTorch computes, within float32 rounding
    t = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(wf).double(),
                                   torch.from_numpy(b).double() if bias else None, stride=attrs[0],
                                   padding=attrs[2], dilation=attrs[6], groups=attrs[8]).numpy()
    assert np.abs(got.reshape(t.shape) - t).max() <= 1e-5 * max(1.0, np.abs(t).max())


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_conv2d_bwd_input_w8_is_conv2d_bwd_input_on_the_dequantized_weight(geometry):
    """dy (output-shaped) in, dx (input-shaped) out; and PyTorch's input gradient within float32 rounding."""
    rng, q, quant, wf, attrs, xs, ys = conv_case(geometry, seed=1)
    plans = [single_op(op, [TTensor("dy", ys), const("w", w, dt, qu)], TTensor("dx", xs), attrs)
             for op, w, dt, qu in (("CONV2D_BWD_INPUT", wf, "F32", None), ("CONV2D_BWD_INPUT_W8", q, "I8", quant))]
    dy = rng.normal(size=ys).astype(np.float32)
    want, got = run(plans[0], dy)[0], run(plans[1], dy)[0]
    assert np.array_equal(got.view(np.int32), want.view(np.int32)), geometry
    xt = torch.zeros(xs, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(xt, torch.from_numpy(wf).double(), stride=attrs[0], padding=attrs[2],
                               dilation=attrs[6], groups=attrs[8]).backward(torch.from_numpy(dy).double())
    assert np.abs(got.reshape(xs) - xt.grad.numpy()).max() <= 1e-5 * max(1.0, np.abs(xt.grad.numpy()).max())


@pytest.mark.parametrize("geometry", ["depthwise 3x3", "depthwise 5x5 s2", "depthwise 5x5 d2"])
def test_depthwise_in_place_w8_ops_are_their_float_ops(geometry):
    rng, q, quant, wf, attrs, xs, ys = conv_case(geometry, seed=2)
    b = rng.normal(size=ys[1]).astype(np.float32)
    fwd = [single_op(op, [TTensor("x", xs), const("w", w, dt, qu), const("b", b)], TTensor("y", ys), attrs,
                     TTensor("s", (xs[2] * xs[3],)))
           for op, w, dt, qu in (("CONV2D_DW_INPLACE", wf, "F32", None), ("CONV2D_DW_INPLACE_W8", q, "I8", quant))]
    x = rng.normal(size=xs).astype(np.float32)
    want, got = run(fwd[0], x)[0], run(fwd[1], x)[0]
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    if xs[2] * xs[3] > ys[2] * ys[3]:
        return   # a strided depthwise has no in-place input gradient (dx larger than dy)
    # the input gradient: dy (output-shaped) in, dx (input-shaped) out
    bwd = [single_op(op, [TTensor("dy", ys), const("w", w, dt, qu)], TTensor("dx", xs), attrs,
                     TTensor("s", (ys[2] * ys[3],)))
           for op, w, dt, qu in (("CONV2D_BWD_INPUT_DW_INPLACE", wf, "F32", None),
                                 ("CONV2D_BWD_INPUT_DW_INPLACE_W8", q, "I8", quant))]
    dy = rng.normal(size=ys).astype(np.float32)
    want, got = run(bwd[0], dy)[0], run(bwd[1], dy)[0]
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    xt = torch.zeros(xs, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(xt, torch.from_numpy(wf).double(), stride=attrs[0], padding=attrs[2],
                               dilation=attrs[6], groups=attrs[8]).backward(torch.from_numpy(dy).double())
    assert np.abs(got.reshape(xs) - xt.grad.numpy()).max() <= 1e-5 * max(1.0, np.abs(xt.grad.numpy()).max())


# ---- bad input: the weight's scales ----

@pytest.mark.parametrize("quant, what", [
    (None, "no quantization record"),
    (Quant(np.float32(0.01), 0), "one scale for the whole tensor"),
    (Quant(np.full(10, 0.01, np.float32), np.zeros(10, np.int32), 1), "scales along the input channels"),
    (Quant(np.full(4, 0.01, np.float32), np.array([0, 1, 0, 0], np.int32), 0), "a nonzero zero point"),
])
def test_int8_weight_without_per_output_channel_scales_is_refused_at_load(quant, what):
    rng, q, _, _, attrs, xs, ys = conv_case("3x3")
    with pytest.raises(PlanError, match=r"needs one scale per output channel .* recompile the plan \(op 0"):
        single_op("CONV2D_W8", [TTensor("x", xs), const("w", q, "I8", quant), None], TTensor("y", ys), attrs)


def test_filters_larger_than_the_buffer_are_refused_and_stay_float():
    """A 9x9 filter (81 taps) has no W8 form: the core refuses it, and the compiler keeps it float32."""
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, size=(2, 1, 9, 9)).astype(np.int8)
    quant = Quant(np.full(2, 0.01, np.float32), np.zeros(2, np.int32), 0)
    attrs = [1, 1, 0, 0, 0, 0, 1, 1, 1]
    with pytest.raises(PlanError, match="filters of at most 64 taps"):
        single_op("CONV2D_W8", [TTensor("x", (1, 1, 10, 10)), const("w", q, "I8", quant), None],
                  TTensor("y", (1, 2, 2, 2)), attrs)
    from microtrain.w8 import MAX_TAPS
    assert MAX_TAPS == 64


def test_mutated_w8_plans_are_refused_or_run_inside_their_ram(paths, tmp_path):
    """The op list and the quantization table of a W8 plan mutated byte by byte (CRC fixed), as
    tests/core/test_bad_input.py does for a float plan: each is refused at load, or loads and trains
    without writing outside its RAM (a subprocess, so a crash fails the test)."""
    import subprocess
    import sys
    from test_bad_input import FUZZ
    _, files = paths
    plan = microtrain.compile(files["ts13"], update=W8_SCHEME, saved="bits", frozen_weights="int8")
    path = tmp_path / "w8.mtp"
    plan.save(str(path))
    h = plan.header
    for start, end in ((h["ops_off"], h["ops_off"] + h["ops_bytes"]),
                       (h["quant_off"], h["quant_off"] + h["n_quant"] * F.QUANT_BYTES)):
        r = subprocess.run([sys.executable, "-c", FUZZ, str(path), str(start), str(end), "3"], capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, "crash or guard violation (rc %d): %s" % (r.returncode, r.stderr[-2000:])
        refused, ran = map(int, r.stdout.split())
        assert refused > 0, (start, end, refused, ran)


def test_cli_option(paths, tmp_path):
    """microtrain compile --frozen-weights int8 gives the plan compile(frozen_weights="int8") gives."""
    import json
    import subprocess
    import sys
    _, files = paths
    scheme = tmp_path / "scheme.json"
    scheme.write_text(json.dumps(W8_SCHEME))
    for fw in ("int8", "float32"):
        out = tmp_path / ("%s.mtp" % fw)
        r = subprocess.run([sys.executable, "-m", "microtrain", "compile", files["ts13"], "-o", str(out), "--update",
                            str(scheme), "--frozen-weights", fw], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        want = microtrain.compile(files["ts13"], update=str(scheme), frozen_weights=fw)
        assert out.read_bytes() == want.data, fw
    assert Plan(out.read_bytes()).meta["w8"] == [] and want.meta["w8"] == []
    assert Plan((tmp_path / "int8.mtp").read_bytes()).meta["w8"]


def test_report_notes_the_int8_weights(paths):
    _, files = paths
    plan = microtrain.compile(files["ts13"], update=W8_SCHEME, frozen_weights="int8")
    note = [n for n in plan.meta["notes"] if n.startswith("w8:")]
    w8_bytes = sum(t["bytes"] for t in plan.tensors if t["name"] in plan.meta["w8"])
    assert note == ["w8: 4 frozen conv weights of float layers stored int8 with per-output-channel scales (%d B), "
                    "their layers computing in float on the dequantized weights" % w8_bytes]
