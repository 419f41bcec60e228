/* microtrain core: quantization records and the float/int8 boundary.
 *   QUANTIZE    y = clamp(round_half_even(x / scale) + zero_point)   (ONNX QuantizeLinear)
 *   DEQUANTIZE  y = (q - zero_point) * scale                          (ONNX DequantizeLinear)
 *   ADD_DQ      y = a + (q - zero_point) * scale                      (DEQUANTIZE, then ADD)
 * These are the only forward ops of an int8 plan that compute in float;
 * IEEE-754 division and multiplication round the same on every FPU and in
 * soft float, so the bits agree everywhere.
 */
#include "mt_q8.h"

int mt_quant_of(const mt_ctx_t *ctx, const mt_tensor_t *t, mt_quant_t *q) {
    if (t->quant == MT_NO_QUANT || t->quant >= ctx->n_quant) {
        return 0;
    }
    const uint8_t *r = ctx->quant + (uint32_t)t->quant * MT_QUANT_BYTES;
    q->scale = mt_f32_from_bits((int32_t)mt_rd_u32(r + MT_Q_SCALE));
    q->zero_point = (int32_t)mt_rd_u32(r + MT_Q_ZERO_POINT);
    q->axis = r[MT_Q_AXIS];
    q->n = mt_rd_u32(r + MT_Q_N_CHANNELS);
    uint32_t scales = mt_rd_u32(r + MT_Q_SCALES), zps = mt_rd_u32(r + MT_Q_ZERO_POINTS);
    /* per-channel arrays in the data section, or in the stream section (with the group of the op) */
    uint32_t region = r[MT_Q_WHERE] == MT_QUANT_IN_STREAM ? MT_REGION_STREAM : MT_REGION_CONST;
    q->scales = scales == MT_NO_NAME ? MT_REF_NONE : scales | region;
    q->zero_points = zps == MT_NO_NAME ? MT_REF_NONE : zps | region;
    return 1;
}

int mt_q8_activation_ok(const mt_ctx_t *ctx, const mt_tensor_t *t) {
    mt_quant_t q;
    return t->dtype == MT_DTYPE_I8 && mt_quant_of(ctx, t, &q) && q.axis == MT_PER_TENSOR;
}

int mt_q8_weight_ok(const mt_ctx_t *ctx, const mt_tensor_t *w, uint8_t axis, uint32_t n) {
    mt_quant_t q;
    if (w->dtype != MT_DTYPE_I8 || !mt_quant_of(ctx, w, &q)) {
        return 0;
    }
    if (q.axis == MT_PER_TENSOR) {
        return q.zero_point == 0;
    }
    if (q.axis != axis || q.n != n) {
        return 0;
    }
    if (q.zero_points != MT_REF_NONE) {   /* validated in range at load; the kernels need 0 */
        const uint8_t *z = (const uint8_t *)mt_ptr(ctx, q.zero_points);
        for (uint32_t c = 0; c < n; c++) {
            if (mt_rd_u32(z + 4 * c) != 0) {
                return 0;
            }
        }
    }
    return 1;
}

/* a constant int32 vector of n elements, each in [lo, hi] (and, if pow2, 0 or >= 2^30); in the stream
 * section, checked where its group is in memory (mt_plan.c) */
static int table_ok(const mt_ctx_t *ctx, const mt_tensor_t *t, uint32_t n, int32_t lo, int32_t hi, int mult) {
    if ((t->storage != MT_STORAGE_CONST && t->storage != MT_STORAGE_STREAM) || t->dtype != MT_DTYPE_I32 || t->n != n) {
        return 0;
    }
    const uint8_t *p = (const uint8_t *)mt_ptr(ctx, t->ref);
    for (uint32_t i = 0; i < n; i++) {
        int32_t v = (int32_t)mt_rd_u32(p + 4 * i);
        if (v < lo || v > hi || (mult && v != 0 && v < MT_Q8_MULT_MIN)) {
            return 0;
        }
    }
    return 1;
}

int mt_q8_rescale_ok(const mt_ctx_t *ctx, const mt_tensor_t *mult, const mt_tensor_t *shift, const mt_tensor_t *b,
    uint32_t n) {
    return table_ok(ctx, mult, n, 0, INT32_MAX, 1) && table_ok(ctx, shift, n, MT_Q8_SHIFT_MIN, MT_Q8_SHIFT_MAX, 0)
           && (b->n == 0 || table_ok(ctx, b, n, -MT_Q8_BIAS_MAX, MT_Q8_BIAS_MAX, 0));
}

int mt_q8_clamp_ok(int32_t lo, int32_t hi) {
    return lo >= -128 && lo <= hi && hi <= 127;
}

int mt_q8_pair_ok(int32_t mult, int32_t shift) {
    return (mult == 0 || mult >= MT_Q8_MULT_MIN) && shift >= MT_Q8_SHIFT_MIN && shift <= MT_Q8_SHIFT_MAX;
}

