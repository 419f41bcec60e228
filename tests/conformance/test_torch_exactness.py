"""microtrain against PyTorch autograd.

For every supported op (tests/support/oracle_models.py OP_CASES, each between trainable
layers) and for whole models (an MLP; a CNN with conv, depthwise conv, ReLU6,
max/avg pooling, a residual Add and a Gemm head), exported to ONNX by the
TorchScript and the dynamo exporters: the loss of every step, every parameter
gradient, every activation gradient the plan computes, and all parameters after
20 SGD updates (momentum 0.9, with and without weight decay, batch 1 and 4)
match PyTorch run on the same data, for each update mode. PyTorch is the only
oracle: it trains the nn.Module (in float64; BatchNormalization folded by
torch.nn.utils.fusion, an output softmax removed since microtrain fuses it into
the loss), never numbers taken from microtrain.
"""
from __future__ import annotations

import copy
import json
import re

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx.reference import ReferenceEvaluator

import microtrain
from microtrain import format as MF

from oracle_models import MODEL_CASES, OP_CASES, VIEW_CASES, case_onnx, layers

RTOL = 1e-4
TINY = 1e-6
STEPS = 20
# small enough that 20 updates on random labels do not diverge: a diverging run amplifies
# float32 rounding (microtrain) vs float64 (oracle) past any tolerance
LR = {"cross-entropy": 0.02, "mse": 0.01}
MOMENTUM = 0.9


# ---------------------------------------------------------------- comparing ----

def assert_close(actual, expected, what, rtol=RTOL):
    """Per tensor: max|actual - expected| <= rtol * max(max|expected|, TINY), i.e.
    the error is measured against the tensor's largest magnitude."""
    a = np.asarray(actual, np.float64).reshape(-1)
    b = np.asarray(expected, np.float64).reshape(-1)
    assert a.shape == b.shape, "%s: %d elements, PyTorch has %d" % (what, a.size, b.size)
    assert np.all(np.isfinite(a)), "%s: not finite: %s" % (what, a)
    err = float(np.max(np.abs(a - b), initial=0.0))
    scale = max(float(np.max(np.abs(b), initial=0.0)), TINY)
    assert err <= rtol * scale, "%s: max |diff| %.3g > %.0e * %.3g\nmicrotrain %s\npytorch    %s" % (
        what, err, rtol, scale, a[:8], b[:8])


# -------------------------------------------------------------------- data ----

def make_data(case, n, loss, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n,) + tuple(case.shape)).astype(np.float32)
    if loss == "cross-entropy":
        return x, rng.integers(0, case.n_out, n)
    return x, rng.normal(size=(n, case.n_out)).astype(np.float32)


def digits_data(n):
    from sklearn.datasets import load_digits
    d = load_digits()
    rng = np.random.default_rng(1)
    idx = rng.permutation(len(d.target))[:n]
    return (d.images[idx] / 16.0).astype(np.float32)[:, None], d.target[idx]


# ----------------------------------------------------------------- exports ----

_EXPORTED = {}


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("onnx"))


def exported(case, exporter, directory):
    """(ONNX path, nn.Module), exported once per (case, exporter)."""
    key = (case.name, exporter)
    if key not in _EXPORTED:
        _EXPORTED[key] = case_onnx(case, exporter, directory)
    return _EXPORTED[key]


# ------------------------------------------------------- plan <-> PyTorch ----

# a layer's forward op: a depthwise conv, or a 1x1 conv with no more outputs than inputs, whose
# input dies there runs in place (x w b s y)
LAYER_FORWARD = ("CONV2D", "GEMM", "CONV2D_DW_INPLACE", "CONV2D_PW_INPLACE")

