"""Trained parameters back into a PyTorch state_dict, BatchNorms un-folded.

A BatchNorm after a conv (or Linear) is folded into it before microtrain sees it, by the
exporter (TorchScript in eval mode: initializers named `onnx::Conv_N`; the dynamo exporter's
optimizer: the conv's own names, holding folded values) or by microtrain's importer. What
trains is then the folded layer: weight Wf = W * s and bias bf = s * (b - mean) + beta, with
s = gamma / sqrt(running_var + eps) per output channel. The BatchNorm's values are not in
those ONNX files, so the way back starts from the module's original state_dict:

- gamma, running_mean and running_var keep their values: microtrain never trained them
  (they are folded constants), and a BatchNorm keeps normalizing as before;
- the conv weight takes the trained folded weight divided by s: W = Wf / s (s measured per
  channel as the ratio of the plan's folded weight to the state dict's weight, so it needs
  no eps), the conv bias keeps its value;
- the trained change of the folded bias goes into the BatchNorm's beta, where it is added
  unscaled: beta = beta0 + (bf - bf0).

Then PyTorch's eval-mode module computes s * (conv(x, W) + b - mean) + beta = conv(x, Wf) + bf,
the function microtrain trained. A channel whose gamma is 0 (s = 0) whose folded weight
trained away from zero cannot keep s: its gamma becomes sqrt(running_var + 1e-5) (s = 1 for
PyTorch's default eps) and its weight the trained folded weight.
"""
from __future__ import annotations

import os

import numpy as np

EPS = 1e-5   # nn.BatchNorm*'s default eps, used only for a channel whose gamma was 0
BN_KEYS = ("weight", "bias", "running_mean", "running_var")


def load_reference(path, option="--state-dict"):
    """A state_dict saved by torch.save(module.state_dict(), path) (.pt/.pth, read with PyTorch)
    or as an .npz of named arrays: {name: numpy array}."""
    if not os.path.exists(path):
        raise ValueError("%s %s: no such file" % (option, path))
    if path.endswith(".npz"):
        from .datafiles import load_npz
        d = load_npz(path, option)
        return {k: d[k] for k in d.files}
    try:
        import torch
    except ImportError:
        raise ValueError("%s %s: reading a PyTorch file needs PyTorch (pip install torch); or save the state "
                         "dict as .npz: np.savez(%r, **{k: v.numpy() for k, v in module.state_dict().items()})"
                         % (option, path, os.path.splitext(path)[0] + ".npz")) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:   # torch raises several types for files it cannot read
        raise ValueError("%s %s is not a state dict torch.load reads (%s); save one with torch.save(module."
                         "state_dict(), %r)" % (option, path, (str(e).strip().splitlines() or ["?"])[0][:120],
                                                path)) from None
    if hasattr(state, "state_dict"):
        state = state.state_dict()
    if not isinstance(state, dict) or not all(hasattr(v, "numpy") for v in state.values()):
        raise ValueError("%s %s holds %s, not a state dict; save one with torch.save(module.state_dict(), %r)"
                         % (option, path, type(state).__name__, path))
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def state_dict(plan, params, reference, initial=None):
    """The module's whole state_dict with the trained `params` ({name: array}, as
    Simulator.params() returns) in place, BatchNorms un-folded (module docstring):
    {name: numpy array} for module.load_state_dict (strict). `reference` is the original
    state dict ({name: array or tensor}) of the module the ONNX model was exported from;
    `initial`, the plan's parameters before training (default: read from the plan)."""
    from .split import merge
    if initial is None:
        from .simulator import Simulator
        initial = Simulator(plan).params()
    ref = {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for k, v in reference.items()}
    trained, start = merge(plan, params), merge(plan, initial)
    out = dict(ref)
    done = set()
    for layer in plan.meta.get("layers", []):
        names = [n for n in (layer["weight"], layer["bias"]) if n]
        if any(n in trained for n in names):
            _layer(plan, layer, trained, start, ref, out)
            done.update(names)
    for p in sorted(set(trained) - done):   # a parameter of no conv/Gemm layer, taken as it is
        key = _key(plan, p, start[p].shape, ref)
        if key is None or not np.array_equal(ref[key].reshape(-1), start[p].reshape(-1)):
            raise ValueError("trained parameter %r is in the state dict under no name with its initial value"
                             % p)
        out[key] = trained[p].reshape(ref[key].shape).astype(ref[key].dtype)
    return out


def _key(plan, p, shape, ref, node=None):
    """The state dict name of plan parameter p: its ONNX initializer name; or, for a weight the
    TorchScript exporter renamed (onnx::Conv_N), `module.weight` of the module its node's
    scope names (/features/features.0/features.0.0/Conv -> features.0.0)."""
    names = [plan.meta["params"].get(p, {}).get("init", p), p]
    if node and node.startswith("/") and node.count("/") >= 2:
        names.append(node.split("/")[-2] + ".weight")
    for n in names:
        if n in ref and ref[n].size == int(np.prod(shape)):
            return n
    return None


