"""An int8 prefix's last tensor read by its first float conv a few channels at a time (dq_conv.py,
CONV2D_DQ_W8 and CONV2D_DQ in mt_conv.c).

int8_models.Block (stem, 1x1 expansion, depthwise 3x3, 1x1 projection, head; both exporters)
int8 up to the depthwise output, the projection's bias and the head training:
* the DEQUANTIZE and the projection's CONV2D_W8 (frozen weights int8) become one CONV2D_DQ_W8, or
  with its CONV2D (float32) one CONV2D_DQ; outputs, losses and parameters after 20 steps with
  momentum are the unfused plan's bit for bit, with 1, 5 (not a divisor of the 24 channels) and
  all 24 channels dequantized at a time; the arena is smaller (but with all 24);
* nothing is fused where the backward reads the float input (the projection's int8 weight trains);
  nor where the int8 tensor is written between the DEQUANTIZE and the conv;
* planes that are not whole planes of x, or more planes than x has channels, are refused at load;
  so are a fused conv of groups 2 and one whose filters outgrow the kernel's stack buffer (9x9),
  fused by a compiler whose own check is switched off;
* MbV2-w0.35's 138kb scheme (MIT's model) trains 2 steps bit for bit as unfused, its arena
  without blocks.5's 96 KB float copy.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import int8_models as M
import microtrain
from microtrain import dq_conv, format as F
from microtrain.native import Core, PlanError
from test_pwdw_q8 import _patched
from tte_parity import assert_trains_alike, tte

SHAPE = (1, 3, 12, 12)
XS = F.OPS_BY_NAME["CONV2D_DQ_W8"].slot_index("xs")


def _unfused(m):
    """No DEQUANTIZE fused into what reads it (tests/int8/test_pwdw_dq.py: the expansion streamed into the
    projection, ADD_DQ)."""
    _dq_alone(m)
    m.setattr(microtrain.compiler, "fuse_dequantize_conv", lambda tensors, ops: (ops, []))


def _dq_alone(m):
    """CONV2D_DQ(_W8) the only fusion of a DEQUANTIZE (the int8 expansion not streamed into it, no ADD_DQ)."""
    m.setattr(microtrain.compiler, "stream_into_projection", lambda tensors, ops: (ops, []))
    m.setattr(microtrain.compiler, "add_dequantized", lambda tensors, ops: (ops, []))


def block_plans(tmp_path, exporter, planes=None, train_weight=False, trained_weights="float32", frozen_weights="int8",
                streams=False, shape=SHAPE, **block):
    """(fused, unfused) plans of the Block (int8_models.Block's arguments in `block`; 8 channels
    expanded to 24 by default), its projection's bias (and weight) and the head trained; fused:
    CONV2D_DQ alone, or with streams every DEQUANTIZE fusion (tests/int8/test_pwdw_dq.py)."""
    block = dict(dict(width=8, expand=24), **block)
    src = M.export(M.Block(cin=3, **block), str(tmp_path / ("block-%s.onnx" % exporter)), exporter, shape=shape)
    rng = np.random.default_rng(1)
    kw = dict(quantize="int8", input_dtype="uint8", input_quant=(1 / 255, 0), frozen_weights=frozen_weights, lr=0.05,
              momentum=0.9, trained_weights=trained_weights,
              calibration=rng.uniform(0, 1, (16,) + shape[1:]).astype(np.float32))
    layers = microtrain.compile(src, update="last-layer").meta["layers"]   # every layer (float plan)
    proj, head = layers[-2], layers[-1]
    update = [proj["bias"], head["weight"], head["bias"]] + ([proj["weight"]] if train_weight else [])
    with pytest.MonkeyPatch.context() as m:
        if not streams:
            _dq_alone(m)
        if planes is not None:
            m.setattr(dq_conv, "planes", lambda *a: planes)
        fused = microtrain.compile(src, update=update, **kw)
        _unfused(m)
        plain = microtrain.compile(src, update=update, **kw)
    return fused, plain


def names(plan):
    return [o["op"] for o in plan.ops]


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("planes,frozen", [(None, "int8"), (1, "int8"), (5, "int8"), (24, "int8"),
                                           (None, "float32"), (5, "float32")])
def test_fused_plan_is_the_unfused_plan(tmp_path, exporter, planes, frozen):
    fused, plain = block_plans(tmp_path, exporter, planes, frozen_weights=frozen)
    op_name = "CONV2D_DQ_W8" if frozen == "int8" else "CONV2D_DQ"
    assert op_name in names(fused) and op_name not in names(plain)
    assert names(fused).count("DEQUANTIZE") == names(plain).count("DEQUANTIZE") - 1
    assert any(n.startswith("dq_conv: ") for n in fused.meta["notes"])
    op = next(o for o in fused.ops if o["op"] == op_name)
    x, xs = fused.tensors[op["slots"][0]], fused.tensors[op["slots"][XS]]
    assert x["dtype"] == "I8" and xs["shape"][1:] == x["shape"][2:]
    assert xs["shape"][0] == (planes or dq_conv.planes(x["shape"][1]))
    if planes != 24:   # all the planes at once: the float copy again, beside its int8 self
        assert fused.report()["arena_bytes"] < plain.report()["arena_bytes"]
    trains_alike_and_moves(fused, plain, SHAPE)


def trains_alike_and_moves(fused, plain, shape, seed=2):
    """20 steps of random uint8 images: the two plans bit for bit alike, and every parameter moved."""
    rng = np.random.default_rng(seed)
    trained = assert_trains_alike(fused, plain, xs=rng.integers(0, 256, (20,) + shape[1:]).astype(np.uint8),
                                  ys=rng.integers(0, 10, 20), predict=5)
    init = microtrain.Simulator(fused).params()
    assert all(not np.array_equal(init[n], trained[n]) for n in init)


def test_not_fused_where_the_backward_reads_the_float_input(tmp_path):
    """The projection's weight trains, held int8 (so its forward is a CONV2D_W8): its weight gradient
    reads the float input (made again in the backward, recompute.py)."""
    fused, plain = block_plans(tmp_path, "ts", train_weight=True, trained_weights="int8")
    assert "CONV2D_W8" in names(fused) and "CONV2D_BWD_WEIGHT" in names(fused)
    assert "CONV2D_DQ_W8" not in names(fused)
    assert fused.data == plain.data


@pytest.fixture(scope="module")
def dq_plan(tmp_path_factory):
    return block_plans(tmp_path_factory.mktemp("dq"), "ts")[0]


@pytest.mark.parametrize("what", ["not whole planes", "more planes than channels"])
def test_planes_of_the_wrong_size_are_refused(dq_plan, what):
    """The planes moved to fresh memory at the arena's end, so that the size check, not the overlap
    check, is what refuses them."""
    k = names(dq_plan).index("CONV2D_DQ_W8")
    op = dq_plan.ops[k]
    i, C = op["slots"][XS], dq_plan.tensors[op["slots"][0]]["shape"][1]
    K, H, W = dq_plan.tensors[i]["shape"]
    end = dq_plan.header["arena_bytes"]
    grown = dict(arena_bytes=end + -(-4 * (C + 1) * H * (W + 1) // F.ALIGN) * F.ALIGN)
    Core(_patched(dq_plan.data, i, grown, offset=end))   # the right size there loads
    dims = dict(dim2=W + 1) if what == "not whole planes" else dict(dim0=C + 1)
    shape = (dims.get("dim0", K), H, dims.get("dim2", W))
    bad = _patched(dq_plan.data, i, grown, bytes=4 * int(np.prod(shape)), offset=end, **dims)
    with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % k):
        Core(bad)


class Proj(torch.nn.Module):
    """An int8 stem, then the float conv the fusion takes (groups, kernel) and a head."""

    def __init__(self, groups, k):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU6())
        self.proj = torch.nn.Conv2d(8, 8, k, padding=k // 2, groups=groups)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.proj(self.stem(x)), 1), 1))


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("groups, k, form", [(2, 1, "CONV2D_DQ_W8"), (1, 9, "CONV2D_DQ")])
def test_a_conv_the_kernel_does_not_take_is_refused(tmp_path, groups, k, form, exporter):
    """groups 2, or 81 taps (over the 64 floats of the kernel's filter buffer: a 9x9 is not made
    CONV2D_W8, so its frozen weight stays float and the fusion gives CONV2D_DQ)."""
    torch.manual_seed(0)
    src = M.export(Proj(groups, k), str(tmp_path / "proj.onnx"), exporter, shape=SHAPE)
    layers = microtrain.compile(src, update="last-layer").meta["layers"]
    rng = np.random.default_rng(1)
    kw = dict(quantize="int8", input_dtype="uint8", input_quant=(1 / 255, 0), frozen_weights="int8",
              calibration=rng.uniform(0, 1, (8,) + SHAPE[1:]).astype(np.float32),
              update=[layers[-2]["bias"], layers[-1]["weight"], layers[-1]["bias"]])
    assert form not in names(microtrain.compile(src, **kw))
    with pytest.MonkeyPatch.context() as m:
        _dq_alone(m)
        m.setattr(dq_conv, "kernel_takes", lambda w, attrs: True)
        with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op \d+\)"):
            microtrain.compile(src, **kw)


def test_mbv2_138kb_trains_as_unfused():
    path, kw = tte("mbv2-w0.35", "138kb")
    fused = microtrain.compile(path, **kw)
    with pytest.MonkeyPatch.context() as m:
        _unfused(m)
        plain = microtrain.compile(path, **kw)
    assert names(fused).count("PWDW_DQ_W8") >= 1
    # blocks.5's depthwise output was dequantized whole: 96 KB
    assert plain.report()["arena_bytes"] - fused.report()["arena_bytes"] > 48 * 1024
    assert_trains_alike(fused, plain)


def test_not_fused_where_the_int8_input_is_written_before_the_conv():
    """The fused op reads the int8 tensor where the conv was: a write between the two would change
    what it reads (the ops as the compiler holds them, made up: no model gives this order)."""
    from microtrain.lowered import TOp, TTensor
    t = [TTensor("xq", (1, 4, 3, 3), "I8"), TTensor("xf", (1, 4, 3, 3)), TTensor("w", (2, 4, 1, 1), "I8", "CONST"),
         TTensor("y", (1, 2, 3, 3)), TTensor("z", (1, 4, 3, 3))]
    conv = TOp("CONV2D_W8", "FORWARD", [1, 2, None, 3], [1, 1, 0, 0, 0, 0, 1, 1, 1])
    deq, over = TOp("DEQUANTIZE", "FORWARD", [0, 1]), TOp("QUANTIZE", "FORWARD", [4, 0])
    ops, fused = dq_conv.fuse_dequantize_conv(list(t), [deq, conv])
    assert [o.name for o in ops] == ["CONV2D_DQ_W8"] and fused == [""]
    ops, fused = dq_conv.fuse_dequantize_conv(list(t), [deq, over, conv])
    assert [o.name for o in ops] == ["DEQUANTIZE", "QUANTIZE", "CONV2D_W8"] and fused == []