def plan_layers(plan):
    """[(weight name, bias name or None, layout)] of the plan's CONV2D/GEMM ops in order;
    layout "out_in" or "in_out" (how the ONNX initializer stores a Gemm/MatMul weight)."""
    names = [t["name"] for t in plan.tensors]
    out = []
    for op in plan.ops:
        if op["op"] in LAYER_FORWARD and op["phase"] == "FORWARD":   # not a replay (recompute.py)
            b = op["slots"][2]
            layout = "in_out" if op["op"] == "GEMM" and op["attrs"][0] == MF.W_LAYOUT_IN_OUT else "out_in"
            out.append((names[op["slots"][1]], names[b] if b is not None else None, layout))
    return out


def param_pairs(plan, oracle):
    """[(ONNX name, torch name, transpose)] pairing every parameter of the plan's layers
    with the oracle's, layer by layer in execution order."""
    pl, tl = plan_layers(plan), layers(oracle)
    assert len(pl) == len(tl), "plan has %d layers, the PyTorch model %d" % (len(pl), len(tl))
    pairs = []
    for (pw, pb, play), (tw, tb, tlay) in zip(pl, tl):
        pairs.append((pw, tw, play != tlay))
        assert (pb is None) == (tb is None), "bias of %s / %s" % (pw, tw)
        if pb is not None:
            pairs.append((pb, tb, False))
    return pairs


def torch_value(p, transpose):
    v = p.detach().double().numpy()
    return v.T if transpose else v


def plan_value(sim, name):
    """A parameter's current value: trainable ones through params(), frozen (constant) ones through tensor()."""
    params = sim.params()
    return params[name] if name in params else sim.tensor(name)


def expected_trainable(mode, pairs, plan_layer_list):
    """ONNX names an update mode should train, worked out from the layer list."""
    if mode == "full":
        return {p for p, _, _ in pairs}
    if mode == "bias":
        return {b for _, b, _ in plan_layer_list if b}
    k = 1 if mode == "last-layer" else int(mode.split(":")[1])
    return {n for w, b, _ in plan_layer_list[-k:] for n in (w, b) if n}


def oracle_model(oracle, trainable_torch):
    model = copy.deepcopy(oracle).double()
    for n, p in model.named_parameters():
        p.requires_grad_(n in trainable_torch)
    return model


def per_sample_loss(out, y, loss):
    out = out.reshape(out.shape[0], -1)
    if loss == "cross-entropy":
        return F.cross_entropy(out, torch.as_tensor(np.asarray(y), dtype=torch.long), reduction="none")
    return ((out - torch.as_tensor(np.asarray(y), dtype=torch.float64).reshape(out.shape)) ** 2).mean(dim=1)


def torch_train(oracle, trainable_torch, xs, ys, loss, batch, lr, momentum, weight_decay):
    """PyTorch SGD over xs in batches of `batch` (mean loss): per-sample losses, final parameters
    (of a float64 copy of the oracle; model.named_parameters())."""
    model = oracle_model(oracle, trainable_torch)
    params = dict(model.named_parameters())
    opt = torch.optim.SGD([params[n] for n in sorted(trainable_torch)], lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    losses = []
    for i in range(0, len(xs), batch):
        per = per_sample_loss(model(torch.from_numpy(xs[i:i + batch]).double()), ys[i:i + batch], loss)
        losses.append(per.detach().numpy())
        opt.zero_grad()
        per.mean().backward()
        opt.step()
    return np.concatenate(losses), params


def torch_grads(oracle, trainable_torch, xs, ys, loss, start=None):
    """Sum over the samples of the per-sample parameter gradients (at the parameters
    `start` from torch_train, default the oracle's)."""
    model = oracle_model(oracle, trainable_torch)
    if start is not None:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start[n])
    per_sample_loss(model(torch.from_numpy(xs).double()), ys, loss).sum().backward()
    return {n: p.grad for n, p in model.named_parameters() if n in trainable_torch}


def torch_activations(oracle, trainable_torch, x, y, loss):
    """Every intermediate tensor of one sample's forward that needs a gradient, with that
    gradient (retain_grad), recorded by running the module through torch.fx."""
    model = oracle_model(oracle, trainable_torch)
    acts = []

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op.startswith("call_") and isinstance(out, torch.Tensor) and out.requires_grad:
                out.retain_grad()
                acts.append((n.name, out))
            return out

    out = Recorder(torch.fx.symbolic_trace(model)).run(torch.from_numpy(x[None]).double())
    per_sample_loss(out, np.asarray(y)[None], loss).sum().backward()
    return [(name, t.detach().numpy(), t.grad.numpy()) for name, t in acts]


