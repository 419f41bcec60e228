"""Each int8 kernel of the C core against the numpy reference of the same integer
arithmetic (tests/support/q8_reference.py, written from TFLite's reference kernels and
gemmlowp): bit for bit, on random data and on the edge cases (padding, stride,
dilation, depthwise, ceil mode, rounding ties, extreme multipliers and shifts).
Single-op plans (tests/support/int8_plans.py) let every parameter take any valid value."""
import math

import numpy as np
import pytest

import q8_cases as Q
import q8_reference as R
from int8_plans import act, const, single_op_plan
from microtrain import format as F
from microtrain.ir import Quant
from microtrain.native import Core
from microtrain.lowered import TTensor

rng = np.random.default_rng(8)


def run(plan, x):
    """The C kernel's int8 output (tensor 'y') for input x, and the plan's float output."""
    core = Core(plan.data)
    out = core.predict(x)
    return core.array(plan.tensor_index("y")).copy(), out


def rand_i8(*shape):
    return Q.rand_i8(rng, *shape)


def rescale(n, shifts=(-12, 2)):
    return Q.rescale(rng, n, shifts)


def conv_case(**case):
    plan, (x,), (want,) = Q.conv_q8(rng, **case)
    return run(plan, x)[0], want


CONV_CASES = {
    "1x1": dict(C=8, H=5, W=7, O=6, k=(1, 1)),
    "3x3 same": dict(C=3, H=9, W=8, O=4, k=(3, 3), pads=(1, 1, 1, 1)),
    "3x3 valid": dict(C=2, H=6, W=6, O=3, k=(3, 3)),
    "5x5 stride 2 pad 2": dict(C=3, H=11, W=10, O=5, k=(5, 5), stride=(2, 2), pads=(2, 2, 2, 2)),
    "asymmetric pads and strides": dict(C=2, H=7, W=9, O=3, k=(3, 2), stride=(2, 3), pads=(0, 2, 1, 0)),
    "dilation 2": dict(C=2, H=9, W=9, O=2, k=(3, 3), dil=(2, 2), pads=(2, 2, 2, 2)),
    "depthwise 3x3": dict(C=6, H=8, W=8, O=6, k=(3, 3), pads=(1, 1, 1, 1), groups=6),
    "depthwise stride 2": dict(C=5, H=9, W=9, O=5, k=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1), groups=5),
    "depthwise 7x7 multiplier 2": dict(C=3, H=10, W=10, O=6, k=(7, 7), pads=(3, 3, 3, 3), groups=3),
    "grouped": dict(C=4, H=5, W=5, O=6, k=(3, 3), pads=(1, 1, 1, 1), groups=2),
    "kernel larger than input (padding only)": dict(C=1, H=2, W=3, O=2, k=(5, 5), pads=(2, 2, 2, 2)),
    "1-D": dict(C=3, H=1, W=40, O=4, k=(1, 5), stride=(1, 2), pads=(0, 2, 0, 2)),
    "wide row (> 32 outputs per chunk)": dict(C=2, H=3, W=70, O=2, k=(3, 3), pads=(1, 1, 1, 1)),
    "no bias, relu6 clamp": dict(C=3, H=6, W=6, O=4, k=(3, 3), pads=(1, 1, 1, 1), bias=False, act_range=(-128, 20)),
    "left shifts": dict(C=2, H=4, W=4, O=3, k=(1, 1), shifts=(0, 30)),
    "right shifts to -31": dict(C=2, H=4, W=4, O=3, k=(3, 3), pads=(1, 1, 1, 1), shifts=(-31, -20)),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_q8_matches_reference(case):
    for _ in range(3):
        got, want = conv_case(**CONV_CASES[case])
        assert np.array_equal(got, want), (case, np.argwhere(got != want)[:5])


@pytest.mark.parametrize("layout", [0, 1])
def test_gemm_q8_matches_reference(layout):
    for K, O in ((7, 5), (64, 10), (3, 70), (300, 33)):
        xzp, yzp = int(rng.integers(-128, 128)), int(rng.integers(-128, 128))
        w = rand_i8(O, K) if layout == 0 else rand_i8(K, O)
        wt = const("w", w, "I8", Quant(rng.uniform(0.001, 0.01, O), np.zeros(O), layout))
        bt = const("b", rng.integers(-(1 << 18), 1 << 18, O).astype(np.int32), "I32")
        mult, shift = rescale(O)
        plan = single_op_plan("GEMM_Q8", act("x", (1, K), 0.1, xzp),
                              [wt, bt, const("mult", mult, "I32"), const("shift", shift, "I32")],
                              act("y", (1, O), 0.2, yzp), [layout, -100, 110])
        xs = rand_i8(1, K)
        got, _ = run(plan, xs)
        assert np.array_equal(got, R.gemm(xs, w, bt.data, mult, shift, xzp, yzp, layout, (-100, 110)))


