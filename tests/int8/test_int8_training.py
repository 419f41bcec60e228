"""Training on top of an int8 frozen part, against PyTorch autograd on the fake-quantized
model: the same network with every int8 tensor replaced by its real value and every int8
output by fq(v) = s * (hardtanh(round_ste(v / s) + zp, act_min, act_max) - zp), where
round_ste rounds in the forward pass and passes the gradient straight through (the
standard straight-through estimator; the clamp's gradient is hardtanh's, zero where the
rounded value sits on a bound: ReLU, ReLU6, saturation).

The PyTorch model is built from the plan's ops and constants (int8 weights times their
per-channel scales, int32 biases times theirs), in float64, with trainable parameters as
torch Parameters; autograd gives the gradients, which must match the simulator's summed
batch gradients within 1e-4. Two forms: int8 before the first trainable layer only (the
default, "prefix"), and every frozen layer int8 with the gradient flowing back through
int8 layers to a trainable first convolution ("frozen")."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import int8_models as M
import microtrain
from microtrain import format as F

TOL = 1e-4


class Net(torch.nn.Module):
    """conv-relu, depthwise conv-relu6 with a residual add, strided conv, 3x3 max pooling, 1x1 conv,
    2x2 average pooling, global average pooling, Linear."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c2 = torch.nn.Conv2d(8, 12, 3, stride=2, padding=1)
        self.pw = torch.nn.Conv2d(12, 16, 1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        a = TF.relu(self.c1(x))
        a = a + TF.relu6(self.dw(a))
        h = TF.max_pool2d(TF.relu(self.c2(a)), 3, stride=1, padding=1)
        h = TF.relu(self.pw(h))
        h = TF.adaptive_avg_pool2d(TF.avg_pool2d(h, 2), 1)
        return self.fc(torch.flatten(h, 1))


def real(plan, name):
    """The real (dequantized) value of a constant of the plan, float64."""
    t = plan.tensors[plan.tensor_index(name)]
    v = plan.constant(name)
    return torch.from_numpy(t["quant"].dequantize(v) if t["quant"] is not None else v.astype(np.float64))


def fq(v, q, lo, hi, ties_even=False):
    """Fake quantization of real values v to the int8 tensor quantization q, clamped to [lo, hi]."""
    s, zp = float(q.scale), float(q.zero_point)
    t = v / s
    r = torch.round(t) if ties_even else torch.floor(t + 0.5)   # as the core rounds (docs/quantization.md)
    t = t + (r - t).detach() + zp
    return (TF.hardtanh(t, lo, hi) - zp) * s


def torch_step(plan, params, x, label):
    """The plan's forward ops in PyTorch (float64); returns the loss."""
    T = plan.tensors
    owner = plan.memory_owners()
    env = {plan.header["input_tensor"]: torch.from_numpy(np.asarray(x, np.float64)).reshape(T[0]["shape"])}

    def get(i):
        t = T[i]
        if t["storage"] == "CONST":
            return real(plan, t["name"]).reshape(t["shape"])
        if t["storage"] == "STATE":
            return params[t["name"]].reshape(t["shape"])
        v = env[i] if i in env else env[owner[i]]
        return v.reshape(t["shape"])

    for op in plan.ops:
        if op["phase"] != "FORWARD":
            break
        spec = F.OPS_BY_NAME[op["op"]]
        s = dict(zip((sl.name for sl in spec.slots), op["slots"]))
        a = dict(zip(spec.attrs, op["attrs"]))
        name = op["op"]
        yq = T[s["y"]]["quant"]
        conv_kw = lambda: dict(stride=(a["stride_h"], a["stride_w"]), dilation=(a["dil_h"], a["dil_w"]),  # noqa
                               groups=a["groups"])

        def padded(v):
            return TF.pad(v, (a["pad_l"], a["pad_r"], a["pad_t"], a["pad_b"]))
        if name in ("CONV2D", "CONV2D_Q8"):
            b = get(s["b"]).reshape(-1) if s["b"] is not None else None
            y = TF.conv2d(padded(get(s["x"])), get(s["w"]), b, **conv_kw())
            if name == "CONV2D_Q8":
                y = fq(y, yq, a["act_min"], a["act_max"])
        elif name in ("GEMM", "GEMM_Q8"):
            w = get(s["w"])
            w = w if a["w_layout"] == 0 else w.T
            y = get(s["x"]).reshape(1, -1) @ w.T
            if s["b"] is not None:
                y = y + get(s["b"]).reshape(1, -1)
            if name == "GEMM_Q8":
                y = fq(y, yq, a["act_min"], a["act_max"])
        elif name == "ADD_Q8":
            y = fq(get(s["a"]) + get(s["b"]), yq, a["act_min"], a["act_max"])
        elif name == "CLIP":
            lo, hi = (float(np.array(v, np.int32).view(np.float32)) for v in (a["lo_bits"], a["hi_bits"]))
            y = TF.hardtanh(get(s["x"]), lo, hi) if hi != np.inf else TF.relu(get(s["x"]))
        elif name == "QUANTIZE":
            y = fq(get(s["x"]), yq, -128, 127, ties_even=True)
        elif name == "DEQUANTIZE":
            y = get(s["x"])
        elif name == "MAXPOOL_Q8":   # the output keeps the input's quantization: no rounding
            assert a["pad_t"] == a["pad_b"] and a["pad_l"] == a["pad_r"]
            y = TF.max_pool2d(get(s["x"]), (a["kernel_h"], a["kernel_w"]), (a["stride_h"], a["stride_w"]),
                              (a["pad_t"], a["pad_l"]), (a["dil_h"], a["dil_w"]))
        elif name == "AVGPOOL_Q8":
            v = TF.avg_pool2d(get(s["x"]), (a["kernel_h"], a["kernel_w"]), (a["stride_h"], a["stride_w"]))
            y = fq(v, yq, -128, 127, ties_even=True)
        elif name == "GAP_Q8":
            y = fq(get(s["x"]).mean((2, 3)), yq, -128, 127, ties_even=True)
        else:
            raise NotImplementedError(name)
        env[s["y"]] = y
    out = env[plan.header["output_tensor"]].reshape(1, -1)
    return TF.cross_entropy(out, torch.tensor([int(label)]), reduction="sum")


@pytest.fixture(scope="module")
def net():
    x, y = M.digits(1)
    torch.manual_seed(1)
    model = M.train(Net(), x[:800], y[:800], epochs=4)
    return model, x, y


@pytest.mark.parametrize("scope, update", [
    ("prefix", "last-layer"),
    ("frozen", ["c1.weight", "c1.bias", "fc.weight", "fc.bias"]),
])
@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_gradients_match_pytorch_on_the_fake_quantized_model(net, tmp_path, scope, update, exporter):
    model, x, y = net
    src = M.export(model, str(tmp_path / "net.onnx"), exporter)
    n = 6
    plan = microtrain.compile(src, update=update, quantize="int8", calibration=x[:200], int8_scope=scope,
                              batch=n + 1, lr=0.1, planner="naive")
    ops = [o["op"] for o in plan.ops]
    assert "CONV2D_Q8" in ops and "DEQUANTIZE" in ops
    if scope == "frozen":   # the gradient reaches c1 through int8 layers
        assert {"CONV2D_BWD_INPUT_Q8", "CLIP_BWD_Q8", "MAXPOOL_BWD_Q8", "CONV2D"} <= set(ops), ops
    sim = microtrain.Simulator(plan)
    params = {k: torch.tensor(v.astype(np.float64).reshape(plan.tensors[plan.tensor_index(k)]["shape"]),
                              requires_grad=True) for k, v in sim.params().items()}
    loss = 0
    for i in range(n):
        ours = sim.step(x[900 + i], y[900 + i])
        theirs = torch_step(plan, params, x[900 + i], y[900 + i])
        assert abs(ours - theirs.item()) <= TOL * max(1, abs(theirs.item())), (i, ours, theirs.item())
        loss = loss + theirs
    loss.backward()
    grads = sim.grads()
    assert set(grads) == set(params)
    for k, p in params.items():
        g = p.grad.numpy().reshape(-1)
        assert np.allclose(grads[k].reshape(-1), g, rtol=TOL, atol=TOL), (k, np.abs(grads[k].reshape(-1) - g).max())
        assert np.abs(g).max() > 1e-3   # a gradient that says something
