"""Gradient-norm clipping (compile(clip_grad=...), --clip-grad), against PyTorch.

The oracle: torch.nn.utils.clip_grad_norm_(params, max_norm) between backward()
and torch.optim.SGD.step(), in float64, on the same module exported with both
exporters. Per update, every trained parameter must agree, and the run must
include updates that were clipped and updates that were not (the coefficient is
min(1, max_norm / (norm + 1e-6)), so both branches are checked). A batch whose
gradient norm is not finite is rejected: nothing changes, info()["rejected"]
counts it, and training continues as if that batch had not happened.
"""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as TF

import microtrain
from microtrain import format as F

from oracle_models import export

RTOL = 1e-4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(TF.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.conv, self.fc = nn.Conv2d(2, 4, 3, padding=1), nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(TF.relu(self.conv(x)).mean((2, 3)))


def close(a, b, what):
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    err, scale = np.abs(a - b).max(), max(np.abs(b).max(), 1e-6)
    assert err <= RTOL * scale, "%s: max |diff| %.3g > %.0e * %.3g" % (what, err, RTOL, scale)


def loss_of(out, y, loss):
    return TF.cross_entropy(out, torch.as_tensor(y)) if loss == "cross-entropy" else \
        TF.mse_loss(out, torch.from_numpy(y).double())


def median_norm(module, xs, ys, loss, batch):
    """The median gradient norm of the batches of an unclipped run (float32-representable), so
    that a run clipped to it clips some updates and leaves others alone."""
    model = copy.deepcopy(module).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    for i in range(0, len(xs), batch):
        opt.zero_grad()
        loss_of(model(torch.from_numpy(xs[i:i + batch]).double()), ys[i:i + batch], loss).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))))
        opt.step()
    return float(np.float32(np.median(norms)))


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("shape, loss, batch, momentum, weight_decay", [
    ("mlp", "cross-entropy", 1, 0.0, 0.0),
    ("mlp", "mse", 3, 0.9, 0.01),
    ("cnn", "cross-entropy", 2, 0.9, 0.0),
])
def test_clip_grad_norm_matches_pytorch_every_update(exporter, shape, loss, batch, momentum, weight_decay, tmp_path):
    module = MLP() if shape == "mlp" else CNN()
    x_shape = (6,) if shape == "mlp" else (2, 5, 5)
    path = export(module.eval(), torch.zeros((1,) + x_shape), exporter, str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(1)
    xs = (rng.normal(size=(12 * batch,) + x_shape) * rng.uniform(0.2, 3, size=(12 * batch,) + (1,) * len(x_shape)))
    xs = xs.astype(np.float32)
    ys = rng.integers(0, 3, 12 * batch) if loss == "cross-entropy" else rng.normal(size=(12 * batch, 3)).astype(np.float32)
    max_norm = median_norm(module, xs, ys, loss, batch)
    plan = microtrain.compile(path, update="full", loss=loss, lr=0.1, momentum=momentum, weight_decay=weight_decay,
                              batch=batch, clip_grad=max_norm)
    sim = microtrain.Simulator(plan)
    model = copy.deepcopy(module).double()
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(sim.params()), "the plan trains other parameters than the module has"
    opt = torch.optim.SGD(params.values(), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    clipped = kept = 0
    for i in range(0, len(xs), batch):
        for x, y in zip(xs[i:i + batch], ys[i:i + batch]):
            sim.step(x, y)
        opt.zero_grad()
        loss_of(model(torch.from_numpy(xs[i:i + batch]).double()), ys[i:i + batch], loss).backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params.values(), max_norm))
        clipped += norm > max_norm
        kept += norm <= max_norm
        opt.step()
        got = sim.params()
        for name, p in params.items():
            close(got[name], p.detach().numpy(), "%s after update %d (norm %.3g)" % (name, i // batch + 1, norm))
    assert clipped >= 2 and kept >= 2, "the run must clip some updates and not others: %d, %d" % (clipped, kept)


def mlp_plan(tmp_path, **kw):
    path = export(MLP().eval(), torch.zeros(1, 6), "ts13", str(tmp_path / "mlp.onnx"))
    return microtrain.compile(path, update="full", lr=0.1, momentum=0.9, clip_grad=1.0, **kw)


def test_a_non_finite_gradient_norm_is_rejected_and_changes_nothing(tmp_path):
    """Inputs of 1e25: the loss is finite, the squared gradient norm overflows. The
    step raises, nothing changes (parameters, momentum), rejected counts it, and the
    next batch trains exactly as in a run that never saw the bad one."""
    plan = mlp_plan(tmp_path, batch=2)
    good, bad = np.linspace(-1, 1, 6).astype(np.float32), np.full(6, 1e25, np.float32)
    sim, ref = microtrain.Simulator(plan), microtrain.Simulator(plan)
    for s in (sim, ref):
        s.step(good, 0)
        s.step(good, 1)   # one update, so the momentum buffers hold something
    before = sim.core.save_state()
    sim.step(bad, 2)      # the loss of this sample is finite: it is accumulated
    with pytest.raises(ValueError, match="gradient is not finite; parameters were not updated"):
        sim.step(good, 1)
    info = sim.core.info()
    assert info["rejected"] == 1 and info["updates"] == 1
    state = sim.core.save_state()
    hdr = F.STATE_HEADER_BYTES
    assert state[hdr:-4] == before[hdr:-4], "parameters, momentum or accumulators changed"
    for s in (sim, ref):
        s.step(good, 2)
        s.step(good, 0)
    for name, v in ref.params().items():
        assert np.array_equal(sim.params()[name], v), name


def test_clip_grad_is_validated():
    from microtrain.native import Core, PlanError
    import struct
    import zlib
    import models
    plan = microtrain.compile(models.mlp(), update="full", lr=0.1, clip_grad=0.5)
    ops = [(code, pos) for code, pos in plan_ops(plan)]
    assert {F.OPS_BY_NAME["GRAD_NORM2"].code, F.OPS_BY_NAME["GRAD_CLIP"].code} <= {c for c, _ in ops}
    clip_at = next(pos for code, pos in ops if code == F.OPS_BY_NAME["GRAD_CLIP"].code)
    spec = F.OPS_BY_NAME["GRAD_CLIP"]
    attr_at = clip_at + F.OP_HEAD_BYTES + ((2 * len(spec.slots) + 3) & ~3)
    # a subnormal bound too: a board that flushes subnormals to zero (the RP2040's float
    # library) would read 0, so the plan would be valid on the host and refused there
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-45, 2.0 ** -127):
        b = bytearray(plan.data)
        struct.pack_into("<f", b, attr_at, bad)
        struct.pack_into("<I", b, F.header_offsets()["crc32"], zlib.crc32(bytes(b[F.CRC_START:])))
        with pytest.raises(PlanError, match="shapes do not fit the op"):
            Core(bytes(b))
    for bad in (0, -1, float("nan"), 1e-40):
        with pytest.raises((ValueError, TypeError)):
            microtrain.compile(models.mlp(), update="full", clip_grad=bad)


def plan_ops(plan):
    pos = plan.header["ops_off"]
    for _ in range(plan.header["n_ops"]):
        start = pos
        code, _, _, _, pos = F.unpack_op(plan.data, pos)
        yield code, start