def plan_trace(sim, x, y):
    """One training step run op by op (forward and train phases); every tensor an op
    writes is copied right after that op, and a tensor no op writes (a view, such as a
    Flatten output) right before its first reader, before anything can reuse its memory."""
    plan, core = sim.plan, sim.core
    core.set_input(np.asarray(x, np.float32))
    core.array(plan.header["target_tensor"])[...] = y
    values = {}
    for i, op in enumerate(plan.ops):
        if op["phase"] == "BATCH_END":
            break
        slots = list(zip(MF.OPS_BY_NAME[op["op"]].slots, op["slots"]))
        for slot, tid in slots:
            if slot.role == "in" and tid is not None and plan.tensors[tid]["name"] not in values:
                values[plan.tensors[tid]["name"]] = core.array(tid).copy()
        core.run_op(i)
        for slot, tid in slots:
            if slot.role == "out" and tid is not None:
                values[plan.tensors[tid]["name"]] = core.array(tid).copy()
    return values


# ------------------------------------------------------------------ checks ----

def compile_plan(path, mode, loss, batch=1, weight_decay=0.0, planner="greedy", momentum=MOMENTUM):
    return microtrain.compile(path, update=mode, loss=loss, lr=LR[loss], momentum=momentum,
                              weight_decay=weight_decay, batch=batch, planner=planner)


def check_training(path, case, oracle, mode, loss, batch, weight_decay=0.0, data=None, expect=None):
    """STEPS updates in microtrain and PyTorch: per-sample losses and all parameters after.
    expect: the ONNX names the update should train (default: worked out from the mode)."""
    return train_both(path, case, oracle, mode, loss, batch, weight_decay, data, expect)[0]


def train_both(path, case, oracle, mode, loss, batch, weight_decay=0.0, data=None, expect=None):
    """check_training's work; returns (plan, the trained simulator, PyTorch's trained parameters)."""
    plan = compile_plan(path, mode, loss, batch, weight_decay)
    pairs = param_pairs(plan, oracle)
    trainable = set(plan.params())
    assert trainable == (expect if expect is not None else expected_trainable(mode, pairs, plan_layers(plan)))
    xs, ys = data if data is not None else make_data(case, STEPS * batch, loss, seed=batch)
    sim = microtrain.Simulator(plan)
    initial = {o: plan_value(sim, o).copy() for o, _, _ in pairs}
    oracle_params = dict(oracle.named_parameters())
    for o, t, tr in pairs:   # the export (and any BatchNormalization folding) kept the values
        assert_close(initial[o], torch_value(oracle_params[t], tr), "initial %s (torch %s)" % (o, t))
    losses = np.array([sim.step(x, y) for x, y in zip(xs, ys)])
    tt = {t for o, t, _ in pairs if o in trainable}
    t_losses, t_params = torch_train(oracle, tt, xs, ys, loss, batch, LR[loss], MOMENTUM, weight_decay)
    assert_close(losses, t_losses, "per-sample losses")
    for o, t, tr in pairs:
        assert_close(plan_value(sim, o), torch_value(t_params[t], tr), "parameter %s (torch %s) after %d updates"
                     % (o, t, STEPS))
        if o not in trainable:
            np.testing.assert_array_equal(plan_value(sim, o), initial[o], "frozen %s changed" % o)
        else:
            assert not np.array_equal(plan_value(sim, o), initial[o]), "trainable %s never changed" % o
    return plan, sim, t_params


