"""PyTorch models for tests/conformance/test_torch_exactness.py, and how to turn them into ONNX.

Every model here is an nn.Module whose parameters are registered in execution
order, so `layers(module)` lists its trainable layers the way the plan orders
them. A Case bundles a model with its input shape, the exporters it is tried
with, and (for BatchNormalization) the folded model PyTorch trains as oracle.
"""
from __future__ import annotations

import contextlib
import copy
import io
import os
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval

# name -> keyword arguments of torch.onnx.export. "-nofold"/"-noopt" keep
# BatchNormalization in the graph (the default exports fold it themselves).
EXPORTERS = {
    "ts13": dict(dynamo=False, opset_version=13),
    "ts17": dict(dynamo=False, opset_version=17),
    "dynamo": dict(dynamo=True),
    "ts13-nofold": dict(dynamo=False, opset_version=13, do_constant_folding=False),
    "dynamo-noopt": dict(dynamo=True, optimize=False),
    "helper": None,   # the case builds its ONNX with onnx.helper (what torch cannot express)
}
DEFAULT_EXPORTERS = ("ts13", "dynamo")


def export(module, x, exporter, path):
    """Export `module` (eval mode) for one sample `x` (batch dim included) to `path`."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), path, input_names=["x"], output_names=["y"], **EXPORTERS[exporter])
    return path


# ---------------------------------------------------------------- layers ----

def layers(module):
    """The module's layers with parameters, in execution order:
    [(weight name, bias name or None, layout)], layout "out_in" (Linear, Conv)
    or "in_out" (a bare matrix used as x @ W)."""
    if hasattr(module, "LAYERS"):
        return list(module.LAYERS)
    out = []
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            p = name + "." if name else ""
            out.append((p + "weight", p + "bias" if m.bias is not None else None, "out_in"))
    return out


def to_onnx_layout(w, layout, onnx_shape):
    """A torch weight as the ONNX initializer holds it (Gemm/MatMul may store W or W^T)."""
    w = np.asarray(w)
    if tuple(w.shape) == tuple(onnx_shape) and (w.ndim != 2 or layout == "out_in"):
        return w
    if w.ndim == 2 and tuple(w.T.shape) == tuple(onnx_shape):
        return w.T
    raise AssertionError("torch weight %s does not fit ONNX shape %s" % (w.shape, onnx_shape))


# ------------------------------------------------------------ per-op models ----

class Sandwich(nn.Module):
    """pre (1x1 conv, trainable) -> op -> flatten -> Linear: the op's backward
    runs because a trainable layer lies before it."""

    def __init__(self, op, shape, c_in=3, c_mid=4, n_out=3, flatten="flatten"):
        super().__init__()
        conv = nn.Conv1d if len(shape) == 1 else nn.Conv2d
        self.pre = conv(c_in, c_mid, 1)
        self.op = op
        self.flatten = flatten
        with torch.no_grad():
            n = self.op(self.pre(torch.zeros(1, c_in, *shape))).numel()
        self.head = nn.Linear(n, n_out)

    def forward(self, x):
        h = self.op(self.pre(x))
        if self.flatten == "view":
            h = h.view(h.size(0), -1)
        elif self.flatten == "squeeze":
            h = h.squeeze(3).squeeze(2)
        elif self.flatten == "reshape":
            h = h.reshape(-1, self.head.in_features)
        else:
            h = torch.flatten(h, 1)
        return self.head(h)


class Residual(nn.Module):
    """h + conv2(relu(conv1(h)))"""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, h):
        return h + self.conv2(F.relu(self.conv1(h)))


class SpatialMean(nn.Module):
    """h.mean((2, 3)): ReduceMean without keepdims, (N, C, H, W) -> (N, C)."""

    def forward(self, h):
        return h.mean((2, 3))


class PoolFirst(nn.Module):
    """MaxPool on the input, before any layer: nothing to differentiate there."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        return self.head(torch.flatten(F.relu(self.conv(F.max_pool2d(x, 2))), 1))


