/* microtrain core: int8 arithmetic and quantization records, shared by the
 * int8 kernels (mt_quant.c, mt_conv_q8.c, mt_pwdw_q8.c, mt_gemm_q8.c,
 * mt_eltwise_q8.c, mt_pool_q8.c). Private to the core.
 *
 * An int8 tensor q stands for real values scale * (q - zero_point). Inside the
 * int8 path everything is integer: an op sums int32 products, then rescales the
 * sum to its output's scale with a fixed-point multiplier (Q31 `mult` and a
 * power-of-two `shift`, computed by the compiler as TFLite's QuantizeMultiplier
 * does): x * mult * 2^(shift - 31), rounded once, half up. That is TensorFlow
 * Lite's reference MultiplyByQuantizedMultiplier in its single-rounding form
 * (TFLITE_SINGLE_ROUNDING); the classic form (gemmlowp's
 * SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT) rounds twice and
 * is off by one in about 0.1% of the outputs of a layer, which then add up
 * through a network. Every platform gives the same bits. Float appears only at
 * the boundary ops QUANTIZE and DEQUANTIZE and in the float backward kernels
 * that read int8 weights.
 */
#ifndef MT_Q8_H
#define MT_Q8_H

#include "mt_core.h"

#define MT_Q8_MULT_MIN (1 << 30)    /* a Q31 multiplier in [0.5, 1): [2^30, 2^31 - 1], or 0 */
#define MT_Q8_SHIFT_MIN (-31)
#define MT_Q8_SHIFT_MAX 30
#define MT_Q8_MAX_TAPS 32767        /* products summed per output: |sum| < 2^30, no int32 overflow */
#define MT_Q8_BIAS_MAX (1 << 30)    /* |bias| <= 2^30: bias plus the sum stays inside int32 */

/* floor(t / 2^s), 0 < s < 63, without relying on >> of a negative number */
MT_INLINE int64_t mt_q8_floor_shift(int64_t t, int32_t s) {
    return t >= 0 ? t >> s : -((-t + (((int64_t)1 << s) - 1)) >> s);
}

/* >> of a negative int32/int64 is implementation-defined in C99; every compiler the core is built
 * with shifts arithmetically, which the fast path of mt_q8_requant relies on: checked here. */
typedef char mt_q8_arithmetic_shift[((-8 >> 1) == -4 && ((int64_t)-8 >> 1) == -4) ? 1 : -1];

/* round(x * mult * 2^(shift - 31)), ties up, saturated to int32. shift is clamped
 * to its valid range, so constants changed after load give other numbers, never
 * undefined shifts. The usual case, a multiplier below 1/2 (shift < 0), needs the
 * high word of the 64-bit product only: |x * mult| < 2^62, so nothing saturates. */
MT_INLINE int32_t mt_q8_requant(int32_t x, int32_t mult, int32_t shift) {
    if (shift < 0 && shift >= MT_Q8_SHIFT_MIN) {
        /* 31 - shift = 32 + k: the product's high word, the half added to it (k >= 1) or, for
         * k = 0, the carry the half (2^31) makes out of the low word, then >> k */
        const int64_t p = (int64_t)x * mult;
        const int32_t k = -1 - shift;
        const int32_t hi = (int32_t)(p >> 32) + (k != 0 ? (int32_t)(1u << (k - 1)) : (int32_t)((uint32_t)p >> 31));
        return hi >> k;
    }
    shift = shift < MT_Q8_SHIFT_MIN ? MT_Q8_SHIFT_MIN : (shift > MT_Q8_SHIFT_MAX ? MT_Q8_SHIFT_MAX : shift);
    const int32_t total = 31 - shift;                      /* 1 .. 62 */
    int64_t t = mt_q8_floor_shift((int64_t)x * mult + ((int64_t)1 << (total - 1)), total);
    return (int32_t)(t > INT32_MAX ? INT32_MAX : (t < INT32_MIN ? INT32_MIN : t));
}

/* The same with ties to even: the averages (AVGPOOL_Q8, GAP_Q8), where a tie is
 * common (a sum of 4 divided by 4) and onnxruntime rounds the mean to even as
 * ONNX QuantizeLinear does. */
MT_INLINE int32_t mt_q8_requant_even(int32_t x, int32_t mult, int32_t shift) {
    shift = shift < MT_Q8_SHIFT_MIN ? MT_Q8_SHIFT_MIN : (shift > MT_Q8_SHIFT_MAX ? MT_Q8_SHIFT_MAX : shift);
    const int32_t total = 31 - shift;
    const int64_t half = (int64_t)1 << (total - 1), t = (int64_t)x * mult + half;
    int64_t r = mt_q8_floor_shift(t, total);
    if ((t & (2 * half - 1)) == 0 && (r & 1) != 0) {   /* exactly halfway, rounded up to odd */
        r--;
    }
    return (int32_t)(r > INT32_MAX ? INT32_MAX : (r < INT32_MIN ? INT32_MIN : r));
}