def check_gradients(path, case, oracle, mode, loss, n_samples=3):
    """Batch-4 plan: the accumulated parameter gradients after n_samples (< 4) of the first
    batch, and again of the second batch (after one update), then every activation
    gradient of one traced step, against PyTorch."""
    plan = compile_plan(path, mode, loss, batch=4, planner="naive")
    pairs = param_pairs(plan, oracle)
    trainable = set(plan.params())
    tt = {t for o, t, _ in pairs if o in trainable}
    xs, ys = make_data(case, 4 + n_samples, loss, seed=7)
    sim = microtrain.Simulator(plan)

    def compare(part, start):
        grads = sim.grads()
        assert set(grads) == trainable
        t_grads = torch_grads(oracle, tt, xs[part], ys[part], loss, start)
        for o, t, tr in pairs:
            if o in trainable:
                assert_close(grads[o], torch_value(t_grads[t], tr), "gradient of %s (torch %s), sum of samples %s"
                             % (o, t, part))

    for x, y in zip(xs[:n_samples], ys[:n_samples]):
        sim.step(x, y)
    compare(slice(0, n_samples), None)
    for x, y in zip(xs[n_samples:], ys[n_samples:]):   # the rest of batch 1 (an update), then n_samples more
        sim.step(x, y)
    compare(slice(4, 4 + n_samples), torch_train(oracle, tt, xs[:4], ys[:4], loss, 4, LR[loss], MOMENTUM, 0.0)[1])
    check_activation_gradients(microtrain.Simulator(plan), oracle, tt, xs[0], ys[0], loss)
    return plan


GRAD_NAME = re.compile(r"^d\((.*)\)(?:\+(\d+))?$")


def check_activation_gradients(sim, oracle, trainable_torch, x, y, loss):
    """Every activation gradient d(v) the plan computes (its final sum when v has several
    consumers) equals PyTorch's retained gradient of the intermediate with v's forward
    value. An intermediate PyTorch gives no gradient (upstream of every trainable
    parameter) has no counterpart, so a gradient the plan computes needlessly fails."""
    values = plan_trace(sim, x, y)
    final = {}
    for name in values:
        m = GRAD_NAME.match(name)
        if m:
            v, k = m.group(1), int(m.group(2) or 0)
            if k >= final.get(v, (-1, None))[0]:
                final[v] = (k, name)
    assert final, "the plan computes no activation gradient"
    acts = torch_activations(oracle, trainable_torch, x, y, loss)
    for v, (_, gname) in sorted(final.items()):
        assert v in values, "d(%s) but %s was never computed" % (v, v)
        fwd = values[v].reshape(-1).astype(np.float64)
        best, best_err = None, np.inf
        for name, t, g in acts:
            if t.size == fwd.size:
                err = np.max(np.abs(t.reshape(-1) - fwd)) / max(np.max(np.abs(t)), TINY)
                if err < best_err:
                    best, best_err = (name, g), err
        assert best is not None and best_err <= RTOL, (
            "plan computes %s, but no PyTorch intermediate that needs a gradient has %s's values (best rel err %.3g)"
            % (gname, v, best_err))
        assert_close(values[gname], best[1], "activation gradient %s (torch %s)" % (gname, best[0]))
    # the same gradients read the public way after a whole step: sim.tensor() on a naive plan,
    # for the tensors whose memory no other tensor shares (in-place ops share it even there)
    public = microtrain.Simulator(sim.plan)
    public.step(x, y)
    unshared = [g for _, g in final.values() if not shares_memory(sim.plan, g)]
    assert unshared, "every activation gradient shares memory"
    for g in unshared:
        assert_close(public.tensor(g), values[g], "sim.tensor(%r) after a step" % g)
    return final


def shares_memory(plan, name):
    t = plan.tensors[plan.tensor_index(name)]
    return any(u is not t and u["storage"] == t["storage"] and u["offset"] < t["offset"] + t["bytes"]
               and t["offset"] < u["offset"] + u["bytes"] for u in plan.tensors)


