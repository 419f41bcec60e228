/* microtrain core: gradient-norm clipping, as torch.nn.utils.clip_grad_norm_
 * (global L2 norm over every trainable parameter, max_norm / (norm + 1e-6),
 * never scaled up). The plan sends every gradient to an accumulator; when a
 * batch ends GRAD_NORM2 ops sum the squares of all accumulators, GRAD_CLIP ops
 * scale each one, and only then do the SGD ops update anything. A non-finite
 * norm clears every accumulator and the last GRAD_CLIP rejects the update, so
 * no parameter or momentum buffer changes (mt_exec.c counts the rejection). */
#include <string.h>
#include "mt_core.h"

/* sqrt for x >= 0 without libm (native modules link none): Newton's method from
 * a halved-exponent first guess, within an ulp; NaN stays NaN, +inf stays +inf. */
static float sqrt_pos(float x) {
    if (!(x > 0.0f) || !mt_f32_finite(x)) {
        return x == 0.0f ? 0.0f : x;
    }
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u >> 1) + 0x1FBD1DF5u;
    float y;
    memcpy(&y, &u, sizeof y);
    for (int i = 0; i < 4; i++) {
        y = 0.5f * (y + x / y);
    }
    return y;
}

/* ---- GRAD_NORM2: n2 = (first ? 0 : n2) + sum(acc^2) ---- */

typedef struct {
    mt_rec_t h;                   /* kind: first */
    uint32_t acc, n2, n;
} grad_norm2_rec_t;

static int grad_norm2_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    return op->t[MT_GRAD_NORM2_N2].n == 1 && (op->t[MT_GRAD_NORM2_ACC].flags & MT_TFLAG_GRAD_ACC)
           && mt_in_range(op->a[MT_GRAD_NORM2_A_FIRST], 0, 1) ? MT_OK : MT_E_SHAPE;
}

static uint32_t grad_norm2_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    grad_norm2_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->h.kind = (uint8_t)op->a[MT_GRAD_NORM2_A_FIRST];
        r->acc = op->t[MT_GRAD_NORM2_ACC].ref;
        r->n2 = op->t[MT_GRAD_NORM2_N2].ref;
        r->n = op->t[MT_GRAD_NORM2_ACC].n;
    }
    return sizeof(grad_norm2_rec_t);
}

static int grad_norm2_run(mt_ctx_t *ctx, const void *rec) {
    const grad_norm2_rec_t *r = rec;
    const float *acc = MT_F32(ctx, r->acc);
    float *n2 = MT_F32(ctx, r->n2);
    float s = r->h.kind ? 0.0f : n2[0];
    for (uint32_t i = 0; i < r->n; i++) {
        s += acc[i] * acc[i];
    }
    n2[0] = s;
    return MT_OK;
}

const mt_opdef_t mt_op_GRAD_NORM2 = {grad_norm2_check, grad_norm2_prepare, grad_norm2_run};

/* ---- GRAD_CLIP: acc *= min(1, max_norm / (sqrt(n2) / batch + 1e-6)) ---- */

typedef struct {
    mt_rec_t h;                   /* kind: last */
    uint32_t n2, acc, n;
    float max_norm, scale;
} grad_clip_rec_t;

static int grad_clip_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    float max_norm = mt_f32_from_bits(op->a[MT_GRAD_CLIP_A_MAX_NORM_BITS]);
    (void)ctx;
    return op->t[MT_GRAD_CLIP_N2].n == 1 && (op->t[MT_GRAD_CLIP_ACC].flags & MT_TFLAG_GRAD_ACC)
           && mt_f32_positive_normal(max_norm) && mt_in_range(op->a[MT_GRAD_CLIP_A_LAST], 0, 1)
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t grad_clip_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    grad_clip_rec_t *r = rec;
    if (r != NULL) {
        r->h.kind = (uint8_t)op->a[MT_GRAD_CLIP_A_LAST];
        r->n2 = op->t[MT_GRAD_CLIP_N2].ref;
        r->acc = op->t[MT_GRAD_CLIP_ACC].ref;
        r->n = op->t[MT_GRAD_CLIP_ACC].n;
        r->max_norm = mt_f32_from_bits(op->a[MT_GRAD_CLIP_A_MAX_NORM_BITS]);
        r->scale = 1.0f / (float)ctx->batch;
    }
    return sizeof(grad_clip_rec_t);
}

static int grad_clip_run(mt_ctx_t *ctx, const void *rec) {
    const grad_clip_rec_t *r = rec;
    float *acc = MT_F32(ctx, r->acc);
    const float norm = sqrt_pos(MT_F32(ctx, r->n2)[0]) * r->scale;   /* of the batch-mean gradient */
    if (!mt_f32_finite(norm)) {
        for (uint32_t i = 0; i < r->n; i++) {
            acc[i] = 0.0f;
        }
        return r->h.kind ? MT_E_GRAD : MT_OK;
    }
    const float coef = r->max_norm / (norm + 1e-6f);
    if (coef < 1.0f) {
        for (uint32_t i = 0; i < r->n; i++) {
            acc[i] *= coef;
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GRAD_CLIP = {grad_clip_check, grad_clip_prepare, grad_clip_run};
