"""Training graph: forward ops, the loss, the backward graph and the updates.

Autodiff happens here, at compile time. The backward graph is pruned to what the
trainable set needs: a tensor gets a gradient only if a trainable parameter lies
upstream of it, so nothing below the earliest trainable layer is differentiated
and no frozen weight gets a gradient. Each parameter gradient op feeds the
optimizer directly (fused update, no gradient buffer) when batch is 1, and an
accumulator applied by SGD ops at the end of the batch otherwise (or when several
layers share the parameter). Each graph op's forward and backward emission is one
rule (RULES, below the Builder); check_gradient_paths is the invariant compile()
checks last: every trainable parameter is reached by the loss's gradient.
"""
from __future__ import annotations

import math

import numpy as np

from . import format as F
from . import q8_rules
from .ir import Graph, Quant
from .lowered import TOp, TTensor, f32_bits
from .memory import lifetimes, op_slots


class Builder:
    def __init__(self, graph: Graph, trainable, loss, batch, momentum, inplace=True, clip_grad=None, channels=None,
                 saved="float32", input_in_place=False):
        self.g = graph
        self.input_in_place = input_in_place
        self.saved = saved                      # "int8"/"bits": Clip outputs kept for backward as int8/masks
        self.saved_q = {}                       # value name -> its int8 copy
        self.saved_mask = {}                    # value name -> its 1-bit mask (U8, ceil(n / 8) bytes)
        self.clip_grad = clip_grad
        self.trainable = set(trainable)
        self.channels = dict(channels or {})   # weight -> (axis, channels): trains on those channels only
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
        self.pipes = {}             # int8 value -> the pipe of rows standing for it (q8_rules.qcdp)

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

    def sink(self, pname, part=None):
        """The optimizer slots (momentum, accumulator) of a gradient op for a trainable parameter,
        whose tensors are created once. With batch 1 the gradient op updates the parameter at
        once, unless several layers share the parameter: their gradients are summed in an
        accumulator first (as PyTorch sums a tied weight's), and an SGD op at the end of the
        batch applies them, so a backward-input op never sees a weight the forward did not use.
        part = (label, shape): the op trains one channel run of the parameter; with batch 1 its
        momentum then holds only that run (an SGD op needs a whole-parameter accumulator)."""
        if part is not None and not self.needs_acc(pname):
            label, shape = part
            self.opt.setdefault(pname, (None, None))
            if self.momentum == 0:
                return [None, None]
            return [self.tensor(TTensor("mom(%s)%s" % (pname, label), tuple(shape), storage="STATE",
                                        flags=F.TFLAGS["MOMENTUM"])), None]
        if pname not in self.opt:
            p = self.tensors[self.index[pname]]
            m = acc = None
            if self.needs_acc(pname):
                acc = self.tensor(TTensor("acc(%s)" % pname, p.shape, storage="STATE", flags=F.TFLAGS["GRAD_ACC"]))
            if self.momentum > 0:
                m = self.tensor(TTensor("mom(%s)" % pname, p.shape, storage="STATE", flags=F.TFLAGS["MOMENTUM"]))
            self.opt[pname] = (m, acc)
        m, acc = self.opt[pname]
        return [m if acc is None else None, acc]

    def needs_acc(self, pname):
        return self.batch > 1 or self.users[pname] > 1 or bool(self.clip_grad)

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
        # which values need a gradient: those downstream of a trainable parameter
        # (a view needs one when its source does, so views are resolved as each node is
        # reached: a view feeding a parameterless op must not cut the gradient). Known before
        # the forward ops, which may save a compact copy of what the backward will read.
        self.needs = set(self.trainable)
        for n in nodes:
            if any(self.needs_grad(i) for i in n.inputs if i):
                self.needs.add(n.output)
        self.needs.update(name for name in self.g.values if self.needs_grad(name))
        x = self.value_tensor(self.g.input)
        self.tensors[x].flags |= F.TFLAGS["INPUT"]
        if self.input_in_place:   # the caller's sample, read where it is: nothing runs in place over it
            self.tensors[x].storage = "INPUT"
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
            if self.allow_inplace:
                self.inplace()
            return self.tensors, self.ops
        dout = self.grad_tensor(self.g.output, out)
        self.op("SOFTMAX_CE" if self.loss == "cross-entropy" else "MSE", "TRAIN", [out, target, dout], source="loss")
        self.contribute(self.g.output, dout)   # the output may be a view (Flatten last): reach its source
        for n in reversed(nodes):
            self.backward(n)
        params = sorted(self.opt, key=lambda p: self.index[p])
        if self.clip_grad:
            self.clip([self.opt[p][1] for p in params])
        for pname in params:
            m, acc = self.opt[pname]
            if acc is not None:
                self.op("SGD", "BATCH_END", [self.index[pname], m, acc], source=pname)
        if self.allow_inplace:
            self.inplace()
        return self.tensors, self.ops

    def clip(self, accs):
        """Gradient-norm clipping, before any update: the squared norms of every accumulated
        gradient summed into one value, then each accumulator scaled (format.py: GRAD_NORM2,
        GRAD_CLIP). With clip_grad every gradient goes to an accumulator (sink)."""
        n2 = self.tensor(TTensor("grad_norm2", (1,)))
        for k, acc in enumerate(accs):
            self.op("GRAD_NORM2", "BATCH_END", [acc, n2], [int(k == 0)], source="clip_grad")
        for k, acc in enumerate(accs):
            self.op("GRAD_CLIP", "BATCH_END", [n2, acc], [f32_bits(self.clip_grad), int(k == len(accs) - 1)],
                    source="clip_grad")

    def needs_grad(self, name):
        """Whether value `name` (or the value it is a view of) lies downstream of a trainable parameter."""
        while name is not None:
            if name in self.needs:
                return True
            name = self.g.values[name].view_of
        return False

    def forward(self, n):
        ins = [self.value_tensor(i) if i else None for i in n.inputs]
        self.fwd[n.output] = rule_for(n).forward(self, n, ins, self.value_tensor(n.output))

    def backward(self, n):
        if n.output in self.grad:
            ins = [self.value_tensor(i) if i else None for i in n.inputs]
            rule_for(n).backward(self, n, ins, self.grad[n.output])

    def wants(self, name):
        """Whether input `name` of a node needs a gradient (a trainable parameter lies upstream)."""
        return name in self.needs

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

    # ---- in place ----
    def root(self, i):
        while self.tensors[i].view_of is not None:
            i = self.tensors[i].view_of
        return i

    def inplace(self):
        """Let an op write over an input that nothing reads afterwards. A 1x1 conv run in place
        keeps its whole input's memory alive as long as its smaller output: each candidate is
        kept only if it lowers the peak of live arena bytes (tried in op order)."""
        chosen, best = set(), None
        for k in [None] + self.pointwise_candidates():
            trial = chosen | ({k} if k is not None else set())
            peak = self.live_peak_with(trial)
            if best is None or peak < best:
                chosen, best = trial, peak
        self.in_place(chosen)

    def live_peak_with(self, pointwise):
        """The peak of live arena bytes if the ops in place were chosen with these 1x1 convs."""
        views, ops, n = [t.view_of for t in self.tensors], [(o.name, list(o.slots)) for o in self.ops], len(self.tensors)
        self.in_place(pointwise)
        first, last = lifetimes(len(self.tensors), op_slots(self.ops))
        live = [0] * len(self.ops)
        spans = {}
        for i, t in enumerate(self.tensors):
            r = self.root(i)
            if self.tensors[r].storage == "ARENA" and first[i] >= 0:
                f, l = spans.get(r, (first[i], last[i]))
                spans[r] = (min(f, first[i]), max(l, last[i]))
        for r, (f, l) in spans.items():
            for k in range(f, l + 1):
                live[k] += -(-self.tensors[r].nbytes // F.ALIGN) * F.ALIGN
        del self.tensors[n:]
        for t, v in zip(self.tensors, views):
            t.view_of = v
        for o, (name, slots) in zip(self.ops, ops):
            o.name, o.slots = name, slots
        return max(live, default=0)

    def last_reads(self):
        last = {}
        for k, o in enumerate(self.ops):
            for s in o.slots:
                if s is not None:
                    r = self.root(s)
                    last[r] = max(last.get(r, -1), k)
        return last

    def in_place(self, pointwise=()):
        last = self.last_reads()
        self.depthwise_in_place(last)
        self.pointwise_in_place(last, pointwise)
        for k, o in enumerate(self.ops):
            for out_name, in_name in o.spec.inplace:
                out, src = o.slots[o.spec.slot_index(out_name)], o.slots[o.spec.slot_index(in_name)]
                to, ts = self.tensors[out], self.tensors[src]
                ro, rs = self.root(out), self.root(src)
                # src may be the head of its root (a 1x1 conv's output in place): views start at
                # their root's offset
                if (to.view_of is not None or ro == rs or ts.storage != "ARENA" or self.tensors[rs].storage != "ARENA"
                        or to.nbytes != ts.nbytes or to.nbytes > self.tensors[rs].nbytes or last.get(rs, -1) != k):
                    continue
                to.view_of = rs
                last[rs] = max(last.get(rs, -1), last.pop(ro, -1))
                break

    def pointwise_candidates(self):
        """The 1x1 CONV2Ds (groups 1, stride 1, no padding) with O <= C outputs whose input
        nothing reads after them."""
        last, out = self.last_reads(), []
        for k, o in enumerate(self.ops):
            if o.name != "CONV2D" or o.attrs != [1, 1, 0, 0, 0, 0, 1, 1, 1]:
                continue
            tw, rs, to = self.tensors[o.slots[1]], self.root(o.slots[0]), self.tensors[o.slots[3]]
            if (tw.shape[2:] == (1, 1) and tw.shape[0] <= tw.shape[1] and last.get(rs) == k and to.view_of is None
                    and self.tensors[rs].storage == "ARENA" and self.tensors[rs].dtype == "F32"):
                out.append(k)
        return out

    def pointwise_in_place(self, last, chosen):
        """Each chosen 1x1 CONV2D becomes CONV2D_PW_INPLACE: its output over the first O planes of
        its input, through a scratch of C floats (one pixel of the input)."""
        for k in sorted(chosen):
            o = self.ops[k]
            x, out = o.slots[0], o.slots[3]
            rs = self.root(x)
            s = self.tensor(TTensor("%s@pixel" % self.tensors[out].name, (self.tensors[o.slots[1]].shape[1],)))
            o.name, o.slots = "CONV2D_PW_INPLACE", o.slots[:3] + [s, out]
            self.tensors[out].view_of = rs
            last[rs] = max(last.get(rs, -1), last.pop(out, -1))

    def depthwise_in_place(self, last):
        """A depthwise CONV2D whose input nothing reads after it (its weight frozen, and the input's
        producer's backward reading a mask or nothing) becomes CONV2D_DW_INPLACE (a CONV2D_Q8,
        CONV2D_Q8_DW_INPLACE; a CONV2D_BWD_INPUT, CONV2D_BWD_INPUT_DW_INPLACE), with one input
        plane of scratch, so that its output can take the input's memory: one activation fewer
        alive in the forward of a MobileNet block (docs/sparse.md)."""
        groups = F.CONV_ATTRS.index("groups")
        for k, o in enumerate(self.ops):
            if o.name == "CONV2D":   # x w b y
                src, w, out = o.slots[0], o.slots[1], o.slots[3]
            elif o.name == "CONV2D_BWD_INPUT":   # dy w dx: the scratch holds a dy plane
                src, w, out = o.slots[0], o.slots[1], o.slots[2]
            elif o.name == "CONV2D_Q8":   # x w b mult shift y, int8
                src, w, out = o.slots[0], o.slots[1], o.slots[5]
            else:
                continue
            ts, tw, to, rs = self.tensors[src], self.tensors[w], self.tensors[out], self.root(src)
            C = tw.shape[0]
            if (o.attrs[groups] != C or tw.shape[1] != 1 or last.get(rs) != k or to.view_of is not None
                    or self.tensors[rs].storage != "ARENA" or to.nbytes != self.tensors[rs].nbytes):
                continue
            plane = (int(np.prod(ts.shape[2:])),)
            if o.name == "CONV2D":
                s = self.tensor(TTensor("%s@plane" % to.name, plane))
                o.name, o.slots = "CONV2D_DW_INPLACE", o.slots[:3] + [s, out]
            elif o.name == "CONV2D_Q8":
                s = self.tensor(TTensor("%s@plane" % to.name, plane, dtype="I8"))
                o.name, o.slots = "CONV2D_Q8_DW_INPLACE", o.slots[:5] + [s, out]
            else:
                s = self.tensor(TTensor("%s@plane" % to.name, plane))
                o.name, o.slots = "CONV2D_BWD_INPUT_DW_INPLACE", o.slots[:2] + [s, out]


# ---- rules: how each IR op trains ----------------------------------------------------------
# One rule per IR op holds its forward op and its backward ops together (as micrograd keeps an
# op's forward and _backward): forward(b, n, ins, y) emits the forward op and returns it;
# backward(b, n, ins, dy) emits what the gradient dy of the output needs and hands each input's
# gradient to b.contribute(). ins are tensor indices of n.inputs (None where absent); b is the
# Builder. Adding an op is one rule here and one handler in onnx_import.py.

RULES = {}


def rule(*ir_ops):
    def register(cls):
        for op in ir_ops:
            RULES[op] = cls()
        return cls
    return register


def rule_for(n):
    if n.op not in RULES:
        raise InternalError("internal error: no training rule for IR op %r (ONNX node '%s')" % (n.op, n.onnx_name))
    return RULES[n.op]


@rule("conv", "gemm")
class Layer:
    """y = conv(x, W) + b, or y = x W^T + b: the bias gradient, the input gradient (before the
    weight's update: it must see the weight the forward used), then the weight gradient, each
    fused with its parameter's update."""

    @staticmethod
    def attrs(n):
        return [n.attrs[k] for k in F.CONV_ATTRS] if n.op == "conv" else [n.attrs["w_layout"]]

    def forward(self, b, n, ins, y):
        w = b.tensors[ins[1]]
        if n.op == "conv":
            ys = b.tensors[y].shape
            macs = ys[1] * ys[2] * ys[3] * int(np.prod(w.shape[1:]))
            if len(ins) > 3:   # y = acc + conv(x, W), no bias (split.py)
                return b.op("CONV2D_ACC", "FORWARD", [ins[0], ins[1], ins[3], y], self.attrs(n), n.onnx_name, macs)
            return b.op("CONV2D", "FORWARD", ins + [y], self.attrs(n), n.onnx_name, macs)
        return b.op("GEMM", "FORWARD", ins + [y], self.attrs(n), n.onnx_name, w.nbytes // 4)

    def backward(self, b, n, ins, dy):
        conv = n.op == "conv"
        w = b.tensors[ins[1]]
        macs = b.fwd[n.output].macs
        x = n.inputs[0]
        if len(n.inputs) > 3:   # y = acc + conv: acc's gradient is dy
            b.contribute(n.inputs[3], dy)
        if n.bias() in b.trainable:   # first: the input gradient may then take dy's memory (in place)
            b.op("BIAS_BWD", "TRAIN", [dy, ins[2]] + b.sink(n.bias()), [0, b.tensors[ins[2]].shape[0]], n.onnx_name)
        if b.wants(x):
            dx = b.grad_tensor(x, ins[0])
            b.op("CONV2D_BWD_INPUT" if conv else "GEMM_BWD_INPUT", "TRAIN", [dy, ins[1], dx], self.attrs(n),
                 n.onnx_name, macs)
            b.contribute(x, dx)
        if n.weight() in b.trainable:
            if conv:
                O, K = w.shape[0], w.shape[1]
            else:
                O, K = (w.shape[0], w.shape[1]) if n.attrs["w_layout"] == F.W_LAYOUT_OUT_IN else (w.shape[1], w.shape[0])
            name = "CONV2D_BWD_WEIGHT" if conv else "GEMM_BWD_WEIGHT"
            if n.weight() not in b.channels:
                b.op(name, "TRAIN", [dy, ins[0], ins[1]] + b.sink(n.weight()), self.attrs(n) + [0, O, 0, K],
                     n.onnx_name, macs)
            for o0, oc, k0, kc in self.runs(b, n, O, K):   # a channel-sparse weight: one op per channel run
                taps = list(w.shape[2:]) if conv else []
                shape = [oc, kc] + taps if conv or n.attrs["w_layout"] == F.W_LAYOUT_OUT_IN else [kc, oc]
                label = "[%d:%d]" % ((o0, o0 + oc) if oc != O else (k0, k0 + kc))
                b.op(name, "TRAIN", [dy, ins[0], ins[1]] + b.sink(n.weight(), (label, shape)),
                     self.attrs(n) + [o0, oc, k0, kc], n.onnx_name, macs * oc * kc // (O * K))


    @staticmethod
    def runs(b, n, O, K):
        """(o_begin, o_count, i_begin, i_count) per contiguous run of a channel-sparse weight's
        channels (axis 0: output channels, also a depthwise conv's; axis 1: input channels)."""
        if n.weight() not in b.channels:
            return []
        from .schemes import channel_runs
        axis, chans = b.channels[n.weight()]
        return [(c0, cn, 0, K) if axis == 0 else (0, O, c0, cn) for c0, cn in channel_runs(chans)]


@rule("clip")
class Clip:
    """y = min(max(x, lo), hi) (ReLU, ReLU6): dx = dy where lo < y < hi, read from y."""

    @staticmethod
    def attrs(n):
        return [f32_bits(n.attrs["lo"]), f32_bits(n.attrs["hi"])]

    def forward(self, b, n, ins, y):
        op = b.op("CLIP", "FORWARD", [ins[0], y], self.attrs(n), n.onnx_name)
        lo, hi = n.attrs["lo"], n.attrs["hi"]
        if b.saved == "bits" and b.wants(n.inputs[0]) and self.only_clip_bwd_reads(b, n.output):
            # the backward needs only where lo < y < hi: one bit per element lets the float y go
            # after its forward readers, and the gradient stays exactly CLIP_BWD's
            t = b.tensors[y]
            m = b.tensor(TTensor(n.output + "@mask", (-(-int(np.prod(t.shape)) // 8),), dtype="U8"))
            b.op("MASK_PACK", "FORWARD", [y, m], self.attrs(n), n.onnx_name)
            b.saved_mask[n.output] = m
        elif b.saved == "int8" and b.wants(n.inputs[0]) and lo == 0 and math.isfinite(hi) and hi > 0 \
                and self.only_clip_bwd_reads(b, n.output):
            # the backward needs only where 0 < y < hi: an int8 copy, 0 -> -128 and hi -> 127, lets the
            # float y go after its forward readers (MIT saves int8 outputs too); y within half a step of
            # 0 or hi then counts as clamped (the fake-quantized model's gradient, docs/sparse.md)
            t = b.tensors[y]
            q = b.tensor(TTensor(n.output + "@int8", t.shape, dtype="I8", onnx_shape=t.onnx_shape,
                                 quant=Quant(np.float32(hi / 255.0), -128)))
            b.op("QUANTIZE", "FORWARD", [y, q], [], n.onnx_name)
            b.saved_q[n.output] = q
        return op

    @staticmethod
    def only_clip_bwd_reads(b, name):
        """Whether the backward reads value `name` only for this Clip's mask: every reader is a
        layer whose weight does not train (its backward reads dy and the weight, not x) or the
        gather of a split weight's channels (split.py: the weight gradient reads its copy)."""
        users = b.g.consumers(name)
        return bool(users) and all(u.op == "gather" or (u.op in ("conv", "gemm") and u.inputs[0] == name
                                                        and u.weight() not in b.trainable) for u in users)

    def backward(self, b, n, ins, dy):
        x = n.inputs[0]
        if b.wants(x):
            dx = b.grad_tensor(x, ins[0])
            if n.output in b.saved_mask:
                b.op("MASK_BWD", "TRAIN", [b.saved_mask[n.output], dy, dx], [], n.onnx_name)
            elif n.output in b.saved_q:
                b.op("CLIP_BWD_Q8", "TRAIN", [b.saved_q[n.output], dy, dx], [-128, 127], n.onnx_name)
            else:
                b.op("CLIP_BWD", "TRAIN", [b.index[n.output], dy, dx], self.attrs(n), n.onnx_name)
            b.contribute(x, dx)


@rule("maxpool", "avgpool", "gap")
class Pool:
    """Max, average and global average pooling; max pooling's backward reads x for the argmax."""

    @staticmethod
    def attrs(n):
        return [n.attrs[k] for k in F.POOL_ATTRS] if n.op != "gap" else []

    def forward(self, b, n, ins, y):
        return b.op(n.op.upper(), "FORWARD", [ins[0], y], self.attrs(n), n.onnx_name)

    def backward(self, b, n, ins, dy):
        x = n.inputs[0]
        if b.wants(x):
            dx = b.grad_tensor(x, ins[0])
            b.op(n.op.upper() + "_BWD", "TRAIN", [ins[0], dy, dx] if n.op == "maxpool" else [dy, dx], self.attrs(n),
                 n.onnx_name)
            b.contribute(x, dx)


@rule("add")
class Add:
    """y = a + b (residual): both inputs get dy itself."""

    def forward(self, b, n, ins, y):
        return b.op("ADD", "FORWARD", [ins[0], ins[1], y], [], n.onnx_name)

    def backward(self, b, n, ins, dy):
        for name in n.inputs:
            b.contribute(name, dy)


@rule("act")
class Act:
    """Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu (format.py ACT_KINDS): the backward reads
    the saved output for Sigmoid and Tanh, the input for the others, which the memory plan then
    keeps alive (and the forward does not overwrite it in place)."""

    @staticmethod
    def attrs(n):
        return [F.ACT_KINDS[n.attrs["kind"]], f32_bits(n.attrs.get("alpha", 0.0)), f32_bits(n.attrs.get("beta", 0.0))]

    def forward(self, b, n, ins, y):
        return b.op("ACT", "FORWARD", [ins[0], y], self.attrs(n), n.onnx_name)

    def backward(self, b, n, ins, dy):
        x = n.inputs[0]
        if b.wants(x):
            dx = b.grad_tensor(x, ins[0])
            v = b.index[n.output] if n.attrs["kind"] in F.ACT_READS_Y else ins[0]
            b.op("ACT_BWD", "TRAIN", [v, dy, dx], self.attrs(n), n.onnx_name)
            b.contribute(x, dx)


@rule("mul")
class Mul:
    """y = a * b, b of a's size or per channel (squeeze-and-excitation): da = dy * b, and db =
    dy * a, summed over each channel when b is per channel."""

    def forward(self, b, n, ins, y):
        return b.op("MUL", "FORWARD", [ins[0], ins[1], y], [], n.onnx_name)

    def backward(self, b, n, ins, dy):
        a_name, b_name = n.inputs[0], n.inputs[1]
        if b.wants(a_name):
            da = b.grad_tensor(a_name, ins[0])
            b.op("MUL", "TRAIN", [dy, ins[1], da], [], n.onnx_name)
            b.contribute(a_name, da)
        if b.wants(b_name):
            db = b.grad_tensor(b_name, ins[1])
            same = b.tensors[ins[1]].nbytes == b.tensors[ins[0]].nbytes
            b.op("MUL" if same else "MUL_BWD_CHANNEL", "TRAIN", [dy, ins[0], db], [], n.onnx_name)
            b.contribute(b_name, db)


@rule("affine")
class Affine:
    """y = x * s + t per channel with constant s and t (a BatchNormalization that cannot be folded,
    Mul/Add/Sub/Div by a constant): dx = dy * s."""

    def forward(self, b, n, ins, y):
        return b.op("AFFINE", "FORWARD", [ins[0], ins[1], ins[2], y], [], n.onnx_name)

    def backward(self, b, n, ins, dy):
        x = n.inputs[0]
        if b.wants(x):
            dx = b.grad_tensor(x, ins[0])
            b.op("MUL", "TRAIN", [dy, ins[1], dx], [], n.onnx_name)
            b.contribute(x, dx)


@rule("concat")
class Concat:
    """y = [a, b, ...] (2 to 4 inputs) along the channels, one after the other in memory: each
    input's gradient is its slice of dy."""

    def forward(self, b, n, ins, y):
        return b.op("CONCAT", "FORWARD", list(ins) + [None] * (4 - len(ins)) + [y], [], n.onnx_name)

    def backward(self, b, n, ins, dy):
        begin = 0
        for name, t in zip(n.inputs, ins):
            if b.wants(name):
                d = b.grad_tensor(name, t)
                b.op("SLICE", "TRAIN", [dy, d], [begin], n.onnx_name)
                b.contribute(name, d)
            begin += b.tensors[t].nbytes // 4


@rule("gather")
class Gather:
    """y = the channels idx of x (split.py); x's gradient is dy in those channels, 0 elsewhere."""

    def forward(self, b, n, ins, y):
        return b.op("GATHER_CH", "FORWARD", [ins[0], ins[1], y], [], n.onnx_name)

    def backward(self, b, n, ins, dy):
        x = n.inputs[0]
        if not b.wants(x):
            return
        dx = b.grad_tensor(x, ins[0])
        if x in b.grad and b.g.values[x].view_of is None:   # the frozen part's gradient: add into it
            b.op("SCATTER_ACC_CH", "TRAIN", [dy, ins[1], b.grad[x], dx], [], n.onnx_name)
            b.grad[x] = dx
        else:
            b.op("SCATTER_CH", "TRAIN", [dy, ins[1], dx], [], n.onnx_name)
            b.contribute(x, dx)


@rule("scatter_acc")
class ScatterAcc:
    """y = acc, y[idx[k]] += t[k] (a depthwise weight's trained channels, split.py): acc's
    gradient is dy, t's the channels idx of dy."""

    def forward(self, b, n, ins, y):
        return b.op("SCATTER_ACC_CH", "FORWARD", [ins[0], ins[1], ins[2], y], [], n.onnx_name)

    def backward(self, b, n, ins, dy):
        t = n.inputs[0]
        if b.wants(t):
            dt = b.grad_tensor(t, ins[0])
            b.op("GATHER_CH", "TRAIN", [dy, ins[1], dt], [], n.onnx_name)
            b.contribute(t, dt)
        b.contribute(n.inputs[2], dy)


class Q8Rule:
    """The int8 ops of a lowered frozen part (q8_rules.py): forward, and the float gradient
    through them where a trainable layer lies upstream."""

    def __init__(self, op):
        self.op = op

    def forward(self, b, n, ins, y):
        return q8_rules.FORWARD[self.op](b, n, ins, y)

    def backward(self, b, n, ins, dy):
        if self.op in q8_rules.BACKWARD:
            q8_rules.BACKWARD[self.op](b, n, dy, ins)


RULES.update((op, Q8Rule(op)) for op in q8_rules.FORWARD)


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


def build_training(graph, trainable, loss, batch, momentum, inplace=True, clip_grad=None, channels=None,
                   saved="float32", input_in_place=False):
    """(tensors, ops) of the training step (the forward ops alone when nothing trains).
    inplace=False gives every value its own tensor memory; clip_grad: the largest L2 norm of
    the batch's gradient over all trainable parameters, or None; channels: {weight: (axis,
    channels)} for weights that train on some channels only (schemes.py); saved: "int8" keeps
    ReLU6 outputs for the backward as int8, "bits" keeps Clip masks as 1 bit each (Clip rule);
    input_in_place: the input tensor is the caller's sample, read where it is (storage INPUT)."""
    if not math.isfinite(momentum) or not 0 <= momentum < 1:
        raise ValueError("momentum must be in [0, 1), got %r" % momentum)
    return Builder(graph, trainable, loss, batch, momentum, inplace, clip_grad, channels, saved, input_in_place).build()
