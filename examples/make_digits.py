#!/usr/bin/env python3
"""Build the bundled microtrain demo: a tiny digit CNN plus a "user" dataset.

Story
-----
The model is trained on a PC on clean 8x8 digits (scikit-learn's bundled
``load_digits``).  The user's board, however, has its 8x8 sensor wired with
the columns reversed, so every image it sees is mirrored left-right.  The PC
model does badly on these images (about a third correct).  Re-training only the
last layer (the Gemm classifier) on a few hundred of the user's own labelled
samples - which is what the microcontroller does on-device - recovers most of
the accuracy.

Outputs (next to this script)
-----------------------------
``digits_cnn.onnx``   the PC-trained model, opset 13, input "input" (1,1,8,8),
                      output "logits" (1,10), batch dimension fixed to 1.
``digits_user.npz``   ``x``/``y``: user-domain (mirrored) training samples,
                      ``x_test``/``y_test``: user-domain held-out samples.
                      x is float32 (N,1,8,8) in [0,1], y is int64.

Run with ``python examples/make_digits.py`` (from anywhere).  Everything is
seeded and single-threaded, so reruns produce identical numbers and files.
"""

import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import onnx
from onnx.reference import ReferenceEvaluator
from sklearn.datasets import load_digits

SEED = 0
HERE = os.path.dirname(os.path.abspath(__file__))
ONNX_PATH = os.path.join(HERE, "digits_cnn.onnx")
NPZ_PATH = os.path.join(HERE, "digits_user.npz")

# Split of the 1797 digits (random, disjoint):
N_PC_TRAIN = 900      # clean, used to train the PC model
N_PC_TEST = 200       # clean, held out: PC accuracy
N_USER_TRAIN = 400    # mirrored, the user's on-device training data
# the remaining 297 samples: mirrored, user held-out test set

# Last-layer retraining recipes evaluated in PyTorch (batch 1, plain CE loss).
# The first one is the reference number for the on-device demo.
RECIPES = [
    # (name, lr, momentum, epochs)
    ("sgd lr=0.05 mom=0.9 5ep", 0.05, 0.9, 5),
    ("sgd lr=0.05 mom=0.0 5ep", 0.05, 0.0, 5),
    ("sgd lr=0.01 mom=0.9 5ep", 0.01, 0.9, 5),
    ("sgd lr=0.05 mom=0.9 3ep", 0.05, 0.9, 3),
]
N_SHUFFLES = 5  # data orders tried per recipe (spread of the result)

ALLOWED_OPS = {"Conv", "Relu", "Clip", "MaxPool", "AveragePool",
               "GlobalAveragePool", "Flatten", "Reshape", "Gemm", "MatMul",
               "Add", "BatchNormalization", "Softmax", "Constant"}


def user_sensor(x):
    """The user's sensor: columns wired in reverse -> left-right mirror."""
    return np.ascontiguousarray(x[..., ::-1], dtype=np.float32)


