"""int8: post-training quantization of a float model, and the lowering of a quantized
graph (from PTQ or an imported QDQ model) to the core's int8 ops.

Both sources end as the same annotations on the float IR graph (ir.Graph):
  graph.quant    {activation value: ir.Quant}   where the model rounds an activation to int8
  graph.wquant   {weight parameter: ir.Quant}   int8 weights (symmetric, zero point 0)
and `lower` turns every frozen node whose inputs and output are annotated into an
int8 node (qconv, qgemm, qadd, qmaxpool, qavgpool, qgap) that reads and writes int8
values, with quantize / dequantize nodes where int8 and float meet. Nodes that need a
gradient (a trainable layer and everything after it) stay float32. docs/quantization.md
tells the whole story; the requantization numbers are TFLite's (QuantizeMultiplier).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .ir import Graph, Node, Quant, Value

QMIN, QMAX = -128, 127
INT8_OPS = ("conv", "gemm", "add", "maxpool", "avgpool", "gap")   # float ops with an int8 form
FUSABLE = ("conv", "gemm", "add")   # ops whose int8 form clamps its output: a Relu/Clip after them folds in
ADD_LEFT_SHIFT = 20                 # TFLite's int8 Add: inputs brought to 2^-20 of twice the larger scale
BIAS_MAX = 1 << 30                  # the core's bound on an int32 bias (mt_q8.h)


class QuantizeError(ValueError):
    """A quantized model (or a quantization request) microtrain cannot run as int8."""


# ---- fixed-point numbers, as TFLite computes them ----

def _round_away(v):
    """Round half away from zero (TfLiteRound, std::round)."""
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def quantize_multiplier(real):
    """(mult, shift) with real ~= mult * 2^(shift - 31): TFLite's QuantizeMultiplier."""
    if real == 0:
        return 0, 0
    if not math.isfinite(real) or real < 0:
        raise QuantizeError("requantization scale %r is not a positive number" % real)
    q, shift = math.frexp(real)
    q_fixed = _round_away(q * (1 << 31))
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        return (1 << 31) - 1, 30
    return int(q_fixed), int(shift)


