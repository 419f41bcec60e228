"""Models and data for the int8 tests: a small CNN trained on scikit-learn's digits (every
op the int8 path has: strided and padded convolutions, BatchNormalization folded, ReLU,
depthwise ReLU6, a residual Add, max, average and global average pooling, Flatten, Linear),
its ONNX export with either exporter, onnxruntime's static quantization of it (QDQ), and
a QDQ model written from microtrain's own post-training quantization, so that onnxruntime
can run the very same integers; and a MobileNetV2-style block (Block) whose expansion the int8
lowering streams into its depthwise conv (PWDW_Q8)."""
import contextlib
import io
import os
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper


def digits(seed=0):
    """scikit-learn's digits as (N, 1, 8, 8) float32 in [0, 1] and labels, shuffled."""
    from sklearn.datasets import load_digits
    d = load_digits()
    order = np.random.default_rng(seed).permutation(len(d.target))
    return (d.images[order] / 16.0).astype(np.float32)[:, None], d.target[order].astype(np.int64)


class DigitsNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pw = nn.Conv2d(16, 16, 1)
        self.c3 = nn.Conv2d(16, 24, 3, padding=1)
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        a = F.relu(self.bn1(self.c1(x)))
        a = a + F.relu6(self.dw(a))
        h = F.relu(self.c2(a))                          # 4x4
        h = F.max_pool2d(F.relu(self.pw(h)), 3, stride=1, padding=1)
        h = F.relu(self.c3(h))
        # average pooling last, as in MCU networks: onnxruntime breaks the ties of a mean
        # (common: a sum of 4 over 4) by float rounding, which integer arithmetic cannot
        # follow; a layer after it would carry those 1-LSB differences on
        h = F.avg_pool2d(h, 3, stride=1, padding=1, count_include_pad=False)
        h = F.adaptive_avg_pool2d(h, 1)
        return self.fc(torch.flatten(h, 1))


def trained_bn_stats(module, seed):
    """Give every BatchNorm2d of module batch statistics and a bias as a trained network has them."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.3)


class Block(nn.Module):
    """stem conv, then an inverted residual: 1x1 expansion, depthwise kxk, 1x1 projection (with the
    residual when the shapes allow), global average pooling, Linear."""

    def __init__(self, k=3, stride=1, pad=1, dil=1, expand=24, cin=1, width=8, bias=False):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(cin, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU6())
        self.pw1 = nn.Sequential(nn.Conv2d(width, expand, 1, bias=bias), nn.BatchNorm2d(expand), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(expand, expand, k, stride, pad, dilation=dil, groups=expand, bias=bias),
                                nn.BatchNorm2d(expand), nn.ReLU6())
        self.pw2 = nn.Sequential(nn.Conv2d(expand, width, 1, bias=bias), nn.BatchNorm2d(width))
        self.residual = stride == 1 and 2 * pad == dil * (k - 1)
        self.fc = nn.Linear(width, 10)
        trained_bn_stats(self, k * 10 + stride)

    def forward(self, x):
        a = self.stem(x)
        h = self.pw2(self.dw(self.pw1(a)))
        if self.residual:
            h = h + a
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


def train(model, x, y, epochs=8, lr=0.01, seed=0):
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # a tiny model: threads only contend
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(epochs):
        for i in torch.randperm(len(x)).split(32):
            opt.zero_grad()
            F.cross_entropy(model(xt[i]), yt[i]).backward()
            opt.step()
    torch.set_num_threads(threads)
    return model.eval()


def export(model, path, exporter="ts", shape=(1, 1, 8, 8)):
    kw = dict(dynamo=False, opset_version=13) if exporter == "ts" else dict(dynamo=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(shape),), path, input_names=["input"], output_names=["logits"], **kw)
    return path


def ort_qdq(src, dst, calib, activation="int8", exclude=(), per_channel=True):
    """onnxruntime's static quantization of src in the QDQ form."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    name = onnx.load(src).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({name: s[None]} for s in calib)

        def get_next(self):
            return next(self.it, None)

    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=types[activation], weight_type=QuantType.QInt8,
                        nodes_to_exclude=list(exclude))
    return dst


