"""Import of quantized ONNX models in the QDQ form (QuantizeLinear / DequantizeLinear
around float ops), as onnxruntime.quantization.quantize_static(quant_format=QDQ) writes
them, with int8 or uint8 activations, per-tensor or per-channel int8 weights, and any
nodes left float (nodes_to_exclude).

The importer reads the float graph as the float importer does and records, instead of
the Q/DQ nodes themselves, where the model rounds an activation to int8 (graph.quant)
and which weights are int8 (graph.wquant, from their DequantizeLinear). quantize.lower
then runs every node the model quantizes as an int8 op and refuses, naming it, any
quantized node it cannot run in int8. A uint8 tensor becomes int8 with its zero point
moved by -128 (the same real values). A model with only weight DequantizeLinear nodes
imports as a float model, as before.
"""
from __future__ import annotations

import numpy as np
import onnx

from .ir import Quant
from .onnx_import import Importer, UnsupportedModel, _where, handles

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
INT_TYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): -128}   # zero-point dtype -> shift to int8


def is_qdq(model):
    return any(n.op_type in QDQ_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node)


class QDQImporter(Importer):
    def __init__(self, model, loss):
        super().__init__(model, loss)
        self.quant = {}       # float activation -> Quant of its QuantizeLinear
        self.qnode = {}       # float activation -> the QuantizeLinear's name, for messages
        self.dq_consts = {}   # folded DequantizeLinear output -> (Quant, int8 values) of a constant

    def qparams(self, node, ins, per_tensor):
        """(scale, zero point, zero-point dtype, axis) of a Q/DQ node; int8/uint8 only."""
        scale = np.asarray(self.const(node, ins[1], "the scale"), np.float32)
        if len(ins) > 2 and ins[2]:
            zp = np.asarray(self.const(node, ins[2], "the zero point"))
        else:
            zp = np.zeros(scale.shape, np.uint8)   # ONNX: no zero point means uint8 0
        if zp.dtype not in INT_TYPES:
            raise UnsupportedModel("%s: %s quantization is not supported; microtrain runs int8 and uint8"
                                   % (_where(node), zp.dtype))
        a = self.attrs(node)
        if a.get("block_size", 0):
            raise UnsupportedModel("%s: blocked quantization (block_size) is not supported" % _where(node))
        if per_tensor and scale.size != 1:
            raise UnsupportedModel("%s: activations must be quantized per tensor; this one has %d scales"
                                   % (_where(node), scale.size))
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise UnsupportedModel("%s: the scale must be finite and positive" % _where(node))
        return scale, zp, INT_TYPES[zp.dtype], int(a.get("axis", 1))

    def op_QuantizeLinear(self, node, ins):
        x = self.act(node, ins[0])
        scale, zp, shift, _ = self.qparams(node, ins, True)
        q = Quant(scale.reshape(()), int(zp.reshape(())) + shift)
        if x in self.quant and self.quant[x].key() != q.key():
            raise UnsupportedModel("%s: '%s' is quantized twice with different parameters (also by '%s')"
                                   % (_where(node), x, self.qnode[x]))
        self.quant[x] = q
        self.qnode[x] = node.name or node.output[0]
        self.alias[node.output[0]] = x   # the int8 tensor stands for x rounded: x from here on

    def op_DequantizeLinear(self, node, ins):
        x = self.r(ins[0])
        if x not in self.quant:
            raise UnsupportedModel("%s: dequantizes '%s', which no QuantizeLinear of this model produced"
                                   % (_where(node), ins[0]))
        scale, zp, shift, _ = self.qparams(node, ins, True)
        q = Quant(scale.reshape(()), int(zp.reshape(())) + shift)
        if q.key() != self.quant[x].key():
            raise UnsupportedModel("%s: dequantizes with other parameters than its QuantizeLinear '%s' used"
                                   % (_where(node), self.qnode[x]))
        self.alias[node.output[0]] = x

    def fold(self, node, ins):
        super().fold(node, ins)
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx") \
                and np.asarray(self.consts[ins[0]]).dtype in INT_TYPES:   # an int32 bias is quantized anew
            scale, zp, shift, axis = self.qparams(node, ins, False)
            values = np.asarray(self.consts[ins[0]]).astype(np.int32) + shift
            zp = zp.astype(np.int32) + shift
            if scale.size == 1:
                q = Quant(scale.reshape(()), int(zp.reshape(())))
            else:
                q = Quant(scale, zp, axis + values.ndim if axis < 0 else axis)
            self.dq_consts[node.output[0]] = q

    def weight_quant(self, graph):
        """{IR weight: Quant} for the layer weights that come from a DequantizeLinear unchanged."""
        out = {}
        for n in graph.layers():
            w = n.inputs[1]
            origin = graph.origins.get(w, {})
            q = self.dq_consts.get(origin.get("init"))
            if q is None or origin.get("folds"):
                continue
            if np.any(q.zero_point != 0):
                raise UnsupportedModel("ONNX node '%s': its weight's zero point is not 0; microtrain's int8 "
                                       "kernels take symmetric weights (onnxruntime: weight_type=QInt8)"
                                       % n.onnx_name)
            out_axis = 0 if n.op == "conv" or n.attrs["w_layout"] == 0 else 1
            if q.axis is not None and q.axis != out_axis:
                raise UnsupportedModel("ONNX node '%s': its weight is quantized per channel along axis %d; "
                                       "microtrain needs the output-channel axis %d" % (n.onnx_name, q.axis, out_axis))
            out[w] = q
        return out

    def run(self):
        graph = super().run()
        graph.quant = {k: v for k, v in self.quant.items() if k in graph.values}
        graph.wquant = self.weight_quant(graph)
        graph.quant_source = "QDQ model" if graph.quant else ""
        return graph


# registered for the registry's supported-op list; only a QDQImporter (chosen by import_onnx
# when the model has Q/DQ nodes) ever meets them
@handles("QuantizeLinear", "int8 QDQ models")
def _quantize_linear(imp, node, ins):
    imp.op_QuantizeLinear(node, ins)


@handles("DequantizeLinear", "int8 QDQ models")
def _dequantize_linear(imp, node, ins):
    imp.op_DequantizeLinear(node, ins)


def qoperator_nodes(model):
    """Nodes of the QOperator form (QLinearConv...), which microtrain does not import."""
    return [n for n in model.graph.node if n.op_type.startswith("QLinear") or n.op_type in
            ("ConvInteger", "MatMulInteger", "DynamicQuantizeLinear")]


def check_supported_form(model):
    if qoperator_nodes(model):
        names = ", ".join("'%s' (%s)" % (n.name or n.output[0], n.op_type) for n in qoperator_nodes(model)[:5])
        raise UnsupportedModel("the model uses onnxruntime's QOperator form (%s); microtrain imports the QDQ form: "
                               "quantize with quant_format=QuantFormat.QDQ" % names)


__all__ = ["QDQImporter", "is_qdq", "check_supported_form", "onnx"]