def quant_of_range(lo, hi):
    """Per-tensor asymmetric int8 parameters covering [lo, hi] (and 0, so zero is exact)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise QuantizeError("activation range [%g, %g] is not finite" % (lo, hi))
    scale = (hi - lo) / (QMAX - QMIN) if hi > lo else 1.0
    scale = float(np.float32(scale))
    zp = int(np.clip(_round_away(QMIN - lo / scale), QMIN, QMAX))
    return Quant(scale, zp)


def weight_quant(w, axis=0):
    """Symmetric per-channel int8 weight parameters along `axis` (max |w| maps to 127)."""
    w = np.asarray(w, np.float32)
    other = tuple(i for i in range(w.ndim) if i != axis)
    m = np.abs(w).max(axis=other) if other else np.abs(w)
    scale = np.where(m > 0, m / 127.0, 1.0).astype(np.float32)
    return Quant(scale, np.zeros(scale.shape, np.int32), axis)


def quantize_weight(w, q):
    """The int8 values of float weights w under Quant q (zero point 0)."""
    shape = [1] * np.ndim(w)
    if q.axis is not None:
        shape[q.axis] = -1
    v = np.asarray(w, np.float64) / q.scale.astype(np.float64).reshape(shape)
    return np.clip(np.round(v), -128, 127).astype(np.int8)


def clamp_range(lo, hi, q):
    """A float clamp [lo, hi] (Relu, Clip) in the int8 domain of q, inside [-128, 127]."""
    s, zp = float(q.scale), int(q.zero_point)
    a = QMIN if lo == -math.inf else max(QMIN, min(QMAX, zp + _round_away(lo / s)))
    b = QMAX if hi == math.inf else max(QMIN, min(QMAX, zp + _round_away(hi / s)))
    return a, max(a, b)


# ---- the int8 lowering ----

SCOPES = ("prefix", "frozen")


class _Lowering:
    """scope "prefix": only what comes before the first trainable layer runs int8 (the rest float32,
    exactly as trained); "frozen": every frozen layer runs int8, also between trainable ones (the
    gradient then passes through int8 layers: q8_rules)."""

    def __init__(self, graph, trainable, input_dtype, scope="prefix"):
        if scope not in SCOPES:
            raise ValueError("unknown int8 scope %r; use one of %s" % (scope, ", ".join(SCOPES)))
        self.g = graph
        self.trainable = set(trainable)
        self.input_dtype = input_dtype
        self.values = {k: replace(v) for k, v in graph.values.items()}
        self.nodes = []
        self.int8 = {}        # float value name -> its int8 twin (a value of dtype I8)
        self.real = {}        # int8 value name -> its dequantized float twin
        self.notes = []
        self.consumers = {}
        for n in graph.nodes:
            for i in n.inputs:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.needs = self.downstream_of_trainable()
        # values computed in float32: a trainable layer's output, or everything it reaches (prefix)
        self.float_out = set(self.needs) if scope == "prefix" else \
            {n.output for n in graph.nodes if any(p in self.trainable for p in (n.weight(), n.bias()) if p)}

    def downstream_of_trainable(self):
        """Values whose computation involves a trainable parameter: they stay float32."""
        needs = set(self.trainable)
        for n in self.g.nodes:
            if any(i in needs or self.root(i) in needs for i in n.inputs if i):
                needs.add(n.output)
        return needs

    def root(self, name):
        while self.values[name].view_of is not None:
            name = self.values[name].view_of
        return name

    def quant(self, name):
        """The activation quantization of a value (or of the value it is a view of)."""
        if name in self.values and self.values[name].quant is not None and self.values[name].dtype == "I8":
            return self.values[name].quant
        q = self.g.quant.get(name)
        return q if q is not None else self.g.quant.get(self.root(name))

    # ---- value twins ----
    def is_int8(self, name):
        return self.values[self.root(name)].dtype == "I8"

    def q8(self, name):
        """The quantization of an int8 value (a view's is its source's)."""
        return self.values[self.root(name)].quant

    def as_int8(self, name):
        """An int8 value holding `name`: itself (or a view of an int8 value), its twin, or a new
        quantize node's output."""
        if self.is_int8(name):
            return name
        if name not in self.int8:
            v = self.values[name]
            own = self.g.quant.get(name)
            twin = name + "/int8"
            src = self.quant(v.view_of) if v.view_of is not None else None
            if src is not None and (own is None or own.key() == src.key()):
                base = self.as_int8(v.view_of)   # a view of the int8 source: the same bytes
                self.values[twin] = Value(twin, v.shape, v.onnx_shape, view_of=base, dtype="I8", quant=self.q8(base))
            else:
                self.values[twin] = Value(twin, v.shape, v.onnx_shape, dtype="I8", quant=self.quant(name))
                self.nodes.append(Node("quantize", [name], twin, {}, "quantize " + name))
            self.int8[name] = twin
        return self.int8[name]

    def as_float(self, name):
        """A float32 value holding `name`: itself, or its dequantized twin."""
        if not self.is_int8(name):
            return name
        if name not in self.real:
            v = self.values[name]
            twin = self.real[name] = name + "/real"
            self.values[twin] = Value(twin, v.shape, v.onnx_shape)
            self.nodes.append(Node("dequantize", [name], twin, {}, "dequantize " + name))
        return self.real[name]

    # ---- nodes ----
    def fused_clip(self, n):
        """The Relu/Clip that alone consumes n's output, if it can fold into n's int8 clamp."""
        users = self.consumers.get(n.output, [])
        if n.op in FUSABLE and len(users) == 1 and users[0].op == "clip" and n.output != self.g.output \
                and self.quant(n.output) is None and users[0].output not in self.float_out:
            return users[0]
        return None

    def int8_form(self, n):
        """(output value, clip folded in or None) if n runs as int8, else None."""
        if n.op not in INT8_OPS or n.output in self.float_out \
                or (n.op in ("conv", "gemm") and n.inputs[1] not in self.g.wquant):
            return None
        clip = self.fused_clip(n)
        out = clip.output if clip is not None else n.output
        acts = [n.inputs[0]] if n.op in ("conv", "gemm") else [i for i in n.inputs if i]
        if self.quant(out) is None or any(self.quant(i) is None for i in acts):
            return None
        return out, clip

    def refuse_if_quantized(self, n):
        """A frozen node the model quantizes (int8 inputs and output) that has no int8 form here."""
        clip = self.fused_clip(n)
        out = clip.output if clip is not None else n.output
        acts = [i for i in n.inputs if i and self.g.values[i].data is None]
        if not acts or out in self.float_out or self.quant(out) is None or any(self.quant(i) is None for i in acts):
            return
        if n.op in ("conv", "gemm") and n.inputs[1] not in self.g.wquant:
            return   # a float weight: the layer is float in the model too (nodes_to_exclude)
        why = "microtrain has no int8 kernel for %s" % n.op if n.op not in INT8_OPS else "it cannot run as int8"
        raise QuantizeError("node '%s' (%s) is quantized in the model (int8 inputs and output), but %s; microtrain "
                            "does not run it dequantized. Leave it out of the quantization (onnxruntime: "
                            "nodes_to_exclude=['%s'])" % (n.onnx_name, n.op, why, n.onnx_name))

    def run(self):
        skip = set()
        for n in self.g.nodes:
            if id(n) in skip:
                continue
            form = self.int8_form(n)
            if form is None:
                self.refuse_if_quantized(n)
                self.nodes.append(Node(n.op, [self.as_float(i) if i else i for i in n.inputs], n.output, dict(n.attrs),
                                       n.onnx_name, dict(n.parts)))
                continue
            out, clip = form
            if clip is not None:
                skip.add(id(clip))
            self.emit_int8(n, out, clip)
        out = self.as_float(self.g.output)
        for name, v in self.values.items():   # a view of an int8 value is int8 too
            if v.view_of is not None and self.is_int8(name):
                v.dtype, v.quant = "I8", self.values[self.root(name)].quant
        return out

    def emit_int8(self, n, out, clip):
        yq = self.quant(out)
        y = out
        self.values[out] = replace(self.values[out], dtype="I8", quant=yq)
        lo, hi = clamp_range(clip.attrs["lo"], clip.attrs["hi"], yq) if clip is not None else (QMIN, QMAX)
        name = n.onnx_name + ("+" + clip.onnx_name if clip is not None else "")
        if n.op in ("conv", "gemm"):
            x = self.as_int8(n.inputs[0])
            xq = self.q8(x)
            wname, bname = n.inputs[1], n.inputs[2] if len(n.inputs) > 2 else None
            wq = self.g.wquant[wname]
            W = self.values[wname].data
            qw = quantize_weight(W, wq)
            wv = self.const(wname + "/int8", qw, "I8", wq, like=wname)
            ws = wq.scale.astype(np.float32)
            bias_scale = np.float32(xq.scale) * ws                    # float32, as onnxruntime forms it
            O = W.shape[0] if n.op == "conv" or n.attrs["w_layout"] == 0 else W.shape[1]
            bias_scale = np.broadcast_to(bias_scale, (O,)).astype(np.float32)
            bv = None
            if bname:
                b = self.values[bname].data.astype(np.float64)
                qb = np.round(b / bias_scale.astype(np.float64))
                if np.abs(qb).max(initial=0) > BIAS_MAX:
                    raise QuantizeError("node '%s': a bias exceeds the int32 range the core allows (2^30) at scale "
                                        "input scale x weight scale" % n.onnx_name)
                bv = self.const(bname + "/int32", qb.astype(np.int32), "I32",
                                Quant(bias_scale, np.zeros(O, np.int32), 0), like=bname)
            real = bias_scale.astype(np.float64) / np.float64(yq.scale)
            mults, shifts = zip(*(quantize_multiplier(float(r)) for r in real))
            mv = self.const(n.output + "/mult", np.array(mults, np.int32), "I32", None)
            sv = self.const(n.output + "/shift", np.array(shifts, np.int32), "I32", None)
            attrs = dict(n.attrs, act_min=lo, act_max=hi)
            self.nodes.append(Node("q" + n.op, [x, wv, bv, mv, sv], y, attrs, name, dict(n.parts)))
        elif n.op == "add":
            a, b = self.as_int8(n.inputs[0]), self.as_int8(n.inputs[1])
            sa, sb, sy = float(self.q8(a).scale), float(self.q8(b).scale), float(yq.scale)
            twice = 2 * max(sa, sb)
            am, ash = quantize_multiplier(sa / twice)
            bm, bsh = quantize_multiplier(sb / twice)
            ym, ysh = quantize_multiplier(twice / ((1 << ADD_LEFT_SHIFT) * sy))
            attrs = dict(left_shift=ADD_LEFT_SHIFT, a_mult=am, a_shift=ash, b_mult=bm, b_shift=bsh, y_mult=ym,
                         y_shift=ysh, act_min=lo, act_max=hi)
            self.nodes.append(Node("qadd", [a, b], y, attrs, name))
        else:
            x = self.as_int8(n.inputs[0])
            xq = self.q8(x)
            attrs = dict(n.attrs)
            if n.op == "maxpool":
                if float(xq.scale) != float(yq.scale) or int(xq.zero_point) != int(yq.zero_point):
                    raise QuantizeError("node '%s' (MaxPool): int8 max pooling needs the same scale and zero point "
                                        "on its input and output" % n.onnx_name)
            elif n.op == "avgpool":   # a multiplier per window size: the mean rounds once
                taps = n.attrs["kernel_h"] * n.attrs["kernel_w"]
                m, s = zip(*(quantize_multiplier(float(xq.scale) / (float(yq.scale) * k)) for k in range(1, taps + 1)))
                ins = [x, self.const(n.output + "/mult", np.array(m, np.int32), "I32", None),
                       self.const(n.output + "/shift", np.array(s, np.int32), "I32", None)]
                self.nodes.append(Node("qavgpool", ins, y, attrs, name))
                return
            else:
                hw = int(np.prod(self.values[n.inputs[0]].shape[2:]))
                attrs["mult"], attrs["shift"] = quantize_multiplier(float(xq.scale) / (float(yq.scale) * hw))
            self.nodes.append(Node("q" + n.op, [x], y, attrs, name))

    def const(self, name, data, dtype, quant, like=None):
        onnx_shape = self.values[like].onnx_shape if like else data.shape
        self.values[name] = Value(name, data.shape, onnx_shape, data=data, dtype=dtype, quant=quant)
        return name


