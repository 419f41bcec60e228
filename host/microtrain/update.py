"""Which parameters train: the --update selection.

Modes: "last-layer", "bias" (every bias, weights frozen), "last:K" (the last K
layers with parameters), "full", a JSON file naming trainable initializers
(a list, or {"trainable": [...]}), or a Python list/set of names.
"""
from __future__ import annotations

import json
import os

MODES = ("last-layer", "bias", "last:K", "full", "none (inference only)", "a JSON file of initializer names",
         "a MIT sparse-update scheme (JSON; a *.schemes.json file with --scheme NAME)")


def _layer_params(layer):
    return [p for p in (layer.weight(), layer.bias()) if p]


def resolve_update(graph, update):
    """The set of value names to train, for a graph and an --update selection."""
    layers = graph.layers()
    if not layers:
        raise ValueError("the model has no layer with parameters (Conv, Gemm, MatMul) to train")
    all_params = [p for layer in layers for p in _layer_params(layer)]
    if isinstance(update, (list, tuple, set, frozenset)):
        names = list(update)
    elif not isinstance(update, str):
        raise TypeError("update must be a mode string, a JSON path or a list of names, not %s" % type(update).__name__)
    elif update == "full":
        names = all_params
    elif update == "bias":
        names = [layer.bias() for layer in layers if layer.bias()]
        if not names:
            raise ValueError("update 'bias': the model's layers have no biases")
    elif update == "last-layer" or update.startswith("last:"):
        k = 1 if update == "last-layer" else _count(update)
        if k > len(layers):
            raise ValueError("update %r: the model has only %d layers with parameters" % (update, len(layers)))
        names = [p for layer in layers[-k:] for p in _layer_params(layer)]
    elif update.endswith(".json") or os.path.exists(update):
        names = _read_json(update)
    else:
        raise ValueError("unknown update mode %r; use one of: %s" % (update, ", ".join(MODES)))
    unknown = [n for n in names if n not in all_params]
    if unknown:
        raise ValueError("cannot train %s: not a weight or bias of a Conv/Gemm layer. Trainable initializers are: %s"
                         % (", ".join(map(repr, unknown)), ", ".join(all_params)))
    _check_copies(graph, names)
    return set(names)


def _count(update):
    try:
        k = int(update.split(":", 1)[1])
    except ValueError:
        raise ValueError("update %r: expected last:K with K a whole number, e.g. last:2" % update) from None
    if k < 1:
        raise ValueError("update %r: K must be at least 1" % update)
    return k


def load_json(path, what="update file"):
    """A JSON file's contents; ValueError naming the file when it cannot be read or parsed."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ValueError("cannot read %s %s: %s" % (what, path, e.strerror)) from e
    except json.JSONDecodeError as e:
        raise ValueError("%s %s is not valid JSON: %s" % (what, path, e)) from e


def _read_json(path):
    doc = load_json(path)
    if isinstance(doc, dict):
        doc = doc.get("trainable")
    if not isinstance(doc, list) or not all(isinstance(n, str) for n in doc):
        raise ValueError("update file %s must hold a list of initializer names or {\"trainable\": [...]}" % path)
    return doc


def _check_copies(graph, names):
    """An initializer several layers use is one parameter (tied weights: its gradients are
    summed), unless a layer folded something into its use (Gemm alpha, BatchNormalization):
    then the uses are different tensors, which training would pull apart."""
    forms = {}
    for p, origin in graph.origins.items():
        forms.setdefault(origin["init"], []).append(p)
    for name in names:
        init = graph.origins[name]["init"]
        if len(forms[init]) > 1:
            uses = []
            for p in forms[init]:
                nodes = ", ".join("'%s'" % n.onnx_name for n in graph.nodes if p in n.inputs)
                folds = graph.origins[p]["folds"]
                uses.append("%s %s, as %r" % (nodes, "with " + " and ".join(folds) + " folded in" if folds else "as it is", p))
            raise ValueError("cannot train initializer %r: the model uses it in %d different forms (%s), which training "
                             "would pull apart. Freeze it (an --update list without %s), or export the model "
                             "without the folded scaling" % (init, len(forms[init]), "; ".join(uses),
                                                              " and ".join(repr(p) for p in forms[init])))