BWD_INPUT = ("CONV2D_BWD_INPUT", "GEMM_BWD_INPUT", "CONV2D_BWD_INPUT_DW_INPLACE")
ELTWISE_BWD = {"CLIP": "CLIP_BWD", "MAXPOOL": "MAXPOOL_BWD", "AVGPOOL": "AVGPOOL_BWD", "GAP": "GAP_BWD",
               "ACT": "ACT_BWD"}


def check_pruning(plan):
    """Frozen parameters get no gradient op, and nothing upstream of the earliest trainable
    layer is differentiated. The models are chains (a residual Add inside a block), so an
    op depends on a layer exactly when it runs after it."""
    names = [t["name"] for t in plan.tensors]
    trainable = set(plan.params())
    pl = plan_layers(plan)
    w_of = lambda op: names[op["slots"][MF.OPS_BY_NAME[op["op"]].slot_index("w")]]   # noqa: E731
    wgrad = sorted(w_of(o) for o in plan.ops if o["op"] in ("CONV2D_BWD_WEIGHT", "GEMM_BWD_WEIGHT"))
    bgrad = sorted(w_of(o) for o in plan.ops if o["op"] == "BIAS_BWD")
    assert wgrad == sorted(w for w, _, _ in pl if w in trainable), "weight-gradient ops %s" % wgrad
    assert bgrad == sorted(b for _, b, _ in pl if b in trainable), "bias-gradient ops %s" % bgrad
    first = min(i for i, (w, b, _) in enumerate(pl) if w in trainable or b in trainable)
    dx = sorted(w_of(o) for o in plan.ops if o["op"] in BWD_INPUT)
    assert dx == sorted(w for w, _, _ in pl[first + 1:]), "input-gradient ops for %s, expected the layers after %s" % (
        dx, pl[first][0])
    fwd = [o for o in plan.ops if o["phase"] == "FORWARD"]
    first_op = [i for i, o in enumerate(fwd) if o["op"] in LAYER_FORWARD][first]
    for op, bwd in ELTWISE_BWD.items():
        want = sum(1 for o in fwd[first_op + 1:] if o["op"] == op)
        got = sum(1 for o in plan.ops if o["op"] == bwd)
        assert got == want, "%d %s ops, expected %d (one per %s after the first trainable layer)" % (got, bwd, want, op)
    if first == len(pl) - 1:   # only the last layer trains: nothing but the loss and its own gradient
        train = {o["op"] for o in plan.ops if o["phase"] != "FORWARD"}
        assert train <= {"SOFTMAX_CE", "MSE", "GEMM_BWD_WEIGHT", "CONV2D_BWD_WEIGHT", "BIAS_BWD", "SGD"}, train


def reference_model(path):
    """The ONNX model for onnx.reference. Its BatchNormalization-9 (opsets 9 to 13) always
    uses batch statistics (it fills in the default momentum and then takes its training
    branch), so such models are converted to opset 15, where inference mode is explicit."""
    model = onnx.load(path)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 14 and any(n.op_type == "BatchNormalization" for n in model.graph.node):
        model = onnx.version_converter.convert_version(model, 15)
    return model


def check_forward(path, case, module, oracle, plan):
    """predict() equals the PyTorch model, and onnx.reference on the (unfolded) ONNX model."""
    xs, _ = make_data(case, 3, "cross-entropy", seed=3)
    sim = microtrain.Simulator(plan)
    ref = ReferenceEvaluator(reference_model(path))
    oracle = copy.deepcopy(oracle).double()
    with torch.no_grad():
        for x in xs:
            z = sim.predict(x)
            assert_close(z, oracle(torch.from_numpy(x[None]).double()).numpy(), "predict vs PyTorch logits")
            out = torch.from_numpy(z.astype(np.float64)).reshape(1, -1)
            out = {"softmax": F.softmax, "log_softmax": F.log_softmax}[case.output](out, -1) if case.output else out
            want = module(torch.from_numpy(x[None])).numpy()
            assert_close(out.numpy(), want, "output vs the PyTorch module")
            assert_close(out.numpy(), ref.run(None, {ref.input_names[0]: x[None]})[0], "output vs onnx.reference")