class InputResidual(nn.Module):
    """x + conv(x): the Add's gradient to the model input is not needed."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.head = nn.Linear(3 * 5 * 5, 3)

    def forward(self, x):
        return self.head(torch.flatten(x + self.conv(x), 1))


class OutputView(nn.Module):
    """... -> conv -> global average pool -> flatten: the model output is a view (no Gemm head)."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv2d(3, 4, 1)
        self.conv = nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x):
        return torch.flatten(F.adaptive_avg_pool2d(self.conv(F.relu(self.pre(x))), 1), 1)


class ConvBN(nn.Module):
    def __init__(self, c_in, c_out, bias):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, h):
        return F.relu(self.bn(self.conv(h)))


class LinearStack(nn.Module):
    """fc0 -> middle -> fc2: an op between two trainable Linear layers."""

    def __init__(self, middle, n_in=6, n_mid=8, n_mid2=5, n_out=3, relu=True):
        super().__init__()
        self.fc0 = nn.Linear(n_in, n_mid)
        self.middle = middle
        self.fc2 = nn.Linear(n_mid2, n_out)
        self.relu = relu

    def forward(self, x):
        h = self.fc0(x)
        h = self.middle(F.relu(h) if self.relu else h)
        return self.fc2(h)


class MatMulAdd(nn.Module):
    """x @ W + b with bare parameters (W is [in, out])."""

    def __init__(self, n_in, n_out, bias=True):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_in, n_out) * 0.4)
        self.b = nn.Parameter(torch.randn(n_out) * 0.1) if bias else None

    def forward(self, h):
        return h @ self.W + self.b if self.b is not None else h @ self.W


class LinearBN(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        self.bn = nn.BatchNorm1d(n_out)

    def forward(self, h):
        return self.bn(self.fc(h))


class SoftmaxHead(nn.Module):
    """An MLP whose output is a (log-)softmax; with `logits=True` it returns the
    logits, which is what microtrain trains (the output softmax is fused into
    the cross-entropy loss)."""

    def __init__(self, log=False):
        super().__init__()
        self.fc0 = nn.Linear(6, 8)
        self.fc1 = nn.Linear(8, 3)
        self.log = log
        self.logits = False

    def forward(self, x):
        z = self.fc1(F.relu(self.fc0(x)))
        if self.logits:
            return z
        return F.log_softmax(z, dim=-1) if self.log else F.softmax(z, dim=-1)


# ------------------------------------------------------------ whole models ----

class MLP(nn.Module):
    def __init__(self, n_in=64, n_out=10):
        super().__init__()
        self.fc1 = nn.Linear(n_in, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, n_out)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    """conv -> ReLU6 -> depthwise conv -> ReLU6 -> + (residual) -> maxpool ->
    1x1 conv -> ReLU -> avgpool -> flatten -> Linear, on (1, 8, 8) images."""

    def __init__(self, n_out=10):
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.pw = nn.Conv2d(4, 8, 1)
        self.fc = nn.Linear(8 * 2 * 2, n_out)

    def forward(self, x):
        a = F.relu6(self.c1(x))
        h = a + F.relu6(self.dw(a))
        h = F.max_pool2d(h, 2)
        h = F.avg_pool2d(F.relu(self.pw(h)), 2)
        return self.fc(torch.flatten(h, 1))


# ------------------------------------------------ views before other ops ----
# A view (Flatten, Reshape, Squeeze, Unsqueeze) feeding an op without parameters: the
# gradient must flow through the view to the layers before it.

class FlattenRelu(nn.Module):
    """conv -> flatten -> relu -> Linear."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv2d(3, 4, 1)
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.head(F.relu(torch.flatten(self.pre(x), 1)))


class ReshapeBetweenGemms(nn.Module):
    """Linear -> reshape (N, 2, 4) -> relu -> reshape (N, 8) -> Linear."""

    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        h = F.relu(self.fc0(x).reshape(-1, 2, 4))
        return self.fc2(h.reshape(-1, 8))


class PoolAfterReshape(nn.Module):
    """Linear -> view (N, 2, 4, 4) -> maxpool 2 -> flatten -> Linear."""

    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(6, 32)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        h = F.max_pool2d(self.fc0(x).view(-1, 2, 4, 4), 2)
        return self.fc2(torch.flatten(h, 1))


class SqueezeAroundPool(nn.Module):
    """conv1d -> unsqueeze(2) -> avgpool (1, 2) -> squeeze(2) -> relu -> flatten -> Linear."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(3, 4, 3)
        self.head = nn.Linear(4 * 5, 3)

    def forward(self, x):
        h = F.avg_pool2d(self.pre(x).unsqueeze(2), (1, 2)).squeeze(2)
        return self.head(torch.flatten(F.relu(h), 1))


def keyword_spotting():
    """The keyword-spotting CNN of issue 5, as a user writes it."""
    return nn.Sequential(nn.Conv1d(13, 32, 3), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 4))


