"""ONNX model -> microtrain graph (ir.Graph).

Folds what is fixed at compile time (constants, shape arithmetic, BatchNormalization
into the preceding layer, identity-like ops, reshapes as views), fuses MatMul+Add
into one fully connected layer, and refuses anything else, every unsupported node at
once. The Importer holds the state and the shared checks; each ONNX op type has one
handler function, registered with @handles (see "handlers" at the end): supporting a
new op is one handler here and one rule in training.py.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from . import export
from .ir import Graph, Node, Value

MIN_OPSET, MAX_OPSET = 13, 21
HANDLERS = {}   # ONNX op type -> handler(importer, node, inputs); see "handlers" below
NOTES = {}      # ONNX op type -> what of it is supported, for messages


def handles(op_type, note=None):
    """Register a function as the handler of an ONNX op type."""
    def register(f):
        HANDLERS[op_type] = f
        if note:
            NOTES[op_type] = note
        return f
    return register


def supported_ops():
    return ["%s (%s)" % (op, NOTES[op]) if op in NOTES else op for op in HANDLERS] + [
        "and any op whose inputs are all constants"]


# what to do instead, for ops people bring from MCU models
SUGGESTIONS = {
    "Transpose": "only weights may be transposed; keep activations in (N, C, H, W) order",
    "LSTM": "recurrent layers are not supported; a Conv1d over time often replaces them",
    "GRU": "recurrent layers are not supported; a Conv1d over time often replaces them",
    "RNN": "recurrent layers are not supported; a Conv1d over time often replaces them",
    "ConvTranspose": "not supported; upsample with Conv layers on the host side instead",
}


class UnsupportedModel(NotImplementedError):
    pass


def _where(node):
    return "ONNX node '%s' (%s)" % (node.name or node.output[0], node.op_type)


def load_model(model):
    """(ModelProto at an opset microtrain reads, notes, fingerprint of the model as given)
    from a path, bytes or ModelProto."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        try:
            model = onnx.load(model) if not isinstance(model, bytes) else onnx.load_from_string(model)
        except Exception as e:   # onnx raises several types for unreadable files
            raise ValueError("cannot read ONNX model %r: %s" % (model, e)) from e
    if not isinstance(model, onnx.ModelProto):
        raise TypeError("expected an ONNX file path or onnx.ModelProto, got %s" % type(model).__name__)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise ValueError("ONNX model declares no default-domain opset")
    if opset > MAX_OPSET:
        raise UnsupportedModel("ONNX opset %d is newer than microtrain reads (%d to %d); re-export with "
                               "opset_version=%d" % (opset, MIN_OPSET, MAX_OPSET, MAX_OPSET))
    notes = []
    fingerprint = export.fingerprint(model)
    if opset < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as e:
            raise UnsupportedModel("ONNX opset %d is older than %d and onnx's version converter failed: %s"
                                   % (opset, MIN_OPSET, e)) from e
        notes.append("converted from opset %d to %d with onnx.version_converter" % (opset, MIN_OPSET))
    return model, notes, fingerprint


def internal_shape(shape, what):
    """Per-sample internal shape for an ONNX activation shape (batch first)."""
    rank = len(shape)
    if rank == 2:
        return (1, int(shape[1]))
    if rank == 3:
        return (1, int(shape[1]), 1, int(shape[2]))
    if rank == 4:
        return (1,) + tuple(int(d) for d in shape[1:])
    raise UnsupportedModel("%s: activations must be 2-D (N,F), 3-D (N,C,L) or 4-D (N,C,H,W); got shape %s"
                           % (what, tuple(shape)))


