"""A numpy reference of the int8 arithmetic the C core runs (an oracle of the arithmetic
only: onnxruntime is the independent one). Written from TensorFlow Lite's reference
kernels (single-rounding requantization), whole arrays at a time, nothing shared
with the C: int64 numpy arrays, explicit padding, im2col-style window sums.

run_plan(plan, x) executes the forward ops of a plan whose ops are int8 or boundary ops
(QUANTIZE, DEQUANTIZE) and returns {tensor name: array}; float ops are not modelled.
"""
import numpy as np

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
FLOAT_OPS = ("CONV2D", "GEMM", "ADD", "CLIP", "MAXPOOL", "AVGPOOL", "GAP")   # not modelled: given by the caller


# ---- TFLite fixed point ----

def requant(x, mult, shift):
    """TFLite's MultiplyByQuantizedMultiplier, single-rounding form (TFLITE_SINGLE_ROUNDING):
    (x * mult + 2^(total - 1)) >> total with total = 31 - shift, saturated to int32."""
    x, mult, shift = (np.asarray(v, np.int64) for v in (x, mult, shift))
    total = 31 - shift
    # numpy's >> on int64 is an arithmetic shift: floor division by 2^total
    return np.clip((x * mult + (np.int64(1) << (total - 1))) >> total, INT32_MIN, INT32_MAX)


def requant_even(x, mult, shift):
    """The same, ties to even (the averages)."""
    x, mult, shift = (np.asarray(v, np.int64) for v in (x, mult, shift))
    total = 31 - shift
    half = np.int64(1) << (total - 1)
    t = x * mult + half
    r = t >> total
    tie = (t & (2 * half - 1)) == 0
    return np.clip(np.where(tie & (r % 2 == 1), r - 1, r), INT32_MIN, INT32_MAX)


def round_half_away(x):
    x = np.asarray(x, np.float64)
    return np.where(x >= 0, np.floor(x + 0.5), -np.floor(-x + 0.5))


# ---- ops ----

def quantize(x, scale, zp):
    v = np.asarray(x, np.float32) / np.float32(scale)   # float32 division, as ONNX QuantizeLinear
    return np.clip(np.rint(v).astype(np.int64) + zp, -128, 127).astype(np.int8)   # rint: ties to even


def dequantize(q, scale, zp):
    return (np.asarray(q, np.int64) - zp).astype(np.float32) * np.float32(scale)


def _windows(x, kh, kw, sh, sw, pads, dh, dw, oh, ow, fill):
    """(C, kh*kw, oh, ow): every window tap of every output, padding filled with `fill`
    (also past the right/bottom edge, where ceil_mode windows hang over)."""
    C, H, W = x.shape
    pt, pl, pb, pr = pads
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    big = np.full((C, max(need_h, pt + H + pb), max(need_w, pl + W + pr)), fill, np.int64)
    big[:, pt:pt + H, pl:pl + W] = x
    taps = [big[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw]
            for ky in range(kh) for kx in range(kw)]
    return np.stack(taps, 1)