# ------------------------------------------------------------------- tests ----

OP_PARAMS = [pytest.param(c, e, id="%s-%s" % (c.name, e)) for c in OP_CASES for e in c.exporters]


@pytest.mark.parametrize("case, exporter", OP_PARAMS)
def test_op(case, exporter, onnx_dir):
    """One op between trainable layers: forward, 20 updates with update='full', every
    parameter and activation gradient, and the pruned backward graph."""
    path, module = exported(case, exporter, onnx_dir)
    oracle = case.oracle(module)
    plan = check_training(path, case, oracle, "full", "cross-entropy", batch=1)
    check_forward(path, case, module, oracle, plan)
    check_pruning(plan)
    check_gradients(path, case, oracle, "full", "cross-entropy")


@pytest.mark.parametrize("case", [c for c in OP_CASES if c.name in ("relu", "maxpool_k3s2p1_ceil",
                                                                    "avgpool_excl_pad_ceil", "residual_add")],
                         ids=lambda c: c.name)
def test_op_batch4_mse(case, onnx_dir):
    """The same ops with batch 4, mse and weight decay."""
    path, module = exported(case, "ts13", onnx_dir)
    oracle = case.oracle(module)
    check_training(path, case, oracle, "full", "mse", batch=4, weight_decay=0.01)


MODES = ["last-layer", "bias", "last:2", "full", "json"]
MODEL_PARAMS = [pytest.param(m, e, id="%s-%s" % (m, e)) for m in MODEL_CASES for e in ("ts13", "dynamo")]


def json_update(tmp_path, plan):
    """A JSON update file naming two parameters: the first layer's weight and the last layer's bias."""
    pl = plan_layers(plan)
    names = [pl[0][0], pl[-1][1]]
    path = tmp_path / "update.json"
    path.write_text(json.dumps(names))
    return str(path), set(names)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model, exporter", MODEL_PARAMS)
def test_model(model, exporter, mode, onnx_dir, tmp_path):
    """Whole models, each update mode: 20 updates with batch 1 and with batch 4, cross-entropy
    and mse; gradients of a partial batch; activation gradients; pruning."""
    case = MODEL_CASES[model]
    path, module = exported(case, exporter, onnx_dir)
    oracle = case.oracle(module)
    update, names = mode, None
    if mode == "json":
        update, names = json_update(tmp_path, compile_plan(path, "full", "cross-entropy"))
    for loss in ("cross-entropy", "mse"):
        for batch in (1, 4):
            check_pruning(check_training(path, case, oracle, update, loss, batch, expect=names))
    plan = check_gradients(path, case, oracle, update, "cross-entropy")
    check_pruning(plan)


@pytest.mark.parametrize("mode", ["full", "bias", "last:2"])
@pytest.mark.parametrize("model", list(MODEL_CASES))
def test_model_weight_decay(model, mode, onnx_dir):
    case = MODEL_CASES[model]
    path, module = exported(case, "ts13", onnx_dir)
    for batch in (1, 4):
        check_training(path, case, case.oracle(module), mode, "cross-entropy", batch, weight_decay=0.05)


