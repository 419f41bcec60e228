/* microtrain core: int8 fully connected layer, and the float input gradient of a
 * frozen int8 one.
 *   GEMM_Q8             y[o] = clamp(y_zp + requant(b[o] + sum_k W(o,k) * (x[k] - x_zp), mult[o], shift[o]))
 *   GEMM_BWD_INPUT_Q8   dx[k] = sum_o dy[o] * W(o,k) * w_scale[o]
 * W is [O, K] (layout OUT_IN) or [K, O] (IN_OUT) as in GEMM; the per-channel
 * scales run along the output axis (0 or 1).
 */
#include "mt_q8.h"

#define CHUNK 32   /* outputs summed at once in the IN_OUT layout: 128 bytes of stack */

static int gemm_q8_dims(int32_t layout, const mt_tensor_t *w, uint32_t *O, uint32_t *K, uint8_t *axis) {
    if (w->ndim != 2 || (layout != MT_W_LAYOUT_OUT_IN && layout != MT_W_LAYOUT_IN_OUT)) {
        return 0;
    }
    *axis = layout == MT_W_LAYOUT_OUT_IN ? 0 : 1;
    *O = w->dim[*axis];
    *K = w->dim[1 - *axis];
    return 1;
}

typedef struct {
    mt_rec_t h;                   /* kind: the layout */
    uint32_t x, w, b, mult, shift, y, O, K;
    int32_t x_zp, y_zp, lo, hi;
} gemm_q8_rec_t;

static int gemm_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    uint32_t O, K;
    uint8_t axis;
    return gemm_q8_dims(op->a[MT_GEMM_Q8_A_W_LAYOUT], &t[MT_GEMM_Q8_W], &O, &K, &axis)
           && t[MT_GEMM_Q8_X].n == K && t[MT_GEMM_Q8_Y].n == O && K <= MT_Q8_MAX_TAPS
           && mt_q8_activation_ok(ctx, &t[MT_GEMM_Q8_X]) && mt_q8_activation_ok(ctx, &t[MT_GEMM_Q8_Y])
           && mt_q8_weight_ok(ctx, &t[MT_GEMM_Q8_W], axis, O)
           && mt_q8_rescale_ok(ctx, &t[MT_GEMM_Q8_MULT], &t[MT_GEMM_Q8_SHIFT], &t[MT_GEMM_Q8_B], O)
           && mt_q8_clamp_ok(op->a[MT_GEMM_Q8_A_ACT_MIN], op->a[MT_GEMM_Q8_A_ACT_MAX]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t gemm_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gemm_q8_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        uint8_t axis;
        r->h.kind = (uint8_t)op->a[MT_GEMM_Q8_A_W_LAYOUT];
        gemm_q8_dims(op->a[MT_GEMM_Q8_A_W_LAYOUT], &t[MT_GEMM_Q8_W], &r->O, &r->K, &axis);
        r->x = t[MT_GEMM_Q8_X].ref;
        r->w = t[MT_GEMM_Q8_W].ref;
        r->b = t[MT_GEMM_Q8_B].ref;
        r->mult = t[MT_GEMM_Q8_MULT].ref;
        r->shift = t[MT_GEMM_Q8_SHIFT].ref;
        r->y = t[MT_GEMM_Q8_Y].ref;
        r->x_zp = mt_q8_zero_point(ctx, &t[MT_GEMM_Q8_X]);
        r->y_zp = mt_q8_zero_point(ctx, &t[MT_GEMM_Q8_Y]);
        r->lo = op->a[MT_GEMM_Q8_A_ACT_MIN];
        r->hi = op->a[MT_GEMM_Q8_A_ACT_MAX];
    }
    return sizeof(gemm_q8_rec_t);
}

