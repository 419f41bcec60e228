"""PWDW_Q8: a frozen int8 1x1 conv streamed into the depthwise int8 conv that alone reads it
(host/microtrain/q8_fuse.py, modules/microtrain/mt_pwdw_q8.c), the expanded tensor kept as a
ring of rows only. The plans here are compiled with int8_fuse="pwdw", so that the 1x1 projection
after the depthwise conv is not streamed too (CONV_DW_PW_Q8, tests/int8/test_cdp_q8.py). On MobileNetV2-style blocks (pointwise-ReLU6, depthwise-ReLU6 of kernel 3
or 5, stride 1 or 2, dilation, padding, pointwise), quantized by microtrain's PTQ and exported
by both PyTorch exporters: the fused plan's outputs are bit for bit the unfused plan's, agree
with onnxruntime running the same quantization (QDQ) within 1 LSB, and every int8 tensor is the
numpy reference's (tests/support/q8_reference.py); its arena is smaller by about the expanded tensor;
a ring of the wrong size is refused at load; and training on top of a fused prefix gives the
parameters training on the unfused one gives."""
import struct
import zlib

import numpy as np
import pytest
import torch

import int8_models as M
import microtrain
import q8_cases as Q
from microtrain import format as F
from microtrain.native import Core, PlanError
from microtrain.onnx_frontend import import_onnx
from microtrain.peak import alive_at_peak
from microtrain.compiler import build_plan
from microtrain.quantize import ptq
from test_int8_onnxruntime import compare

N_SAMPLES = 60


GEOMETRIES = {   # name: (k, stride, pad, dil)
    "k3s1": (3, 1, 1, 1), "k3s2": (3, 2, 1, 1), "k5s1": (5, 1, 2, 1), "k5s2": (5, 2, 2, 1),
    "k3s2p0": (3, 2, 0, 1), "k5s1p1": (5, 1, 1, 1), "k3s1d2": (3, 1, 2, 2),
}


@pytest.fixture(scope="module")
def data():
    return M.digits()[0]


def export(tmp_path, geometry, exporter, **kw):
    k, s, p, d = GEOMETRIES[geometry]
    torch.manual_seed(0)
    path = str(tmp_path / ("%s_%s.onnx" % (geometry, exporter)))
    return M.export(M.Block(k, s, p, d, **kw).eval(), path, exporter, shape=(1, kw.get("cin", 1), 8, 8))


def ops(plan):
    return [o["op"] for o in plan.ops]