# ------------------------------------------------ activations, products, concat ----
# (the ops of MobileNetV3-style models: HardSwish, squeeze-and-excitation, frozen BatchNorm)

class Swish(nn.Module):
    """h * sigmoid(h): Mul of two activations of one shape."""

    def forward(self, h):
        return h * torch.sigmoid(h)


class SqueezeExcite(nn.Module):
    """h * hardsigmoid(conv2(relu(conv1(mean(h))))): Mul by one value per channel."""

    def __init__(self, c, r=2):
        super().__init__()
        self.fc1 = nn.Conv2d(c, r, 1)
        self.fc2 = nn.Conv2d(r, c, 1)

    def forward(self, h):
        s = F.adaptive_avg_pool2d(h, 1)
        return h * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class ConstArith(nn.Module):
    """((h - mean) / std) * k + c, then 0.5 - that: Sub, Div, Mul, Add by per-channel and scalar
    constants, none of which folds into the convolution before."""

    def __init__(self, c):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("mean", torch.randn(c, 1, 1, generator=g) * 0.3)
        self.register_buffer("std", torch.rand(c, 1, 1, generator=g) + 0.5)
        self.register_buffer("k", torch.randn(c, 1, 1, generator=g))

    def forward(self, h):
        return 0.5 - (((h - self.mean) / self.std) * self.k + 0.25)


class NormalizedInput(nn.Module):
    """(x - mean) / std per channel on the model input, then conv -> relu -> flatten -> Linear:
    input normalisation inside the model (nothing before it needs a gradient)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.5, -0.2, 0.1]).reshape(3, 1, 1))
        self.register_buffer("std", torch.tensor([0.3, 1.5, 0.8]).reshape(3, 1, 1))
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.head(torch.flatten(F.relu(self.conv((x - self.mean) / self.std)), 1))


class CatBranches(nn.Module):
    """cat([conv(h), relu(h), h], channels): each input gets its slice of the gradient."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, 2, 3, padding=1)

    def forward(self, h):
        return torch.cat([self.conv(h), F.relu(h), h], 1)