class Importer:
    def __init__(self, model, loss):
        self.model = model
        self.loss = loss
        self.g = model.graph
        self.consts = {}      # name -> np.ndarray (ONNX values, any dtype)
        self.acts = {}        # name -> ONNX shape of an activation
        self.values = {}      # IR values
        self.nodes = []       # IR nodes
        self.producer = {}    # activation name -> IR node
        self.alias = {}       # ONNX name -> the name it stands for
        self.transposed = {}  # const name -> initializer it is the 2-D transpose of
        self.notes = []
        self.dropped = None
        self.uses = {}
        for n in self.g.node:
            for i in n.input:
                if i:
                    self.uses[i] = self.uses.get(i, 0) + 1
        for o in self.g.output:
            self.uses[o.name] = self.uses.get(o.name, 0) + 1
        self.param_uses = self.scan()
        self.origins = {}     # IR parameter -> {"init": ONNX initializer, "folds": [what changed its value]}

    def scan(self):
        """How many nodes that compute on activations read each initializer, directly or through
        a Transpose that is folded away (nodes that only compute constants are evaluated here and
        do not count: an Identity of an initializer, which is how the TorchScript exporter writes
        two parameters that happen to be equal, makes a copy, not a use)."""
        const = {t.name for t in self.g.initializer}
        source = {}
        uses = {}
        for n in self.g.node:
            ins = [i for i in n.input if i]
            if n.op_type in ("Constant", "Shape") or (all(i in const for i in ins)
                                                      and n.op_type not in ("Softmax", "LogSoftmax")) \
                    or (n.op_type == "CastLike" and ins and ins[0] in const):
                const.update(o for o in n.output if o)
                if n.op_type == "Transpose" and len(ins) == 1:
                    source[n.output[0]] = source.get(ins[0], ins[0])
                continue
            for i in ins:
                if i in const:
                    i = source.get(i, i)
                    uses[i] = uses.get(i, 0) + 1
        return uses

    @staticmethod
    def supported(node):
        return node.domain in ("", "ai.onnx") and node.op_type in HANDLERS

    @staticmethod
    def unsupported_message(bad):
        """Every node microtrain cannot run ({op: [node names]}), grouped by op type, with what to
        do where there is something to do, and the supported ops once."""
        n = sum(map(len, bad.values()))
        lines = ["the model has %d node%s microtrain does not support:" % (n, "" if n == 1 else "s")]
        for op, names in bad.items():
            shown = ", ".join("'%s'" % n for n in names[:6]) + (", ... (%d more)" % (len(names) - 6) if len(names) > 6 else "")
            hint = SUGGESTIONS.get(op.split(" ")[0])
            lines.append("  %s x%d: %s%s" % (op, len(names), shown, " (%s)" % hint if hint else ""))
        lines.append("microtrain supports: %s" % ", ".join(supported_ops()))
        return "\n".join(lines)

    # ---- helpers ----
    def r(self, name):
        while name in self.alias:
            name = self.alias[name]
        return name

    def is_const(self, name):
        return name in self.consts

    def const(self, node, name, what):
        name = self.r(name)
        if name not in self.consts:
            raise UnsupportedModel("%s: %s must be a constant (an initializer), not a computed tensor"
                                   % (_where(node), what))
        return self.consts[name]

    def act(self, node, name):
        name = self.r(name)
        if name not in self.acts:
            raise UnsupportedModel("%s: input '%s' must be an activation, but it is a constant"
                                   % (_where(node), name))
        return name

    def add_act(self, name, onnx_shape, what, view_of=None):
        shape = internal_shape(onnx_shape, what)
        self.acts[name] = tuple(int(d) for d in onnx_shape)
        self.values[name] = Value(name, shape, tuple(int(d) for d in onnx_shape), view_of=view_of)

    def param(self, name, data, onnx_shape, node=None, fold=None):
        """A float32 constant the IR keeps (weight, bias), in internal shape, named after the
        initializer `name` it comes from. Used as it is, it is one value however many layers use
        it (tied weights). Folded (fold says how: Gemm alpha, BatchNormalization, a broadcast),
        it keeps that name only if no other node uses the initializer; otherwise the folded copy
        gets a name of its own, so that the fold never leaks into the other uses."""
        ir = name
        if fold is not None and (self.param_uses.get(name, 0) > 1 or name in self.values):
            ir = base = "%s@%s" % (name, node.name or node.output[0])
            k = 1
            while ir in self.values:
                k += 1
                ir = "%s#%d" % (base, k)
        if ir not in self.values:
            self.values[ir] = Value(ir, data.shape, tuple(onnx_shape), data=np.ascontiguousarray(data, np.float32))
            self.origins[ir] = {"init": name, "folds": [fold] if fold else []}
        return ir

    def exclusive(self, ir):
        """Whether IR parameter `ir` may be changed in place: its initializer feeds one node only."""
        return ir is None or (self.param_uses.get(self.origins[ir]["init"], 0) <= 1
                              and sum(1 for n in self.nodes if ir in n.inputs) <= 1)

    def emit(self, op, inputs, output, attrs, node, onnx_shape):
        self.add_act(output, onnx_shape, _where(node))
        ir = Node(op, inputs, output, attrs, node.name or node.output[0])
        self.nodes.append(ir)
        self.producer[output] = ir
        return ir

    @staticmethod
    def attrs(node):
        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    # ---- driver ----
    def run(self):
        inits = {t.name for t in self.g.initializer}
        for t in self.g.initializer:
            self.consts[t.name] = numpy_helper.to_array(t)
        inputs = [i for i in self.g.input if i.name not in inits]
        if len(inputs) != 1:
            raise UnsupportedModel("the model must have exactly one input (besides initializers); it has %d: %s"
                                   % (len(inputs), [i.name for i in inputs]))
        inp = inputs[0]
        dims = inp.type.tensor_type.shape.dim
        shape = []
        for k, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            elif k == 0:
                shape.append(1)       # symbolic batch: compile for one sample
            else:
                raise UnsupportedModel("input '%s' dimension %d is symbolic (%s); export with fixed sizes"
                                       % (inp.name, k, d.dim_param or "?"))
        if inp.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            raise UnsupportedModel("input '%s' must be float32" % inp.name)
        self.batch = shape[0]
        self.add_act(inp.name, shape, "model input '%s'" % inp.name)
        self.input = inp.name
        # every unsupported node at once: past one, the nodes that depend on it are only checked
        # for support (their inputs are unknown), the others imported as usual
        bad, unknown = {}, set()
        for node in self.g.node:
            downstream = any(self.r(i) in unknown for i in node.input if i)
            if not self.supported(node) and (downstream or not self.computes_constant(node)):
                key = node.op_type if node.domain in ("", "ai.onnx") else "%s (domain '%s')" % (node.op_type,
                                                                                                 node.domain)
                bad.setdefault(key, []).append(node.name or node.output[0])
                unknown.update(node.output)
            elif downstream:
                unknown.update(node.output)
            else:
                self.visit(node)
        if bad:
            raise UnsupportedModel(self.unsupported_message(bad))
        if len(self.g.output) != 1:
            raise UnsupportedModel("the model must have exactly one output; it has %d" % len(self.g.output))
        out = self.r(self.g.output[0].name)
        if out not in self.acts:
            raise UnsupportedModel("the model output '%s' is a constant" % out)
        if out == self.input:
            raise UnsupportedModel("the model computes nothing: its output is its input")
        graph = Graph({}, self.nodes, self.input, out, self.notes, self.dropped)
        used = {self.input, out}
        for n in self.nodes:
            used.update(i for i in n.inputs if i)
            used.add(n.output)
        for name in list(used):           # views keep their source alive
            v = self.values[name]
            while v.view_of is not None:
                used.add(v.view_of)
                v = self.values[v.view_of]
        graph.values = {k: v for k, v in self.values.items() if k in used}
        graph.origins = {k: o for k, o in self.origins.items() if k in used}
        return graph

    def computes_constant(self, node):
        """Whether the node only computes a constant (evaluated here, whatever its op)."""
        ins = [self.r(i) for i in node.input if i]
        return (node.op_type in ("Constant", "Shape") or (all(i in self.consts for i in ins)
                                                         and node.op_type not in ("Softmax", "LogSoftmax")))

    def visit(self, node):
        ins = [self.r(i) if i else "" for i in node.input]
        if node.op_type == "Constant":
            from onnx.reference import ReferenceEvaluator
            self.consts[node.output[0]] = ReferenceEvaluator(node).run(None, {})[0]
            return
        if node.op_type == "Shape" and ins[0] in self.acts:
            a = self.attrs(node)
            full = np.array(self.acts[ins[0]], dtype=np.int64)
            self.consts[node.output[0]] = full[a.get("start", 0):a.get("end", len(full))]
            return
        if all(i == "" or i in self.consts for i in ins) and node.op_type not in ("Softmax", "LogSoftmax"):
            self.fold(node, ins)
            return
        HANDLERS[node.op_type](self, node, ins)   # run() checked that there is one

    def fold(self, node, ins):
        """Evaluate a node whose inputs are all constants, with onnx.reference."""
        from onnx.reference import ReferenceEvaluator
        feeds = {n: self.consts[n] for n in ins if n}
        renamed = onnx.helper.make_node(node.op_type, [i for i in ins], list(node.output),
                                        domain=node.domain)
        renamed.attribute.extend(node.attribute)
        try:
            outs = ReferenceEvaluator(renamed).run(None, feeds)
        except Exception as e:
            raise UnsupportedModel("%s: could not fold this constant computation: %s" % (_where(node), e)) from e
        for name, val in zip(node.output, outs):
            if name:
                self.consts[name] = np.asarray(val)
        if node.op_type == "Transpose" and ins[0] in {t.name for t in self.g.initializer} \
                and self.consts[ins[0]].ndim == 2:
            self.transposed[node.output[0]] = ins[0]

    def pads(self, node, a, spatial, k, strides, dil):
        sd = len(spatial)
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto in ("NOTSET", ""):
            pads = list(a.get("pads", [0] * 2 * sd))
        elif auto == "VALID":
            pads = [0] * 2 * sd
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            pads = [0] * 2 * sd
            for i in range(sd):
                out = -(-spatial[i] // strides[i])
                total = max(0, (out - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 - spatial[i])
                small, big = total // 2, total - total // 2
                pads[i], pads[i + sd] = (small, big) if auto == "SAME_UPPER" else (big, small)
        else:
            raise UnsupportedModel("%s: auto_pad %s is not supported" % (_where(node), auto))
        if any(p < 0 for p in pads):
            raise UnsupportedModel("%s: negative pads %s" % (_where(node), pads))
        return pads

    @staticmethod
    def extent(node, size, p0, p1, k, dil, stride, ceil):
        eff = dil * (k - 1) + 1
        span = size + p0 + p1 - eff
        if span < (1 - stride if ceil else 0):   # ceil_mode: a window may hang past the padded input
            raise UnsupportedModel("%s: window %d is larger than the padded input %d" % (_where(node), eff, size + p0 + p1))
        out = (-(-span // stride) if ceil else span // stride) + 1
        if ceil and (out - 1) * stride >= size + p0:   # PyTorch: the last window must start inside the input or left pad
            out -= 1
        return out

    def bias_param(self, node, name, C, O, out_rank=2, fold=None):
        """C broadcast onto a layer output (N, O, ...) of rank out_rank must vary along O only."""
        full = (1,) * (out_rank - C.ndim) + tuple(C.shape) if C.ndim <= out_rank else None
        if full is None or any(d != 1 for i, d in enumerate(full) if i != 1):
            raise UnsupportedModel("%s: bias of shape %s does not broadcast per output channel onto an output of "
                                   "rank %d with %d channels" % (_where(node), C.shape, out_rank, O))
        if C.size == O:
            return self.param(name, C.reshape(O), C.shape, node, fold)
        if C.size == 1:
            self.notes.append("%s: scalar bias broadcast to %d outputs" % (_where(node), O))
            return self.param(name, np.full(O, C.reshape(()), np.float32), (O,), node,
                              "broadcast to %d" % O + (", " + fold if fold else ""))
        raise UnsupportedModel("%s: bias of shape %s does not broadcast per output (%d)" % (_where(node), C.shape, O))

    def pool(self, node, ins, op):
        x = self.act(node, ins[0])
        xs = self.acts[x]
        if len(xs) not in (3, 4):
            raise UnsupportedModel("%s: only 1-D and 2-D pooling is supported (input %s)" % (_where(node), xs))
        if len(node.output) > 1 and node.output[1]:
            raise UnsupportedModel("%s: the Indices output is not supported" % _where(node))
        a = self.attrs(node)   # storage_order only orders Indices, so it is ignored
        sd = len(xs) - 2
        k = list(a["kernel_shape"])
        strides = list(a.get("strides", [1] * sd))
        dil = list(a.get("dilations", [1] * sd))
        spatial = list(xs[2:])
        pads = self.pads(node, a, spatial, k, strides, dil)
        ceil = bool(a.get("ceil_mode", 0))
        out_sp = [self.extent(node, spatial[i], pads[i], pads[i + sd], k[i], dil[i], strides[i], ceil)
                  for i in range(sd)]
        if sd == 1:
            k, strides, dil, pads = [1] + k, [1] + strides, [1] + dil, [0, pads[0], 0, pads[1]]
        attrs = dict(kernel_h=k[0], kernel_w=k[1], stride_h=strides[0], stride_w=strides[1], pad_t=pads[0],
                     pad_l=pads[1], pad_b=pads[2], pad_r=pads[3], dil_h=dil[0], dil_w=dil[1],
                     count_include_pad=int(a.get("count_include_pad", 0)) if op == "avgpool" else 0)
        self.emit(op, [x], node.output[0], attrs, node, [xs[0], xs[1]] + out_sp)

    def per_channel(self, node, x, C, what):
        """Constant C broadcast onto activation x (N, C, ...) as an internal vector: one value per
        channel when it varies along axis 1 only (or is a scalar), else one per element."""
        xs = self.acts[x]
        C = np.asarray(C, np.float32)
        if C.ndim > len(xs):
            raise UnsupportedModel("%s: %s of shape %s has more axes than the activation %s"
                                   % (_where(node), what, C.shape, xs))
        C = C.reshape((1,) * (len(xs) - C.ndim) + C.shape)
        if C.shape[0] != 1:
            raise UnsupportedModel("%s: %s of shape %s has a batch axis; microtrain runs one sample at a time, so "
                                   "a constant must be the same for every sample" % (_where(node), what, C.shape))
        try:
            full = np.broadcast_to(C, (1,) + tuple(xs[1:]))
        except ValueError:
            raise UnsupportedModel("%s: %s of shape %s does not broadcast onto the activation %s"
                                   % (_where(node), what, C.shape, xs)) from None
        per = full.reshape(full.shape[0], full.shape[1], -1)[0]
        if np.all(per == per[:, :1]):
            return np.ascontiguousarray(per[:, 0])
        return np.ascontiguousarray(full.reshape(-1))

    def affine(self, node, x, scale, shift, what):
        """y = x * scale + shift with constant scale and shift (frozen, per channel or per element):
        Mul, Add, Sub, Div by a constant, a BatchNormalization that cannot be folded."""
        s = self.per_channel(node, x, scale, what)
        t = self.per_channel(node, x, shift, what)
        if s.size != t.size:   # one per channel, the other per element: both per element
            n = max(s.size, t.size)
            C = self.acts[x][1]
            s, t = (np.repeat(v, n // C) if v.size != n else v for v in (s, t))
        out = node.output[0]
        names = []
        for v, part in ((s, "scale"), (t, "shift")):
            name = "%s/%s" % (out, part)
            self.values[name] = Value(name, v.shape, v.shape, data=np.ascontiguousarray(v, np.float32))
            names.append(name)
        self.emit("affine", [x] + names, out, {}, node, self.acts[x])

    def view(self, node, x, shape):
        """Output of a shape-only op (Flatten, Reshape, Squeeze, Unsqueeze): a view of x's memory."""
        shape = [int(d) for d in shape]
        if shape[0] != self.acts[x][0] or int(np.prod(shape)) != int(np.prod(self.acts[x])):
            raise UnsupportedModel("%s: reshaping %s to %s mixes samples of the batch; only reshapes that keep "
                                   "the batch axis first are supported" % (_where(node), self.acts[x], tuple(shape)))
        self.add_act(node.output[0], shape, _where(node), view_of=x)

    def squeeze_axes(self, node, ins, rank):
        a = self.attrs(node)
        axes = self.const(node, ins[1], "axes") if len(ins) > 1 and ins[1] else a.get("axes")
        return None if axes is None else [int(v) + rank if int(v) < 0 else int(v) for v in axes]


# ---- handlers: one per ONNX op type -------------------------------------------------------
# handler(imp, node, ins): ins are node.input with aliases resolved; the handler checks what
# it needs, then emits IR nodes (imp.emit), views (imp.view), parameters (imp.param) or
# aliases. Nodes whose inputs are all constants never reach a handler: they are evaluated.

# ---- layers ----


@handles("Conv")
def conv(imp, node, ins):
    x = imp.act(node, ins[0])
    W = imp.const(node, ins[1], "the Conv weight").astype(np.float32)
    B = imp.const(node, ins[2], "the Conv bias").astype(np.float32) if len(ins) > 2 and ins[2] else None
    xs = imp.acts[x]
    rank = len(xs)
    if rank not in (3, 4) or W.ndim != rank:
        raise UnsupportedModel("%s: only 1-D and 2-D convolutions are supported (input shape %s)"
                               % (_where(node), xs))
    a = imp.attrs(node)
    k = list(W.shape[2:])
    if list(a.get("kernel_shape", k)) != k:
        raise UnsupportedModel("%s: kernel_shape %s does not match the weight %s" % (_where(node), a["kernel_shape"], W.shape))
    groups = int(a.get("group", 1))
    sd = rank - 2
    strides = list(a.get("strides", [1] * sd))
    dil = list(a.get("dilations", [1] * sd))
    spatial = list(xs[2:])
    pads = imp.pads(node, a, spatial, k, strides, dil)
    C, O = xs[1], W.shape[0]
    if C % groups or O % groups or W.shape[1] * groups != C:
        raise UnsupportedModel("%s: weight %s does not fit input channels %d with group=%d"
                               % (_where(node), W.shape, C, groups))
    out_sp = [imp.extent(node, spatial[i], pads[i], pads[i + sd], k[i], dil[i], strides[i], False)
              for i in range(sd)]
    if sd == 1:   # 1-D runs as 2-D with H = 1
        W = W.reshape(W.shape[0], W.shape[1], 1, W.shape[2])
        strides, dil, pads = [1] + strides, [1] + dil, [0, pads[0], 0, pads[1]]
    wname = imp.param(ins[1], W, imp.consts[ins[1]].shape)
    bname = imp.param(ins[2], B, B.shape) if B is not None else None
    attrs = dict(stride_h=strides[0], stride_w=strides[1], pad_t=pads[0], pad_l=pads[1], pad_b=pads[2],
                 pad_r=pads[3], dil_h=dil[0], dil_w=dil[1], groups=groups)
    imp.emit("conv", [x, wname, bname], node.output[0], attrs, node, [xs[0], O] + out_sp)


@handles("Gemm")
def gemm(imp, node, ins):
    a = imp.attrs(node)
    if a.get("transA", 0):
        raise UnsupportedModel("%s: transA=1 is not supported" % _where(node))
    x = imp.act(node, ins[0])
    if len(imp.acts[x]) != 2:
        raise UnsupportedModel("%s: Gemm input must be 2-D (N, F); got %s. Flatten first." % (_where(node), imp.acts[x]))
    W = imp.const(node, ins[1], "the Gemm weight B").astype(np.float32)
    layout = 0 if a.get("transB", 0) else 1
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    if alpha != 1.0:
        W = W * np.float32(alpha)
    O = W.shape[0] if layout == 0 else W.shape[1]
    K = W.shape[1] if layout == 0 else W.shape[0]
    if K != imp.acts[x][1]:
        raise UnsupportedModel("%s: weight %s does not fit input %s" % (_where(node), W.shape, imp.acts[x]))
    bname = None
    if len(ins) > 2 and ins[2]:
        C = imp.const(node, ins[2], "the Gemm bias C").astype(np.float32)
        bname = imp.bias_param(node, ins[2], C * np.float32(beta), O, fold="beta=%g" % beta if beta != 1 else None)
        if beta != 1.0:
            imp.notes.append("%s: beta=%g folded into the bias %r" % (_where(node), beta, bname))
    wname = imp.param(ins[1], W, imp.consts[ins[1]].shape, node, "alpha=%g" % alpha if alpha != 1 else None)
    if alpha != 1.0:
        imp.notes.append("%s: alpha=%g folded into the weight %r" % (_where(node), alpha, wname))
    imp.emit("gemm", [x, wname, bname], node.output[0], {"w_layout": layout}, node, [imp.acts[x][0], O])


@handles("MatMul")
def mat_mul(imp, node, ins):
    x = imp.act(node, ins[0])
    if len(imp.acts[x]) != 2:
        raise UnsupportedModel("%s: MatMul input must be 2-D (N, F); got %s" % (_where(node), imp.acts[x]))
    if ins[1] in imp.transposed:             # MatMul(x, Transpose(W)) is Gemm with transB=1
        wsrc, layout = imp.transposed[ins[1]], 0
    else:
        wsrc, layout = ins[1], 1
    W = imp.const(node, wsrc, "the MatMul right-hand side").astype(np.float32)
    if W.ndim != 2:
        raise UnsupportedModel("%s: MatMul weight must be 2-D; got %s" % (_where(node), W.shape))
    O = W.shape[1] if layout == 1 else W.shape[0]
    K = W.shape[0] if layout == 1 else W.shape[1]
    if K != imp.acts[x][1]:
        raise UnsupportedModel("%s: weight %s does not fit input %s" % (_where(node), W.shape, imp.acts[x]))
    wname = imp.param(wsrc, W, W.shape)
    imp.emit("gemm", [x, wname, None], node.output[0], {"w_layout": layout}, node, [imp.acts[x][0], O])


@handles("Add")
def add(imp, node, ins):
    consts = [i for i in ins if i in imp.consts]
    if not consts:
        a, b = imp.act(node, ins[0]), imp.act(node, ins[1])
        if imp.acts[a] != imp.acts[b]:
            raise UnsupportedModel("%s: Add with broadcasting (%s + %s) is not supported; only equal shapes "
                                   "(residual connections)" % (_where(node), imp.acts[a], imp.acts[b]))
        imp.emit("add", [a, b], node.output[0], {}, node, imp.acts[a])
        return
    # a constant added to a bias-less layer's output is that layer's bias (MatMul + Add)
    x = [i for i in ins if i not in imp.consts][0]
    prod = imp.producer.get(x)
    C = imp.consts[consts[0]].astype(np.float32)
    O = imp.values[x].shape[1]
    if (prod is None or prod.op not in ("gemm", "conv") or prod.inputs[2] is not None or imp.uses.get(x, 0) != 1
            or (prod.op == "conv" and C.size not in (O, 1))):
        imp.affine(node, x, np.float32(1.0), C, "the added constant")
        return
    prod.inputs[2] = imp.bias_param(node, consts[0], C, O, len(imp.acts[x]))
    prod.parts.update(bias_add=node.name or node.output[0],
                      bias_input=node.input[[imp.r(i) for i in node.input].index(consts[0])])
    imp.alias[node.output[0]] = x


# ---- activations and pooling ----


@handles("Relu")
def relu(imp, node, ins):
    x = imp.act(node, ins[0])
    imp.emit("clip", [x], node.output[0], {"lo": 0.0, "hi": math.inf}, node, imp.acts[x])


@handles("Clip")
def clip(imp, node, ins):
    x = imp.act(node, ins[0])
    lo = float(imp.const(node, ins[1], "Clip min").reshape(())) if len(ins) > 1 and ins[1] else -math.inf
    hi = float(imp.const(node, ins[2], "Clip max").reshape(())) if len(ins) > 2 and ins[2] else math.inf
    if math.isnan(lo) or math.isnan(hi):
        raise UnsupportedModel("%s: Clip bounds must not be NaN" % _where(node))
    if lo > hi:   # ONNX: when min is greater than max, every output is max
        imp.notes.append("%s: min %g above max %g: every output is max" % (_where(node), lo, hi))
        lo = hi
    imp.emit("clip", [x], node.output[0], {"lo": lo, "hi": hi}, node, imp.acts[x])


def _activation(imp, node, ins, kind, alpha=0.0, beta=0.0):
    x = imp.act(node, ins[0])
    imp.emit("act", [x], node.output[0], {"kind": kind, "alpha": float(alpha), "beta": float(beta)}, node,
             imp.acts[x])


@handles("Sigmoid")
def sigmoid(imp, node, ins):
    _activation(imp, node, ins, "SIGMOID")


@handles("Tanh")
def tanh(imp, node, ins):
    _activation(imp, node, ins, "TANH")


@handles("HardSigmoid")
def hard_sigmoid(imp, node, ins):
    a = imp.attrs(node)
    _activation(imp, node, ins, "HARDSIGMOID", a.get("alpha", 0.2), a.get("beta", 0.5))


@handles("HardSwish")
def hard_swish(imp, node, ins):
    """x * HardSigmoid(x) with alpha 1/6, beta 0.5 (ONNX fixes them)."""
    _activation(imp, node, ins, "HARDSWISH", 1.0 / 6.0, 0.5)


@handles("LeakyRelu")
def leaky_relu(imp, node, ins):
    _activation(imp, node, ins, "LEAKYRELU", imp.attrs(node).get("alpha", 0.01))


@handles("Mul", note="of two activations of one shape, or one per channel; or by a constant")
def mul(imp, node, ins):
    consts = [i for i in ins if i in imp.consts]
    if consts:
        x = imp.act(node, [i for i in ins if i not in imp.consts][0])
        imp.affine(node, x, imp.consts[consts[0]], np.float32(0.0), "the constant factor")
        return
    a, b = imp.act(node, ins[0]), imp.act(node, ins[1])
    for x, h in ((a, b), (b, a)):
        # x * HardSigmoid(x) is HardSwish (how opset 13 exports it): one op, no gradient of h
        p = imp.producer.get(h)
        if p is not None and p.op == "act" and p.attrs["kind"] == "HARDSIGMOID" and p.inputs[0] == x \
                and imp.uses.get(h, 0) == 1 and h != imp.g.output[0].name:
            p.attrs["kind"] = "HARDSWISH"
            imp.alias[node.output[0]] = h
            imp.notes.append("%s: x * HardSigmoid(x) runs as one HardSwish" % _where(node))
            return
    sa, sb = imp.acts[a], imp.acts[b]
    if int(np.prod(sa)) < int(np.prod(sb)):   # the per-channel factor second
        a, b, sa, sb = b, a, sb, sa
    per_channel = len(sa) >= 3 and len(sb) == len(sa) and sb[:2] == sa[:2] and all(d == 1 for d in sb[2:])
    if sa != sb and not per_channel:
        raise UnsupportedModel("%s: Mul of %s and %s is not supported; the shapes must be equal, or one (N, C, 1, 1) "
                               "per channel of the other (squeeze-and-excitation)" % (_where(node), sa, sb))
    imp.emit("mul", [a, b], node.output[0], {}, node, sa)


@handles("Sub", note="of a constant, or from a constant")
def sub(imp, node, ins):
    if ins[1] in imp.consts and ins[0] not in imp.consts:     # x - c
        imp.affine(node, imp.act(node, ins[0]), np.float32(1.0), -imp.consts[ins[1]].astype(np.float32),
                   "the subtracted constant")
    elif ins[0] in imp.consts:                                 # c - x
        imp.affine(node, imp.act(node, ins[1]), np.float32(-1.0), imp.consts[ins[0]].astype(np.float32),
                   "the constant")
    else:
        raise UnsupportedModel("%s: Sub of two activations is not supported; only x - constant or constant - x"
                               % _where(node))


@handles("Div", note="by a constant")
def div(imp, node, ins):
    if ins[0] in imp.consts or ins[1] not in imp.consts:
        raise UnsupportedModel("%s: only division of an activation by a constant is supported" % _where(node))
    c = imp.consts[ins[1]].astype(np.float32)
    if np.any(c == 0) or not np.all(np.isfinite(c)):
        raise UnsupportedModel("%s: the divisor must be finite and non-zero" % _where(node))
    imp.affine(node, imp.act(node, ins[0]), (1.0 / c.astype(np.float64)).astype(np.float32), np.float32(0.0),
               "the divisor")


@handles("Concat", note="along channels")
def concat(imp, node, ins):
    """Along an axis with only 1s before it (channels of one sample), concatenation puts the inputs
    one after another in memory; more than four inputs become a chain of concats."""
    xs = [imp.act(node, i) for i in ins]
    shapes = [imp.acts[x] for x in xs]
    rank = len(shapes[0])
    axis = imp.attrs(node).get("axis")
    axis = axis + rank if axis is not None and axis < 0 else axis
    if (axis is None or any(len(s) != rank for s in shapes) or int(np.prod(shapes[0][:axis])) != 1
            or any(s[:axis] != shapes[0][:axis] or s[axis + 1:] != shapes[0][axis + 1:] for s in shapes)):
        raise UnsupportedModel("%s: Concat of %s along axis %s is not supported; only along the channels "
                               "(axis 1) of inputs that agree on the other axes" % (_where(node), shapes, axis))
    if len(xs) == 1:
        imp.alias[node.output[0]] = xs[0]
        return
    acc, size, k = [], 0, 0
    for k, (x, s) in enumerate(zip(xs, shapes)):   # CONCAT takes up to 4 inputs: chain beyond
        if len(acc) == 4:
            out = "%s/concat%d" % (node.output[0], k)
            imp.emit("concat", acc, out, {}, node, shapes[0][:axis] + (size,) + shapes[0][axis + 1:])
            acc = [out]
        acc.append(x)
        size += s[axis]
    imp.emit("concat", acc, node.output[0], {}, node, shapes[0][:axis] + (size,) + shapes[0][axis + 1:])


@handles("MaxPool")
def max_pool(imp, node, ins):
    imp.pool(node, ins, "maxpool")


@handles("AveragePool")
def average_pool(imp, node, ins):
    imp.pool(node, ins, "avgpool")


@handles("GlobalAveragePool")
def global_average_pool(imp, node, ins):
    x = imp.act(node, ins[0])
    xs = imp.acts[x]
    if len(xs) not in (3, 4):
        raise UnsupportedModel("%s: input must be 3-D or 4-D, got %s" % (_where(node), xs))
    imp.emit("gap", [x], node.output[0], {}, node, list(xs[:2]) + [1] * (len(xs) - 2))


@handles("ReduceMean", note="over all spatial axes")
def reduce_mean(imp, node, ins):
    """A mean over every spatial axis is global average pooling (the dynamo
    exporter writes AdaptiveAvgPool2d(1) and x.mean((2, 3)) this way)."""
    x = imp.act(node, ins[0])
    xs = imp.acts[x]
    axes = imp.squeeze_axes(node, ins, len(xs))
    if len(xs) not in (3, 4) or axes is None or sorted(set(axes)) != list(range(2, len(xs))):
        raise UnsupportedModel("%s: ReduceMean is only supported over all spatial axes of a 3-D or 4-D input "
                               "(global average pooling); got axes %s of shape %s" % (_where(node), axes, xs))
    pooled = list(xs[:2]) + [1] * (len(xs) - 2)
    if imp.attrs(node).get("keepdims", 1):
        imp.emit("gap", [x], node.output[0], {}, node, pooled)
        return
    imp.emit("gap", [x], node.output[0] + "/keepdims", {}, node, pooled)
    imp.view(node, node.output[0] + "/keepdims", list(xs[:2]))


@handles("CastLike")
def cast_like(imp, node, ins):
    """CastLike(value, activation): activations are float32, so this casts to float32."""
    if ins[0] in imp.acts:
        imp.alias[node.output[0]] = ins[0]
    else:
        imp.consts[node.output[0]] = np.asarray(imp.consts[ins[0]], np.float32)


@handles("Flatten")
def flatten(imp, node, ins):
    x = imp.act(node, ins[0])
    xs = imp.acts[x]
    axis = imp.attrs(node).get("axis", 1)
    axis = axis + len(xs) if axis < 0 else axis
    imp.view(node, x, [int(np.prod(xs[:axis])), int(np.prod(xs[axis:]))])


@handles("Reshape")
def reshape(imp, node, ins):
    x = imp.act(node, ins[0])
    target = [int(d) for d in imp.const(node, ins[1], "the Reshape shape")]
    xs = imp.acts[x]
    allowzero = imp.attrs(node).get("allowzero", 0)
    shape = [xs[i] if (d == 0 and not allowzero) else d for i, d in enumerate(target)]
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(xs)) // max(known, 1)
    imp.view(node, x, shape)


@handles("Squeeze")
def squeeze(imp, node, ins):
    x = imp.act(node, ins[0])
    xs = list(imp.acts[x])
    axes = imp.squeeze_axes(node, ins, len(xs))
    axes = [i for i, d in enumerate(xs) if d == 1 and i > 0] if axes is None else axes
    imp.view(node, x, [d for i, d in enumerate(xs) if i not in axes])


@handles("Unsqueeze")
def unsqueeze(imp, node, ins):
    x = imp.act(node, ins[0])
    xs = list(imp.acts[x])
    axes = sorted(imp.squeeze_axes(node, ins, len(xs) + len(imp.squeeze_axes(node, ins, 0) or [])))
    for ax in axes:
        xs.insert(ax, 1)
    imp.view(node, x, xs)


@handles("Identity")
def identity(imp, node, ins):
    imp.alias[node.output[0]] = imp.act(node, ins[0])


@handles("Dropout")
def dropout(imp, node, ins):
    if len(node.output) > 1 and node.output[1] and imp.uses.get(node.output[1]):
        raise UnsupportedModel("%s: the mask output is not supported" % _where(node))
    if len(ins) > 2 and ins[2]:   # training_mode: true means a random mask (unless ratio is 0)
        training = bool(imp.const(node, ins[2], "Dropout training_mode").reshape(()))
        ratio = float(imp.const(node, ins[1], "Dropout ratio").reshape(())) if ins[1] else 0.5
        if training and ratio != 0.0:
            raise UnsupportedModel("%s: Dropout with training_mode=true is not supported; export the model "
                                   "in eval mode" % _where(node))
    imp.alias[node.output[0]] = imp.act(node, ins[0])


# ---- folded ----


@handles("BatchNormalization")
def batch_normalization(imp, node, ins):
    a = imp.attrs(node)
    if a.get("training_mode", 0):
        raise UnsupportedModel("%s: training_mode=1 is not supported; export the model in eval mode" % _where(node))
    x = imp.act(node, ins[0])
    scale, bias, mean, var = (imp.const(node, n, w).astype(np.float64) for n, w in
                              zip(ins[1:5], ("scale", "bias", "mean", "var")))
    s = scale / np.sqrt(var + float(a.get("epsilon", 1e-5)))
    shift = bias - mean * s
    prod = imp.producer.get(x)
    # folded into the layer before only if that layer's weight and bias are its own: a weight
    # shared with another layer stays as it is, and this becomes a layer of its own (below)
    foldable = (prod is not None and prod.op in ("conv", "gemm") and imp.uses.get(x, 0) == 1
                and imp.exclusive(prod.inputs[1]) and imp.exclusive(prod.inputs[2]))
    how = "BatchNormalization '%s'" % (node.name or node.output[0])
    if foldable:
        w = imp.values[prod.inputs[1]]
        shape = [-1, 1, 1, 1] if prod.op == "conv" else ([-1, 1] if prod.attrs["w_layout"] == 0 else [1, -1])
        w.data = (w.data.astype(np.float64) * s.reshape(shape)).astype(np.float32)
        imp.origins[prod.inputs[1]]["folds"].append(how)
        b = imp.values[prod.inputs[2]].data.astype(np.float64) if prod.inputs[2] else 0.0
        newb = (b * s + shift).astype(np.float32)
        if prod.inputs[2]:
            imp.values[prod.inputs[2]].data = newb
            imp.origins[prod.inputs[2]]["folds"].append(how)
        else:
            prod.inputs[2] = imp.param(ins[2], newb, newb.shape, node, how + " (as the layer's bias)")
        prod.parts["bn"] = node.name or node.output[0]
        imp.alias[node.output[0]] = x
        imp.notes.append("%s folded into '%s'" % (_where(node), prod.onnx_name))
        return
    xs = imp.acts[x]
    if len(xs) not in (2, 3, 4):
        raise UnsupportedModel("%s: a BatchNormalization that does not follow a Conv or Gemm must have a 2-D, 3-D "
                               "or 4-D input; got %s" % (_where(node), xs))
    # a frozen per-channel scale and shift (PyTorch's eval-mode BatchNorm with its parameters
    # frozen): the gradient passes through it to the layers before
    C = xs[1]
    imp.affine(node, x, s.astype(np.float32).reshape((C,) + (1,) * (len(xs) - 2)),
               shift.astype(np.float32).reshape((C,) + (1,) * (len(xs) - 2)), how)
    imp.notes.append("%s became a frozen per-channel scale and shift" % _where(node))


@handles("Softmax", note="output only")
@handles("LogSoftmax", note="output only")
def output_softmax(imp, node, ins):
    x = imp.act(node, ins[0])
    outs = [o.name for o in imp.g.output]
    if node.output[0] not in outs or node is not imp.g.node[-1]:
        raise UnsupportedModel("%s: Softmax is only supported as the model's final op" % _where(node))
    xs = imp.acts[x]
    axis = imp.attrs(node).get("axis", -1)
    if axis not in (-1, len(xs) - 1) or len(xs) != 2:
        raise UnsupportedModel("%s: only a softmax over the last axis of a 2-D output is supported" % _where(node))
    if imp.loss != "cross-entropy":
        raise UnsupportedModel("%s: a %s at the output is only supported with loss cross-entropy (where it is "
                               "fused into the loss); with mse, export the model without it"
                               % (_where(node), node.op_type))
    imp.alias[node.output[0]] = x
    imp.dropped = node.op_type
    imp.notes.append("%s at the output dropped: fused into the cross-entropy loss; predict() returns "
                      "logits" % _where(node))