def _layer(plan, layer, trained, start, ref, out):
    wn, bn = layer["weight"], layer["bias"]
    Wf0 = start[wn]
    kw = _key(plan, wn, Wf0.shape, ref, layer["node"])
    if kw is None:
        raise ValueError("layer %r: no entry of the state dict is its weight %r (shape %s): is it the state dict "
                         "of the module the ONNX model came from?" % (layer["node"], wn, Wf0.shape))
    kb = kw[:-len("weight")] + "bias" if kw.endswith("weight") and kw[:-len("weight")] + "bias" in ref else None
    # the weight with output channels first, as the plan holds it (a [in, out] matrix transposed)
    axis = 1 if layer.get("w_layout") == 1 and Wf0.ndim == 2 else 0
    flip = (lambda a: a.T) if axis else (lambda a: a)
    W0 = ref[kw].astype(np.float64)
    if W0.shape != Wf0.shape:   # the state dict's Linear weight [out, in] against a MatMul's [in, out]
        W0 = W0.T
    W0, Wf0 = flip(W0), flip(Wf0).astype(np.float64)
    C = Wf0.shape[0]
    b0 = ref[kb].astype(np.float64) if kb else np.zeros(C)
    bf0 = start[bn].astype(np.float64).reshape(C) if bn else np.zeros(C)
    if np.array_equal(W0, Wf0) and (np.array_equal(b0, bf0) if bn else True) and (kb or not bn):
        if wn in trained:   # nothing folded: the trained values as they are
            out[kw] = _shaped(flip(trained[wn]), ref[kw])
        if bn in trained:
            out[kb] = _shaped(trained[bn], ref[kb])
        return
    a, b = W0.reshape(C, -1), Wf0.reshape(C, -1)
    norm = (a * a).sum(1)
    s = np.where(norm > 0, (a * b).sum(1) / np.where(norm > 0, norm, 1), np.nan)
    known = ~np.isnan(s)
    off = np.abs(b - np.nan_to_num(s)[:, None] * a).max(1)
    if np.any(off[known] > 1e-5 * np.maximum(np.abs(b).max(1), 1e-30)[known]):
        raise ValueError("layer %r: its weight is not the state dict's %r scaled per output channel (a folded "
                         "BatchNorm), so it cannot be mapped back" % (layer["node"], kw))
    m = _batchnorm(kw, C, s, b0, bf0, ref)
    if m is None:
        raise ValueError("layer %r: its weight is the state dict's %r scaled per output channel (a folded "
                         "BatchNorm), but no BatchNorm of %d channels in the state dict gives its bias"
                         % (layer["node"], kw, C))
    gamma, beta0, mean, var = (ref[m + k].astype(np.float64) for k in BN_KEYS)
    s = np.where(known, s, gamma / np.sqrt(var + EPS))
    Wf = flip(trained[wn]).astype(np.float64).reshape(C, -1) if wn in trained else b
    bf = trained[bn].astype(np.float64).reshape(C) if bn in trained else bf0
    dead = (s == 0) & np.any(Wf != 0, axis=1)   # gamma 0, yet the folded weight trained away from 0
    gamma = np.where(dead, np.sqrt(var + EPS), gamma)
    W = np.where((s != 0)[:, None], Wf / np.where(s != 0, s, 1)[:, None], a)
    W[dead] = Wf[dead]
    beta = np.where(dead, bf - (b0 - mean), beta0 + (bf - bf0))
    if wn in trained or dead.any():
        out[kw] = _shaped(flip(W.reshape(Wf0.shape)), ref[kw])
    out[m + "weight"] = _shaped(gamma, ref[m + "weight"])
    out[m + "bias"] = _shaped(beta, ref[m + "bias"])


def _batchnorm(kw, C, s, b0, bf0, ref):
    """The prefix of the BatchNorm folded into the layer of weight kw: one with C channels whose
    values give the folded bias, bf0 = s * (b0 - mean) + beta (no eps needed), nearest after kw
    in the state dict's order (module registration order: a conv, then its BatchNorm)."""
    keys = list(ref)
    at = keys.index(kw)
    found = []
    for i, k in enumerate(keys):
        m = k[:-len("running_var")]
        if not k.endswith("running_var") or not all(m + x in ref and ref[m + x].shape == (C,) for x in BN_KEYS):
            continue
        gamma, beta, mean, _ = (ref[m + x].astype(np.float64) for x in BN_KEYS)
        known = ~np.isnan(s)
        want = s * (b0 - mean) + beta
        if np.allclose(bf0[known], want[known], rtol=1e-4, atol=1e-5):
            found.append((i < at, abs(i - at), m))
    return min(found)[2] if found else None


def _shaped(v, like):
    return np.asarray(v, np.float64).reshape(like.shape).astype(like.dtype)
