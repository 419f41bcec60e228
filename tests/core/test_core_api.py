"""The core's public API beyond step and predict: parameters, checkpoints,
settings, facts and error text (mt.h; microtrain.native.Core on the host).

Oracles: onnx.reference for the outputs of a model whose parameters were set,
PyTorch for training, and for checkpoints an uninterrupted run of the same plan.
"""
import struct
import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import microtrain
from microtrain import format as F
from microtrain.native import Core

import models

HO = F.header_offsets()
SO = F.state_offsets()


def with_crc(data):
    b = bytearray(data)
    b[HO["crc32"]:HO["crc32"] + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


def blob_with_crc(blob):
    b = bytearray(blob)
    b[-4:] = struct.pack("<I", zlib.crc32(bytes(b[:-4])))
    return bytes(b)


def samples(n, n_in, n_out, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, n_in)).astype(np.float32), rng.integers(0, n_out, n)


def params(core):
    return {k: core.param(k).copy() for k in core.param_names}


def same_bits(a, b):
    return all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a) and a.keys() == b.keys()


# ---- parameters -------------------------------------------------------------------------------

def test_set_params_then_predict_matches_onnx_reference():
    model = models.mlp(n_in=6, hidden=5, n_out=3, seed=0)
    core = Core(microtrain.compile(model, update="full").data)
    rng = np.random.default_rng(5)
    new = {t.name: rng.normal(size=numpy_helper.to_array(t).shape).astype(np.float32) for t in model.graph.initializer}
    core.set_params(new)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(new[t.name], t.name))
    x = rng.normal(size=6).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x[None]})[0][0]
    np.testing.assert_allclose(core.predict(x), want, rtol=1e-5, atol=1e-6)
    for k in new:
        np.testing.assert_array_equal(core.param(k).reshape(new[k].shape), new[k])


@pytest.mark.parametrize("bad", ["unknown name", "wrong size", "nan", "inf"])
def test_set_params_checks_every_entry_before_writing_any(bad):
    core = Core(microtrain.compile(models.mlp(), update="full").data)
    before = params(core)
    good = {"fc1.bias": np.full(5, 7.0, np.float32)}
    wrong = {"unknown name": ("fc9.weight", np.zeros(3)), "wrong size": ("fc2.bias", np.zeros(4)),
             "nan": ("fc2.bias", [0, np.nan, 0]), "inf": ("fc2.bias", [0, 0, -np.inf])}[bad]
    with pytest.raises((KeyError, ValueError), match="fc9.weight|values; the parameter has 3|NaN or infinity"):
        core.set_params({**good, wrong[0]: np.asarray(wrong[1], np.float32)})
    assert same_bits(params(core), before)


# ---- checkpoints ------------------------------------------------------------------------------

def run(core, xs, ys, steps):
    return [core.step_label(xs[i % len(xs)], int(ys[i % len(ys)])) for i in steps]


@pytest.mark.parametrize("batch,momentum,stop", [(1, 0.9, 3), (3, 0.9, 4), (3, 0.0, 5), (4, 0.5, 8)])
def test_resume_from_saved_state_continues_bit_for_bit(batch, momentum, stop):
    """Oracle: the same plan trained without interruption. Stopping mid-batch
    (stop not a multiple of batch) resumes the accumulators and the in-batch count."""
    plan = microtrain.compile(models.mlp(n_in=6, hidden=5, n_out=3, seed=2), update="full", lr=0.05,
                              momentum=momentum, weight_decay=0.01, batch=batch)
    xs, ys = samples(7, 6, 3)
    a = Core(plan.data)
    loss_a = run(a, xs, ys, range(stop))
    a.set_lr(0.03)                      # the blob carries lr too
    loss_a += run(a, xs, ys, range(stop, 12))
    b = Core(plan.data)
    run(b, xs, ys, range(stop))
    b.set_lr(0.03)
    blob = b.save_state()
    assert len(blob) == b.state_len == b.info()["param_bytes"] + 44
    c = Core(plan.data)                 # a fresh board: the plan and the blob are all it has
    c.load_state(blob)
    assert c.info()["steps"] == stop and c.info()["updates"] == stop // batch
    loss_c = run(c, xs, ys, range(stop, 12))
    assert loss_c == loss_a[stop:]
    assert same_bits(params(c), params(a))
    assert c.save_state() == a.save_state()


