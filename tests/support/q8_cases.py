"""Single-op int8 conv plans with random quantization parameters, and what the numpy reference
(q8_reference.py) says they compute: CONV2D_Q8, PWDW_Q8 (1x1 expansion streamed into a depthwise
conv) and CONV_DW_PW_Q8 (a conv, a depthwise conv and a 1x1 conv streamed row by row). The host
kernel tests (tests/int8) check the C core against the reference with them; the device test
(tests/device/micropython/int8_kernels.py) runs the same plans on every CPU, where the SIMD
kernels of Cortex-M4/M7 take over from the portable C."""
import numpy as np

import q8_reference as R
from int8_plans import act, const, single_op_plan
from microtrain import format as F
from microtrain.ir import Quant

ONE = dict(stride_h=1, stride_w=1, pad_t=0, pad_l=0, pad_b=0, pad_r=0, dil_h=1, dil_w=1, groups=1)


def rand_i8(rng, *shape, lo=-128):
    return rng.integers(lo, 128, size=shape).astype(np.int8)


def rescale(rng, n, shifts=(-12, 2), extremes=True):
    """Random Q31 multipliers and shifts in [shifts[0], shifts[1]], with the extreme multipliers among them."""
    mult = rng.integers(1 << 30, (1 << 31) - 1, size=n, endpoint=True).astype(np.int32)
    shift = rng.integers(shifts[0], shifts[1], size=n, endpoint=True).astype(np.int32)
    if extremes:
        mult[:1] = (1 << 31) - 1
        mult[1:2] = 1 << 30
    return mult, shift


def extent(n, k, s, p0, p1, d=1):
    return (n + p0 + p1 - d * (k - 1) - 1) // s + 1


