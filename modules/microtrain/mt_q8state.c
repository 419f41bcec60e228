/* microtrain core: trained weights stored int8 (compile(trained_weights="int8"), docs/sparse.md).
 * Such a parameter is an I8 state tensor with per-output-channel scales in its quantization
 * record, fixed at compile time. DEQUANTIZE_W makes the float copy the float kernels read,
 * before each use; the optimizer sink (mt_optim.c) updates the codes in place:
 *     w <- clamp(round_half_even((w * s - lr * g) / s), -127, 127)
 * with g the (momentum, weight-decay) step of PyTorch's SGD on the float value w * s.
 */
#include "mt_q8.h"

int mt_q8w_of(const mt_ctx_t *ctx, const mt_tensor_t *t, mt_q8w_t *q) {
    mt_quant_t qr;
    if (t->dtype != MT_DTYPE_I8 || !mt_quant_of(ctx, t, &qr) || qr.axis == MT_PER_TENSOR || qr.axis >= t->ndim
        || qr.zero_points != MT_REF_NONE || qr.n != t->dim[qr.axis]) {
        return 0;
    }
    uint32_t inner = 1;
    for (uint8_t d = (uint8_t)(qr.axis + 1); d < t->ndim; d++) {
        inner *= t->dim[d];
    }
    q->scales = qr.scales;
    q->inner = inner;
    q->nch = qr.n;
    return 1;
}

int8_t mt_q8w_round(float v) {
    v = v > -127.0f ? v : -127.0f;   /* NaN goes to the low end */
    v = v < 127.0f ? v : 127.0f;
    return (int8_t)mt_round_half_even(v);
}

/* ---- DEQUANTIZE_W: y[e] = w[e] * scale of e's channel ---- */

typedef struct {
    mt_rec_t h;
    uint32_t w, y, n;
    mt_q8w_t q;
} dequantize_w_rec_t;

static int dequantize_w_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *w = &op->t[MT_DEQUANTIZE_W_W], *y = &op->t[MT_DEQUANTIZE_W_Y];
    mt_q8w_t q;
    return w->n == y->n && mt_q8w_of(ctx, w, &q) ? MT_OK : MT_E_SHAPE;
}

static uint32_t dequantize_w_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    dequantize_w_rec_t *r = rec;
    if (r != NULL) {
        r->w = op->t[MT_DEQUANTIZE_W_W].ref;
        r->y = op->t[MT_DEQUANTIZE_W_Y].ref;
        r->n = op->t[MT_DEQUANTIZE_W_Y].n;
        mt_q8w_of(ctx, &op->t[MT_DEQUANTIZE_W_W], &r->q);
    }
    return sizeof(dequantize_w_rec_t);
}

static int dequantize_w_run(mt_ctx_t *ctx, const void *rec) {
    const dequantize_w_rec_t *r = rec;
    const int8_t *w = (const int8_t *)mt_ptr(ctx, r->w);
    const float *sc = (const float *)mt_ptr(ctx, r->q.scales);
    float *y = MT_F32(ctx, r->y);
    const uint32_t inner = r->q.inner;
    for (uint32_t e = 0, c = 0; e < r->n; c = c + 1 == r->q.nch ? 0 : c + 1) {   /* a run of inner per channel */
        const float s = sc[c];
        for (uint32_t k = 0; k < inner; k++, e++) {
            y[e] = (float)w[e] * s;
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_DEQUANTIZE_W = {dequantize_w_check, dequantize_w_prepare, dequantize_w_run};
