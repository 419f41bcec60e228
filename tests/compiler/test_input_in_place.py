"""Plans that read each sample where the caller keeps it (compile(input_in_place=True)).

The input tensor has storage INPUT: the core sets its address to the caller's buffer for the
step (mt_set_input) and copies nothing, so the arena has no room for it and peak RAM leaves it
out. Checked, for both exporters:
* a CNN, an MLP, a keyword-spotting net, a model whose first op is a ReLU (which the copying plan
  may run in place over its input) and one whose first op is a Flatten (a view of the input):
  predictions, every step's loss and every parameter after 10 steps with momentum 0.9 are bit
  for bit those of the plan that copies its input; the caller's sample is unchanged by every
  step; the arena is no larger;
* the CNN trained whole against PyTorch autograd (test_torch_exactness's check);
* an int8 model with int8 input whose first op is a depthwise conv, which the copying plan runs in
  place over its input: the in-place plan runs it into the arena instead, with the same numbers;
* MCUNet-5fps with MIT's 49kb scheme and int8 input: the same numbers as the copying plan, and
  a lower peak RAM;
* refused, with the problem named: uint8 input in place (the core flips it to int8 in a copy),
  a float sample at an odd address given to the core, running an op with no sample set, and plans
  whose records put INPUT storage where it does not belong (the validator, a CRC-fixed mutation).
"""
from __future__ import annotations

import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

import microtrain
from microtrain import format as F
from microtrain._native import ffi, lib
from microtrain.native import Core, PlanError

import test_torch_exactness as TE
from oracle_models import MODEL_CASES, VIEW_CASES, Case, case_onnx
from tte_parity import assert_trains_alike, mcunet, tte

EXPORTERS = ("ts13", "dynamo")
STEPS = 10


class ReluFirst(nn.Module):
    """relu(x) first: an op the copying plan may run in place over its input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = torch.relu(self.conv(torch.relu(x)))
        return self.fc(y.mean(dim=(2, 3)))


class FlattenFirst(nn.Module):
    """flatten(x) first: a view of the input, read in place too."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2 * 4 * 4, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(torch.flatten(x, 1))))


CASES = {
    "cnn": MODEL_CASES["cnn"],
    "mlp": MODEL_CASES["mlp"],
    "keyword_spotting": VIEW_CASES["keyword_spotting"],
    "relu_first": Case("relu_first", ReluFirst, (2, 4, 4), n_out=3),
    "flatten_first": Case("flatten_first", FlattenFirst, (2, 4, 4), n_out=3),
}


def plans(path, **options):
    kw = dict(update="full", lr=0.02, momentum=0.9, **options)
    return microtrain.compile(path, **kw), microtrain.compile(path, input_in_place=True, **kw)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_in_place_trains_as_the_copying_plan(name, exporter, tmp_path):
    case = CASES[name]
    path, _ = case_onnx(case, exporter, str(tmp_path))
    copy, inplace = plans(path)
    x_id = inplace.header["input_tensor"]
    assert inplace.tensors[x_id]["storage"] == "INPUT" and copy.tensors[x_id]["storage"] == "ARENA"
    assert inplace.report()["input_in_place"] and not copy.report()["input_in_place"]
    assert inplace.report()["arena_bytes"] <= copy.report()["arena_bytes"]
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(STEPS,) + tuple(case.shape)).astype(np.float32)
    ys = rng.integers(0, case.n_out, STEPS)
    got = []
    for plan in (copy, inplace):
        sim = microtrain.Simulator(plan)
        out = sim.predict(xs[0])
        losses = []
        for x, y in zip(xs, ys):
            before = x.tobytes()
            losses.append(sim.step(x, int(y)))
            assert x.tobytes() == before, "the step wrote into the caller's sample"
        got.append((out, losses, sim.params()))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    assert got[0][1] == got[1][1]
    for k in got[0][2]:
        np.testing.assert_array_equal(got[0][2][k], got[1][2][k], err_msg=k)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_in_place_cnn_against_pytorch(exporter, tmp_path, monkeypatch):
    case = MODEL_CASES["cnn"]
    path, oracle = case_onnx(case, exporter, str(tmp_path))
    compile_plan = TE.compile_plan
    monkeypatch.setattr(TE, "compile_plan", lambda *a, **k: microtrain.compile(
        a[0], update=a[1], loss=a[2], lr=TE.LR[a[2]], momentum=TE.MOMENTUM, batch=a[3], input_in_place=True))
    plan, _, _ = TE.train_both(path, case, oracle.double(), "full", "cross-entropy", 1)
    assert plan.report()["input_in_place"] and compile_plan is not TE.compile_plan


def test_mcunet_49kb_int8_input_in_place():
    path, opts = tte("mcunet-5fps", "49kb", "int8")
    copy = microtrain.compile(path, **opts)
    inplace = microtrain.compile(path, input_in_place=True, **opts)
    xs = np.random.default_rng(5).integers(-128, 128, (2, 1, 3, 128, 128)).astype(np.int8)
    assert_trains_alike(copy, inplace, xs=xs, ys=[3, 7])
    r, c = inplace.report(), copy.report()
    assert r["input_bytes"] == 3 * 128 * 128
    assert r["peak_ram_bytes"] < c["peak_ram_bytes"]