VIEW_PARAMS = [pytest.param(c, e, id="%s-%s" % (c.name, e)) for c in VIEW_CASES.values() for e in ("ts13", "dynamo")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case, exporter", VIEW_PARAMS)
def test_view_before_parameterless_op(case, exporter, mode, onnx_dir, tmp_path):
    """A view (Flatten, Reshape, Squeeze, Unsqueeze) feeding pooling, ReLU or ReduceMean, and the
    keyword-spotting CNN of issue 5: every update mode trains exactly what PyTorch trains, for
    20 steps with batch 1 (cross-entropy) and batch 4 (mse); with update 'full' also the forward,
    every parameter gradient and every activation gradient."""
    path, module = exported(case, exporter, onnx_dir)
    oracle = case.oracle(module)
    update, names = mode, None
    if mode == "json":
        update, names = json_update(tmp_path, compile_plan(path, "full", "cross-entropy"))
    check_pruning(check_training(path, case, oracle, update, "cross-entropy", 1, expect=names))
    check_training(path, case, oracle, update, "mse", 4, expect=names)
    if mode == "full":
        plan = check_gradients(path, case, oracle, "full", "cross-entropy")
        check_forward(path, case, module, oracle, plan)


ALL_CASES = ([pytest.param(c, e, id="%s-%s" % (c.name, e)) for c in OP_CASES for e in c.exporters]
             + [pytest.param(c, e, id="%s-%s" % (c.name, e)) for c in list(MODEL_CASES.values())
                + list(VIEW_CASES.values()) for e in ("ts13", "dynamo")])


@pytest.mark.parametrize("mode", ["full", "last:2"])
@pytest.mark.parametrize("case, exporter", ALL_CASES)
def test_what_pytorch_changes_microtrain_changes(case, exporter, mode, onnx_dir):
    """Property over every model of the suite: after one step whose loss gradient is not zero,
    every parameter PyTorch's SGD changes (at least one element) microtrain changes too, and
    every parameter PyTorch leaves alone microtrain leaves alone."""
    path, module = exported(case, exporter, onnx_dir)
    oracle = case.oracle(module)
    plan = compile_plan(path, mode, "cross-entropy", momentum=0.0)
    pairs = param_pairs(plan, oracle)
    trainable = set(plan.params())
    sim = microtrain.Simulator(plan)
    before = {o: plan_value(sim, o).copy() for o, _, _ in pairs}
    xs, ys = make_data(case, 1, "cross-entropy", seed=11)
    sim.step(xs[0], ys[0])
    tt = {t for o, t, _ in pairs if o in trainable}
    _, t_params = torch_train(oracle, tt, xs, ys, "cross-entropy", 1, LR["cross-entropy"], 0.0, 0.0)
    t_before = dict(oracle.named_parameters())
    for o, t, tr in pairs:
        t_changed = not np.array_equal(torch_value(t_params[t], tr), torch_value(t_before[t], tr))
        changed = not np.array_equal(plan_value(sim, o), before[o])
        assert changed == t_changed, "PyTorch %s %s (%s), microtrain %s it" % (
            "changes" if t_changed else "leaves", t, "trainable" if o in trainable else "frozen",
            "changes" if changed else "leaves")


def test_digits_cnn(onnx_dir):
    """scikit-learn's digits: the CNN trained from its initial weights, batch 4."""
    case = MODEL_CASES["cnn"]
    path, module = exported(case, "dynamo", onnx_dir)
    xs, ys = digits_data(STEPS * 4)
    oracle = case.oracle(module)
    plan, sim, t_params = train_both(path, case, oracle, "full", "cross-entropy", 4, data=(xs, ys))
    trained = oracle_model(oracle, set())
    with torch.no_grad():
        for n, p in trained.named_parameters():
            p.copy_(t_params[n])
        want = trained(torch.from_numpy(xs).double()).numpy()
    assert_close(sim.predict(xs), want, "predictions of the trained simulator vs the trained PyTorch model")


def test_digits_mlp_last2(onnx_dir):
    """scikit-learn's digits on the MLP (opset 17 export), last two layers, batch 1, mse on one-hot targets."""
    case = MODEL_CASES["mlp"]
    path, module = exported(case, "ts17", onnx_dir)
    xs, ys = digits_data(STEPS)
    onehot = np.eye(10, dtype=np.float32)[ys]
    check_training(path, case, case.oracle(module), "last:2", "mse", 1, data=(xs.reshape(len(xs), -1), onehot))


def test_assert_close_can_fail():
    """The tolerance helper itself rejects a relative error above 1e-4."""
    assert_close([1.0, 2.0], [1.0, 2.0 + 1e-5], "ok")
    with pytest.raises(AssertionError):
        assert_close([1.0, 2.0], [1.0, 2.0 + 1e-3], "too far")
    with pytest.raises(AssertionError):
        assert_close([1.0], [1.0, 1.0], "shape")
