"""The trained model as ONNX: the original model with the trained values in place.

A parameter the plan uses as the ONNX initializer is (the common case, tied weights
included) is written into that initializer. A parameter the compiler folded (Gemm
alpha or beta, a broadcast bias, a BatchNormalization folded into the layer before)
is written as the folded layer: the Conv/Gemm gets the folded weight and bias
(alpha and beta become 1) and the folded BatchNormalization becomes an Identity.
A BatchNormalization that could not be folded ran as a frozen per-channel scale and
shift and stays as it is. An initializer another node still reads
as it was is never overwritten: the changed use gets an initializer of its own.
"""
from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .split import merge


def fingerprint(model):
    """What ties a plan to the model it came from: the nodes and the initializers' names and
    shapes (not their values, so a model with other weights of the same shape matches)."""
    h = hashlib.sha256()
    for n in model.graph.node:
        h.update(repr((n.op_type, n.domain, n.name, list(n.input), list(n.output))).encode())
    for t in model.graph.initializer:
        h.update(repr((t.name, list(t.dims))).encode())
    return h.hexdigest()[:16]


def _load(model):
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    try:
        return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)
    except Exception as e:   # onnx raises several types for unreadable files
        raise ValueError("cannot read ONNX model %r: %s" % (model, e)) from e


class _Writer:
    """Edits a ModelProto: initializer values, node inputs and attributes."""

    def __init__(self, model):
        self.model = model
        self.g = model.graph
        self.inits = {t.name: t for t in self.g.initializer}
        self.nodes = {(n.name or n.output[0]): n for n in self.g.node}
        self.taken = set(self.inits) | {i.name for i in self.g.input} | {o for n in self.g.node for o in n.output}

    def node(self, name):
        if name not in self.nodes:
            raise ValueError("the ONNX model has no node %r: it is not the model the plan was compiled from" % name)
        return self.nodes[name]

    def readers(self, name):
        return sum(1 for n in self.g.node for i in n.input if i == name)

    def value(self, name):
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        for n in self.g.node:   # a Constant node's value
            if n.op_type == "Constant" and n.output[0] == name:
                from onnx.reference import ReferenceEvaluator
                return ReferenceEvaluator(n).run(None, {})[0]
        raise ValueError("cannot find the constant %r in the ONNX model" % name)

    def overwrite(self, name, value):
        """Give initializer `name` a new value (of its own shape), for every node that reads it."""
        t = self.inits[name]
        t.CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32).reshape(tuple(t.dims)), name))

    def set_input(self, node, k, value, base):
        """Input k of `node` takes `value`: in place when only this input reads that initializer,
        else as a new initializer named after `base`."""
        old = node.input[k] if k < len(node.input) else ""
        value = np.asarray(value, np.float32)
        if old in self.inits and self.readers(old) == 1 and tuple(self.inits[old].dims) == value.shape:
            self.overwrite(old, value)
            return
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = "%s_%d" % (base, n)
        self.taken.add(name)
        self.g.initializer.append(numpy_helper.from_array(value, name))
        self.inits[name] = self.g.initializer[-1]
        while len(node.input) <= k:
            node.input.append("")
        node.input[k] = name

    @staticmethod
    def set_attr(node, name, value):
        for a in node.attribute:
            if a.name == name:
                node.attribute.remove(a)
                break
        node.attribute.append(helper.make_attribute(name, value))

    def replace(self, old, new):
        """Put node `new` where node `old` is (execution order matters in ONNX); returns the node
        now in the graph (protobuf stores a copy)."""
        k = list(self.g.node).index(old)
        self.g.node.remove(old)
        self.g.node.insert(k, new)
        self.nodes[new.name or new.output[0]] = self.g.node[k]
        return self.g.node[k]

    def drop_unread(self):
        read = {i for n in self.g.node for i in n.input} | {o.name for o in self.g.output}
        for t in list(self.g.initializer):
            if t.name not in read:
                self.g.initializer.remove(t)
        for i in list(self.g.input):
            if i.name in self.inits and i.name not in read:
                self.g.input.remove(i)