def lower(graph, trainable, input_dtype="F32", scope="prefix", fuse=True):
    """The int8 form of an annotated graph (graph.quant, graph.wquant): a new ir.Graph whose frozen
    annotated nodes are int8 nodes. With input_dtype I8 or U8 the plan takes its input as int8
    (or uint8) values of the input's quantization instead of float32. fuse: True streams int8 convs
    (q8_fuse.py, the same integers), "pwdw" only 1x1 convs into depthwise ones, False none."""
    if not graph.quant:
        return graph
    graph.quant = dict(graph.quant)
    for name, q in list(graph.quant.items()):   # a view's rounding is its source's, if that has none
        root = name
        while graph.values[root].view_of is not None:
            root = graph.values[root].view_of
        if root != name and root not in graph.quant:
            graph.quant[root] = q
    low = _Lowering(graph, trainable, input_dtype, scope)
    inp = graph.input
    if input_dtype != "F32":
        q = low.quant(inp)
        if q is None:
            raise QuantizeError("an int8 input needs the input's quantization (it comes from calibration or from the "
                                "model's QuantizeLinear on the input)")
        v = low.values[inp]
        v.dtype, v.quant = "I8", q
    out = low.run()
    dropped = sorted(v for v in graph.quant if v in low.float_out and low.values[v].dtype != "I8")
    notes = list(graph.notes)
    if dropped:
        notes.append("the trainable part runs in float32: the int8 rounding of %d value%s after the first trainable "
                     "layer is left out (%s)" % (len(dropped), "" if len(dropped) == 1 else "s",
                                                 ", ".join(dropped[:4]) + (", ..." if len(dropped) > 4 else "")))
    if fuse:
        from .q8_fuse import fuse_pwdw
        low.nodes = fuse_pwdw(low.nodes, low.values, trainable, keep=(inp, out), three=fuse is True)
        if fuse is True:
            from .q8_fuse import pipe_pairs
            pipe_pairs(low.nodes, low.values, keep=(inp, out))
    n_int8 = sum(1 for n in low.nodes if n.op.startswith("q") and n.op != "quantize")
    notes.append("int8: %d op%s run in int8 (%s)" % (n_int8, "" if n_int8 == 1 else "s",
                                                     graph.quant_source or "quantized"))
    n3, n2 = (sum(1 for n in low.nodes if n.op == op) for op in ("qcdp", "qpwdw"))
    if n3:
        notes.append("int8: %d of them (CONV_DW_PW_Q8) a conv, a depthwise conv and a 1x1 conv streamed row by "
                     "row: the first two outputs are never stored" % n3)
    if n2:
        notes.append("int8: %d of them (PWDW_Q8) a 1x1 conv streamed into the depthwise conv after it: the "
                     "expanded tensor is never stored" % n2)
    n_pipes = sum(1 for n in low.nodes if n.attrs.get("pipe_out"))
    if n_pipes:
        notes.append("int8: %d pair%s of them piped (CONV_DW_PW_Q8_TO_PIPE/_FROM_PIPE): the first's output is "
                     "made a row at a time as the second needs it, never stored" % (n_pipes, "" if n_pipes == 1 else "s"))
    new = Graph(low.values, low.nodes, inp, out, notes, graph.dropped_output_op, dict(graph.origins),
                graph.fingerprint)
    new.quant, new.wquant, new.quant_source = graph.quant, graph.wquant, graph.quant_source
    used = {inp, out}
    for n in new.nodes:
        used.update(i for i in n.inputs if i)
        used.add(n.output)
    for name in list(used):
        while new.values[name].view_of is not None:
            name = new.values[name].view_of
            used.add(name)
    new.values = {k: v for k, v in new.values.items() if k in used}
    return new


