"""Training graph: forward ops, the loss, the backward graph and the updates.

Autodiff happens here, at compile time. The backward graph is pruned to what the
trainable set needs: a tensor gets a gradient only if a trainable parameter lies
upstream of it, so nothing below the earliest trainable layer is differentiated
and no frozen weight gets a gradient. Each parameter gradient op feeds the
optimizer directly (fused update, no gradient buffer) when batch is 1, and an
accumulator applied by SGD ops at the end of the batch otherwise.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np

from . import format as F
from . import q8_rules
from .ir import Graph


@dataclass
class TTensor:
    name: str
    shape: tuple
    dtype: str = "F32"
    storage: str = "ARENA"          # ARENA, CONST, STATE
    flags: int = 0                  # format.TFLAGS
    data: np.ndarray | None = None  # constant value, or a parameter's initial value
    view_of: int | None = None      # index of the tensor whose memory this one uses
    onnx_shape: tuple = ()
    offset: int = 0                 # in the arena or the state region, set by the memory plan
    data_offset: int = 0            # in the plan's data section, for constants and initial values
    quant: object = None            # ir.Quant of an integer tensor

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * F.DTYPES[self.dtype][1]


@dataclass
class TOp:
    name: str                       # format.OPS name
    phase: str                      # FORWARD, TRAIN, BATCH_END
    slots: list                     # tensor index or None, per format slot
    attrs: list = field(default_factory=list)
    source: str = ""                # the ONNX node it came from
    macs: int = 0

    @property
    def spec(self):
        return F.OPS_BY_NAME[self.name]


def f32_bits(v):
    return struct.unpack("<i", struct.pack("<f", v))[0]


class Builder:
    def __init__(self, graph: Graph, trainable, loss, batch, momentum, inplace=True):
        self.g = graph
        self.trainable = set(trainable)
        self.loss = loss
        self.batch = batch
        self.momentum = momentum
        self.allow_inplace = inplace
        self.tensors = []
        self.index = {}             # value name -> tensor index
        self.ops = []
        self.grad = {}              # value name -> tensor index of its gradient
        self.opt = {}               # parameter name -> (momentum index, accumulator index)
        self.fwd = {}               # node output -> its forward op

    def tensor(self, t):
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(self, name, phase, slots, attrs=(), source="", macs=0):
        self.ops.append(TOp(name, phase, list(slots), list(attrs), source, macs))
        return self.ops[-1]

    # ---- tensors ----
    def value_tensor(self, name):
        if name in self.index:
            return self.index[name]
        v = self.g.values[name]
        if v.view_of is not None:
            t = TTensor(name, v.shape, view_of=self.value_tensor(v.view_of), onnx_shape=v.onnx_shape)
        elif v.is_const and name in self.trainable:
            t = TTensor(name, v.shape, storage="STATE", flags=F.TFLAGS["PARAM"], data=v.data, onnx_shape=v.onnx_shape)
        elif v.is_const:
            t = TTensor(name, v.shape, storage="CONST", data=v.data, onnx_shape=v.onnx_shape)
        else:
            t = TTensor(name, v.shape, onnx_shape=v.onnx_shape)
        t.dtype, t.quant = v.dtype, v.quant
        self.index[name] = self.tensor(t)
        return self.index[name]

    def grad_tensor(self, name, like):
        k = sum(1 for t in self.tensors if t.name.startswith("d(%s)" % name))
        return self.tensor(TTensor("d(%s)" % name + ("+%d" % k if k else ""), self.tensors[like].shape))

    def view(self, of, shape, name):
        return self.tensor(TTensor(name, tuple(shape), view_of=of))

    def sink(self, pname):
        """The optimizer slots (momentum, accumulator) of a gradient op for a trainable parameter,
        whose tensors are created once. With batch 1 the gradient op updates the parameter at
        once, unless several layers share the parameter: their gradients are summed in an
        accumulator first (as PyTorch sums a tied weight's), and an SGD op at the end of the
        batch applies them, so a backward-input op never sees a weight the forward did not use."""
        if pname not in self.opt:
            p = self.tensors[self.index[pname]]
            m = acc = None
            if self.batch > 1 or self.users[pname] > 1:
                acc = self.tensor(TTensor("acc(%s)" % pname, p.shape, storage="STATE", flags=F.TFLAGS["GRAD_ACC"]))
            if self.momentum > 0:
                m = self.tensor(TTensor("mom(%s)" % pname, p.shape, storage="STATE", flags=F.TFLAGS["MOMENTUM"]))
            self.opt[pname] = (m, acc)
        m, acc = self.opt[pname]
        return [m if acc is None else None, acc]

    # ---- build ----
    def live_nodes(self):
        """Nodes the output depends on (dead branches are dropped)."""
        need = set()

        def want(name):
            while name is not None and name not in need:
                need.add(name)
                name = self.g.values[name].view_of

        want(self.g.output)
        keep = []
        for n in reversed(self.g.nodes):
            if n.output in need:
                keep.append(n)
                for i in n.inputs:
                    if i:
                        want(i)
        return keep[::-1]

    def build(self):
        nodes = self.live_nodes()
        self.users = {}   # trainable parameter -> how many of the layers run use it
        for n in nodes:
            for p in (n.weight(), n.bias()):
                if p in self.trainable:
                    self.users[p] = self.users.get(p, 0) + 1
        x = self.value_tensor(self.g.input)
        self.tensors[x].flags |= F.TFLAGS["INPUT"]
        for n in nodes:
            self.forward(n)
        out = self.value_tensor(self.g.output)
        self.tensors[out].flags |= F.TFLAGS["OUTPUT"]
        if self.loss == "cross-entropy":
            target = self.tensor(TTensor("target", (1,), dtype="I32", flags=F.TFLAGS["TARGET"]))
        else:
            target = self.tensor(TTensor("target", self.tensors[out].shape, flags=F.TFLAGS["TARGET"]))
        self.target, self.output, self.input = target, out, x
        if not self.trainable:   # an inference-only plan: the forward ops alone
            return self.tensors, self.ops
        # which values need a gradient: those downstream of a trainable parameter
        # (a view needs one when its source does, so views are resolved as each node is
        # reached: a view feeding a parameterless op must not cut the gradient)
        self.needs = set(self.trainable)
        for n in nodes:
            if any(self.needs_grad(i) for i in n.inputs if i):
                self.needs.add(n.output)
        self.needs.update(name for name in self.g.values if self.needs_grad(name))
        dout = self.grad_tensor(self.g.output, out)
        self.op("SOFTMAX_CE" if self.loss == "cross-entropy" else "MSE", "TRAIN", [out, target, dout], source="loss")
        self.contribute(self.g.output, dout)   # the output may be a view (Flatten last): reach its source
        for n in reversed(nodes):
            self.backward(n)
        for pname in sorted(self.opt, key=lambda p: self.index[p]):
            m, acc = self.opt[pname]
            if acc is not None:
                self.op("SGD", "BATCH_END", [self.index[pname], m, acc], source=pname)
        if self.allow_inplace:
            self.inplace()
        return self.tensors, self.ops

    def needs_grad(self, name):
        """Whether value `name` (or the value it is a view of) lies downstream of a trainable parameter."""
        while name is not None:
            if name in self.needs:
                return True
            name = self.g.values[name].view_of
        return False

    def forward(self, n):
        self.fwd[n.output] = self.forward_op(n)

    def forward_op(self, n):
        ins = [self.value_tensor(i) if i else None for i in n.inputs]
        y = self.value_tensor(n.output)
        a = n.attrs
        if n.op in q8_rules.FORWARD:
            return q8_rules.FORWARD[n.op](self, n, ins, y)
        if n.op == "conv":
            w = self.tensors[ins[1]]
            ys = self.tensors[y].shape
            macs = ys[1] * ys[2] * ys[3] * int(np.prod(w.shape[1:]))
            return self.op("CONV2D", "FORWARD", ins + [y], [a[k] for k in F.CONV_ATTRS], n.onnx_name, macs)
        elif n.op == "gemm":
            return self.op("GEMM", "FORWARD", ins + [y], [a["w_layout"]], n.onnx_name, self.tensors[ins[1]].nbytes // 4)
        elif n.op == "clip":
            return self.op("CLIP", "FORWARD", [ins[0], y], [f32_bits(a["lo"]), f32_bits(a["hi"])], n.onnx_name)
        elif n.op in ("maxpool", "avgpool"):
            return self.op(n.op.upper(), "FORWARD", [ins[0], y], [a[k] for k in F.POOL_ATTRS], n.onnx_name)
        elif n.op == "gap":
            return self.op("GAP", "FORWARD", [ins[0], y], [], n.onnx_name)
        elif n.op == "add":
            return self.op("ADD", "FORWARD", [ins[0], ins[1], y], [], n.onnx_name)
        else:
            raise AssertionError(n.op)

    def contribute(self, name, g):
        """Add gradient g to value `name`; a view's gradient is a view of its source's."""
        if name not in self.needs:
            return
        v = self.g.values[name]
        if v.view_of is not None:
            self.contribute(v.view_of, self.view(g, self.g.values[v.view_of].shape, "d(%s)@view" % v.view_of))
        elif name in self.grad:
            acc = self.grad_tensor(name, self.index[name])
            self.op("ADD", "TRAIN", [self.grad[name], g, acc], source="d(%s)" % name)
            self.grad[name] = acc
        else:
            self.grad[name] = g

    def backward(self, n):
        if n.output not in self.grad:
            return
        dy = self.grad[n.output]
        ins = [self.value_tensor(i) if i else None for i in n.inputs]
        if n.op in q8_rules.BACKWARD:
            return q8_rules.BACKWARD[n.op](self, n, dy, ins)
        x = n.inputs[0]
        need_x = x in self.needs
        a = n.attrs
        if n.op in ("conv", "gemm"):
            conv = n.op == "conv"
            w = self.tensors[ins[1]]
            fwd = self.fwd[n.output]
            attrs = [a[k] for k in F.CONV_ATTRS] if conv else [a["w_layout"]]
            if need_x:   # before the weight update: it must see the weight the forward used
                dx = self.grad_tensor(x, ins[0])
                self.op("CONV2D_BWD_INPUT" if conv else "GEMM_BWD_INPUT", "TRAIN", [dy, ins[1], dx], attrs,
                        n.onnx_name, fwd.macs)
                self.contribute(x, dx)
            wname, bname = n.weight(), n.bias()
            if wname in self.trainable:
                if conv:
                    rng = [0, w.shape[0], 0, w.shape[1]]
                else:
                    O, K = (w.shape[0], w.shape[1]) if a["w_layout"] == 0 else (w.shape[1], w.shape[0])
                    rng = [0, O, 0, K]
                self.op("CONV2D_BWD_WEIGHT" if conv else "GEMM_BWD_WEIGHT", "TRAIN",
                        [dy, ins[0], ins[1]] + self.sink(wname), attrs + rng, n.onnx_name, fwd.macs)
            if bname in self.trainable:
                O = self.tensors[ins[2]].shape[0]
                self.op("BIAS_BWD", "TRAIN", [dy, ins[2]] + self.sink(bname), [0, O], n.onnx_name)
        elif n.op == "clip":
            if need_x:
                dx = self.grad_tensor(x, ins[0])
                self.op("CLIP_BWD", "TRAIN", [self.index[n.output], dy, dx],
                        [f32_bits(a["lo"]), f32_bits(a["hi"])], n.onnx_name)
                self.contribute(x, dx)
        elif n.op in ("maxpool", "avgpool", "gap"):
            if need_x:
                dx = self.grad_tensor(x, ins[0])
                attrs = [a[k] for k in F.POOL_ATTRS] if n.op != "gap" else []
                slots = [ins[0], dy, dx] if n.op == "maxpool" else [dy, dx]
                self.op(n.op.upper() + "_BWD", "TRAIN", slots, attrs, n.onnx_name)
                self.contribute(x, dx)
        elif n.op == "add":
            for name in n.inputs:
                self.contribute(name, dy)
        else:
            raise AssertionError(n.op)

    # ---- in place ----
    def root(self, i):
        while self.tensors[i].view_of is not None:
            i = self.tensors[i].view_of
        return i

    def inplace(self):
        """Let an op write over an input that nothing reads afterwards."""
        last = {}
        for k, o in enumerate(self.ops):
            for s in o.slots:
                if s is not None:
                    r = self.root(s)
                    last[r] = max(last.get(r, -1), k)
        for k, o in enumerate(self.ops):
            for out_name, in_name in o.spec.inplace:
                out, src = o.slots[o.spec.slot_index(out_name)], o.slots[o.spec.slot_index(in_name)]
                to, ts = self.tensors[out], self.tensors[src]
                ro, rs = self.root(out), self.root(src)
                if (to.view_of is not None or ro == rs or ts.storage != "ARENA" or self.tensors[rs].storage != "ARENA"
                        or to.nbytes != self.tensors[rs].nbytes or last.get(rs, -1) != k):
                    continue
                to.view_of = rs
                last[rs] = max(last.get(rs, -1), last.pop(ro, -1))
                break


class InternalError(RuntimeError):
    """A compiler bug: the plan would not do what the compiler reports. Never a user error."""


def check_gradient_paths(tensors, ops, trainable):
    """The invariant a training plan keeps: every parameter reported trainable is updated
    by an op that reads a gradient flowing back from the loss. Raises InternalError
    otherwise, so a plan that silently does not train is never written."""
    def root(i):
        while tensors[i].view_of is not None:
            i = tensors[i].view_of
        return i

    from_loss = set()   # memory roots holding a gradient that flows back from the loss
    updated = set()
    for o in ops:
        spec = o.spec
        reads = [s for slot, s in zip(spec.slots, o.slots) if s is not None and slot.role == "in"]
        is_loss = o.name in ("SOFTMAX_CE", "MSE")
        if not is_loss and not any(root(s) in from_loss for s in reads):
            continue
        for slot, s in zip(spec.slots, o.slots):
            if s is None:
                continue
            if slot.role == "out":
                from_loss.add(root(s))
            elif slot.role == "param" and o.phase == "TRAIN":
                updated.add(tensors[s].name)
    missing = sorted(set(trainable) - updated)
    if missing:
        raise InternalError("internal error: %s reported trainable but no gradient from the loss reaches %s; "
                            "the plan would not train %s. Please report this with the model."
                            % (", ".join(map(repr, missing)), "it" if len(missing) == 1 else "them",
                               "it" if len(missing) == 1 else "them"))


def macs_total(ops):
    return sum(o.macs for o in ops)


def build_training(graph, trainable, loss, batch, momentum, inplace=True):
    """(tensors, ops) of the training step (the forward ops alone when nothing trains).
    inplace=False gives every value its own tensor memory."""
    if not math.isfinite(momentum) or not 0 <= momentum < 1:
        raise ValueError("momentum must be in [0, 1), got %r" % momentum)
    return Builder(graph, trainable, loss, batch, momentum, inplace).build()