def corruptions(blob):
    """(what, bad blob): truncations, a bit flip in every part, trailing bytes, fields changed with the CRC fixed."""
    out = [("empty", b""), ("header only", blob[:F.STATE_HEADER_BYTES]), ("one byte short", blob[:-1]),
           ("one byte more", blob + b"\0")]
    for pos in (0, SO["version"], SO["steps"], SO["lr"], F.STATE_HEADER_BYTES, len(blob) // 2, len(blob) - 1):
        b = bytearray(blob)
        b[pos] ^= 0x10
        out.append(("bit flip at %d" % pos, bytes(b)))

    def field(name, value, fmt="<I"):
        b = bytearray(blob)
        struct.pack_into(fmt, b, SO[name], value)
        return blob_with_crc(b)
    out += [("in_batch = batch", field("in_batch", 3)), ("lr NaN", field("lr", float("nan"), "<f")),
            ("lr -1", field("lr", -1.0, "<f")), ("version 2", field("version", 2, "<H")),
            ("reserved set", field("reserved1", 1))]
    return out


def test_bad_state_blobs_are_refused_and_change_nothing():
    plan = microtrain.compile(models.mlp(seed=3), update="full", lr=0.05, momentum=0.9, batch=3)
    other = microtrain.compile(models.mlp(seed=3), update="full", lr=0.04, momentum=0.9, batch=3)
    xs, ys = samples(5, 6, 3)
    core = Core(plan.data)
    run(core, xs, ys, range(4))
    blob = core.save_state()
    run(core, xs, ys, range(4, 5))
    before = core.save_state()
    donor = Core(other.data)            # same shapes, another plan (its lr differs, so its CRC does)
    run(donor, xs, ys, range(4))
    cases = corruptions(blob) + [("another plan's blob", donor.save_state())]
    for what, bad in cases:
        with pytest.raises(ValueError, match="state blob") as e:
            core.load_state(bad)
        assert core.save_state() == before, what
    assert "different plan" in str(pytest.raises(ValueError, core.load_state, donor.save_state()).value)
    core.load_state(blob)               # the good one still loads
    assert core.info()["steps"] == 4


def test_batch_boundary_survives_the_step_counter_wrapping():
    """steps is a uint32: set it to 2^32 - 2 through a state blob. The batch must
    still end after every third sample (v0 used steps % batch, which wraps)."""
    plan = microtrain.compile(models.mlp(seed=4), update="full", lr=0.1, momentum=0.9, batch=3)
    xs, ys = samples(6, 6, 3)
    a = Core(plan.data)
    run(a, xs, ys, range(6))
    b = Core(plan.data)
    blob = bytearray(b.save_state())
    struct.pack_into("<I", blob, SO["steps"], 2 ** 32 - 2)
    b.load_state(blob_with_crc(blob))
    first = params(b)
    run(b, xs, ys, range(2))
    assert same_bits(params(b), first), "no update before the batch's third sample"
    run(b, xs, ys, range(2, 6))
    assert b.info()["steps"] == 4 and b.info()["updates"] == 2
    assert same_bits(params(b), params(a))


# ---- batch end with batch 1 -------------------------------------------------------------------

def torch_mlp(model):
    w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for (name, p) in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"), net.parameters()):
            p.copy_(w[name])
    return net


def test_batch_end_ops_run_with_batch_1():
    """A batch-1 plan whose gradients go through accumulators and SGD ops at
    BATCH_END (as a parameter shared by two layers needs): made here from a
    batch-2 plan with its batch field set to 1. Oracle: PyTorch SGD, batch 1."""
    model = models.mlp(seed=6)
    plan2 = microtrain.compile(model, update="full", lr=0.1, momentum=0.9, batch=2)
    data = bytearray(plan2.data)
    struct.pack_into("<H", data, HO["batch"], 1)
    core = Core(with_crc(data))
    assert any(o["phase"] == "BATCH_END" for o in plan2.ops)
    net = torch_mlp(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    xs, ys = samples(5, 6, 3, seed=6)
    for i in range(5):
        loss = core.step_label(xs[i], int(ys[i]))
        opt.zero_grad()
        ref = torch.nn.functional.cross_entropy(net(torch.from_numpy(xs[i][None])), torch.tensor([int(ys[i])]))
        ref.backward()
        opt.step()
        assert abs(loss - ref.item()) < 1e-5
    assert core.info()["updates"] == 5
    for name, p in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"), net.parameters()):
        np.testing.assert_allclose(core.param(name).reshape(p.shape), p.detach().numpy(), rtol=1e-5, atol=1e-6)


# ---- validation -------------------------------------------------------------------------------

def test_tensor_offsets_must_be_multiples_of_8():
    """format.py promises ALIGN = 8 for every offset; v0 accepted multiples of 4."""
    plan = microtrain.compile(models.mlp(), update="full", lr=0.05)
    for i, t in enumerate(plan.tensors):
        if t["storage"] == "ARENA" and t["offset"] + t["bytes"] + 4 <= plan.header["arena_bytes"]:
            break
    else:
        pytest.fail("no arena tensor with room to move")
    b = bytearray(plan.data)
    at = plan.header["tensors_off"] + i * F.TENSOR_BYTES + F.tensor_offsets()["offset"]
    struct.pack_into("<I", b, at, t["offset"] + 4)
    with pytest.raises(ValueError, match=r"invalid tensor record \(tensor %d\)" % i):
        Core(with_crc(b))
    struct.pack_into("<I", b, at, t["offset"] + 8 if t["offset"] + t["bytes"] + 8 <= plan.header["arena_bytes"]
                     else t["offset"])
    Core(with_crc(b))   # a multiple of 8 is fine (the plan may then compute wrong numbers, never unsafely)


def test_another_format_version_names_both_and_says_recompile():
    b = bytearray(microtrain.compile(models.mlp()).data)
    struct.pack_into("<H", b, HO["version"], F.VERSION + 1)
    with pytest.raises(ValueError, match="plan format version %d, this runtime reads %d: recompile the model"
                       % (F.VERSION + 1, F.VERSION)):
        Core(bytes(b))


# ---- settings and facts -----------------------------------------------------------------------

def test_lr_setter_refuses_bad_values_and_trains_with_a_good_one():
    core = Core(microtrain.compile(models.mlp(), update="full", lr=0.05).data)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="learning rate must be a finite number >= 0$"):
            core.set_lr(bad)
    assert core.lr == np.float32(0.05)
    core.set_lr(0.0)
    before = params(core)
    core.step_label(np.ones(6, np.float32), 1)
    assert same_bits(params(core), before)


def test_info_counts_the_runtime_context_in_ram_unless_read_from_the_plan():
    plan = microtrain.compile(models.cnn(), update="full", lr=0.05, momentum=0.9, batch=2)
    core = Core(plan.data)
    info, report = core.info(), plan.report()
    assert info["context_bytes"] == report["context_bytes"] > 0
    assert info["context_in_plan"] and report["context_in_plan"]   # test_context_in_plan.py: without it
    assert info["ram_bytes"] == report["ram_bytes"] == report["arena_bytes"] + report["param_bytes"] == core.ram_bytes
    assert info["format_version"] == F.VERSION
    for k in ("arena_bytes", "param_bytes", "naive_bytes", "const_bytes", "macs_per_step", "ops", "batch", "loss"):
        assert info[k] == report[k], k


def test_rejected_steps_are_counted_and_change_nothing():
    core = Core(microtrain.compile(models.mlp(n_in=6), update="full", lr=0.05, momentum=0.9).data)
    core.set_params({"fc2.bias": np.array([3e38, -3e38, 0], np.float32)})
    before = core.save_state()
    with pytest.raises(ValueError, match="loss is not finite"):   # 3e38 - (-3e38) overflows
        core.step_label(np.ones(6, np.float32), 1)
    assert core.info()["rejected"] == 1 and core.info()["steps"] == 0
    after = bytearray(core.save_state())
    struct.pack_into("<I", after, SO["rejected"], 0)
    assert blob_with_crc(after) == before