# ---- post-training quantization ----

def calibrate(graph, samples, build_plan):
    """{value name: (min, max)} of every activation over the calibration samples, from the float
    graph run by the C core (a forward-only plan where every tensor keeps its own memory, from
    build_plan: compiler.build_plan, which the compiler hands down, being above this pass)."""
    from .native import Core
    plan = build_plan(graph, set(), "cross-entropy", planner="naive")
    core = Core(plan.data)
    names = {i: t["name"] for i, t in enumerate(plan.tensors) if t["storage"] == "ARENA" and t["name"] in graph.values}
    lo = {n: math.inf for n in names.values()}
    hi = {n: -math.inf for n in names.values()}
    n_in = int(np.prod(graph.values[graph.input].shape))
    x = np.asarray(samples, np.float32)
    if x.ndim == 0 or x.size % n_in or len(x) == 0:
        raise QuantizeError("calibration samples of shape %s do not fit the model input %s (samples first)"
                            % (x.shape, graph.values[graph.input].onnx_shape))
    x = x.reshape(-1, n_in)
    if not np.isfinite(x).all():
        raise QuantizeError("calibration samples contain NaN or infinity")
    for s in x:
        core.predict(s)
        for i, name in names.items():
            a = core.array(i)
            lo[name] = min(lo[name], float(a.min()))
            hi[name] = max(hi[name], float(a.max()))
    return {n: (lo[n], hi[n]) for n in names.values()}