def export_trained(plan, params, onnx_in, onnx_out=None):
    """Write the model `onnx_in` (path, bytes or ModelProto) with `params` (name -> array, as
    Simulator.params() gives them) in place to `onnx_out` (a path, or None); returns the
    ModelProto."""
    meta = plan.meta
    if "layers" not in meta or "model" not in meta:
        raise ValueError("this plan holds no export information; recompile it with this microtrain")
    model = _load(onnx_in)
    if fingerprint(model) != meta["model"]:
        raise ValueError("the ONNX model %s is not the one the plan was compiled from (its nodes or initializer "
                         "shapes differ); pass the model given to microtrain compile"
                         % (onnx_in if isinstance(onnx_in, str) else "given"))
    values = merge(plan, _checked_params(plan, params))   # trained channel slices back into their weights
    trainable = set(values)
    info = meta["params"]
    w = _Writer(model)
    plain = {p for p in trainable if not info[p]["folds"] and info[p]["init"] == p and p in w.inits}
    for p in sorted(plain):
        w.overwrite(p, values[p])
    w8 = set(meta.get("w8", []))
    for layer in meta["layers"]:
        names = [n for n in (layer["weight"], layer["bias"]) if n]
        # a frozen weight stored int8 (w8.py) is written as the dequantized weight the plan computes with
        if not any(n in trainable and n not in plain for n in names) and layer["weight"] not in w8:
            continue
        # a rewritten layer's frozen parameters keep the plan's (folded, dequantized) values
        vals = {n: values[n] if n in values else plan.weight(n).reshape(info[n]["shape"]) for n in names}
        _write_layer(w, w.node(layer["node"]), layer, vals)
    w.drop_unread()
    onnx.checker.check_model(model)
    if onnx_out is not None:
        onnx.save(model, onnx_out)
    return model


def _checked_params(plan, params):
    """{name: float32 array in the ONNX shape}, every name and shape checked before anything is written."""
    if not isinstance(params, dict):
        raise TypeError("params must be a dict {name: array}, as Simulator.params() returns, not %s"
                        % type(params).__name__)
    want = plan.params()
    missing, unknown = sorted(set(want) - set(params)), sorted(set(params) - set(want))
    if missing or unknown:
        raise ValueError("params do not match the plan's trainable parameters: %s%s%s"
                         % ("missing %s" % ", ".join(map(repr, missing)) if missing else "",
                            "; " if missing and unknown else "",
                            "not in the plan %s" % ", ".join(map(repr, unknown)) if unknown else ""))
    out = {}
    for name in want:
        shape = tuple(plan.meta["params"][name]["shape"])
        v = np.asarray(params[name])
        if v.dtype.kind not in "fiu" or v.size != int(np.prod(shape)):
            raise ValueError("parameter %r has shape %s (%s); the plan's is %s" % (name, v.shape, v.dtype, shape))
        v = v.astype(np.float32).reshape(shape)
        if not np.all(np.isfinite(v)):
            raise ValueError("parameter %r contains NaN or infinity" % name)
        out[name] = v
    return out


def _write_layer(w, node, layer, vals):
    """A Conv/Gemm/MatMul (and its bias Add, its folded BatchNormalization) written as the folded layer."""
    wname, bname = layer["weight"], layer["bias"]
    if node.op_type == "MatMul" and bname and not layer.get("bias_add"):
        # a BatchNormalization gave a bias-less MatMul its bias: it becomes a Gemm
        gemm = helper.make_node("Gemm", [node.input[0], layer["weight_init"], ""], list(node.output), name=node.name,
                                transB=1 if layer["w_layout"] == 0 else 0)
        node = w.replace(node, gemm)
    if node.op_type == "MatMul" and layer["w_layout"] == 0:   # MatMul(x, Transpose(W)): x @ W^T
        w.set_input(node, 1, vals[wname].T, wname)
    else:
        w.set_input(node, 1, vals[wname], wname)
    if node.op_type == "Gemm":
        w.set_attr(node, "alpha", 1.0)
    if bname:
        if layer.get("bias_add"):   # MatMul + Add: the Add's constant input
            add = w.node(layer["bias_add"])
            k = list(add.input).index(layer["bias_input"])
            w.set_input(add, k, vals[bname].reshape(-1), bname)
        else:
            w.set_input(node, 2, vals[bname].reshape(-1), bname)
            if node.op_type == "Gemm":
                w.set_attr(node, "beta", 1.0)
    if layer.get("bn"):
        bn = w.node(layer["bn"])
        w.replace(bn, helper.make_node("Identity", [bn.input[0]], [bn.output[0]], name=bn.name))
