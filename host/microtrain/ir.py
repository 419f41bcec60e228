"""The compiler's model graph: what the ONNX importer produces and autodiff consumes.

Shapes are internal and per sample (batch 1): activations are (1, F) or
(1, C, H, W); a 1-D signal (N, C, L) becomes (1, C, 1, L) so every convolution
and pooling kernel is 2-D. `onnx_shape` keeps what the ONNX graph said, for the
user-facing side (predict output, params()).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LAYER_OPS = ("conv", "gemm")   # ops that own a weight and an optional bias
NP_DTYPES = {"F32": np.float32, "I32": np.int32, "I8": np.int8, "U8": np.uint8}


@dataclass
class Quant:
    """Quantization of an integer tensor: real = scale * (q - zero_point), per tensor
    (axis None: scale and zero_point are scalars) or per channel along `axis`."""
    scale: np.ndarray                # float32, () or (n,)
    zero_point: np.ndarray           # int32, () or (n,)
    axis: int | None = None

    def __post_init__(self):
        self.scale = np.asarray(self.scale, np.float32)
        self.zero_point = np.asarray(self.zero_point, np.int32)
        if self.axis is None:
            self.scale, self.zero_point = self.scale.reshape(()), self.zero_point.reshape(())

    def key(self):
        return (self.axis, self.scale.tobytes(), self.zero_point.tobytes())

    def dequantize(self, q, shape=None):
        """Real values of the integer array q."""
        q = np.asarray(q).astype(np.float64)
        if self.axis is None:
            return (q - float(self.zero_point)) * float(self.scale)
        bshape = [1] * q.ndim
        bshape[self.axis] = -1
        return (q - self.zero_point.reshape(bshape)) * self.scale.astype(np.float64).reshape(bshape)


@dataclass
class Value:
    name: str
    shape: tuple                   # internal shape
    onnx_shape: tuple = ()         # the ONNX shape (batch dim included for activations)
    data: np.ndarray | None = None  # constants: float32 (int8/int32 when quantized), internal shape
    view_of: str | None = None     # same memory as another value, other shape
    dtype: str = "F32"             # format.DTYPES name: F32, or I8 (int8 activation or weight), I32 (bias)
    quant: Quant | None = None     # for I8 and I32 values

    @property
    def is_const(self):
        return self.data is not None

    @property
    def size(self):
        return int(np.prod(self.shape))


@dataclass
class Node:
    op: str                        # conv, gemm, clip, maxpool, avgpool, gap, add
    inputs: list                   # value names; None for an absent optional input
    output: str
    attrs: dict = field(default_factory=dict)
    onnx_name: str = ""            # for messages: which ONNX node this came from
    # other ONNX nodes merged into this layer, for export: "bias_add" (MatMul + Add) with
    # "bias_input" (the Add's constant input), "bn" (a BatchNormalization folded into it)
    parts: dict = field(default_factory=dict)

    def weight(self):
        return self.inputs[1] if self.op in LAYER_OPS else None

    def bias(self):
        return self.inputs[2] if self.op in LAYER_OPS and len(self.inputs) > 2 else None


@dataclass
class Graph:
    values: dict                   # name -> Value
    nodes: list                    # Node, in execution order
    input: str
    output: str
    notes: list = field(default_factory=list)   # what the importer changed (folds, dropped softmax)
    dropped_output_op: str | None = None        # "Softmax"/"LogSoftmax" removed from the output
    # parameter -> {"init": the ONNX initializer it comes from, "folds": what changed its value}
    origins: dict = field(default_factory=dict)
    fingerprint: str = ""          # of the ONNX model as given (export.fingerprint)
    # int8 (quantize.py): where the model rounds activations to int8, and its int8 weights
    quant: dict = field(default_factory=dict)    # activation value -> Quant
    wquant: dict = field(default_factory=dict)   # weight parameter -> Quant (symmetric)
    quant_source: str = ""         # "post-training quantization ...", "QDQ model"

    def layers(self):
        """Nodes that own parameters, in execution order."""
        return [n for n in self.nodes if n.op in LAYER_OPS]

    def consumers(self, name):
        return [n for n in self.nodes if name in n.inputs]

    def root(self, name):
        """The value whose memory `name` uses (follows views)."""
        while self.values[name].view_of is not None:
            name = self.values[name].view_of
        return name