/* ---- QUANTIZE, DEQUANTIZE: one record for both ---- */

typedef struct {
    mt_rec_t h;
    uint32_t x, y, n;
    int32_t zp;
    float scale;
} boundary_rec_t;

static int quantize_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_QUANTIZE_X], *y = &op->t[MT_QUANTIZE_Y];
    return x->n == y->n && mt_q8_activation_ok(ctx, y) ? MT_OK : MT_E_SHAPE;
}

static int dequantize_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_DEQUANTIZE_X], *y = &op->t[MT_DEQUANTIZE_Y];
    return x->n == y->n && mt_q8_activation_ok(ctx, x) ? MT_OK : MT_E_SHAPE;
}

/* x is slot 0 and y slot 1 in both ops; the int8 side holds the parameters */
static uint32_t boundary_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    boundary_rec_t *r = rec;
    if (r != NULL) {
        mt_quant_t q;
        mt_quant_of(ctx, &op->t[op->code == MT_OP_QUANTIZE ? MT_QUANTIZE_Y : MT_DEQUANTIZE_X], &q);
        r->x = op->t[0].ref;
        r->y = op->t[1].ref;
        r->n = op->t[1].n;
        r->zp = q.zero_point;
        r->scale = q.scale;
    }
    return sizeof(boundary_rec_t);
}

/* round to nearest, ties to even, of |v| < 2^22 (v - (int)v is then exact) */
int32_t mt_round_half_even(float v) {
    int32_t r = (int32_t)v;
    float f = v - (float)r;
    if (f > 0.5f || (f == 0.5f && (r & 1))) {
        r++;
    } else if (f < -0.5f || (f == -0.5f && (r & 1))) {
        r--;
    }
    return r;
}

static int quantize_run(mt_ctx_t *ctx, const void *rec) {
    const boundary_rec_t *r = rec;
    const float *x = MT_F32(ctx, r->x);
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    const float scale = r->scale;
    const int32_t zp = r->zp;
    for (uint32_t i = 0; i < r->n; i++) {
        float v = x[i] / scale;
        /* anything past +-1024 saturates anyway; NaN goes to the low end */
        v = v > -1024.0f ? v : -1024.0f;
        v = v < 1024.0f ? v : 1024.0f;
        y[i] = mt_q8_clamp(mt_round_half_even(v) + zp, -128, 127);
    }
    return MT_OK;
}

static int dequantize_run(mt_ctx_t *ctx, const void *rec) {
    const boundary_rec_t *r = rec;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x);
    float *y = MT_F32(ctx, r->y);
    const float scale = r->scale;
    const int32_t zp = r->zp;
    for (uint32_t i = 0; i < r->n; i++) {
        y[i] = (float)((int32_t)x[i] - zp) * scale;
    }
    return MT_OK;
}

/* ---- ADD_DQ: DEQUANTIZE then ADD, y = a + (q - zero_point) * scale, y a's memory or apart ---- */

typedef struct {
    boundary_rec_t q;   /* x: q, y: y */
    uint32_t a;
} add_dq_rec_t;

static int add_dq_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    return t[MT_ADD_DQ_A].n == t[MT_ADD_DQ_Q].n && t[MT_ADD_DQ_Y].n == t[MT_ADD_DQ_Q].n
           && mt_q8_activation_ok(ctx, &t[MT_ADD_DQ_Q]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t add_dq_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    add_dq_rec_t *r = rec;
    if (r != NULL) {
        mt_quant_t q;
        mt_quant_of(ctx, &op->t[MT_ADD_DQ_Q], &q);
        r->q.x = op->t[MT_ADD_DQ_Q].ref;
        r->q.y = op->t[MT_ADD_DQ_Y].ref;
        r->q.n = op->t[MT_ADD_DQ_Y].n;
        r->q.zp = q.zero_point;
        r->q.scale = q.scale;
        r->a = op->t[MT_ADD_DQ_A].ref;
    }
    return sizeof(add_dq_rec_t);
}

static int add_dq_run(mt_ctx_t *ctx, const void *rec) {
    const add_dq_rec_t *r = rec;
    const int8_t *q = (const int8_t *)mt_ptr(ctx, r->q.x);
    const float *a = MT_F32(ctx, r->a);
    float *y = MT_F32(ctx, r->q.y);
    for (uint32_t i = 0; i < r->q.n; i++) {
        const float v = (float)((int32_t)q[i] - r->q.zp) * r->q.scale;   /* DEQUANTIZE's value, then ADD's sum */
        y[i] = a[i] + v;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_ADD_DQ = {add_dq_check, add_dq_prepare, add_dq_run};
const mt_opdef_t mt_op_QUANTIZE = {quantize_check, boundary_prepare, quantize_run};
const mt_opdef_t mt_op_DEQUANTIZE = {dequantize_check, boundary_prepare, dequantize_run};
