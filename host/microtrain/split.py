"""Weights that train on some channels, split so that only the trained slice is in RAM.

A convolution y = conv(x, W) + b whose weight trains on input channels S only (MIT's
pointwise1 schemes, schemes.py) is rewritten, before the training plan is built, as

    y = conv(x, W_frozen) + b  +  conv(gather(x, S), W[:, S])      (the sum: CONV2D_ACC, in place)

and a depthwise convolution trained on its channels S (MIT's depthwise entries) as

    y = dwconv(x, W_frozen) + b,  y[S] += dwconv(gather(x, S), W[S])    (SCATTER_ACC_CH, in place)

W_frozen ("W@frozen") is W with the channels S zeroed, a constant (flash on a board); the
slice of W ("W@trained") is a new trainable parameter, in RAM with its optimizer state; gather
copies the channels S of x, and that copy is what the weight gradient reads instead of all of
x, so the frozen convolution's input is free after it (a depthwise one then runs in place).
The input gradient is the sum of both convolutions' (the frozen one sees zeros where the
slice trains; the gather's part is added into it in place, SCATTER_ACC_CH), so the arithmetic
is that of the original layer with the frozen channels held. Export and Plan.onnx_params() put
the slice back into the full weight.

Weights shared by several layers, grouped convolutions other than depthwise and output-channel
selections of other convolutions keep the whole weight in RAM with ranged gradient ops
(training.py, Layer.runs).
"""
from __future__ import annotations

import numpy as np

from .ir import Node, Value


def slice_name(weight):
    """The parameter that holds the trained input channels of `weight`."""
    return weight + "@trained"


def frozen_name(weight):
    return weight + "@frozen"


def is_depthwise(graph, node):
    """A conv with one input and one output channel per group (weight (C, 1, kh, kw), C groups)."""
    shape = graph.values[node.weight()].shape
    return node.op == "conv" and node.attrs.get("groups", 1) == shape[0] > 1 and shape[1] == 1


def can_split(graph, node, axis):
    w = node.weight()
    kind = (axis == 1 and node.attrs.get("groups", 1) == 1) or (axis == 0 and is_depthwise(graph, node))
    return (node.op == "conv" and kind and sum(1 for n in graph.nodes if w in n.inputs) == 1
            and graph.values[w].is_const)


def split_partial_weights(graph, trainable, channels):
    """(trainable, channels left for ranged gradients, {weight: split record}); graph changed in
    place. A split record: {"slice": parameter name, "frozen": constant name, "axis": 1,
    "channels": [...], "shape": the weight's ONNX shape}."""
    trainable, channels, splits = set(trainable), dict(channels), {}
    nodes = []
    for n in graph.nodes:
        w = n.weight()
        if w not in channels or w not in trainable or not can_split(graph, n, channels[w][0]):
            nodes.append(n)
            continue
        axis, chans = channels.pop(w)
        chans = [int(c) for c in chans]
        nodes.extend(_split(graph, n, chans))
        trainable.discard(w)
        trainable.add(slice_name(w))
        splits[w] = {"slice": slice_name(w), "frozen": frozen_name(w), "axis": axis, "channels": chans,
                     "shape": list(graph.values[w].onnx_shape)}
    graph.nodes = nodes
    return trainable, channels, splits


def _split(graph, n, chans):
    """The nodes that replace n. The gather comes first, so that x is free after the frozen
    convolution (which may then run in place) and the gather's gradient, the last to reach x,
    is added into the frozen convolution's (SCATTER_ACC_CH)."""
    x, w, bias = n.inputs[0], n.weight(), n.bias()
    V = graph.values
    wv, xv, yv = V[w], V[x], V[n.output]
    K = len(chans)
    dw = is_depthwise(graph, n)
    frozen = wv.data.copy()
    if dw:
        frozen[chans] = 0.0
        part = np.ascontiguousarray(wv.data[chans])
        part_onnx = (K,) + tuple(wv.onnx_shape[1:])
    else:
        frozen[:, chans] = 0.0
        part = np.ascontiguousarray(wv.data[:, chans])
        part_onnx = (wv.onnx_shape[0], K) + tuple(wv.onnx_shape[2:])
    idx = n.output + "@channels"
    xs = n.output + "@gathered"
    y0 = n.output + "@frozen_part"
    V[frozen_name(w)] = Value(frozen_name(w), wv.shape, wv.onnx_shape, data=frozen)
    V[slice_name(w)] = Value(slice_name(w), part.shape, part_onnx, data=part)
    V[idx] = Value(idx, (K,), (K,), data=np.asarray(chans, np.int32), dtype="I32")
    V[xs] = Value(xs, (1, K) + tuple(xv.shape[2:]), (xv.onnx_shape[0], K) + tuple(xv.onnx_shape[2:]))
    V[y0] = Value(y0, yv.shape, yv.onnx_shape)
    origin = graph.origins.get(w, {"init": w, "folds": []})
    graph.origins[frozen_name(w)] = dict(origin)
    graph.origins[slice_name(w)] = dict(origin, channels=chans)
    gather = Node("gather", [x, idx], xs, {}, n.onnx_name)
    frozen_conv = Node("conv", [x, frozen_name(w), bias], y0, dict(n.attrs), n.onnx_name, dict(n.parts))
    if not dw:
        return [gather, frozen_conv,
                Node("conv", [xs, slice_name(w), None, y0], n.output, dict(n.attrs), n.onnx_name)]   # y0 + conv
    t = n.output + "@trained_part"
    V[t] = Value(t, (1, K) + tuple(yv.shape[2:]), (yv.onnx_shape[0], K) + tuple(yv.onnx_shape[2:]))
    return [gather, Node("conv", [xs, slice_name(w), None], t, dict(n.attrs, groups=K), n.onnx_name), frozen_conv,
            Node("scatter_acc", [t, idx, y0], n.output, {}, n.onnx_name)]


def merge(plan, params):
    """params ({name: array} as Simulator.params() gives them) with each trained slice put back
    into its full weight, under the weight's ONNX name and shape."""
    out = dict(params)
    for w, s in plan.meta.get("split", {}).items():
        if s["slice"] not in out:
            continue
        full = plan.weight(s["frozen"]).reshape(s["shape"]).copy()   # dequantized if stored int8 (w8.py)
        part = np.asarray(out.pop(s["slice"]), np.float32)
        sel = (s["channels"],) if s["axis"] == 0 else (slice(None), s["channels"])
        full[sel] = part.reshape(full[sel].shape)
        out[w] = full
    return out
