"""Initializers used by more than one node, against PyTorch.

Tied weights (one nn.Parameter used by two layers) export as one initializer read by
two nodes; microtrain trains it as one parameter whose gradients from both uses are
summed before the update, as PyTorch does. A folded use (Gemm alpha, a
BatchNormalization folded into the layer before) gets a copy of its own, so the fold
never leaks into the other uses; training such an initializer is refused, since its
forms would drift apart. The oracle is PyTorch autograd on the same module in float64.
"""
import copy

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import microtrain

from oracle_models import export

STEPS = 20
RTOL = 1e-4


def close(a, b, what):
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    assert a.shape == b.shape, what
    err, scale = np.abs(a - b).max(), max(np.abs(b).max(), 1e-6)
    assert err <= RTOL * scale, "%s: max |diff| %.3g > %.0e * %.3g" % (what, err, RTOL, scale)


def train_both(plan, oracle, xs, ys, lr, momentum, weight_decay, batch):
    """STEPS updates of the plan in the simulator and of `oracle` (float64, parameters named as
    the plan's ONNX initializers in its state_dict) with torch.optim.SGD: per-sample losses and
    every parameter after, and frozen parameters unchanged."""
    sim = microtrain.Simulator(plan)
    model = copy.deepcopy(oracle).double()
    state = model.state_dict(keep_vars=True)
    trainable = plan.params()
    for p in model.parameters():
        p.requires_grad_(False)
    params = []
    for name in trainable:
        assert name in state, "plan parameter %r has no PyTorch counterpart" % name
        if not any(state[name] is p for p in params):   # a tied weight is one parameter
            params.append(state[name].requires_grad_(True))
    assert params
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    frozen = {k: v.detach().clone() for k, v in state.items() if not any(v is p for p in params)}
    losses, t_losses = [], []
    for i in range(0, len(xs), batch):
        for x, y in zip(xs[i:i + batch], ys[i:i + batch]):
            losses.append(sim.step(x, y))
        out = model(torch.from_numpy(xs[i:i + batch]).double())
        per = F.cross_entropy(out, torch.as_tensor(ys[i:i + batch]), reduction="none")
        t_losses += per.tolist()
        opt.zero_grad()
        per.mean().backward()
        opt.step()
    close(losses, t_losses, "per-sample losses")
    got = sim.params()
    for name in trainable:
        close(got[name], state[name].detach().numpy(), "parameter %s after %d updates" % (name, len(xs) // batch))
        assert not np.array_equal(got[name], microtrain.Simulator(plan).params()[name]), name + " never changed"
    for k, v in frozen.items():
        assert torch.equal(state[k], v), "PyTorch changed frozen %s" % k
    return sim


def predicts_like(plan, oracle, onnx_model, xs):
    sim = microtrain.Simulator(plan)
    ref = ReferenceEvaluator(onnx_model)
    with torch.no_grad():
        want = oracle.double()(torch.from_numpy(xs).double()).numpy()
    close(sim.predict(xs), want, "predict vs PyTorch")
    for x, w in zip(xs, want):
        close(ref.run(None, {ref.input_names[0]: x[None]})[0], w, "onnx.reference vs PyTorch")


# ---- tied Linear weights ---------------------------------------------------------------------

class TiedMLP(nn.Module):
    """fc0 -> relu -> fc1 -> relu -> fc2 -> relu -> head, with fc2.weight = fc1.weight."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.fc0, self.fc1, self.fc2, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.fc2.weight = self.fc1.weight

    def forward(self, x):
        return self.head(F.relu(self.fc2(F.relu(self.fc1(F.relu(self.fc0(x)))))))


def data(shape, n, n_out=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n,) + shape).astype(np.float32), rng.integers(0, n_out, n)


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("update, momentum, weight_decay, batch", [
    ("full", 0.0, 0.0, 1), ("full", 0.9, 0.01, 1), ("full", 0.9, 0.0, 4), ("last:2", 0.9, 0.0, 1), ("bias", 0.5, 0.0, 1)])
def test_tied_linear_weights_train_like_pytorch(exporter, update, momentum, weight_decay, batch, tmp_path):
    module = TiedMLP().eval()
    path = export(module, torch.zeros(1, 6), exporter, str(tmp_path / "tied.onnx"))
    inits = [n.input[1] for n in onnx.load(path).graph.node if n.op_type == "Gemm"]
    assert inits[1] == inits[2], "the exporter did not keep the weights tied: %s" % inits
    plan = microtrain.compile(path, update=update, lr=0.05, momentum=momentum, weight_decay=weight_decay, batch=batch)
    if update != "bias":
        assert inits[1] in plan.params()
        sgd = [o for o in plan.ops if o["op"] == "SGD"]
        assert [plan.tensors[o["slots"][0]]["name"] for o in sgd if batch == 1] == ([inits[1]] if batch == 1 else [])
    xs, ys = data((6,), STEPS * batch, seed=batch)
    predicts_like(plan, module, onnx.load(path), xs[:3])
    train_both(plan, module, xs, ys, 0.05, momentum, weight_decay, batch)


def test_tied_weight_backward_input_sees_the_forward_weight(tmp_path):
    """fc1's input gradient is computed after fc2's weight gradient: with the tied weight updated
    by fc2's gradient op on the spot, fc1 would back-propagate through a weight the forward never
    used (fc0's update would then differ from PyTorch's). The update waits for the batch end."""
    module = TiedMLP().eval()
    path = export(module, torch.zeros(1, 6), "ts13", str(tmp_path / "tied.onnx"))
    plan = microtrain.compile(path, update="full", lr=0.5)
    names = [t["name"] for t in plan.tensors]
    reads_w = [k for k, o in enumerate(plan.ops) if o["phase"] == "TRAIN" and names[o["slots"][1]] == "fc1.weight"]
    # ops that change the weight: SGD, or a gradient op with no accumulator (updating on the spot)
    writes_w = [k for k, o in enumerate(plan.ops) if o["op"] == "SGD" and names[o["slots"][0]] == "fc1.weight"
                or o["op"] == "GEMM_BWD_WEIGHT" and names[o["slots"][2]] == "fc1.weight" and o["slots"][4] is None]
    assert [plan.ops[k]["op"] for k in reads_w] == ["GEMM_BWD_INPUT", "GEMM_BWD_INPUT"]
    assert [plan.ops[k]["op"] for k in writes_w] == ["SGD"] and writes_w[0] > max(reads_w)
    xs, ys = data((6,), STEPS)
    train_both(plan, module, xs, ys, 0.5, 0.0, 0.0, 1)


# ---- a Gemm alpha on one use of a shared weight ----------------------------------------------

class AlphaShared(nn.Module):
    """relu(2 * x W^T + b1) W^T, then V: Gemm(alpha=2) -> Relu -> Gemm -> Gemm, W shared."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.W = nn.Parameter(torch.randn(4, 4, generator=g) * 0.6)
        self.b1 = nn.Parameter(torch.randn(4, generator=g) * 0.2)
        self.V = nn.Parameter(torch.randn(3, 4, generator=g) * 0.6)
        self.c = nn.Parameter(torch.randn(3, generator=g) * 0.2)

    def forward(self, x):
        h = F.relu(2.0 * x @ self.W.T + self.b1) @ self.W.T
        return h @ self.V.T + self.c

    def onnx(self):
        inits = [numpy_helper.from_array(p.detach().numpy().astype(np.float32), n) for n, p in self.named_parameters()]
        nodes = [helper.make_node("Gemm", ["x", "W", "b1"], ["g1"], alpha=2.0, transB=1, name="g1"),
                 helper.make_node("Relu", ["g1"], ["r"], name="relu"),
                 helper.make_node("Gemm", ["r", "W"], ["g2"], transB=1, name="g2"),
                 helper.make_node("Gemm", ["g2", "V", "c"], ["y"], transB=1, name="g3")]
        g = helper.make_graph(nodes, "alpha", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_gemm_alpha_on_one_use_does_not_leak_into_the_other():
    module = AlphaShared()
    model = module.onnx()
    xs, ys = data((4,), STEPS, seed=1)
    plan = microtrain.compile(model, update=["V", "c", "b1"], lr=0.05, momentum=0.9)
    predicts_like(plan, module, model, xs[:4])
    consts = {t["name"] for t in plan.tensors if t["storage"] == "CONST"}
    assert {"W", "W@g1"} <= consts
    train_both(plan, module, xs, ys, 0.05, 0.9, 0.0, 1)
    for update in ("full", ["W"]):
        with pytest.raises(ValueError, match=r"cannot train initializer 'W': .* 2 different forms.*alpha=2"):
            microtrain.compile(model, update=update)


# ---- Conv(W) -> BatchNormalization -> Conv(W) ------------------------------------------------

class TiedConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3), nn.Conv2d(3, 3, 3, padding=1)
        self.c2.weight = self.c1.weight
        self.head = nn.Linear(3 * 5 * 5, 3)
        with torch.no_grad():
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.normal_(0, 0.3)
            self.bn.running_mean.normal_(0, 0.3)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.head(torch.flatten(self.c2(F.relu(self.bn(self.c1(x)))), 1))


@pytest.mark.parametrize("exporter", ["ts13-nofold", "dynamo-noopt", "ts13", "dynamo"])
def test_conv_bn_conv_with_one_weight(exporter, tmp_path):
    """The BatchNormalization is not folded into the first Conv (that would change the second
    Conv's weight too): it runs as a frozen per-channel scale and shift, and the tied weight trains
    as one. The default exports fold it themselves and untie the weights: then only the
    forward and the head are compared."""
    module = TiedConvBN().eval()
    path = export(module, torch.zeros(1, 3, 5, 5), exporter, str(tmp_path / "m.onnx"))
    model = onnx.load(path)
    xs, ys = data((3, 5, 5), STEPS, seed=2)
    oracle = copy.deepcopy(module)   # its BatchNorm in eval mode; frozen, as the plan's
    tied = len({n.input[1] for n in model.graph.node if n.op_type == "Conv"}) == 1
    assert tied or exporter == "ts13"   # the TorchScript exporter folds the BatchNormalization itself
    plan = microtrain.compile(path, update="full" if tied else "last-layer", lr=0.02, momentum=0.9)
    if model.opset_import[0].version < 15 and any(n.op_type == "BatchNormalization" for n in model.graph.node):
        model = onnx.version_converter.convert_version(model, 15)   # onnx.reference's BN-9 uses batch statistics
    predicts_like(plan, module, model, xs[:3])
    if tied:
        assert not {"bn.weight", "bn.bias"} & set(plan.params())   # a frozen per-channel affine
    train_both(plan, oracle, xs, ys, 0.02, 0.9, 0.0, 1)
