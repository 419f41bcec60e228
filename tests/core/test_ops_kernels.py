"""The kernels of the activation, product, concatenation and mask ops (mt_act.c, mt_mul.c,
mt_concat.c, mt_mask.c) beyond what training against PyTorch shows (tests/conformance/test_torch_exactness.py
runs each op between trainable layers, with both exporters, and a MobileNetV3-style block):

* forward accuracy over the whole float range, against PyTorch in float64: Sigmoid and Tanh
  use the core's own exp, and Tanh a series near 0, where 1 - exp(-2x) would cancel;
* each op's load-time check refuses a plan whose op does not fit (kind, alpha, sizes, slice
  range, a packed mask's byte count), naming the op, so no kernel ever runs on shapes it does
  not expect.
"""
import struct
import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import microtrain
from microtrain import format as F
from microtrain.plan import Plan

ULP = 2.0 ** -23   # float32 relative spacing at 1


def identity_then(op, n, **attrs):
    """x (1, n) -> Gemm (identity, bias 0: exact) -> op -> y: a plan whose forward is the op alone."""
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1, name="identity"),
         helper.make_node(op, ["h"], ["y"], name="op", **attrs)], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(np.eye(n, dtype=np.float32), "w"),
         numpy_helper.from_array(np.zeros(n, np.float32), "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])


def wide_range():
    """Both signs of 0, subnormals, tiny and huge values, the region around the Tanh series
    switch (0.125), and a dense sweep of [-20, 20]."""
    rng = np.random.default_rng(0)
    mags = np.concatenate([[0.0, 1e-45, 1e-38, 1e-20, 1e-8, 1e-4, 0.1249999, 0.125, 0.1250001, 87.0, 89.0, 1e4,
                            3.4e38], 10.0 ** rng.uniform(-6, 2, 600), np.linspace(0, 20, 400)])
    return np.concatenate([mags, -mags]).astype(np.float32)


# op: (PyTorch float64 reference, ONNX attributes, the magnitude errors are measured against).
# Sigmoid, Tanh and LeakyRelu: the result itself. HardSigmoid's alpha x + beta cancels near its
# ends in any float32 evaluation (PyTorch's too), so there: its range, 1; HardSwish multiplies
# that by x, so there: |x|.
TORCH = {
    "Sigmoid": (torch.sigmoid, {}, lambda x, y: np.abs(y)),
    "Tanh": (torch.tanh, {}, lambda x, y: np.abs(y)),
    "HardSigmoid": (lambda x: torch.clamp(x * 0.2 + 0.5, 0, 1), dict(alpha=0.2, beta=0.5), lambda x, y: 1.0),
    "HardSwish": (lambda x: x * torch.clamp(x / 6 + 0.5, 0, 1), {}, lambda x, y: np.maximum(np.abs(x), np.abs(y))),
    "LeakyRelu": (lambda x: torch.where(x > 0, x, 0.1 * x), dict(alpha=0.1), lambda x, y: np.abs(y)),
}


@pytest.mark.parametrize("op", list(TORCH))
def test_forward_accuracy_over_the_float_range(op):
    """Each output within 4 float32 ulps of PyTorch's float64 result, measured against the op's
    magnitude (TORCH), or 1e-38 for results below the normal range (Sigmoid of -100 is 4e-44)."""
    fn, attrs, scale = TORCH[op]
    x = wide_range()
    sim = microtrain.Simulator(microtrain.compile(identity_then(op, x.size, **attrs), update="last-layer"))
    got = sim.predict(x).astype(np.float64)
    want = fn(torch.from_numpy(x.astype(np.float64))).numpy()
    err = np.abs(got - want) / np.maximum(scale(x.astype(np.float64), want), 1e-38)
    worst = int(np.argmax(err))
    assert err[worst] <= 4 * ULP, "%s(%r): %r, PyTorch float64 %r (%.2f ulp)" % (
        op, float(x[worst]), got[worst], want[worst], err[worst] / ULP)


# ---- load-time checks ----

def patched(plan, op_name, slot=None, attr=None, value=None):
    """The plan's bytes with one slot or attribute of the first `op_name` op replaced, CRC fixed."""
    data = bytearray(plan.data)
    h = plan.header
    pos = h["ops_off"]
    for _ in range(h["n_ops"]):
        code, _, slots, attrs, nxt = F.unpack_op(data, pos)
        if F.OPS_BY_CODE[code].name == op_name:
            if slot is not None:
                struct.pack_into("<H", data, pos + F.OP_HEAD_BYTES + 2 * slot, value)
            else:
                at = pos + F.OP_HEAD_BYTES + ((2 * len(slots) + 3) & ~3) + 4 * attr
                struct.pack_into("<i", data, at, value)
            crc = F.header_offsets()["crc32"]
            data[crc:crc + 4] = struct.pack("<I", zlib.crc32(bytes(data[F.CRC_START:])))
            return bytes(data)
        pos = nxt
    raise AssertionError("no %s op in the plan" % op_name)


def mobile_plan():
    """fuzz/make_corpus.py's model with every one of these ops, trained in full; naive memory, so
    that a slot pointed at another tensor of the wrong size is a shape error, not an overlap."""
    import os
    import sys
    from repo import ROOT
    sys.path.insert(0, os.path.join(ROOT, "fuzz"))
    import make_corpus
    return microtrain.compile(make_corpus.mobile_ops(), update="full", lr=0.05, planner="naive")


def test_patching_keeps_a_valid_plan_valid():
    """The helper itself: the first ACT (the HardSwish) rewritten with its own kind still loads."""
    plan = mobile_plan()
    microtrain.Simulator(Plan(patched(plan, "ACT", attr=0, value=F.ACT_KINDS["HARDSWISH"])))


@pytest.mark.parametrize("op, what, how", [
    ("ACT", "kind past the last", dict(attr=0, value=len(F.ACT_KINDS))),
    ("ACT", "negative kind", dict(attr=0, value=-1)),
    ("ACT", "alpha NaN", dict(attr=1, value=0x7FC00000)),
    ("ACT_BWD", "beta infinite", dict(attr=2, value=0x7F800000)),
    ("SLICE", "begin past the end", dict(attr=0, value=10 ** 6)),
    ("SLICE", "negative begin", dict(attr=0, value=-1)),
])
def test_bad_attributes_are_refused_at_load(op, what, how):
    plan = mobile_plan()
    with pytest.raises(ValueError, match=r"tensor shapes do not fit the op \(op \d+"):
        microtrain.Simulator(Plan(patched(plan, op, **how)))


@pytest.mark.parametrize("op, slot, name", [
    ("MUL", 1, "cat"),                  # b (96) neither a's size (48) nor one per channel (3)
    ("MUL_BWD_CHANNEL", 2, "s1r"),      # db of 2 for 3 channels
    ("AFFINE", 2, "s1"),                # shift of 2, scale of 3
    ("CONCAT", 0, "sum"),               # sizes no longer add up
    ("CONCAT", 3, "m3"),                # a fourth input without a third
    ("ACT", 0, "g"),                    # x of 3, y of 48
    ("ACT_BWD", 0, "g"),                # saved value of 3, gradients of 48
    ("SLICE", 0, "s"),                  # a slice of 48 from 3 elements
])
def test_bad_shapes_are_refused_at_load(op, slot, name):
    plan = mobile_plan()
    with pytest.raises(ValueError, match=r"tensor shapes do not fit the op \(op \d+"):
        microtrain.Simulator(Plan(patched(plan, op, slot=slot, value=plan.tensor_index(name))))


# ---- 1-bit masks (mt_mask.c, compile(saved="bits")) ----

def masks_plan():
    """fuzz/make_corpus.py's masked model with saved="bits": two MASK_PACK/MASK_BWD pairs, masks of
    45 bits (6 bytes); naive memory, so a resized tensor overlaps nothing."""
    import os
    import sys
    from repo import ROOT
    sys.path.insert(0, os.path.join(ROOT, "fuzz"))
    import make_corpus
    return microtrain.compile(make_corpus.masked(), update=["c.weight", "c.bias"], lr=0.05, saved="bits",
                              planner="naive")


def resized(plan, name, n):
    """The plan's bytes with tensor `name` (1-D, 1-byte elements) resized to n elements, CRC fixed."""
    data = bytearray(plan.data)
    pos = plan.header["tensors_off"] + plan.tensor_index(name) * F.TENSOR_BYTES
    rec = F.unpack_tensor(data, pos)
    rec.update(dim0=n, bytes=n)
    data[pos:pos + F.TENSOR_BYTES] = F.pack_tensor(**rec)
    crc = F.header_offsets()["crc32"]
    data[crc:crc + 4] = struct.pack("<I", zlib.crc32(bytes(data[F.CRC_START:])))
    return bytes(data)


def test_mask_plan_loads_and_its_masks_are_one_bit_per_element():
    plan = masks_plan()
    assert [t["bytes"] for t in plan.tensors if t["name"].endswith("@mask")] == [6, 6]
    microtrain.Simulator(Plan(resized(plan, "r@mask", 6)))   # the helper itself keeps a valid plan valid


@pytest.mark.parametrize("name, n", [("r@mask", 5), ("r@mask", 7), ("b6@mask", 5), ("b6@mask", 1)])
def test_packed_mask_of_the_wrong_size_is_refused_at_load(name, n):
    """A packed mask must be ceil(n / 8) bytes for its float tensor's n elements (45 -> 6)."""
    with pytest.raises(ValueError, match=r"tensor shapes do not fit the op \(op \d+"):
        microtrain.Simulator(Plan(resized(masks_plan(), name, n)))


@pytest.mark.parametrize("op, how", [
    ("MASK_BWD", dict(slot=2, name="q")),       # dx of 2 for dy of 45
    ("MASK_BWD", dict(slot=1, name="q")),       # dy of 2 for dx of 45
    ("MASK_PACK", dict(slot=0, name="q")),      # 2 floats for a mask of 45 bits
    ("MASK_PACK", dict(attr=0, value=0x7FC00000)),   # lo NaN
    ("MASK_PACK", dict(attr=1, value=-0x40800000)),  # hi -1 below lo 0 (0xBF800000 as an int32)
])
def test_bad_mask_ops_are_refused_at_load(op, how):
    plan = masks_plan()
    if "name" in how:
        how = dict(slot=how["slot"], value=plan.tensor_index(how["name"]))
    with pytest.raises(ValueError, match=r"tensor shapes do not fit the op \(op \d+"):
        microtrain.Simulator(Plan(patched(plan, op, **how)))