def ptq(graph, trainable, samples, build_plan, input_quant=None, scope="prefix"):
    """Annotate graph (in place) for int8: per-channel symmetric weights of the frozen layers, per-tensor
    asymmetric activations from the min/max over the calibration samples. input_quant (scale,
    zero_point) fixes the input's quantization instead of calibrating it."""
    ranges = calibrate(graph, samples, build_plan)
    low = _Lowering(graph, trainable, "F32", scope)   # its view of the graph: consumers, what stays float
    quant, wquant = {}, {}

    def act(name):
        name = low.root(name)
        if name not in quant:
            quant[name] = quant_of_range(*ranges[name])
        return quant[name]

    for n in graph.nodes:
        if n.op not in INT8_OPS or n.output in low.float_out:
            continue
        clip = low.fused_clip(n)
        out = clip.output if clip is not None else n.output
        for i in ([n.inputs[0]] if n.op in ("conv", "gemm") else [i for i in n.inputs if i]):
            act(i)
        if n.op == "maxpool" or n.op == "avgpool":
            quant[low.root(out)] = act(n.inputs[0])   # pooling keeps its input's scale (TFLite, onnxruntime)
        else:
            act(out)
        if n.op in ("conv", "gemm"):
            w = graph.values[n.inputs[1]].data
            axis = 0 if n.op == "conv" or n.attrs["w_layout"] == 0 else 1
            q = weight_quant(w, axis)
            b = n.inputs[2] if len(n.inputs) > 2 else None
            if b:   # a channel with tiny weights and a large bias: a coarser weight scale keeps the bias in int32
                need = np.abs(graph.values[b].data.astype(np.float64)) / (float(act(n.inputs[0]).scale) * (BIAS_MAX // 2))
                q = Quant(np.maximum(q.scale, need).astype(np.float32), q.zero_point, q.axis)
            wquant[n.inputs[1]] = q
    if input_quant is not None and graph.input in quant:
        quant[graph.input] = Quant(*input_quant)
    graph.quant, graph.wquant, graph.quant_source = quant, wquant, "post-training quantization, min/max calibration"
    return graph