KERNEL_CASES = {   # C, E, H, W, depthwise k, stride, pads (t, l, b, r), dilation
    "k3 same": (3, 8, 7, 9, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "k5 stride 2 pad 2": (2, 6, 11, 10, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    "asymmetric pads and strides": (2, 5, 9, 8, (3, 2), (2, 3), (0, 2, 1, 0), (1, 1)),
    "dilation 2": (3, 4, 9, 9, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    "stride 3 > ring rows 2": (2, 4, 10, 6, (2, 2), (3, 3), (0, 0, 0, 0), (1, 1)),
    "1x1 depthwise stride 2 (ring of one row)": (3, 5, 7, 7, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
    "kernel larger than input": (2, 3, 2, 3, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    "wide rows": (2, 3, 4, 70, (3, 3), (1, 2), (1, 1, 1, 1), (1, 1)),
}


@pytest.mark.parametrize("case", sorted(KERNEL_CASES))
def test_kernel_matches_the_two_convs_for_any_parameters(case):
    """A single-op PWDW_Q8 plan (tests/support/q8_cases.py) with random zero points, clamps, multipliers
    and biases (present or not), against the numpy reference of the two CONV2D_Q8 ops."""
    C, E, H, W, k, stride, pads, dil = KERNEL_CASES[case]
    rng = np.random.default_rng(sorted(KERNEL_CASES).index(case))
    for bias in (True, False):
        plan, xs, wants = Q.pwdw_q8(rng, C, E, H, W, k, stride, pads, dil, bias, samples=2)
        for x, want in zip(xs, wants):
            core = Core(plan.data)
            core.predict(x)
            got = core.array(plan.tensor_index("y")).reshape(want.shape)
            assert np.array_equal(got, want), (case, bias, np.argwhere(got != want)[:5])


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_fused_plan_is_the_unfused_plan_and_onnxruntime(data, tmp_path, geometry, exporter):
    src = export(tmp_path, geometry, exporter, bias=geometry.endswith("p0"))
    calib, xs = data[:200], data[-N_SAMPLES:]
    fused = microtrain.compile(src, update="none", quantize="int8", calibration=calib, int8_fuse="pwdw")
    plain = microtrain.compile(src, update="none", quantize="int8", calibration=calib, int8_fuse=False)
    assert ops(fused).count("PWDW_Q8") == 1 and ops(fused).count("CONV2D_Q8") == 2, ops(fused)
    # unfused, a stride-1 depthwise conv whose input dies there runs in place (CONV2D_Q8_DW_INPLACE)
    assert "PWDW_Q8" not in ops(plain), ops(plain)
    assert ops(plain).count("CONV2D_Q8") + ops(plain).count("CONV2D_Q8_DW_INPLACE") == 4, ops(plain)
    a, b = Core(fused.data), Core(plain.data)
    for x in xs:
        assert np.array_equal(a.predict(x), b.predict(x))
    # onnxruntime on microtrain's quantization, and the numpy reference for every int8 tensor
    graph = import_onnx(src)
    ptq(graph, set(), calib, build_plan)
    qdq = M.qdq_from_plan_quantization(src, graph, str(tmp_path / "qdq.onnx"))
    naive = microtrain.compile(src, update="none", quantize="int8", calibration=calib, planner="naive",
                               int8_fuse="pwdw")
    assert "PWDW_Q8" in ops(naive)
    worst, exact = compare(naive, qdq, xs)
    assert worst <= 1, worst
    assert exact == len(xs)


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize("geometry", ["k3s2", "k5s1"])
def test_onnxruntime_qdq_model_fuses_too(data, tmp_path, geometry, activation):
    """A model quantized by onnxruntime (QDQ) and compiled as it is: fused as PTQ's, the same numbers."""
    src = export(tmp_path, geometry, "dynamo")
    dst = M.ort_qdq(src, str(tmp_path / "ort.onnx"), data[:200], activation)
    fused = microtrain.compile(dst, update="none", planner="naive", int8_fuse="pwdw")
    plain = microtrain.compile(dst, update="none", planner="naive", int8_fuse=False)
    assert "PWDW_Q8" in ops(fused) and "PWDW_Q8" not in ops(plain)
    a, b = Core(fused.data), Core(plain.data)
    for x in data[-N_SAMPLES:]:
        assert np.array_equal(a.predict(x), b.predict(x))
    worst, exact = compare(fused, dst, data[-N_SAMPLES:])
    assert worst <= 1, worst
    assert exact == N_SAMPLES


@pytest.mark.parametrize("geometry", ["k3s1", "k3s2", "k5s2", "k3s1d2"])
def test_wide_rows_are_bit_identical(tmp_path, geometry):
    """Rows wider than the kernels' 32-output chunks, three input channels, random inputs."""
    k, s, p, d = GEOMETRIES[geometry]
    torch.manual_seed(1)
    src = M.export(M.Block(k, s, p, d, expand=16, cin=3, width=6).eval(), str(tmp_path / "wide.onnx"), "ts",
                   shape=(1, 3, 11, 70))
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((20, 3, 11, 70)).astype(np.float32)
    fused = microtrain.compile(src, update="none", quantize="int8", calibration=calib, int8_fuse="pwdw")
    plain = microtrain.compile(src, update="none", quantize="int8", calibration=calib, int8_fuse=False)
    assert "PWDW_Q8" in ops(fused)
    a, b = Core(fused.data), Core(plain.data)
    for x in rng.standard_normal((10, 3, 11, 70)).astype(np.float32):
        assert np.array_equal(a.predict(x), b.predict(x))


def test_arena_is_smaller_by_the_expanded_tensor(tmp_path):
    """An MCU-sized block: 24x24 input, 8 channels expanded to 48 (27,648 bytes of int8)."""
    torch.manual_seed(2)
    src = M.export(M.Block(3, 2, 1, 1, expand=48, cin=3, width=8).eval(), str(tmp_path / "big.onnx"), "ts",
                   shape=(1, 3, 24, 24))
    calib = np.random.default_rng(0).standard_normal((10, 3, 24, 24)).astype(np.float32)
    fused = microtrain.compile(src, update="last-layer", quantize="int8", calibration=calib, int8_fuse="pwdw")
    plain = microtrain.compile(src, update="last-layer", quantize="int8", calibration=calib, int8_fuse=False)
    # unfused, the peak is the expanded tensor and the depthwise output; fused, the block's input,
    # the ring and the depthwise output (the input stays alive while the depthwise output is written)
    expanded, ring, block_in = 48 * 24 * 24, 3 * 48 * 24, 8 * 24 * 24
    saved = plain.header["arena_bytes"] - fused.header["arena_bytes"]
    assert expanded - ring - block_in - 64 <= saved <= expanded, (saved, expanded, ring)
    peak = alive_at_peak(plain)
    assert any(size == expanded for _, size, *_ in peak["tensors"]), peak   # what bounded the unfused plan
    assert all(size != expanded for _, size, *_ in alive_at_peak(fused)["tensors"])
    # peak RAM: the same saving, give or take the runtime context (one op record fewer, a larger one)
    assert abs(plain.report()["peak_ram_bytes"] - fused.report()["peak_ram_bytes"] - saved) <= 256


def _patched(data, i, header=None, **fields):
    """The plan bytes with tensor i's record fields (and header fields) replaced, the CRC fixed."""
    b = bytearray(data)
    h = dict(zip((f for f, _ in F.HEADER_FIELDS), F.HEADER_STRUCT.unpack_from(b, 0)))
    pos = h["tensors_off"] + i * F.TENSOR_BYTES
    rec = F.unpack_tensor(b, pos)
    rec.update(fields)
    b[pos:pos + F.TENSOR_BYTES] = F.pack_tensor(**rec)
    h.update(header or {})
    b[:F.HEADER_BYTES] = F.HEADER_STRUCT.pack(*h.values())
    crc = F.header_offsets()["crc32"]
    b[crc:crc + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


@pytest.mark.parametrize("rows", [-1, +1])
def test_a_ring_of_the_wrong_size_is_refused(tmp_path, data, rows):
    """One row short or one too many; the ring moved to fresh memory at the arena's end, so that
    the size check, not the overlap check, is what refuses it."""
    src = export(tmp_path, "k5s2", "ts")
    plan = microtrain.compile(src, update="none", quantize="int8", calibration=data[:50], int8_fuse="pwdw")
    op = next(o for o in plan.ops if o["op"] == "PWDW_Q8")
    i = op["slots"][F.OPS_BY_NAME["PWDW_Q8"].slot_index("ring")]
    R, E, W = plan.tensors[i]["shape"]
    assert (R, E, W) == (5, 24, 8)
    end = plan.header["arena_bytes"]
    moved = dict(offset=end)
    grown = dict(arena_bytes=end + (R + 1) * E * W)
    Core(_patched(plan.data, i, grown, dim0=R, bytes=R * E * W, **moved))   # the right size there loads
    bad = _patched(plan.data, i, grown, dim0=R + rows, bytes=(R + rows) * E * W, **moved)
    with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % plan.ops.index(op)):
        Core(bad)


def test_no_fusion_where_a_gradient_passes(tmp_path, data):
    """int8_scope="frozen" with the stem training: the gradient crosses the block, whose backward
    reads the expanded tensor (CLIP_BWD_Q8), so the block stays two ops and still trains."""
    src = export(tmp_path, "k3s1", "ts")
    g = import_onnx(src)
    stem = g.layers()[0].weight()
    plan = microtrain.compile(src, update=[stem, g.layers()[-1].weight()], quantize="int8", calibration=data[:50],
                              int8_scope="frozen")
    assert "PWDW_Q8" not in ops(plan) and "CONV2D_BWD_INPUT_Q8" in ops(plan), ops(plan)
    # the same frozen scope with only the classifier training fuses
    plan = microtrain.compile(src, update="last-layer", quantize="int8", calibration=data[:50], int8_scope="frozen",
                              int8_fuse="pwdw")
    assert "PWDW_Q8" in ops(plan)


class TwoReaders(M.Block):
    """The expanded tensor also feeds a residual add after the depthwise conv."""

    def forward(self, x):
        e = self.pw1(self.stem(x))
        h = self.pw2(self.dw(e) + e)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(h, 1), 1))


@pytest.mark.parametrize("case", ["two readers", "ring as tall as the tensor"])
def test_not_fused(tmp_path, data, case):
    torch.manual_seed(0)
    model = TwoReaders(3, 1, 1) if case == "two readers" else M.Block(9, 1, 4)   # 9 rows of an 8-row tensor
    src = M.export(model.eval(), str(tmp_path / "m.onnx"), "ts")
    plan = microtrain.compile(src, update="none", quantize="int8", calibration=data[:50])
    convs = ops(plan).count("CONV2D_Q8") + ops(plan).count("CONV2D_Q8_DW_INPLACE")   # a dead input: in place
    assert "PWDW_Q8" not in ops(plan) and convs == 4, ops(plan)


@pytest.mark.parametrize("geometry", ["k3s2", "k5s1"])
@pytest.mark.parametrize("update", ["last-layer", "last:2"])
def test_training_on_a_fused_prefix_gives_the_same_parameters(tmp_path, geometry, update):
    x, y = M.digits()
    src = export(tmp_path, geometry, "dynamo")
    kw = dict(update=update, quantize="int8", calibration=x[:100], lr=0.05, momentum=0.9)
    fused, plain = microtrain.compile(src, int8_fuse="pwdw", **kw), microtrain.compile(src, int8_fuse=False, **kw)
    assert "PWDW_Q8" in ops(fused) and "PWDW_Q8" not in ops(plain)
    sims = [microtrain.Simulator(p) for p in (fused, plain)]
    for s in sims:
        s.fit(x[:150], y[:150], epochs=1, shuffle=False)
    pa, pb = sims[0].params(), sims[1].params()
    assert pa.keys() == pb.keys() and pa
    for name in pa:
        assert np.array_equal(pa[name], pb[name]), name
    # and it trained
    assert any(not np.array_equal(pa[n], microtrain.Simulator(fused).params()[n]) for n in pa)


def test_int8_fuse_is_checked(tmp_path, data):
    with pytest.raises(ValueError, match="int8_fuse must be True, False or \"pwdw\""):
        microtrain.compile(export(tmp_path, "k3s1", "ts"), quantize="int8", calibration=data[:10], int8_fuse="yes")