/* round to nearest, ties to even, of |v| < 2^22 (mt_quant.c) */
int32_t mt_round_half_even(float v);

MT_INLINE int8_t mt_q8_clamp(int32_t v, int32_t lo, int32_t hi) {
    return (int8_t)(v < lo ? lo : (v > hi ? hi : v));
}

/* zp + v clamped to [lo, hi] (inside the int8 range): v is limited first, so the sum
 * cannot overflow however large the requantized v is. */
MT_INLINE int8_t mt_q8_out(int32_t v, int32_t zp, int32_t lo, int32_t hi) {
    v = v < -256 ? -256 : (v > 256 ? 256 : v);
    return mt_q8_clamp(v + zp, lo, hi);
}

/* ---- the row loops of the int8 convolutions (mt_conv_q8.c, mt_pwdw_q8.c) ---- */

#define MT_Q8_ROW 32   /* outputs summed at once: 128 bytes of stack */

/* The chunk of a row of `width` outputs that starts at x0: its n (<= MT_Q8_ROW) sums set to init; n. */
MT_INLINE int32_t mt_q8_chunk(int32_t *acc, int32_t x0, int32_t width, int32_t init) {
    const int32_t n = width - x0 < MT_Q8_ROW ? width - x0 : MT_Q8_ROW;
    for (int32_t j = 0; j < n; j++) {
        acc[j] = init;
    }
    return n;
}

/* acc[j] += wv * (in[j*step] - zp), j < n */
MT_INLINE void mt_q8_mac_row(int32_t *acc, const int8_t *in, int32_t step, int32_t wv, int32_t zp, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        acc[j] += wv * ((int32_t)in[j * step] - zp);
    }
}

/* The taps wr[0..KW) of one input row irow (W values) for outputs x0 .. x0+n of an output row:
 * acc[j] += wr[kx] * (irow[(x0+j)*sw + kx*dw - pl] - zp); taps in the padding add nothing. */
MT_INLINE void mt_q8_mac_taps(int32_t *acc, const int8_t *irow, const int8_t *wr, const mt_conv_geom_t *g,
    int32_t x0, int32_t n, int32_t zp) {
    for (int32_t kx = 0; kx < (int32_t)g->KW; kx++) {
        int32_t off = kx * g->dw - g->pl, lo, hi;
        mt_window_range(off, g->sw, (int32_t)g->OW, (int32_t)g->W, &lo, &hi);
        lo = lo > x0 ? lo : x0;
        hi = hi < x0 + n ? hi : x0 + n;
        if (lo < hi) {
            mt_q8_mac_row(acc + (lo - x0), irow + lo * g->sw + off, g->sw, wr[kx], zp, hi - lo);
        }
    }
}

/* y[j] = the int8 output of the sum acc[j], j < n */
MT_INLINE void mt_q8_store_row(int8_t *y, const int32_t *acc, int32_t n, int32_t mult, int32_t shift, int32_t zp,
    int32_t lo, int32_t hi) {
    for (int32_t j = 0; j < n; j++) {
        y[j] = mt_q8_out(mt_q8_requant(acc[j], mult, shift), zp, lo, hi);
    }
}

#define MT_Q8_DW_ROWS 16   /* kernel rows mt_q8_dw takes at once (taller kernels: the row loops above) */

/* The windows of outputs [ja, jb) of one output row over one input channel (mt_q8_kernels.c):
 * the input rows they cover, rows[0..nrows) (each g->W values), with their kernel rows
 * wrows[0..nrows) (each g->KW taps); g gives the row's geometry (W, OW, KW, sw, dw, pl). Each
 * output's sum of w * (x - zp) is added to acc[j - ja]; taps outside a row add nothing. A
 * depthwise conv's row is one call; any other conv's, one per input channel of the group. */
void mt_q8_win(const int8_t *const *rows, const int8_t *const *wrows, int32_t nrows, const mt_conv_geom_t *g,
    int32_t zp, int32_t ja, int32_t jb, int32_t *acc);
/* One output row (g->OW values into y) of one channel of a depthwise convolution: mt_q8_win from
 * the bias, requantized as CONV2D_Q8 does. nrows <= MT_Q8_DW_ROWS. */
void mt_q8_dw(const int8_t *const *rows, const int8_t *const *wrows, int32_t nrows, const mt_conv_geom_t *g,
    int32_t zp, int32_t bias, int32_t mult, int32_t shift, int32_t yzp, int32_t lo, int32_t hi, int8_t *y);

/* A depthwise conv (geometry g, groups = channels) over a tensor held as a ring of R rows (row r
 * in slot r % R, each slot all channels x g->W): its output row oy, whose window spans rows
 * [ky0, ky1) of the kernel, for every channel o, written at out + o * ostride (the streamed ops,
 * PWDW_Q8 and CONV_DW_PW_Q8). The same sums and requantization as CONV2D_Q8's row loop. */