class DigitsCNN(nn.Module):
    """1018 parameters (954 after BN folding, ~3.8 KB as float32)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)               # 8x8x8
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)       # depthwise
        self.bn2 = nn.BatchNorm2d(8)
        self.relu6 = nn.ReLU6()                                 # -> Clip(0,6)
        self.pool = nn.MaxPool2d(2)                             # 8x4x4
        self.pw = nn.Conv2d(8, 16, 1)                           # 16x4x4
        self.bn3 = nn.BatchNorm2d(16)
        self.relu3 = nn.ReLU()
        self.avg = nn.AvgPool2d(2)                              # 16x2x2
        self.flatten = nn.Flatten()                             # 64
        self.fc = nn.Linear(64, 10)                             # trained on-device

    def features(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = x + self.relu6(self.bn2(self.dw(x)))                # residual Add
        x = self.pool(x)
        x = self.relu3(self.bn3(self.pw(x)))
        return self.flatten(self.avg(x))

    def forward(self, x):
        return self.fc(self.features(x))


def accuracy(logits, y):
    return float((logits.argmax(1) == y).float().mean())


def train_pc(model, x, y, epochs=60, batch=32, lr=5e-3):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(x))
        for i in range(0, len(x), batch):
            b = perm[i:i + batch]
            opt.zero_grad()
            F.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
    return model.eval()


def retrain_last_layer(fc0, feats, y, lr, momentum, epochs, seed):
    """Batch-1 SGD on a copy of the Linear layer only (features are frozen,
    so they are computed once; this is exactly last-layer training)."""
    fc = nn.Linear(fc0.in_features, fc0.out_features)
    fc.load_state_dict(fc0.state_dict())
    opt = torch.optim.SGD(fc.parameters(), lr=lr, momentum=momentum)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for i in torch.randperm(len(feats), generator=g).tolist():
            opt.zero_grad()
            F.cross_entropy(fc(feats[i:i + 1]), y[i:i + 1]).backward()
            opt.step()
    return fc


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(SEED)

    digits = load_digits()
    x_all = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y_all = digits.target.astype(np.int64)

    perm = rng.permutation(len(x_all))
    a = N_PC_TRAIN
    b = a + N_PC_TEST
    c = b + N_USER_TRAIN
    i_pc_tr, i_pc_te, i_u_tr, i_u_te = perm[:a], perm[a:b], perm[b:c], perm[c:]

    x_pc_tr, y_pc_tr = x_all[i_pc_tr], y_all[i_pc_tr]
    x_pc_te, y_pc_te = x_all[i_pc_te], y_all[i_pc_te]
    x_u_tr, y_u_tr = user_sensor(x_all[i_u_tr]), y_all[i_u_tr]
    x_u_te, y_u_te = user_sensor(x_all[i_u_te]), y_all[i_u_te]
    print(f"split: pc_train={len(i_pc_tr)} pc_test={len(i_pc_te)} "
          f"user_train={len(i_u_tr)} user_test={len(i_u_te)}")

    # ---- PC training ---------------------------------------------------
    model = DigitsCNN()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model parameters: {n_params}")
    train_pc(model, torch.from_numpy(x_pc_tr), torch.from_numpy(y_pc_tr))

    t = torch.from_numpy
    with torch.no_grad():
        acc_pc_train = accuracy(model(t(x_pc_tr)), t(y_pc_tr))
        acc_clean = accuracy(model(t(x_pc_te)), t(y_pc_te))
        acc_before = accuracy(model(t(x_u_te)), t(y_u_te))
        acc_before_train = accuracy(model(t(x_u_tr)), t(y_u_tr))
        f_u_tr = model.features(t(x_u_tr))
        f_u_te = model.features(t(x_u_te))

    # ---- export ---------------------------------------------------------
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based")
    torch.onnx.export(model.eval(), torch.zeros(1, 1, 8, 8), ONNX_PATH,
                      dynamo=False, opset_version=13,
                      input_names=["input"], output_names=["logits"])
    m = onnx.load(ONNX_PATH)   # as the exporter wrote it: microtrain folds its Constant nodes
    onnx.checker.check_model(m, full_check=True)
    ops = [n.op_type for n in m.graph.node]
    print("onnx ops (graph order):", " ".join(ops))
    print("onnx op types:", sorted(set(ops)))
    bad = sorted(set(ops) - ALLOWED_OPS)
    if bad:
        sys.exit(f"ERROR: disallowed ops in graph: {bad}")
    if "Softmax" in ops[:-1]:
        sys.exit("ERROR: Softmax only allowed as the final op")
    io = [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim])
          for v in list(m.graph.input) + list(m.graph.output)]
    print("onnx io:", io)

    ref = ReferenceEvaluator(m)
    max_diff = 0.0
    check = np.concatenate([x_pc_te[:4], x_u_te[:4]])
    for s in check:
        s = s[None]
        (o,) = ref.run(None, {"input": s})
        with torch.no_grad():
            pt = model(t(s)).numpy()
        max_diff = max(max_diff, float(np.abs(o - pt).max()))
    print(f"onnx ReferenceEvaluator vs torch, {len(check)} samples: "
          f"max abs diff = {max_diff:.3g}")

    # ---- user dataset ----------------------------------------------------
    np.savez_compressed(NPZ_PATH, x=x_u_tr, y=y_u_tr,
                        x_test=x_u_te, y_test=y_u_te)

    # ---- what on-device training should reach --------------------------
    print()
    print(f"PC model, clean train ({len(y_pc_tr)}):        {acc_pc_train:.3f}")
    print(f"PC model, clean held-out test ({len(y_pc_te)}): {acc_clean:.3f}")
    print(f"PC model, user train ({len(y_u_tr)}):          {acc_before_train:.3f}")
    print(f"PC model, user test ({len(y_u_te)})  BEFORE:    {acc_before:.3f}")
    print(f"last-layer retraining on user train (batch 1, {N_SHUFFLES} data "
          f"orders), user test AFTER:")
    yt_u_tr, yt_u_te = t(y_u_tr), t(y_u_te)
    for name, lr, mom, ep in RECIPES:
        accs = []
        for k in range(N_SHUFFLES):
            fc = retrain_last_layer(model.fc, f_u_tr, yt_u_tr, lr, mom, ep,
                                    seed=SEED + k)
            with torch.no_grad():
                accs.append(accuracy(fc(f_u_te), yt_u_te))
        accs = np.array(accs)
        print(f"  {name}:  first={accs[0]:.3f}  mean={accs.mean():.3f}  "
              f"min={accs.min():.3f}  max={accs.max():.3f}")

    print()
    for p in (ONNX_PATH, NPZ_PATH):
        print(f"wrote {os.path.relpath(p)} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
