"""The generic gesture model: an MLP trained with PyTorch on wearer 0's windows,
exported to ONNX and compiled into a plan whose whole network trains on the board.

    python examples/gesture/make_model.py OUT_DIR     # writes gesture.onnx and gesture.mtp
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sensor  # noqa: E402
import microtrain  # noqa: E402


def data(wearer, start, n):
    xs, ys = zip(*(sensor.window(wearer, k) for k in range(start, start + n)))
    return np.array(xs, np.float32), np.array(ys, np.int64)


def main(out):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(sensor.N_IN, 24), nn.ReLU(), nn.Linear(24, len(sensor.GESTURES)))
    x, y = data(0, 0, 600)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
    os.makedirs(out, exist_ok=True)
    onnx_path = os.path.join(out, "gesture.onnx")
    torch.onnx.export(model.eval(), (torch.zeros(1, sensor.N_IN),), onnx_path, input_names=["x"],
                      output_names=["logits"], dynamo=False, opset_version=13)
    plan = microtrain.compile(onnx_path, update="full", loss="cross-entropy", lr=0.02, momentum=0.9)
    plan.save(os.path.join(out, "gesture.mtp"))
    return plan


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/gesture")