class AddThenBN(nn.Module):
    """h + conv(h) -> BatchNorm: it follows an Add, so it cannot be folded (a frozen per-channel affine)."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, h):
        return self.bn(h + self.conv(h))


class ReluThenBN1d(nn.Module):
    """Linear -> ReLU -> BatchNorm1d: a 2-D BatchNorm that cannot be folded."""

    def __init__(self, n):
        super().__init__()
        self.bn = nn.BatchNorm1d(n)

    def forward(self, h):
        return self.bn(h)


class MobileNetV3Block(nn.Module):
    """A MobileNetV3 bottleneck on a stem: conv 3x3 -> HardSwish -> [1x1 expand -> HardSwish ->
    3x3 depthwise -> HardSwish -> squeeze-and-excitation (mean -> 1x1 -> ReLU -> 1x1 -> HardSigmoid
    -> Mul) -> 1x1 project] + residual -> mean -> Linear."""

    def __init__(self, n_out=3, c=4, e=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.expand = nn.Conv2d(c, e, 1)
        self.dw = nn.Conv2d(e, e, 3, padding=1, groups=e)
        self.se = SqueezeExcite(e, 4)
        self.project = nn.Conv2d(e, c, 1)
        self.head = nn.Linear(c, n_out)

    def forward(self, x):
        h = F.hardswish(self.stem(x))
        b = F.hardswish(self.dw(F.hardswish(self.expand(h))))
        h = h + self.project(self.se(b))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


# ------------------------------------------------------------------ cases ----

@dataclass
class Case:
    name: str
    build: object                       # () -> nn.Module (eval mode, seeded)
    shape: tuple                        # one sample, no batch dim
    n_out: int = 3
    exporters: tuple = DEFAULT_EXPORTERS
    train_as: object = None             # module -> the module PyTorch trains instead (BN folded, logits)
    output: str | None = None           # "softmax"/"log_softmax": what the ONNX model applies to the logits
    onnx_helper: object = None          # module -> ModelProto, for exporter "helper"

    def module(self):
        torch.manual_seed(zlib.crc32(self.name.encode()))
        m = self.build()
        _randomize_bn(m)
        return m.eval()

    def oracle(self, module):
        """The module PyTorch trains: a copy, BatchNormalization folded, returning logits."""
        m = copy.deepcopy(module)
        return (self.train_as(m) if self.train_as else m).eval()


def _randomize_bn(m):
    with torch.no_grad():
        for bn in m.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.normal_(0, 0.3)
                bn.running_mean.normal_(0, 0.3)
                bn.running_var.uniform_(0.5, 2.0)


def _fold_bn(m):
    for name, child in list(m.named_children()):
        if isinstance(child, ConvBN):
            child.conv = fuse_conv_bn_eval(child.conv, child.bn)
            child.bn = nn.Identity()
        elif isinstance(child, LinearBN):
            child.fc = fuse_linear_bn_eval(child.fc, child.bn)
            child.bn = nn.Identity()
        else:
            _fold_bn(child)
    return m


def _logits(m):
    m.logits = True
    return m


def _asym_conv_onnx(module, **conv_attrs):
    """pre 1x1 conv -> Conv(stride (2, 1), pads top 0, left 1, bottom 2, right 1 unless
    conv_attrs say otherwise) -> Flatten -> Gemm."""
    sd = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in sd.items()]
    out = module(torch.zeros(1, *module.SHAPE)).shape
    nodes = [helper.make_node("Conv", ["x", "pre.weight", "pre.bias"], ["p"], name="pre"),
             helper.make_node("Conv", ["p", "op.conv.weight", "op.conv.bias"], ["c"], name="asym",
                              **dict(dict(pads=[0, 1, 2, 1], strides=[2, 1], kernel_shape=[3, 3]), **conv_attrs)),
             helper.make_node("Flatten", ["c"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "head.weight", "head.bias"], ["y"], transB=1, name="head")]
    g = helper.make_graph(nodes, "asym", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *module.SHAPE])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


class AsymPadConv(nn.Module):
    """What ONNX Conv pads=[0, 1, 2, 1] computes: zero-pad top 0, left 1, bottom 2, right 1."""

    def __init__(self, c_in, c_out, stride=(2, 1), pad=(1, 1, 0, 2)):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride=stride)
        self.pad = pad   # F.pad order: left, right, top, bottom

    def forward(self, h):
        return self.conv(F.pad(h, self.pad))


def _asym_sandwich():
    m = Sandwich(AsymPadConv(4, 5), (7, 6))
    m.SHAPE = (3, 7, 6)
    return m


def _same_upper_sandwich():
    """auto_pad=SAME_UPPER, stride 2 on 7x6: output 4x3, pads top 1 bottom 1, left 0 right 1."""
    m = Sandwich(AsymPadConv(4, 5, stride=(2, 2), pad=(0, 1, 1, 1)), (7, 6))
    m.SHAPE = (3, 7, 6)
    return m


def _same_upper_onnx(module):
    return _asym_conv_onnx(module, pads=None, strides=[2, 2], auto_pad="SAME_UPPER")


def _matmul_helper_onnx(module):
    """fc0 (Gemm) -> Relu -> MatMul(h, W) -> Add(b) -> Relu -> MatMul(h, Transpose(V)) -> Add(c):
    MatMul+Add fused into a layer, and a transposed weight found through a Transpose node."""
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in module.state_dict().items()}
    inits = [numpy_helper.from_array(v, k) for k, v in sd.items()]
    nodes = [helper.make_node("Gemm", ["x", "fc0.weight", "fc0.bias"], ["h0"], transB=1, name="fc0"),
             helper.make_node("Relu", ["h0"], ["r0"], name="r0"),
             helper.make_node("MatMul", ["r0", "mid.W"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "mid.b"], ["h1"], name="add1"),
             helper.make_node("Relu", ["h1"], ["r1"], name="r1"),
             helper.make_node("Transpose", ["fc2.weight"], ["fc2.weight_T"], perm=[1, 0], name="t2"),
             helper.make_node("MatMul", ["r1", "fc2.weight_T"], ["m2"], name="mm2"),
             helper.make_node("Add", ["fc2.bias", "m2"], ["y"], name="add2")]
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


class MatMulHelperModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(6, 8)
        self.mid = MatMulAdd(8, 5)
        self.fc2 = nn.Linear(5, 3)
        self.LAYERS = [("fc0.weight", "fc0.bias", "out_in"), ("mid.W", "mid.b", "in_out"),
                       ("fc2.weight", "fc2.bias", "out_in")]

    def forward(self, x):
        return self.fc2(F.relu(self.mid(F.relu(self.fc0(x)))))


def _stack(middle, **kw):
    m = LinearStack(middle, **kw)
    mid = "middle."
    m.LAYERS = [("fc0.weight", "fc0.bias", "out_in")]
    if isinstance(middle, MatMulAdd):
        m.LAYERS.append((mid + "W", mid + "b" if middle.b is not None else None, "in_out"))
    elif isinstance(middle, nn.Linear):
        m.LAYERS.append((mid + "weight", mid + "bias" if middle.bias is not None else None, "out_in"))
    elif isinstance(middle, LinearBN):
        m.LAYERS.append((mid + "fc.weight", mid + "fc.bias", "out_in"))
    m.LAYERS.append(("fc2.weight", "fc2.bias", "out_in"))
    return m


_BN_EXPORTERS = ("ts13-nofold", "dynamo-noopt", "dynamo")

OP_CASES = [
    Case("conv_stride2", lambda: Sandwich(nn.Conv2d(4, 5, 3, stride=2, padding=1), (7, 7)), (3, 7, 7),
         exporters=("ts13", "ts17", "dynamo", "dynamo-noopt")),
    Case("conv_asym_pad", _asym_sandwich, (3, 7, 6), exporters=("helper",), onnx_helper=_asym_conv_onnx),
    Case("conv_same_upper", _same_upper_sandwich, (3, 7, 6), exporters=("helper",), onnx_helper=_same_upper_onnx),
    Case("conv_groups2", lambda: Sandwich(nn.Conv2d(4, 6, 3, padding=1, groups=2), (5, 5)), (3, 5, 5)),
    Case("conv_depthwise", lambda: Sandwich(nn.Conv2d(4, 4, 3, padding=1, groups=4), (6, 6)), (3, 6, 6)),
    Case("conv_depthwise_x2_nobias",
         lambda: Sandwich(nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=4, bias=False), (6, 6)), (3, 6, 6)),
    Case("conv_dilation", lambda: Sandwich(nn.Conv2d(4, 4, 3, padding=2, dilation=2), (7, 7)), (3, 7, 7)),
    Case("conv1d", lambda: Sandwich(nn.Conv1d(4, 5, 3, stride=2, padding=1), (11,)), (3, 11)),
    # the core's kernel variants (mt_conv.c): 3-wide filters at stride 1 run sliding rows with
    # checked edges; the backward input pass pads by 2 - pad; narrow inputs leave no interior
    Case("conv_3x3_valid", lambda: Sandwich(nn.Conv2d(4, 5, 3), (6, 7)), (3, 6, 7)),
    Case("conv_3x3_pad2", lambda: Sandwich(nn.Conv2d(4, 5, 3, padding=2), (4, 5)), (3, 4, 5)),
    Case("conv_3x3_narrow", lambda: Sandwich(nn.Conv2d(4, 4, 3, padding=1), (4, 2)), (3, 4, 2)),
    Case("conv_2x3", lambda: Sandwich(nn.Conv2d(4, 5, (2, 3), padding=(1, 1)), (5, 6)), (3, 5, 6)),
    Case("conv1d_k3_valid", lambda: Sandwich(nn.Conv1d(4, 5, 3), (9,)), (3, 9)),
    Case("conv_1x1", lambda: Sandwich(nn.Conv2d(4, 6, 1), (5, 3)), (3, 5, 3)),
    Case("conv_1x1_groups2", lambda: Sandwich(nn.Conv2d(4, 6, 1, groups=2), (4, 3)), (3, 4, 3)),
    Case("conv_5x5", lambda: Sandwich(nn.Conv2d(4, 4, 5, padding=2), (6, 5)), (3, 6, 5)),
    Case("linear_nobias", lambda: _stack(nn.Linear(8, 5, bias=False)), (6,)),
    Case("matmul_add", lambda: _stack(MatMulAdd(8, 5)), (6,)),
    Case("matmul_nobias", lambda: _stack(MatMulAdd(8, 5, bias=False)), (6,)),
    Case("matmul_transpose_helper", MatMulHelperModel, (6,), exporters=("helper",), onnx_helper=_matmul_helper_onnx),
    Case("relu", lambda: Sandwich(nn.ReLU(), (5, 5)), (3, 5, 5)),
    Case("relu6", lambda: Sandwich(nn.ReLU6(), (5, 5)), (3, 5, 5), exporters=("ts13", "dynamo", "dynamo-noopt")),
    Case("clip", lambda: Sandwich(nn.Hardtanh(-0.3, 0.4), (5, 5)), (3, 5, 5)),
    Case("maxpool_k3s2p1_ceil", lambda: Sandwich(nn.MaxPool2d(3, 2, 1, ceil_mode=True), (8, 8)), (3, 8, 8),
         exporters=("ts13", "ts17", "dynamo")),
    Case("maxpool_k2s2_ceil", lambda: Sandwich(nn.MaxPool2d(2, 2, ceil_mode=True), (7, 7)), (3, 7, 7)),
    Case("relu_maxpool_ties", lambda: Sandwich(nn.Sequential(nn.ReLU(), nn.MaxPool2d(2)), (6, 6)), (3, 6, 6)),
    # ceil_mode where the last window would start in the right padding: PyTorch drops it (5x5 -> 3x3, not 4x4)
    Case("maxpool_ceil_last_window", lambda: Sandwich(nn.MaxPool2d(2, 2, 1, ceil_mode=True), (5, 5)), (3, 5, 5)),
    Case("avgpool_ceil_last_window", lambda: Sandwich(nn.AvgPool2d(2, 2, 1, ceil_mode=True), (5, 5)), (3, 5, 5)),
    Case("maxpool_dilation", lambda: Sandwich(nn.MaxPool2d(2, 1, dilation=2), (6, 6)), (3, 6, 6)),
    Case("maxpool1d", lambda: Sandwich(nn.MaxPool1d(3, 2, 1), (9,)), (3, 9)),
    Case("avgpool_incl_pad_ceil",
         lambda: Sandwich(nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=True), (8, 8)), (3, 8, 8),
         exporters=("ts13", "ts17", "dynamo")),
    Case("avgpool_excl_pad_ceil",
         lambda: Sandwich(nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (8, 8)), (3, 8, 8),
         exporters=("ts13", "ts17", "dynamo")),
    Case("avgpool_k2s2_ceil", lambda: Sandwich(nn.AvgPool2d(2, 2, ceil_mode=True), (7, 7)), (3, 7, 7)),
    Case("avgpool_excl_pad", lambda: Sandwich(nn.AvgPool2d(3, 1, 1, count_include_pad=False), (5, 5)), (3, 5, 5)),
    Case("gap", lambda: Sandwich(nn.AdaptiveAvgPool2d(1), (5, 5)), (3, 5, 5),
         exporters=("ts13", "dynamo", "dynamo-noopt")),
    Case("mean_spatial", lambda: Sandwich(SpatialMean(), (5, 5)), (3, 5, 5)),
    Case("gap_squeeze", lambda: Sandwich(nn.AdaptiveAvgPool2d(1), (5, 5), flatten="squeeze"), (3, 5, 5)),
    Case("view", lambda: Sandwich(nn.ReLU(), (4, 4), flatten="view"), (3, 4, 4)),
    Case("reshape", lambda: Sandwich(nn.ReLU(), (4, 4), flatten="reshape"), (3, 4, 4)),
    Case("residual_add", lambda: Sandwich(Residual(4), (5, 5)), (3, 5, 5)),
    Case("pool_on_input", PoolFirst, (3, 6, 6)),
    Case("residual_from_input", InputResidual, (3, 5, 5)),
    Case("output_is_view", OutputView, (3, 5, 5)),
    Case("batchnorm_conv", lambda: Sandwich(ConvBN(4, 5, True), (5, 5)), (3, 5, 5),
         exporters=_BN_EXPORTERS, train_as=_fold_bn),
    Case("batchnorm_conv_nobias", lambda: Sandwich(ConvBN(4, 5, False), (5, 5)), (3, 5, 5),
         exporters=_BN_EXPORTERS, train_as=_fold_bn),
    Case("batchnorm_linear", lambda: _stack(LinearBN(8, 5)), (6,), exporters=_BN_EXPORTERS, train_as=_fold_bn),
    Case("sigmoid", lambda: Sandwich(nn.Sigmoid(), (5, 5)), (3, 5, 5)),
    Case("tanh", lambda: Sandwich(nn.Tanh(), (5, 5)), (3, 5, 5)),
    Case("hardsigmoid", lambda: Sandwich(nn.Hardsigmoid(), (5, 5)), (3, 5, 5)),
    Case("hardswish", lambda: Sandwich(nn.Hardswish(), (5, 5)), (3, 5, 5)),
    Case("leakyrelu", lambda: Sandwich(nn.LeakyReLU(0.1), (5, 5)), (3, 5, 5)),
    Case("tanh_linear", lambda: _stack(nn.Tanh(), relu=False, n_mid2=8), (6,)),
    Case("swish_mul", lambda: Sandwich(Swish(), (4, 4)), (3, 4, 4)),
    Case("squeeze_excite_mul", lambda: Sandwich(SqueezeExcite(4), (4, 4)), (3, 4, 4)),
    Case("const_arith", lambda: Sandwich(ConstArith(4), (4, 4)), (3, 4, 4)),
    Case("input_normalisation", NormalizedInput, (3, 4, 4)),
    Case("concat_channels", lambda: Sandwich(CatBranches(4), (4, 4)), (3, 4, 4)),
    Case("batchnorm_after_add", lambda: Sandwich(AddThenBN(4), (4, 4)), (3, 4, 4)),
    Case("batchnorm1d_after_relu", lambda: _stack(ReluThenBN1d(8), n_mid2=8), (6,)),
    Case("softmax_output", lambda: SoftmaxHead(), (6,), train_as=_logits, output="softmax"),
    Case("logsoftmax_output", lambda: SoftmaxHead(log=True), (6,), train_as=_logits, output="log_softmax"),
]

MODEL_CASES = {
    "mlp": Case("mlp", MLP, (64,), n_out=10),
    "cnn": Case("cnn", CNN, (1, 8, 8), n_out=10),
    "mobilenetv3_block": Case("mobilenetv3_block", MobileNetV3Block, (3, 6, 6)),
}


VIEW_CASES = {c.name: c for c in [
    Case("adaptive_avgpool1d_flatten", lambda: Sandwich(nn.AdaptiveAvgPool1d(1), (9,)), (3, 9)),
    Case("adaptive_avgpool2d_flatten", lambda: Sandwich(nn.AdaptiveAvgPool2d(1), (5, 5)), (3, 5, 5)),
    Case("flatten_relu_linear", FlattenRelu, (3, 4, 4)),
    Case("reshape_between_gemms", ReshapeBetweenGemms, (6,)),
    Case("pool_after_reshape", PoolAfterReshape, (6,)),
    Case("squeeze_unsqueeze_around_pool", SqueezeAroundPool, (3, 12)),
    Case("keyword_spotting", keyword_spotting, (13, 49), n_out=4),
]}


def case_onnx(case, exporter, directory):
    """The case's model as ONNX (a file in `directory`), and the module it came from."""
    module = case.module()
    path = os.path.join(directory, "%s-%s.onnx" % (case.name, exporter))
    if exporter == "helper":
        onnx.save(case.onnx_helper(module), path)
    else:
        export(module, torch.zeros((1,) + tuple(case.shape)), exporter, path)
    return path, module