def ort_session(path):
    """onnxruntime running the QDQ model as the ONNX standard defines it: DequantizeLinear, the
    float op, QuantizeLinear, with its graph optimizations off. Optimized, it fuses each
    DQ-op-Q into an integer kernel whose uint8 x int8 products, on an x86-64 CPU with AVX2 but
    no VNNI (onnxruntime's quantization docs, "U8S8 ... VPMADDUBSW ... saturation"), add in
    saturating int16 pairs: up to 21 LSB off on the models here, so the reference would
    depend on the CPU it runs on."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def qdq_from_plan_quantization(src, graph, dst):
    """src (a float ONNX model whose initializers the IR uses unchanged) with microtrain's PTQ
    (graph.quant, graph.wquant from quantize.ptq) written in as QuantizeLinear/DequantizeLinear:
    what onnxruntime then runs is microtrain's quantization."""
    m = onnx.load(src)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    nodes = list(g.node)
    new_inits = []
    # weights: int8 + DequantizeLinear; biases of those layers: int32 at x_scale * w_scale
    producer = {o: n for n in nodes for o in n.output}
    rename = {}
    for n in nodes:
        if n.op_type not in ("Conv", "Gemm") or n.input[1] not in graph.wquant:
            continue
        wq = graph.wquant[n.input[1]]
        w = numpy_helper.to_array(inits[n.input[1]])
        scale_shape = [-1] + [1] * (w.ndim - 1) if wq.axis == 0 else [1, -1]
        q = np.clip(np.round(w / wq.scale.reshape(scale_shape)), -128, 127).astype(np.int8)
        base = n.input[1]
        new_inits += [numpy_helper.from_array(q, base + "_q"), numpy_helper.from_array(wq.scale, base + "_s"),
                      numpy_helper.from_array(np.zeros(wq.scale.size, np.int8), base + "_z")]
        nodes.append(helper.make_node("DequantizeLinear", [base + "_q", base + "_s", base + "_z"], [base + "_dq"],
                                      axis=wq.axis, name=base + "_DQ"))
        rename.setdefault(id(n), {})[1] = base + "_dq"
        xq = graph.quant[_root(graph, n.input[0])]
        if len(n.input) > 2 and n.input[2]:
            bs = (np.float32(xq.scale) * wq.scale).astype(np.float32)
            b = numpy_helper.to_array(inits[n.input[2]]).astype(np.float64)
            qb = np.round(b / bs.astype(np.float64)).astype(np.int32)
            bb = n.input[2]
            new_inits += [numpy_helper.from_array(qb, bb + "_q"), numpy_helper.from_array(bs, bb + "_s"),
                          numpy_helper.from_array(np.zeros(bs.size, np.int32), bb + "_z")]
            nodes.append(helper.make_node("DequantizeLinear", [bb + "_q", bb + "_s", bb + "_z"], [bb + "_dq"],
                                          axis=0, name=bb + "_DQ"))
            rename[id(n)][2] = bb + "_dq"
    # activations: QuantizeLinear + DequantizeLinear after each annotated value
    outputs = {o.name for o in g.output}
    for v, q in graph.quant.items():
        s, z = v + "_qs", v + "_qz"
        new_inits += [numpy_helper.from_array(np.asarray(q.scale, np.float32), s),
                      numpy_helper.from_array(np.asarray(q.zero_point, np.int8), z)]
        src, dq = v, v + "_dq"
        if v in outputs:   # the model's output is the dequantized value
            src, dq = v + "_pre", v
            for n in g.node:
                n.output[:] = [src if o == v else o for o in n.output]
        nodes.append(helper.make_node("QuantizeLinear", [src, s, z], [v + "_q"], name=v + "_Q"))
        nodes.append(helper.make_node("DequantizeLinear", [v + "_q", s, z], [dq], name=v + "_DQ"))
        for n in g.node:
            for k, i in enumerate(n.input):
                if i == v and dq != v:
                    rename.setdefault(id(n), {})[k] = dq
    for n in g.node:
        for k, new in rename.get(id(n), {}).items():
            n.input[k] = new
    del producer
    available = [i.name for i in g.input] + [t.name for t in g.initializer] + [t.name for t in new_inits]
    out = helper.make_graph(_toposort(nodes, available), g.name, list(g.input), list(g.output), list(g.initializer) + new_inits)
    model = helper.make_model(out, opset_imports=[helper.make_opsetid("", max(13, _opset(m)))])
    model.ir_version = m.ir_version
    onnx.save(model, dst)
    return dst


def _root(graph, name):
    while graph.values[name].view_of is not None:
        name = graph.values[name].view_of
    return name


def _opset(m):
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


def _toposort(nodes, available):
    """nodes in an order where each runs after the producers of its inputs."""
    made, out, todo = set(available), [], list(nodes)
    while todo:
        ready = [n for n in todo if all(not i or i in made for i in n.input)]
        if not ready:
            raise AssertionError("the QDQ graph has a cycle or a missing input")
        for n in ready:
            out.append(n)
            made.update(n.output)
        todo = [n for n in todo if all(n is not r for r in ready)]
    return out


def conv_relu_qdq_with(op_after, path):
    """A hand-written QDQ model: DQ -> Conv -> Q -> DQ -> <op_after> -> Q -> DQ (the op quantized
    on both sides), for refusal tests."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.full(4, 0.01, np.float32), "w_s"),
             numpy_helper.from_array(np.zeros(4, np.int8), "w_z"),
             numpy_helper.from_array(np.float32(0.02), "s"), numpy_helper.from_array(np.int8(3), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0, name="dqw"),
             helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"], name="qc"),
             helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["cd"], name="dqc"),
             op_after("cd", "e"),
             helper.make_node("QuantizeLinear", ["e", "s", "z"], ["eq"], name="qe"),
             helper.make_node("DequantizeLinear", ["eq", "s", "z"], ["ed"], name="dqe"),
             helper.make_node("GlobalAveragePool", ["ed"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["y"], name="flat")]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


__all__ = ["digits", "DigitsNet", "train", "export", "ort_qdq", "ort_session", "qdq_from_plan_quantization",
           "conv_relu_qdq_with", "os"]