def test_add_q8_matches_reference():
    from microtrain.quantize import quantize_multiplier
    for sa, sb, sy, lo, hi in ((0.05, 0.03, 0.06, -128, 127), (0.02, 0.2, 0.1, -50, 127), (1.0, 1e-3, 0.5, -128, 0)):
        zps = rng.integers(-128, 128, 3)
        twice = 2 * max(sa, sb)
        am, ash = quantize_multiplier(sa / twice)
        bm, bsh = quantize_multiplier(sb / twice)
        ym, ysh = quantize_multiplier(twice / ((1 << 20) * sy))
        at = dict(left_shift=20, a_mult=am, a_shift=ash, b_mult=bm, b_shift=bsh, y_mult=ym, y_shift=ysh,
                  act_min=lo, act_max=hi)
        b = act("b", (1, 3, 5, 7), sb, int(zps[1]))
        plan = single_op_plan("ADD_Q8", act("x", (1, 3, 5, 7), sa, int(zps[0])), [b],
                              act("y", (1, 3, 5, 7), sy, int(zps[2])),
                              [at[k] for k in F.OPS_BY_NAME["ADD_Q8"].attrs])
        # the second operand is a plan tensor the first op never writes: give it through the arena
        core = Core(plan.data)
        xa, xb = rand_i8(1, 3, 5, 7), rand_i8(1, 3, 5, 7)
        core.array(plan.tensor_index("b"))[...] = xb
        core.set_input(xa)
        core.run_op(0)
        got = core.array(plan.tensor_index("y"))
        assert np.array_equal(got, R.add(xa, xb, int(zps[0]), int(zps[1]), int(zps[2]), at, (1, 3, 5, 7)))


POOL_CASES = {
    "2x2 stride 2": dict(k=(2, 2), s=(2, 2)),
    "3x3 stride 2 pad 1": dict(k=(3, 3), s=(2, 2), p=(1, 1, 1, 1)),
    "3x3 stride 1 pad 1 count_include_pad": dict(k=(3, 3), s=(1, 1), p=(1, 1, 1, 1), cip=1),
    "ceil mode": dict(k=(3, 3), s=(2, 2), ceil=True),
    "ceil mode, pad, count_include_pad": dict(k=(3, 3), s=(2, 2), p=(1, 1, 1, 1), ceil=True, cip=1),
    "dilation 2": dict(k=(2, 2), s=(1, 1), d=(2, 2)),
    "1-D": dict(k=(1, 4), s=(1, 3), p=(0, 1, 0, 2)),
}


def pool_case(op, H, W, k, s, p=(0, 0, 0, 0), d=(1, 1), ceil=False, cip=0):
    from microtrain.onnx_import import Importer
    eff = [d[i] * (k[i] - 1) + 1 for i in (0, 1)]
    oh, ow = [Importer.extent(None, n, p[i], p[i + 2], k[i], d[i], s[i], ceil) for i, n in enumerate((H, W))]
    assert min(oh, ow) >= 1 and min(eff) >= 1
    a = dict(kernel_h=k[0], kernel_w=k[1], stride_h=s[0], stride_w=s[1], pad_t=p[0], pad_l=p[1], pad_b=p[2],
             pad_r=p[3], dil_h=d[0], dil_w=d[1], count_include_pad=cip)
    xzp = int(rng.integers(-128, 128))
    attrs = [a[name] for name in F.POOL_ATTRS]
    if op == "MAXPOOL_Q8":
        y = act("y", (1, 3, oh, ow), 0.05, xzp)
        tables = []
    else:
        mult, shift = rescale(k[0] * k[1], (-8, 0))
        y = act("y", (1, 3, oh, ow), 0.07, int(rng.integers(-128, 128)))
        tables = [const("mult", mult, "I32"), const("shift", shift, "I32")]
    plan = single_op_plan(op, act("x", (1, 3, H, W), 0.05, xzp), tables, y, attrs)
    xs = rand_i8(1, 3, H, W)
    got, _ = run(plan, xs)
    if op == "MAXPOOL_Q8":
        return got, R.maxpool(xs, xzp, a, (1, 3, oh, ow))
    return got, R.avgpool(xs, xzp, int(y.quant.zero_point), mult, shift, a, (1, 3, oh, ow))


@pytest.mark.parametrize("op", ["MAXPOOL_Q8", "AVGPOOL_Q8"])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pool_q8_matches_reference(op, case):
    for H, W in ((7, 8), (6, 6), (1, 11) if case == "1-D" else (9, 5)):
        got, want = pool_case(op, H, W, **POOL_CASES[case])
        assert np.array_equal(got, want), case


def test_gap_q8_matches_reference():
    from microtrain.quantize import quantize_multiplier
    for C, H, W in ((4, 5, 5), (16, 1, 1), (3, 32, 32)):
        xzp, yzp = (int(v) for v in rng.integers(-128, 128, 2))
        m, s = quantize_multiplier(0.05 / (0.02 * H * W))
        plan = single_op_plan("GAP_Q8", act("x", (1, C, H, W), 0.05, xzp), [], act("y", (1, C), 0.02, yzp), [m, s])
        xs = rand_i8(1, C, H, W)
        got, _ = run(plan, xs)
        assert np.array_equal(got, R.gap(xs, xzp, yzp, m, s, (1, C)))


