"""The same ONNX model as a PyTorch eager module, for the host-speed comparison.

Only the ops the benchmark models use (what torch.onnx.export and onnx.helper
produce for MLPs and the MCU CNNs); each node becomes its torch.nn.functional
call, the initializers become parameters, and only the ones microtrain trains
for the update mode require a gradient, so autograd does the same work.
"""
import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads(a, rank):
    p = list(a.get("pads", [0] * (2 * rank)))
    if p[:rank] != p[rank:]:
        raise NotImplementedError("asymmetric pads %s" % p)
    return p[:rank]


class OnnxModule(torch.nn.Module):
    def __init__(self, model, trainable):
        super().__init__()
        self.graph = model.graph
        self.values = {}
        self.params = torch.nn.ParameterDict()
        self.keys = {}
        for t in model.graph.initializer:
            a = torch.from_numpy(np.array(numpy_helper.to_array(t), dtype=np.float32))
            key = "p%d" % len(self.keys)
            self.keys[t.name] = key
            self.params[key] = torch.nn.Parameter(a, requires_grad=t.name in trainable)
        missing = set(trainable) - set(self.keys)
        if missing:
            raise ValueError("trainable names not among the initializers: %s" % sorted(missing))
        for n in model.graph.node:
            if n.op_type == "Constant":
                self.values[n.output[0]] = torch.from_numpy(np.array(numpy_helper.to_array(_attrs(n)["value"])))

        # decoded once: each step only runs the torch calls
        self.program = [(n.op_type, n.name, list(n.input), n.output[0], _attrs(n))
                        for n in model.graph.node if n.op_type != "Constant"]
        self.input_name, self.output_name = model.graph.input[0].name, model.graph.output[0].name

    def forward(self, x):
        env = dict(self.values)
        for name, key in self.keys.items():
            env[name] = self.params[key]
        env[self.input_name] = x
        for op, name, inputs, output, attrs in self.program:
            env[output] = self._run(op, name, [env[i] if i else None for i in inputs], attrs)
        return env[self.output_name]

    @staticmethod
    def _run(op, name, x, a):
        if op == "Conv":
            rank = x[1].dim() - 2
            conv = F.conv2d if rank == 2 else F.conv1d
            return conv(x[0], x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", 1),
                        padding=_pads(a, rank), dilation=a.get("dilations", 1), groups=a.get("group", 1))
        if op == "Gemm":
            A = x[0].t() if a.get("transA", 0) else x[0]
            B = x[1].t() if a.get("transB", 0) else x[1]
            y = a.get("alpha", 1.0) * (A @ B)
            return y + a.get("beta", 1.0) * x[2] if len(x) > 2 and x[2] is not None else y
        if op == "MatMul":
            return x[0] @ x[1]
        if op == "Add":
            return x[0] + x[1]
        if op == "Relu":
            return F.relu(x[0])
        if op == "Clip":
            lo = x[1] if len(x) > 1 and x[1] is not None else a.get("min")
            hi = x[2] if len(x) > 2 and x[2] is not None else a.get("max")
            return torch.clamp(x[0], None if lo is None else float(lo), None if hi is None else float(hi))
        if op in ("MaxPool", "AveragePool"):
            k = a["kernel_shape"]
            kw = dict(stride=a.get("strides", k), padding=_pads(a, len(k)), ceil_mode=bool(a.get("ceil_mode", 0)))
            if op == "MaxPool":
                return F.max_pool2d(x[0], k, **kw)
            return F.avg_pool2d(x[0], k, count_include_pad=bool(a.get("count_include_pad", 0)), **kw)
        if op == "GlobalAveragePool":
            return x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True)
        if op == "Flatten":
            return torch.flatten(x[0], a.get("axis", 1))
        if op == "Reshape":
            return x[0].reshape([int(v) for v in x[1]])
        raise NotImplementedError("torch_eager: ONNX op %s (node %s)" % (op, name))


def trainer(model, trainable, lr, momentum):
    """(module, step(x, y) -> loss): one PyTorch eager SGD step on one sample, as microtrain's."""
    net = OnnxModule(model, trainable)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=lr, momentum=momentum)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return net, step
