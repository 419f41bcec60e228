"""MIT Tiny Training Engine sparse-update schemes as an --update selection.

A scheme (one entry of the `schemes` list in a *.schemes.json file, such as those in
shared/models/tte/, or the whole file with a scheme name) says which parameters train:

- `bias_updates`: [{"conv_index": k, "initializer": name}, ...], biases trained whole;
- `weight_updates`: [{"conv_index": k, "initializer": name, "ratio": r, "select": "magnitude+",
  "channel_axis": 1 or 0, "selected_channels": [...]}, ...], a weight trained on some channels;
- `classifier`: "full" (the last Gemm's weight and bias train), or absent / "none".

Mapping onto the ONNX graph (docs/sparse.md): MIT's conv_index counts the Conv layers in graph
order (first_conv = 0, then each block's pointwise1, depthwise, pointwise2; the classifier is
not a conv). An entry's `initializer` must name that conv's weight (or bias) in the ONNX model;
when both are given they must agree, so a scheme for another model fails loudly. Channels:
`selected_channels` when given, else `select` "magnitude+" (the round-down ratio*C channels of
largest L2 norm, as MIT's algorithm) or "first" (the first round(ratio*C), as MIT's compile-time
engine); "all" (ratio 1) the whole weight. Ratio 1 trains the whole weight; ratio 0 does not
train it.

resolve_scheme returns (trainable names, {weight name: (axis, sorted channel tuple)}) for the
weights that train on part of their channels.
"""
from __future__ import annotations

import json
import os

import numpy as np

SELECTS = ("magnitude+", "first", "all")