class DepthwiseFirst(nn.Module):
    """A depthwise conv first: int8 with int8 input, the copying plan runs it in place over its input
    (CONV2D_Q8_DW_INPLACE); reading the input in place, it must not."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.pw = nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.pw(torch.relu(self.dw(x)))).mean(dim=(2, 3)))


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_int8_depthwise_first_not_run_over_the_sample(exporter, tmp_path):
    path, _ = case_onnx(Case("dw_first", DepthwiseFirst, (4, 6, 6), n_out=3), exporter, str(tmp_path))
    rng = np.random.default_rng(4)
    opts = dict(update="last-layer", lr=0.05, momentum=0.9, quantize="int8", input_dtype="int8", input_quant=(0.05, 0),
                calibration=rng.normal(size=(16, 4, 6, 6)).astype(np.float32))
    copy = microtrain.compile(path, **opts)
    inplace = microtrain.compile(path, input_in_place=True, **opts)
    assert copy.ops[0]["op"] == "CONV2D_Q8_DW_INPLACE" and inplace.ops[0]["op"] == "CONV2D_Q8"
    xs = rng.integers(-128, 128, (STEPS, 4, 6, 6)).astype(np.int8)
    got = []
    for plan in (copy, inplace):
        sim = microtrain.Simulator(plan)
        losses = []
        for i, x in enumerate(xs):
            before = x.tobytes()
            losses.append(sim.step(x, i % 3))
            assert x.tobytes() == before
        got.append((losses, sim.predict(xs[0]).tolist()))
    assert got[0] == got[1]


def test_uint8_input_in_place_refused():
    path, opts = mcunet("49kb")
    with pytest.raises(ValueError, match=r"input_in_place .* uint8 input is flipped to int8 in a copy.*input_dtype='int8'"):
        microtrain.compile(path, input_in_place=True, **opts)
    with pytest.raises(ValueError, match="input_in_place must be True or False"):
        microtrain.compile(path, input_in_place="yes", **opts)


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory):
    path, _ = case_onnx(MODEL_CASES["mlp"], "ts13", str(tmp_path_factory.mktemp("mlp")))
    return microtrain.compile(path, update="full", input_in_place=True)


def test_core_refuses_an_unaligned_float_sample_and_a_missing_one(mlp_plan):
    core = Core(mlp_plan.data)
    n = lib.mt_input_len(core.ctx)
    raw = np.zeros(4 * n + 4, np.uint8)
    odd = ffi.cast("const void *", ffi.from_buffer(raw)) + 1
    assert lib.mt_set_input(core.ctx, odd, n) == [name for name, _ in F.ERRORS].index("ALIGN") + 1
    with pytest.raises(ValueError, match="reads its input in place and none is set"):
        core.run_op(0)
    x = np.ones(n, np.float32)
    x[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        core.set_input(x)
    with pytest.raises(ValueError, match="none is set"):   # a refused sample leaves none set
        core.run_op(0)
    core.set_input(np.ones(n, np.float32))
    core.run_op(0)
    core.step_label(np.ones(n, np.float32), 1)
    with pytest.raises(ValueError, match="none is set"):   # a step's sample is the caller's for the step only
        core.run_op(0)


def _with_tensor_field(plan, i, field, value):
    """The plan with tensor i's record field set, the CRC fixed: only the validator stands between."""
    b = bytearray(plan.data)
    off = plan.header["tensors_off"] + i * F.TENSOR_BYTES + F.tensor_offsets()[field]
    fmt = dict(F.TENSOR_FIELDS)[field]
    struct.pack_into("<" + fmt, b, off, value)
    ho = F.header_offsets()["crc32"]
    b[ho:ho + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


def test_validator_refuses_input_storage_where_it_does_not_belong(mlp_plan, tmp_path):
    x_id = mlp_plan.header["input_tensor"]
    Core(mlp_plan.data)   # the plan itself loads
    other = next(i for i, t in enumerate(mlp_plan.tensors) if t["storage"] == "ARENA" and i != x_id)
    bad = {
        "another tensor in the input's storage": _with_tensor_field(mlp_plan, other, "storage", F.STORAGES["INPUT"]),
        "the input at an offset": _with_tensor_field(mlp_plan, x_id, "offset", F.ALIGN),
    }
    for what, data in bad.items():
        with pytest.raises(PlanError, match="invalid tensor record"):
            Core(data)
    # uint8 input read in place: the plan's input dtype field set to U8 on an int8-input plan
    path, opts = tte("mcunet-5fps", "49kb", "int8")
    p8 = microtrain.compile(path, update="none", **{k: v for k, v in opts.items() if k not in ("update", "scheme")},
                            input_in_place=True)
    b = bytearray(p8.data)
    b[F.header_offsets()["input_dtype"]] = F.DTYPES["U8"][0]
    ho = F.header_offsets()["crc32"]
    b[ho:ho + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    with pytest.raises(PlanError, match="invalid tensor record"):
        Core(bytes(b))


def test_cli_compile_input_in_place(tmp_path):
    path, _ = case_onnx(MODEL_CASES["cnn"], "ts13", str(tmp_path))
    out = str(tmp_path / "p.mtp")
    r = subprocess.run([sys.executable, "-m", "microtrain", "compile", path, "-o", out, "--update", "full",
                        "--input-in-place"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "input: 256 B read in place where the caller keeps it" in r.stdout
    assert microtrain.Plan(open(out, "rb").read()).report()["input_in_place"]
    r = subprocess.run([sys.executable, "-m", "microtrain", "report", out], capture_output=True, text=True)
    assert r.returncode == 0 and "float32, 256 B read in place where the caller keeps it" in r.stdout, r.stdout
