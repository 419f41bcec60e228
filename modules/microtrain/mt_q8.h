/* microtrain core: int8 arithmetic and quantization records, shared by the
 * int8 kernels (mt_quant.c, mt_conv_q8.c, mt_gemm_q8.c, mt_eltwise_q8.c,
 * mt_pool_q8.c). Private to the core.
 *
 * An int8 tensor q stands for real values scale * (q - zero_point). Inside the
 * int8 path everything is integer: an op sums int32 products, then rescales the
 * sum to its output's scale with a fixed-point multiplier (Q31 `mult`, power of
 * two `shift`, computed by the compiler) exactly as TensorFlow Lite's reference
 * kernels do (gemmlowp's SaturatingRoundingDoublingHighMul and
 * RoundingDivideByPOT), so every platform gives the same bits. The one
 * difference: where TFLite's x * 2^shift would overflow int32 (undefined there),
 * this saturates. Float appears only at the boundary ops QUANTIZE and
 * DEQUANTIZE and in the float backward kernels that read int8 weights.
 */
#ifndef MT_Q8_H
#define MT_Q8_H

#include "mt_core.h"

#define MT_Q8_MULT_MIN (1 << 30)    /* a Q31 multiplier in [0.5, 1): [2^30, 2^31 - 1], or 0 */
#define MT_Q8_SHIFT_MIN (-31)
#define MT_Q8_SHIFT_MAX 30
#define MT_Q8_MAX_TAPS 32767        /* products summed per output: |sum| < 2^30, no int32 overflow */
#define MT_Q8_BIAS_MAX (1 << 30)    /* |bias| <= 2^30: bias plus the sum stays inside int32 */

/* round(a * b / 2^31) (gemmlowp's nudge: ties go up, -1.5 -> -1); the one overflow
 * (INT32_MIN^2) saturates. */
MT_INLINE int32_t mt_q8_srdhm(int32_t a, int32_t b) {
    if (a == b && a == INT32_MIN) {
        return INT32_MAX;
    }
    int64_t t = (int64_t)a * b + (((int64_t)a * b) >= 0 ? (1 << 30) : (1 - (1 << 30)));
    /* t / 2^31 truncated toward zero, as gemmlowp's division, with shifts only */
    return (int32_t)(t >= 0 ? t >> 31 : -((-t) >> 31));
}

/* round(x / 2^e), ties away from zero, 0 <= e <= 31. (x >> e of a negative x is
 * an arithmetic shift on every compiler the core supports, as gemmlowp assumes.) */
MT_INLINE int32_t mt_q8_rdbpot(int32_t x, int32_t e) {
    const int32_t mask = (int32_t)((1u << e) - 1u);
    const int32_t remainder = x & mask;
    const int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> e) + (remainder > threshold ? 1 : 0);
}

/* x * mult * 2^(shift - 31), rounded: TFLite's MultiplyByQuantizedMultiplier.
 * shift is clamped to its valid range, so constants changed after load give
 * other numbers, never undefined shifts. */
MT_INLINE int32_t mt_q8_requant(int32_t x, int32_t mult, int32_t shift) {
    int32_t left = shift > 0 ? (shift > MT_Q8_SHIFT_MAX ? MT_Q8_SHIFT_MAX : shift) : 0;
    int32_t right = shift < 0 ? (shift < MT_Q8_SHIFT_MIN ? -MT_Q8_SHIFT_MIN : -shift) : 0;
    int64_t v = (int64_t)x * ((int64_t)1 << left);
    v = v > INT32_MAX ? INT32_MAX : (v < INT32_MIN ? INT32_MIN : v);
    return mt_q8_rdbpot(mt_q8_srdhm((int32_t)v, mult), right);
}

MT_INLINE int8_t mt_q8_clamp(int32_t v, int32_t lo, int32_t hi) {
    return (int8_t)(v < lo ? lo : (v > hi ? hi : v));
}

/* zp + v clamped to [lo, hi] (inside the int8 range): v is limited first, so the sum
 * cannot overflow however large the requantized v is. */
MT_INLINE int8_t mt_q8_out(int32_t v, int32_t zp, int32_t lo, int32_t hi) {
    v = v < -256 ? -256 : (v > 256 ? 256 : v);
    return mt_q8_clamp(v + zp, lo, hi);
}

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
