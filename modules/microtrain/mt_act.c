/* microtrain core: element-wise activations with a backward (ACT, ACT_BWD):
 * Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, one op code with a kind.
 * exp is the core's own mt_expf (mt_math.c), so every platform gives the same bits.
 * The backward of Sigmoid and Tanh reads the saved output y, the others the input x
 * (format.py ACT_READS_Y); the compiler keeps that tensor alive until then. */
#include "mt_core.h"

typedef struct {
    mt_rec_t h;                   /* h.kind: MT_ACT_KIND_* */
    uint32_t v, dy, out, n;       /* ACT: v = x, dy unused; ACT_BWD: v saved, dy, out = dx */
    float alpha, beta;
} act_rec_t;

/* kind known, alpha and beta finite (the kinds that ignore them get 0 from the compiler) */
static int act_attrs_ok(const int32_t *a) {
    return mt_in_range(a[MT_ACT_A_KIND], 0, MT_ACT_KIND_MAX) && mt_f32_finite(mt_f32_from_bits(a[MT_ACT_A_ALPHA_BITS]))
           && mt_f32_finite(mt_f32_from_bits(a[MT_ACT_A_BETA_BITS]));
}

static void act_attrs(const int32_t *a, act_rec_t *r) {
    r->h.kind = (uint8_t)a[MT_ACT_A_KIND];
    r->alpha = mt_f32_from_bits(a[MT_ACT_A_ALPHA_BITS]);
    r->beta = mt_f32_from_bits(a[MT_ACT_A_BETA_BITS]);
}

/* ---- forward ---- */

/* 1 / (1 + exp(-x)); for x < 0 as e / (1 + e), e = exp(x), which keeps the tiny results that
 * 1 / (1 + exp(-x)) rounds to 0 once exp(-x) overflows (x < -88.7) */
MT_INLINE float sigmoid1(float x) {
    if (x < 0.0f) {
        const float e = mt_expf(x);
        return e / (1.0f + e);
    }
    return 1.0f / (1.0f + mt_expf(-x));
}

/* tanh |x| = (1 - e) / (1 + e), e = exp(-2|x|); below 0.125 the odd Taylor series to x^9
 * instead (1 - e would cancel; the first term left out is below 2e-12 relative) */
MT_INLINE float tanh1(float x) {
    const float a = x < 0.0f ? -x : x;
    float t;
    if (a < 0.125f) {
        const float z = a * a;
        t = a + a * z * (-1.0f / 3 + z * (2.0f / 15 + z * (-17.0f / 315 + z * (62.0f / 2835))));
    } else {
        const float e = mt_expf(-2.0f * a);
        t = (1.0f - e) / (1.0f + e);
    }
    return x < 0.0f ? -t : t;
}

/* max(0, min(1, alpha x + beta)) */
MT_INLINE float hardsigmoid1(float x, float alpha, float beta) {
    const float v = alpha * x + beta;
    return v <= 0.0f ? 0.0f : (v >= 1.0f ? 1.0f : v);
}

static int act_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    return act_attrs_ok(op->a) && op->t[MT_ACT_X].n == op->t[MT_ACT_Y].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t act_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    act_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        act_attrs(op->a, r);
        r->v = op->t[MT_ACT_X].ref;
        r->dy = MT_REF_NONE;
        r->out = op->t[MT_ACT_Y].ref;
        r->n = op->t[MT_ACT_Y].n;
    }
    return sizeof(act_rec_t);
}

/* element by element, so y may be x */
static int act_run(mt_ctx_t *ctx, const void *rec) {
    const act_rec_t *r = rec;
    const float *x = MT_F32(ctx, r->v);
    float *y = MT_F32(ctx, r->out);
    const float alpha = r->alpha, beta = r->beta;
    const uint32_t n = r->n;
    switch (r->h.kind) {
        case MT_ACT_KIND_SIGMOID:
            for (uint32_t i = 0; i < n; i++) {
                y[i] = sigmoid1(x[i]);
            }
            break;
        case MT_ACT_KIND_TANH:
            for (uint32_t i = 0; i < n; i++) {
                y[i] = tanh1(x[i]);
            }
            break;
        case MT_ACT_KIND_HARDSIGMOID:
            for (uint32_t i = 0; i < n; i++) {
                y[i] = hardsigmoid1(x[i], alpha, beta);
            }
            break;
        case MT_ACT_KIND_HARDSWISH:
            for (uint32_t i = 0; i < n; i++) {
                const float v = x[i];
                y[i] = v * hardsigmoid1(v, alpha, beta);
            }
            break;
        default:   /* MT_ACT_KIND_LEAKYRELU (checked at load) */
            for (uint32_t i = 0; i < n; i++) {
                const float v = x[i];
                y[i] = v > 0.0f ? v : v * alpha;
            }
            break;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_ACT = {act_check, act_prepare, act_run};

/* ---- backward: dx = dy * f'(x), as PyTorch's autograd computes it ---- */

static int act_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return act_attrs_ok(op->a) && t[MT_ACT_BWD_V].n == t[MT_ACT_BWD_DY].n && t[MT_ACT_BWD_DY].n == t[MT_ACT_BWD_DX].n
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t act_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    act_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        act_attrs(op->a, r);
        r->v = op->t[MT_ACT_BWD_V].ref;
        r->dy = op->t[MT_ACT_BWD_DY].ref;
        r->out = op->t[MT_ACT_BWD_DX].ref;
        r->n = op->t[MT_ACT_BWD_DX].n;
    }
    return sizeof(act_rec_t);
}

/* element by element, so dx may be dy */
static int act_bwd_run(mt_ctx_t *ctx, const void *rec) {
    const act_rec_t *r = rec;
    const float *v = MT_F32(ctx, r->v), *dy = MT_F32(ctx, r->dy);
    float *dx = MT_F32(ctx, r->out);
    const float alpha = r->alpha, beta = r->beta;
    const uint32_t n = r->n;
    switch (r->h.kind) {
        case MT_ACT_KIND_SIGMOID:   /* v = y: y (1 - y) */
            for (uint32_t i = 0; i < n; i++) {
                dx[i] = dy[i] * (1.0f - v[i]) * v[i];
            }
            break;
        case MT_ACT_KIND_TANH:      /* v = y: 1 - y^2 */
            for (uint32_t i = 0; i < n; i++) {
                dx[i] = dy[i] * (1.0f - v[i] * v[i]);
            }
            break;
        case MT_ACT_KIND_HARDSIGMOID:   /* alpha inside the linear part, 0 outside */
            for (uint32_t i = 0; i < n; i++) {
                const float s = alpha * v[i] + beta;
                dx[i] = (s > 0.0f && s < 1.0f) ? dy[i] * alpha : 0.0f;
            }
            break;
        case MT_ACT_KIND_HARDSWISH:     /* x h(x): 0, then 2 alpha x + beta, then 1 */
            for (uint32_t i = 0; i < n; i++) {
                const float s = alpha * v[i] + beta;
                dx[i] = s <= 0.0f ? 0.0f : (s >= 1.0f ? dy[i] : dy[i] * (2.0f * alpha * v[i] + beta));
            }
            break;
        default:   /* MT_ACT_KIND_LEAKYRELU */
            for (uint32_t i = 0; i < n; i++) {
                dx[i] = v[i] > 0.0f ? dy[i] : dy[i] * alpha;
            }
            break;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_ACT_BWD = {act_bwd_check, act_bwd_prepare, act_bwd_run};
