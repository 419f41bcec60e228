"""Learning quality of sparse updates on data nobody here made: scikit-learn's digits.

A small MobileNet-style CNN (3x3 conv, then two inverted-residual blocks of 1x1 expansion,
3x3 depthwise and 1x1 projection, global average pool, Linear head) is pretrained in PyTorch
on the digits as they are (the "source" domain), exported to ONNX and compiled with its frozen
part int8 (post-training calibration on source images). It then adapts, in the host simulator
(the C core), to a shifted domain defined here: every image shifted one pixel right and one
down, its contrast scaled by 0.6 around 0.5 and Gaussian noise of 0.05 added (a camera mounted off
centre, in flatter light). The adaptation set is 600 shifted images; the test set the other
shifted images (of digits never seen in adaptation). Rows: no adaptation, last layer, every
bias, a MIT-style sparse scheme (biases of the two blocks + a quarter / half of the input
channels of their 1x1 expansion convs + the head), the schemes --budget chooses for the sparse
scheme's peak RAM (by its fit-first rule, and by a probe on a proxy task: --budget-probe with 600
source-domain images blurred, brightened and noised, proxy_domain below, a change of another
kind than the shifted domain's: the user's own data never reach the host), and full float
fine-tuning in PyTorch (the same per-sample SGD, the best of three learning rates, which
favours the reference), each with its test accuracy and peak RAM (for PyTorch the float
full-update plan's, its activations kept as PyTorch's autograd keeps them; the same plan with
saved activations made again in the backward, recompute.py, is printed below the table) and its
share of the full fine-tuning's gain.

The frozen conv weights of the float layers are int8 with per-channel scales (--frozen-weights,
default int8: an int8 backbone, w8.py), so each block the gradient passes through runs a
channel at a time (dw_stream.py, docs/sparse.md). --trained-weights int8 stores the trained
conv/Linear weights of the microtrain rows as int8 codes with per-channel scales, updated with
the float gradient and rounded (docs/sparse.md).

    python benchmarks/sparse_digits.py [--epochs 4] [--saved int8|bits|float32] [--json FILE]
                                       [--trained-weights float32|int8] [--frozen-weights float32|int8]
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import microtrain
import microtrain.w8
from microtrain.budget import choose

LR, MOMENTUM = 0.003, 0.9  # adaptation: per-sample SGD, on the board and in PyTorch
FULL_LRS = (0.0003, 0.001, 0.003)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Conv2d(1, 16, 3, padding=1)
        self.blocks = nn.ModuleList()
        for _ in range(2):
            self.blocks.append(nn.ModuleDict(dict(pw1=nn.Conv2d(16, 48, 1), dw=nn.Conv2d(48, 48, 3, padding=1, groups=48),
                                                  pw2=nn.Conv2d(48, 16, 1))))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu6(self.first(x))
        for b in self.blocks:
            x = b["pw2"](F.relu6(b["dw"](F.relu6(b["pw1"](x))))) + x
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def shift_domain(x, rng):
    """One pixel right and down (zeros come in), contrast 0.6 around 0.5, noise sigma 0.05."""
    y = np.zeros_like(x)
    y[..., 1:, 1:] = x[..., :-1, :-1]
    return ((y - 0.5) * 0.6 + 0.5 + rng.normal(0, 0.05, size=y.shape)).astype(np.float32)


def proxy_domain(x, rng):
    """The probe's proxy task (budget.py): a 3x3 box blur, brightness 0.8x + 0.2, noise sigma 0.1.
    What a developer can make from the images the host has, without the user's."""
    pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    blurred = sum(pad[..., i:i + x.shape[-2], j:j + x.shape[-1]] for i in range(3) for j in range(3)) / 9
    return (blurred * 0.8 + 0.2 + rng.normal(0, 0.1, size=x.shape)).astype(np.float32)


def torch_fit(model, x, y, epochs, batch=1, adam=False, lr=LR):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3) if adam else \
        torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            k = order[i:i + batch]
            opt.zero_grad()
            F.cross_entropy(model(torch.from_numpy(x[k])), torch.as_tensor(y[k])).backward()
            opt.step()