def conv(x, w, b, mult, shift, x_zp, y_zp, a, act, yshape):
    """x (1,C,H,W) int8, w (O,C/g,kh,kw) int8, b int32 or None; a: the conv attributes."""
    x = np.asarray(x, np.int64)[0] - x_zp          # real 0 is 0 from here on: padding is 0
    O, Cg, kh, kw = w.shape
    g = a["groups"]
    _, _, oh, ow = yshape
    win = _windows(x, kh, kw, a["stride_h"], a["stride_w"], (a["pad_t"], a["pad_l"], a["pad_b"], a["pad_r"]),
                   a["dil_h"], a["dil_w"], oh, ow, 0)            # (C, taps, oh, ow)
    win = win.reshape(g, Cg * kh * kw, oh * ow)
    wg = np.asarray(w, np.int64).reshape(g, O // g, Cg * kh * kw)
    acc = np.einsum("gok,gkp->gop", wg, win).reshape(O, oh * ow)
    if b is not None:
        acc = acc + np.asarray(b, np.int64)[:, None]
    assert np.abs(acc).max() < 2 ** 31
    y = requant(acc, np.asarray(mult)[:, None], np.asarray(shift)[:, None]) + y_zp
    return np.clip(y, act[0], act[1]).astype(np.int8).reshape(yshape)


def gemm(x, w, b, mult, shift, x_zp, y_zp, layout, act):
    W = np.asarray(w, np.int64)
    W = W if layout == 0 else W.T                  # (O, K)
    acc = W @ (np.asarray(x, np.int64).reshape(-1) - x_zp)
    if b is not None:
        acc = acc + np.asarray(b, np.int64)
    y = requant(acc, mult, shift) + y_zp
    return np.clip(y, act[0], act[1]).astype(np.int8).reshape(1, -1)


def add(a, b, a_zp, b_zp, y_zp, at, shape):
    ls = 1 << at["left_shift"]
    sa = requant((np.asarray(a, np.int64) - a_zp) * ls, at["a_mult"], at["a_shift"])
    sb = requant((np.asarray(b, np.int64) - b_zp) * ls, at["b_mult"], at["b_shift"])
    y = requant(sa + sb, at["y_mult"], at["y_shift"]) + y_zp
    return np.clip(y, at["act_min"], at["act_max"]).astype(np.int8).reshape(shape)


def _pool_windows(x, a, yshape, fill):
    _, _, oh, ow = yshape
    return _windows(np.asarray(x, np.int64)[0], a["kernel_h"], a["kernel_w"], a["stride_h"], a["stride_w"],
                    (a["pad_t"], a["pad_l"], a["pad_b"], a["pad_r"]), a["dil_h"], a["dil_w"], oh, ow, fill)


def maxpool(x, zp, a, yshape):
    win = _pool_windows(x, a, yshape, -10 ** 6).max(1)
    return np.where(win < -128, zp, win).astype(np.int8).reshape(yshape)


def avgpool(x, x_zp, y_zp, mult, shift, a, yshape):
    """mult/shift: tables by window size n (1-based)."""
    x = np.asarray(x, np.int64)
    inside = _pool_windows(np.ones_like(x), a, yshape, 0)
    total = _pool_windows(x - x_zp, a, yshape, 0).sum(1)
    if a["count_include_pad"]:   # PyTorch: the window clipped to the padded input
        H, W = x.shape[2:]
        padded = np.zeros((1, x.shape[1], H + a["pad_t"] + a["pad_b"], W + a["pad_l"] + a["pad_r"]), np.int64)
        a0 = dict(a, pad_t=0, pad_l=0, pad_b=0, pad_r=0)
        count = _pool_windows(padded + 1, a0, yshape, 0).sum(1)
    else:
        count = inside.sum(1)
    k = np.maximum(count, 1) - 1
    y = np.where(count > 0, requant_even(total, np.asarray(mult)[k], np.asarray(shift)[k]), 0) + y_zp
    return np.clip(y, -128, 127).astype(np.int8).reshape(yshape)


def gap(x, x_zp, y_zp, mult, shift, yshape):
    s = (np.asarray(x, np.int64) - x_zp).reshape(x.shape[1], -1).sum(1)
    return np.clip(requant_even(s, mult, shift) + y_zp, -128, 127).astype(np.int8).reshape(yshape)


# ---- a plan ----

def run_plan(plan, x, values=None):
    """The int8 and boundary forward ops of plan on input x; {tensor name: value}. values may
    give tensors that float ops (not modelled here) computed."""
    from microtrain import format as F
    T = plan.tensors
    owner = plan.memory_owners()   # views read their source's memory
    env = dict(values or {})
    inp = T[plan.header["input_tensor"]]
    env[inp["name"]] = np.asarray(x).reshape(inp["shape"])

    def get(i):
        t = T[i]
        if t["storage"] == "CONST":
            return plan.constant(t["name"])
        name = t["name"] if t["name"] in env else T[owner[i]]["name"]
        return np.asarray(env[name]).reshape(t["shape"])

    def zp(i):
        return int(T[i]["quant"].zero_point)

    def sc(i):
        return float(T[i]["quant"].scale)

    for op in plan.ops:
        if op["phase"] != "FORWARD":
            break
        spec = F.OPS_BY_NAME[op["op"]]
        s = dict(zip((sl.name for sl in spec.slots), op["slots"]))
        a = dict(zip(spec.attrs, op["attrs"]))
        name = op["op"]
        out = T[s["y"]]
        if name == "QUANTIZE":
            y = quantize(get(s["x"]), sc(s["y"]), zp(s["y"]))
        elif name == "DEQUANTIZE":
            y = dequantize(get(s["x"]), sc(s["x"]), zp(s["x"]))
        elif name == "CONV2D_Q8":
            b = get(s["b"]) if s["b"] is not None else None
            y = conv(get(s["x"]), get(s["w"]), b, get(s["mult"]), get(s["shift"]), zp(s["x"]), zp(s["y"]), a,
                     (a["act_min"], a["act_max"]), out["shape"])
        elif name == "PWDW_Q8":   # the two convolutions it streams, the expanded tensor whole
            x = get(s["x"])
            w1, ring = get(s["w1"]), T[s["ring"]]
            one = dict(stride_h=1, stride_w=1, pad_t=0, pad_l=0, pad_b=0, pad_r=0, dil_h=1, dil_w=1, groups=1)
            e = conv(x, w1, get(s["b1"]) if s["b1"] is not None else None, get(s["mult1"]), get(s["shift1"]),
                     zp(s["x"]), zp(s["ring"]), one, (a["act_min1"], a["act_max1"]),
                     (1, w1.shape[0]) + x.shape[2:])
            y = conv(e, get(s["w"]), get(s["b"]) if s["b"] is not None else None, get(s["mult"]), get(s["shift"]),
                     zp(s["ring"]), zp(s["y"]), a, (a["act_min"], a["act_max"]), out["shape"])
        elif name == "GEMM_Q8":
            b = get(s["b"]) if s["b"] is not None else None
            y = gemm(get(s["x"]), get(s["w"]), b, get(s["mult"]), get(s["shift"]), zp(s["x"]), zp(s["y"]),
                     a["w_layout"], (a["act_min"], a["act_max"]))
        elif name == "ADD_Q8":
            y = add(get(s["a"]), get(s["b"]), zp(s["a"]), zp(s["b"]), zp(s["y"]), a, out["shape"])
        elif name == "MAXPOOL_Q8":
            y = maxpool(get(s["x"]), zp(s["x"]), a, out["shape"])
        elif name == "AVGPOOL_Q8":
            y = avgpool(get(s["x"]), zp(s["x"]), zp(s["y"]), get(s["mult"]), get(s["shift"]), a, out["shape"])
        elif name == "GAP_Q8":
            y = gap(get(s["x"]), zp(s["x"]), zp(s["y"]), a["mult"], a["shift"], out["shape"])
        elif out["name"] in env:
            continue   # a float op whose result the caller gave
        else:
            raise NotImplementedError("the reference does not model %s" % name)
        env[out["name"]] = np.asarray(y).reshape(out["shape"])
    return env