def conv_attrs(stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    return dict(stride_h=stride[0], stride_w=stride[1], pad_t=pads[0], pad_l=pads[1], pad_b=pads[2], pad_r=pads[3],
                dil_h=dil[0], dil_w=dil[1], groups=groups)


def _wquant(rng, n):
    return Quant(rng.uniform(0.001, 0.01, n), np.zeros(n), 0)


def conv_q8(rng, C, H, W, O, k, stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1, bias=True, act_range=None,
            shifts=(-12, 2), samples=1):
    """A CONV2D_Q8 plan, samples int8 inputs and the reference's int8 output for each."""
    kh, kw = k
    oh, ow = extent(H, kh, stride[0], pads[0], pads[2], dil[0]), extent(W, kw, stride[1], pads[1], pads[3], dil[1])
    xzp, yzp = (int(v) for v in rng.integers(-128, 128, 2))
    w = rand_i8(rng, O, C // groups, kh, kw, lo=-127)
    b = rng.integers(-(1 << 16), 1 << 16, O).astype(np.int32) if bias else None
    mult, shift = rescale(rng, O, shifts)
    lo, hi = act_range or (-128, 127)
    a = conv_attrs(stride, pads, dil, groups)
    plan = single_op_plan("CONV2D_Q8", act("x", (1, C, H, W), 0.05, xzp),
                          [const("w", w, "I8", _wquant(rng, O)), const("b", b, "I32") if bias else None,
                           const("mult", mult, "I32"), const("shift", shift, "I32")],
                          act("y", (1, O, oh, ow), 0.1, yzp), [a[n] for n in F.CONV_ATTRS] + [lo, hi])
    xs = [rand_i8(rng, 1, C, H, W) for _ in range(samples)]
    return plan, xs, [R.conv(x, w, b, mult, shift, xzp, yzp, a, (lo, hi), (1, O, oh, ow)) for x in xs]


def pwdw_q8(rng, C, E, H, W, k, stride, pads, dil=(1, 1), bias=True, samples=1):
    """A PWDW_Q8 plan (1x1 expansion C -> E into an E-channel depthwise conv k), inputs, reference outputs."""
    (kh, kw), (sh, sw) = k, stride
    oh, ow = extent(H, kh, sh, pads[0], pads[2], dil[0]), extent(W, kw, sw, pads[1], pads[3], dil[1])
    xzp, ezp, yzp = (int(v) for v in rng.integers(-128, 128, 3))
    lo1, hi1 = sorted(int(v) for v in rng.integers(-128, 128, 2))
    lo, hi = sorted(int(v) for v in rng.integers(-128, 128, 2))
    w1, w = rand_i8(rng, E, C, 1, 1, lo=-127), rand_i8(rng, E, 1, kh, kw, lo=-127)
    b1, b = (rng.integers(-(1 << 14), 1 << 14, E).astype(np.int32) if bias else None for _ in range(2))
    (m1, s1), (m, s) = rescale(rng, E, (-12, 0), False), rescale(rng, E, (-12, 0), False)
    a = conv_attrs(stride, pads, dil, E)
    ring = act("ring", ((kh - 1) * dil[0] + 1, E, W), 0.1, ezp)
    ins = [const("w1", w1, "I8", _wquant(rng, E)), const("b1", b1, "I32") if bias else None, const("m1", m1, "I32"),
           const("s1", s1, "I32"), const("w", w, "I8", _wquant(rng, E)), const("b", b, "I32") if bias else None,
           const("m", m, "I32"), const("s", s, "I32"), ring]
    plan = single_op_plan("PWDW_Q8", act("x", (1, C, H, W), 0.05, xzp), ins, act("y", (1, E, oh, ow), 0.1, yzp),
                          [a[n] for n in F.CONV_ATTRS] + [lo, hi, lo1, hi1])
    xs = [rand_i8(rng, 1, C, H, W, lo=-127) for _ in range(samples)]
    wants = []
    for x in xs:
        e = R.conv(x, w1, b1, m1, s1, xzp, ezp, ONE, (lo1, hi1), (1, E, H, W))
        wants.append(R.conv(e, w, b, m, s, ezp, yzp, a, (lo, hi), (1, E, oh, ow)))
    return plan, xs, wants


def cdp_q8(rng, C, E, O, H, W, first, dw, bias=True, samples=1):
    """A CONV_DW_PW_Q8 plan: a first conv C -> E (first = (k, stride, pads)), an E-channel depthwise
    conv (dw = (k, stride, pads, dilation)) and a 1x1 conv E -> O; inputs, reference outputs."""
    (k0, s0, p0), (k1, s1, p1, d1) = first, dw
    H1, W1 = extent(H, k0, s0, p0[0], p0[2]), extent(W, k0, s0, p0[1], p0[3])
    OH, OW = extent(H1, k1, s1, p1[0], p1[2], d1), extent(W1, k1, s1, p1[1], p1[3], d1)
    a0, a1 = conv_attrs((s0, s0), p0), conv_attrs((s1, s1), p1, (d1, d1), E)
    xzp, ezp, dzp, yzp = (int(v) for v in rng.integers(-128, 128, 4))
    clamps = [tuple(sorted(int(v) for v in rng.integers(-128, 128, 2))) for _ in range(3)]
    w0, w1, w = (rand_i8(rng, E, C, k0, k0, lo=-127), rand_i8(rng, E, 1, k1, k1, lo=-127),
                 rand_i8(rng, O, E, 1, 1, lo=-127))
    b0, b1, b = (rng.integers(-(1 << 14), 1 << 14, n).astype(np.int32) if bias else None for n in (E, E, O))
    (m0, sh0), (m1, sh1), (m, sh) = (rescale(rng, n, (-12, 0), False) for n in (E, E, O))
    ring = act("ring", ((k1 - 1) * d1 + 1, E, W1), 0.1, ezp)
    row = act("row", (E, OW), 0.1, dzp)
    ins = [const("w0", w0, "I8", _wquant(rng, E)), const("b0", b0, "I32") if bias else None, const("m0", m0, "I32"),
           const("s0", sh0, "I32"), const("w1", w1, "I8", _wquant(rng, E)), const("b1", b1, "I32") if bias else None,
           const("m1", m1, "I32"), const("s1", sh1, "I32"), const("w", w, "I8", _wquant(rng, O)),
           const("b", b, "I32") if bias else None, const("m", m, "I32"), const("s", sh, "I32"), ring, row]
    attrs = ([a0[n] for n in F.CONV_ATTRS] + [a1[n] for n in F.CONV_ATTRS[:-1]] + [v for c in clamps for v in c])
    plan = single_op_plan("CONV_DW_PW_Q8", act("x", (1, C, H, W), 0.05, xzp), ins,
                          act("y", (1, O, OH, OW), 0.1, yzp), attrs)
    xs = [rand_i8(rng, 1, C, H, W, lo=-127) for _ in range(samples)]
    wants = []
    for x in xs:
        e = R.conv(x, w0, b0, m0, sh0, xzp, ezp, a0, clamps[0], (1, E, H1, W1))
        d = R.conv(e, w1, b1, m1, sh1, ezp, dzp, a1, clamps[1], (1, E, OH, OW))
        wants.append(R.conv(d, w, b, m, sh, dzp, yzp, ONE, clamps[2], (1, O, OH, OW)))
    return plan, xs, wants
