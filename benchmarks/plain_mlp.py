"""The baseline: one training step of a Gemm-Relu-Gemm MLP written in plain
MicroPython (no C module), as a user without microtrain would: weights and
momentum in array('f') rows (unboxed float32, so the heap holds no float
object per weight and the garbage collector has little to walk), activations
in lists.

Cross-entropy loss and SGD with momentum as PyTorch defines it (v = mu*v + g;
p -= lr*v). Runs unchanged on MicroPython and CPython; benchmarks/bench.py
sends this file to the board, and tests/bench/test_bench.py checks it against
PyTorch autograd on the host.
"""
import math
from array import array


def make(w1, b1, w2, b2, n_in, lr, momentum, full):
    """A network from flat float sequences (row-major (out, in) weights, ONNX Gemm transB=1 layout)."""
    hidden, n_out = len(b1), len(b2)

    def rows(w, n_rows, n_cols):
        return [array("f", [w[r * n_cols + c] for c in range(n_cols)]) for r in range(n_rows)]

    def zeros(n):
        return array("f", [0.0] * n)

    return {"w1": rows(w1, hidden, n_in), "b1": array("f", b1), "w2": rows(w2, n_out, hidden), "b2": array("f", b2),
            "v1": [zeros(n_in) for _ in range(hidden)], "vb1": zeros(hidden),
            "v2": [zeros(hidden) for _ in range(n_out)], "vb2": zeros(n_out),
            "lr": lr, "mu": momentum, "full": full, "loss": None}


def _update(w, v, b, vb, g, inp, lr, mu):
    """SGD with momentum for one layer: the gradient of row k is g[k] * inp."""
    for k in range(len(w)):
        row, vrow, gk = w[k], v[k], g[k]
        for i in range(len(inp)):
            m = mu * vrow[i] + gk * inp[i]
            vrow[i] = m
            row[i] -= lr * m
        m = mu * vb[k] + gk
        vb[k] = m
        b[k] -= lr * m


def step(net, x, y):
    """One sample (x: sequence of floats, y: class index); returns the loss before the update."""
    w1, b1, w2, b2 = net["w1"], net["b1"], net["w2"], net["b2"]
    h = []
    for row, b in zip(w1, b1):
        s = b
        for w, v in zip(row, x):
            s += w * v
        h.append(s if s > 0.0 else 0.0)
    z = []
    for row, b in zip(w2, b2):
        s = b
        for w, v in zip(row, h):
            s += w * v
        z.append(s)
    top = max(z)
    e = [math.exp(v - top) for v in z]
    total = sum(e)
    loss = math.log(total) + top - z[y]
    g = [v / total for v in e]   # d loss / d logits = softmax - onehot
    g[y] -= 1.0
    lr, mu = net["lr"], net["mu"]
    if net["full"]:
        gh = [0.0] * len(h)       # through the second layer, before it changes
        for j in range(len(h)):
            if h[j] > 0.0:
                s = 0.0
                for k in range(len(w2)):
                    s += w2[k][j] * g[k]
                gh[j] = s
        _update(w2, net["v2"], b2, net["vb2"], g, h, lr, mu)
        _update(w1, net["v1"], b1, net["vb1"], gh, x, lr, mu)
    else:
        _update(w2, net["v2"], b2, net["vb2"], g, h, lr, mu)
    net["loss"] = loss
    return loss