static int gemm_q8_run(mt_ctx_t *ctx, const void *rec) {
    const gemm_q8_rec_t *r = rec;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x), *w = (const int8_t *)mt_ptr(ctx, r->w);
    const int32_t *b = (const int32_t *)mt_ptr(ctx, r->b);
    const int32_t *mult = (const int32_t *)mt_ptr(ctx, r->mult), *shift = (const int32_t *)mt_ptr(ctx, r->shift);
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    const uint32_t O = r->O, K = r->K;
    const int32_t zp = r->x_zp;
    int32_t acc[CHUNK];
    for (uint32_t o0 = 0; o0 < O; o0 += CHUNK) {
        const uint32_t n = O - o0 < CHUNK ? O - o0 : CHUNK;
        for (uint32_t j = 0; j < n; j++) {
            acc[j] = b != NULL ? b[o0 + j] : 0;
        }
        if (r->h.kind == MT_W_LAYOUT_OUT_IN) {
            for (uint32_t j = 0; j < n; j++) {
                const int8_t *row = w + (size_t)(o0 + j) * K;
                int32_t s = acc[j];
                for (uint32_t k = 0; k < K; k++) {
                    s += (int32_t)row[k] * ((int32_t)x[k] - zp);
                }
                acc[j] = s;
            }
        } else {
            for (uint32_t k = 0; k < K; k++) {
                const int8_t *row = w + (size_t)k * O + o0;
                const int32_t xv = (int32_t)x[k] - zp;
                for (uint32_t j = 0; j < n; j++) {
                    acc[j] += (int32_t)row[j] * xv;
                }
            }
        }
        for (uint32_t j = 0; j < n; j++) {
            y[o0 + j] = mt_q8_out(mt_q8_requant(acc[j], mult[o0 + j], shift[o0 + j]), r->y_zp, r->lo, r->hi);
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GEMM_Q8 = {gemm_q8_check, gemm_q8_prepare, gemm_q8_run};

/* ---- GEMM_BWD_INPUT_Q8 ---- */

typedef struct {
    mt_rec_t h;                   /* kind: the layout */
    uint32_t dy, w, dx, scales, O, K;
    float scale;
} gemm_bwd_input_q8_rec_t;

static int gemm_bwd_input_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    uint32_t O, K;
    uint8_t axis;
    return gemm_q8_dims(op->a[MT_GEMM_BWD_INPUT_Q8_A_W_LAYOUT], &t[MT_GEMM_BWD_INPUT_Q8_W], &O, &K, &axis)
           && t[MT_GEMM_BWD_INPUT_Q8_DY].n == O && t[MT_GEMM_BWD_INPUT_Q8_DX].n == K
           && mt_q8_weight_ok(ctx, &t[MT_GEMM_BWD_INPUT_Q8_W], axis, O) ? MT_OK : MT_E_SHAPE;
}

static uint32_t gemm_bwd_input_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gemm_bwd_input_q8_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        uint8_t axis;
        mt_quant_t q;
        mt_quant_of(ctx, &t[MT_GEMM_BWD_INPUT_Q8_W], &q);
        r->h.kind = (uint8_t)op->a[MT_GEMM_BWD_INPUT_Q8_A_W_LAYOUT];
        gemm_q8_dims(op->a[MT_GEMM_BWD_INPUT_Q8_A_W_LAYOUT], &t[MT_GEMM_BWD_INPUT_Q8_W], &r->O, &r->K, &axis);
        r->dy = t[MT_GEMM_BWD_INPUT_Q8_DY].ref;
        r->w = t[MT_GEMM_BWD_INPUT_Q8_W].ref;
        r->dx = t[MT_GEMM_BWD_INPUT_Q8_DX].ref;
        r->scales = q.scales;
        r->scale = q.scale;
    }
    return sizeof(gemm_bwd_input_q8_rec_t);
}

static int gemm_bwd_input_q8_run(mt_ctx_t *ctx, const void *rec) {
    const gemm_bwd_input_q8_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->dy), *scales = MT_F32(ctx, r->scales);
    const int8_t *w = (const int8_t *)mt_ptr(ctx, r->w);
    float *dx = MT_F32(ctx, r->dx);
    const uint32_t O = r->O, K = r->K;
    if (r->h.kind == MT_W_LAYOUT_OUT_IN) {
        for (uint32_t k = 0; k < K; k++) {
            dx[k] = 0.0f;
        }
        for (uint32_t o = 0; o < O; o++) {
            const int8_t *row = w + (size_t)o * K;
            const float d = dy[o] * (scales != NULL ? scales[o] : r->scale);
            for (uint32_t k = 0; k < K; k++) {
                dx[k] += (float)row[k] * d;
            }
        }
    } else {
        for (uint32_t k = 0; k < K; k++) {
            const int8_t *row = w + (size_t)k * O;
            float acc = 0.0f;
            for (uint32_t o = 0; o < O; o++) {
                acc += (float)row[o] * (dy[o] * (scales != NULL ? scales[o] : r->scale));
            }
            dx[k] = acc;
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GEMM_BWD_INPUT_Q8 = {gemm_bwd_input_q8_check, gemm_bwd_input_q8_prepare,
    gemm_bwd_input_q8_run};