def torch_acc(model, x, y):
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=4, help="adaptation epochs")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--saved", choices=microtrain.options.SAVED, default="bits",
                    help="how the ReLU6 outputs the backward reads are kept (compile(saved=...)); bench/sparse_digits"
                    ".json and docs/sparse.md are measured with the default, bits")
    ap.add_argument("--trained-weights", choices=microtrain.options.TRAINED_WEIGHTS, default="float32",
                    help="how the microtrain rows store their trained weights (compile(trained_weights=...))")
    ap.add_argument("--frozen-weights", choices=microtrain.options.FROZEN_WEIGHTS, default="int8",
                    help="how the microtrain rows store the frozen weights of their float layers "
                    "(compile(frozen_weights=...))")
    args = ap.parse_args()
    from sklearn.datasets import load_digits
    d = load_digits()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(d.target))
    x = (d.images[order] / 16.0).astype(np.float32)[:, None]
    y = d.target[order]
    src_x, src_y = x[:1000], y[:1000]                # pretraining, source domain
    ada_x, ada_y = shift_domain(x[1000:1600], rng), y[1000:1600]   # adaptation, shifted
    test_x, test_y = shift_domain(x[1600:], rng), y[1600:]         # test, shifted, other digits
    torch.set_num_threads(1)   # tiny ops: threads only add overhead
    net = Net()
    torch_fit(net, src_x, src_y, 60, batch=16, adam=True)   # pretraining: any recipe
    net.eval()
    print("pretrained: source-domain accuracy %.3f (held-out source images), shifted test %.3f"
          % (torch_acc(net, (x[1600:]), y[1600:]), torch_acc(net, test_x, test_y)), flush=True)
    q = dict(quantize="int8", calibration=src_x[:200], saved=args.saved, lr=LR, momentum=MOMENTUM,
             trained_weights=args.trained_weights, frozen_weights=args.frozen_weights)
    sparse = {"scheme": "digits-sparse", "classifier": "full",
              "bias_updates": [{"conv_index": k} for k in range(1, 7)],
              "weight_updates": [{"conv_index": 1, "ratio": 0.25, "select": "magnitude+"},
                                 {"conv_index": 4, "ratio": 0.5, "select": "magnitude+"}]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "net.onnx")
        torch.onnx.export(net, (torch.zeros(1, 1, 8, 8),), path, dynamo=False, input_names=["x"], output_names=["y"])
        plans = {"last layer": microtrain.compile(path, update="last-layer", **q),
                 "every bias + head": microtrain.compile(path, update=_biases_and_head(path), **q),
                 "sparse scheme": microtrain.compile(path, update=sparse, **q)}
        budget = plans["sparse scheme"].report()["peak_ram_bytes"]
        plans["budget %d B, fit-first" % budget] = choose(path, budget, **q)[1]
        proxy = (proxy_domain(src_x[:600], np.random.default_rng(5)), src_y[:600])
        plans["budget %d B, proxy probe" % budget] = choose(path, budget, probe=proxy, **q)[1]
        # PyTorch's autograd keeps every activation the backward reads: so does this plan
        full_plan = microtrain.compile(path, update="full", lr=LR, momentum=MOMENTUM, recompute=False)
        full_recompute = microtrain.compile(path, update="full", lr=LR, momentum=MOMENTUM)
    sim0 = microtrain.Simulator(plans["last layer"])
    rows.append(dict(mode="no adaptation", accuracy=sim0.evaluate(test_x, test_y),
                     peak_ram_bytes=None))
    for name, plan in plans.items():
        sim = microtrain.Simulator(plan)
        sim.fit(ada_x, ada_y, epochs=args.epochs, progress=False)
        rows.append(dict(mode=name, accuracy=sim.evaluate(test_x, test_y),
                         peak_ram_bytes=plan.report()["peak_ram_bytes"]))
        if name.startswith("budget"):   # what it chose
            u = plan.meta["update"]
            rows[-1]["scheme"] = {"biases": [b["conv_index"] for b in u["bias_updates"]],
                                  "weights": [[w["conv_index"], w["ratio"]] for w in u["weight_updates"]]}
            print("%s: biases of convs %s, weights %s" % (name, rows[-1]["scheme"]["biases"],
                                                         rows[-1]["scheme"]["weights"]), flush=True)
    best = None
    for lr in FULL_LRS:   # the reference gets the best of several learning rates
        tuned = Net()
        tuned.load_state_dict(net.state_dict())
        torch_fit(tuned, ada_x, ada_y, args.epochs, lr=lr)
        acc = torch_acc(tuned, test_x, test_y)
        print("full fine-tuning in PyTorch, lr %g: %.3f" % (lr, acc), flush=True)
        best = max(best or (acc, lr), (acc, lr))
    rows.append(dict(mode="full fine-tuning (PyTorch, float, lr %g)" % best[1], accuracy=best[0],
                     peak_ram_bytes=full_plan.report()["peak_ram_bytes"]))
    base, full = rows[0]["accuracy"], rows[-1]["accuracy"]
    print("%-36s %9s %14s %10s" % ("update", "accuracy", "peak RAM (B)", "of gain"))
    for r in rows:
        gain = (r["accuracy"] - base) / (full - base) if full != base else float("nan")
        r["share_of_full_gain"] = gain
        print("%-36s %9.3f %14s %9.0f%%" % (r["mode"], r["accuracy"],
                                            r["peak_ram_bytes"] if r["peak_ram_bytes"] else "-", 100 * gain))
    kept, again = full_plan.report()["peak_ram_bytes"], full_recompute.report()["peak_ram_bytes"]
    print("full update's peak RAM: %d B keeping its activations (as PyTorch does; the row above), %d B making "
          "some again in the backward (microtrain's default, recompute.py); the sparse scheme is %.1f%% and %.1f%% "
          "of them" % (kept, again, 100 * budget / kept, 100 * budget / again))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "sparse_digits", "epochs": args.epochs, "rows": rows,
                       "full_update_peak_ram_bytes": {"activations_kept": kept, "recompute": again}}, f, indent=1)
            f.write("\n")
    return 0


def _biases_and_head(path):
    plan = microtrain.compile(path, update="full")
    names = plan.params()
    return [n for n in names if n.endswith("bias")] + [n for n in names if n.startswith("fc.")]


if __name__ == "__main__":
    sys.exit(main())