MT_INLINE void mt_q8_dw_ring_row(const int8_t *ring, uint32_t R, const mt_conv_geom_t *g, int32_t oy, int32_t ky0,
    int32_t ky1, const int8_t *w, const int32_t *b, const int32_t *mult, const int32_t *shift, int32_t in_zp,
    int32_t out_zp, int32_t lo, int32_t hi, int8_t *out, size_t ostride, int32_t *acc) {
    const int32_t OW = (int32_t)g->OW, by = oy * g->sh - g->pt, nrows = ky1 - ky0;
    const size_t taps = (size_t)g->KH * g->KW, slot = (size_t)g->C * g->W;
    if (nrows <= MT_Q8_DW_ROWS) {
        const int8_t *rows[MT_Q8_DW_ROWS], *wrows[MT_Q8_DW_ROWS];
        for (uint32_t o = 0; o < g->O; o++) {
            for (int32_t k = 0; k < nrows; k++) {
                rows[k] = ring + (size_t)((uint32_t)(by + (ky0 + k) * g->dh) % R) * slot + (size_t)o * g->W;
                wrows[k] = w + o * taps + (size_t)(ky0 + k) * g->KW;
            }
            mt_q8_dw(rows, wrows, nrows, g, in_zp, b != NULL ? b[o] : 0, mult[o], shift[o], out_zp, lo, hi,
                out + o * ostride);
        }
        return;
    }
    for (uint32_t o = 0; o < g->O; o++) {
        const int8_t *wo = w + o * taps;
        const int32_t init = b != NULL ? b[o] : 0;
        for (int32_t x0 = 0; x0 < OW; x0 += MT_Q8_ROW) {
            const int32_t n = mt_q8_chunk(acc, x0, OW, init);
            for (int32_t ky = ky0; ky < ky1; ky++) {
                const int32_t row = by + ky * g->dh;
                mt_q8_mac_taps(acc, ring + (size_t)((uint32_t)row % R) * slot + (size_t)o * g->W, wo + ky * g->KW, g,
                    x0, n, in_zp);
            }
            mt_q8_store_row(out + o * ostride + x0, acc, n, mult[o], shift[o], out_zp, lo, hi);
        }
    }
}

/* ---- the int8 convolution kernels (mt_q8_kernels.c) ---- */

/* A 1x1 convolution over n pixels: for o < O, j < n,
 *   y[o*ys + j] = out(b[o] + sum_c w[o*C + c] * (x[c*xs + j] - xzp))
 * requantized by mult[o], shift[o] to zero point yzp and clamped to [lo, hi] (b may be NULL). */
void mt_q8_pw(const int8_t *x, size_t xs, uint32_t C, int32_t xzp, const int8_t *w, const int32_t *b,
    const int32_t *mult, const int32_t *shift, uint32_t O, int8_t *y, size_t ys, uint32_t n, int32_t yzp, int32_t lo,
    int32_t hi);

/* ---- quantization records (mt_quant.c) ---- */

typedef struct {
    float scale;                  /* per tensor; 0 when per channel */
    int32_t zero_point;           /* per tensor; 0 when per channel */
    uint32_t n;                   /* channels: 1 per tensor */
    uint32_t scales;              /* reference of n f32 scales (per channel), else MT_REF_NONE */
    uint32_t zero_points;         /* reference of n i32 zero points, MT_REF_NONE when all are 0 */
    uint8_t axis;                 /* MT_PER_TENSOR or the channel axis */
} mt_quant_t;

/* The quantization record of t (validated at load); 0 if t has none. */
int mt_quant_of(const mt_ctx_t *ctx, const mt_tensor_t *t, mt_quant_t *q);
/* t is an int8 activation: per-tensor quantization */
int mt_q8_activation_ok(const mt_ctx_t *ctx, const mt_tensor_t *t);
/* w is an int8 weight with zero points 0, per tensor or per channel along axis with n channels */
int mt_q8_weight_ok(const mt_ctx_t *ctx, const mt_tensor_t *w, uint8_t axis, uint32_t n);
/* mult and shift: constant int32 tables of n entries (or one for all) with valid values;
 * b (optional): a constant int32 bias of n entries within MT_Q8_BIAS_MAX */
int mt_q8_rescale_ok(const mt_ctx_t *ctx, const mt_tensor_t *mult, const mt_tensor_t *shift, const mt_tensor_t *b,
    uint32_t n);
/* -128 <= lo <= hi <= 127 */
int mt_q8_clamp_ok(int32_t lo, int32_t hi);
/* one multiplier/shift pair given as attributes */
int mt_q8_pair_ok(int32_t mult, int32_t shift);

MT_INLINE int32_t mt_q8_zero_point(const mt_ctx_t *ctx, const mt_tensor_t *t) {
    mt_quant_t q;
    return mt_quant_of(ctx, t, &q) ? q.zero_point : 0;
}

#endif /* MT_Q8_H */