def is_scheme_file(path):
    """Whether a JSON --update file is a MIT scheme (or a file of schemes), not a list of names."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and ("schemes" in doc or "weight_updates" in doc or "bias_updates" in doc)


def load_scheme(update, scheme=None):
    """The scheme dict from a path or a dict: one scheme, or the scheme called `scheme` of a
    file holding a `schemes` list."""
    doc = update
    where = "the scheme"
    if isinstance(update, str):
        from .update import load_json
        if scheme is not None and not update.endswith(".json") and not os.path.exists(update):
            raise ValueError("--scheme %s picks a scheme out of a *.schemes.json file given as --update (Python: "
                             "update=PATH, scheme=NAME), but --update is %r; MIT's files (such as "
                             "mcunet-5fps.schemes.json) are in the TTE models folder, docs/sparse.md"
                             % (scheme, update))
        where = update
        doc = load_json(update, "scheme file")
    if not isinstance(doc, dict):
        raise ValueError("%s must hold a JSON object: one scheme, or a file with a \"schemes\" list" % where)
    if "schemes" in doc:
        names = [s.get("scheme") for s in doc["schemes"]]
        if scheme is None:
            raise ValueError("%s holds %d schemes (%s): choose one with --scheme NAME (Python: scheme=NAME)"
                             % (where, len(names), ", ".join(map(str, names))))
        found = [s for s in doc["schemes"] if s.get("scheme") == scheme]
        if not found:
            raise ValueError("%s has no scheme %r; its schemes are: %s" % (where, scheme, ", ".join(map(str, names))))
        return found[0]
    if scheme is not None and doc.get("scheme") not in (None, scheme):
        raise ValueError("%s is scheme %r, not %r" % (where, doc.get("scheme"), scheme))
    if "weight_updates" not in doc and "bias_updates" not in doc:
        raise ValueError("%s is not a sparse-update scheme: it needs \"bias_updates\" and/or \"weight_updates\" "
                         "(see shared/models/tte/README.md)" % where)
    return doc


def conv_layers(graph):
    """The graph's Conv layers in MIT's conv_index order (graph order)."""
    return [n for n in graph.layers() if n.op == "conv"]


def _init_of(graph, value):
    return graph.origins[value]["init"] if value in graph.origins else value


def _layer_for(graph, convs, entry, part, where):
    """The layer an entry names, by conv_index and/or initializer (which must agree)."""
    by_init = {}
    for n in graph.layers():
        for v in (n.weight(), n.bias()):
            if v:
                by_init.setdefault(_init_of(graph, v), n)
    idx, init = entry.get("conv_index"), entry.get("initializer")
    if idx is None and init is None:
        raise ValueError("%s: entry %s names no layer (needs \"conv_index\" or \"initializer\")" % (where, entry))
    n = None
    if idx is not None:
        if not isinstance(idx, int) or not 0 <= idx < len(convs):
            raise ValueError("%s: conv_index %r is out of range: the model has %d convs (0..%d)"
                             % (where, idx, len(convs), len(convs) - 1))
        n = convs[idx]
    if init is not None:
        if init not in by_init:
            raise ValueError("%s: %r is not a weight or bias of a Conv/Gemm layer in the model. Its layer "
                             "parameters are: %s" % (where, init, ", ".join(sorted(by_init))))
        if n is not None and by_init[init] is not n:
            raise ValueError("%s: conv_index %d is the model's conv '%s', but the entry names %r (conv '%s'): the "
                             "scheme is for another model" % (where, idx, n.onnx_name, init, by_init[init].onnx_name))
        n = by_init[init]
    value = n.weight() if part == "weight" else n.bias()
    if value is None:
        raise ValueError("%s: layer '%s' has no %s" % (where, n.onnx_name, part))
    if init is not None and _init_of(graph, value) != init:
        raise ValueError("%s: %r is not the %s of layer '%s' (that is %r)" % (where, init, part, n.onnx_name,
                                                                               _init_of(graph, value)))
    return n, value


def _channels(graph, n, value, entry, where):
    """(axis, channels) an entry trains of weight `value`, None for the whole weight, () for none."""
    from . import format as F
    w = graph.values[value]
    data = w.data.reshape(w.onnx_shape)
    if n.op == "gemm" and n.attrs["w_layout"] == F.W_LAYOUT_IN_OUT:
        data = data.T   # channel axes are [out, in] whatever the storage
    shape = data.shape
    grouped = n.op == "conv" and n.attrs.get("groups", 1) > 1
    depthwise = grouped and shape[1] == 1
    axis = entry.get("channel_axis", 0 if depthwise else 1)
    if axis not in (0, 1):
        raise ValueError("%s: channel_axis %r of %r: use 1 (input channels) or 0 (output channels, depthwise)"
                         % (where, axis, value))
    if axis == 1 and grouped:
        raise ValueError("%s: %r is a grouped conv: train it on its channels (channel_axis 0), not on input "
                         "channels within a group" % (where, value))
    C = shape[axis]
    ratio = entry.get("ratio", 1.0)
    if not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ValueError("%s: ratio %r of %r must be a fraction from 0 to 1" % (where, ratio, value))
    if "selected_channels" in entry:
        sel = entry["selected_channels"]
        if not isinstance(sel, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in sel):
            raise ValueError("%s: selected_channels of %r must be a list of channel numbers" % (where, value))
        bad = [c for c in sel if not 0 <= c < C]
        if bad or len(set(sel)) != len(sel):
            raise ValueError("%s: selected_channels of %r: %s; axis %d has channels 0..%d"
                             % (where, value, "out of range: %s" % bad if bad else "repeated", axis, C - 1))
        sel = sorted(sel)
    else:
        select = entry.get("select", "magnitude+")
        if select not in SELECTS:
            raise ValueError("%s: select %r of %r: use one of %s" % (where, select, value, ", ".join(SELECTS)))
        if select == "all" and ratio != 1:
            raise ValueError("%s: select 'all' of %r with ratio %r: 'all' means ratio 1" % (where, value, ratio))
        if select == "all":
            sel = list(range(C))
        elif select == "first":
            sel = list(range(int(round(ratio * C))))
        else:   # MIT: argsort(-norm)[:int(ratio*C)], the norm over everything but the channel axis
            norm = np.sqrt((np.moveaxis(data, axis, 0).reshape(C, -1) ** 2).sum(1))
            sel = sorted(int(c) for c in np.argsort(-norm, kind="stable")[:int(ratio * C)])
    if not sel:
        return ()
    if len(sel) == C:
        return None
    return (axis, tuple(sel))


def resolve_scheme(graph, update, scheme=None):
    """(set of trainable value names, {weight: (axis, channels)} of channel-sparse weights)."""
    doc = load_scheme(update, scheme)
    where = "scheme %r" % doc.get("scheme", "?")
    convs = conv_layers(graph)
    trainable, channels = set(), {}
    for e in doc.get("bias_updates", []):
        trainable.add(_layer_for(graph, convs, e, "bias", where)[1])
    for e in doc.get("weight_updates", []):
        n, value = _layer_for(graph, convs, e, "weight", where)
        sel = _channels(graph, n, value, e, where)
        if sel == ():
            continue
        trainable.add(value)
        if sel is not None:
            channels[value] = sel
    head = doc.get("classifier", "none")
    if head == "full":
        gemms = [n for n in graph.layers() if n.op == "gemm"]
        if not gemms:
            raise ValueError("%s: classifier 'full' but the model has no Gemm/MatMul layer" % where)
        trainable.update(p for p in (gemms[-1].weight(), gemms[-1].bias()) if p)
    elif head not in ("none", None):
        raise ValueError("%s: classifier %r: use \"full\" or \"none\"" % (where, head))
    if not trainable:
        raise ValueError("%s trains nothing" % where)
    return trainable, channels


def channel_runs(channels):
    """Sorted channels as contiguous runs [(begin, count), ...]."""
    runs = []
    for c in channels:
        if runs and runs[-1][0] + runs[-1][1] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return [tuple(r) for r in runs]