def test_quantize_and_dequantize_match_onnx_rounding():
    """QUANTIZE rounds ties to even (ONNX QuantizeLinear) and saturates; DEQUANTIZE is exact.
    Oracle for the boundary: onnx.reference's QuantizeLinear/DequantizeLinear."""
    import onnx
    from onnx import helper, TensorProto
    from onnx.reference import ReferenceEvaluator
    scale, zp = 0.25, -3    # a power of two: x = (k + 1/2) * scale are exact ties
    ties = (np.arange(-80, 80) + 0.5) * scale
    # (onnx.reference casts through int32, so the saturation cases stay within it)
    x = np.concatenate([ties, rng.normal(0, 20, 200), [1e6, -1e6, 40.0, -40.0, 0.0, -0.0, 1e-30]]).astype(np.float32)
    n = x.size
    xt = TTensor("x", (1, n))
    plan = single_op_plan("QUANTIZE", xt, [], act("y", (1, n), scale, zp), [], input_dtype="F32")
    got, out = run(plan, x)
    g = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["r"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("q", TensorProto.INT8, [n]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [n])],
                          [helper.make_tensor("s", TensorProto.FLOAT, [], [scale]),
                           helper.make_tensor("z", TensorProto.INT8, [], [zp])])
    q, r = ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])).run(None, {"x": x})
    assert np.array_equal(got.reshape(-1), q)
    assert np.array_equal(got.reshape(-1), R.quantize(x, scale, zp))
    assert np.array_equal(out.reshape(-1), r)


def test_requantization_reference_is_exact_rounding():
    """The reference's requant is round(x * mult * 2^(shift-31)), ties up, computed exactly with Python
    integers (fractions), over random values and the edges of every range."""
    from fractions import Fraction
    xs = [0, 1, -1, 3, -3, (1 << 31) - 1, -(1 << 31)] + [int(v) for v in rng.integers(-(1 << 31), 1 << 31, 300)]
    mults = [0, 1 << 30, (1 << 31) - 1] + [int(v) for v in rng.integers(1 << 30, 1 << 31, 20)]
    for shift in (-31, -20, -7, -1, 0, 1, 5, 30):
        for m in mults:
            for x in xs:
                exact = Fraction(x * m) * Fraction(2) ** (shift - 31)
                up = math.floor(exact + Fraction(1, 2))
                even = up - 1 if exact - math.floor(exact) == Fraction(1, 2) and up % 2 else up
                sat = lambda v: max(-(1 << 31), min((1 << 31) - 1, v))   # noqa: E731
                assert int(R.requant(x, m, shift)) == sat(up), (x, m, shift)
                assert int(R.requant_even(x, m, shift)) == sat(even), (x, m, shift)


def test_quantize_saturates_huge_values():
    scale, zp = 0.5, 7
    x = np.array([1e30, -1e30, 3e38, -3e38, 2.5e9, -2.5e9, 63.0, 64.0], np.float32)
    plan = single_op_plan("QUANTIZE", TTensor("x", (1, x.size)), [], act("y", (1, x.size), scale, zp), [],
                          input_dtype="F32")
    got, _ = run(plan, x)
    assert list(got.reshape(-1)) == [127, -128, 127, -128, 127, -128, 127, 127]


def test_average_ties_round_to_even():
    """A 2x2 average of int8 values (scale kept) is a tie a quarter of the time: it rounds to even,
    as onnxruntime's average pooling (and the reference) do."""
    from microtrain.quantize import quantize_multiplier
    m, s = (np.array(v, np.int32) for v in zip(*(quantize_multiplier(1.0 / k) for k in range(1, 5))))
    a = dict(kernel_h=2, kernel_w=2, stride_h=2, stride_w=2, pad_t=0, pad_l=0, pad_b=0, pad_r=0, dil_h=1, dil_w=1,
             count_include_pad=0)
    plan = single_op_plan("AVGPOOL_Q8", act("x", (1, 2, 8, 8), 0.1, 3), [const("mult", m, "I32"),
                          const("shift", s, "I32")], act("y", (1, 2, 4, 4), 0.1, 3), [a[k] for k in F.POOL_ATTRS])
    xs = rand_i8(1, 2, 8, 8)
    got, _ = run(plan, xs)
    sums = (xs.astype(np.int64) - 3).reshape(2, 4, 2, 4, 2).sum((2, 4))
    assert np.array_equal(got.reshape(2, 4, 4), np.clip(np.rint(sums / 4) + 3, -128, 127))   # rint: ties to even
    assert np.mean(sums % 4 == 2) > 0.1   # the case had ties to round
