/* microtrain core: products with a per-channel broadcast.
 *   MUL               y = a * b; b of a's size, or one value per channel of a (1,C,...)
 *                     (squeeze-and-excitation: x (1,C,H,W) * s (1,C,1,1))
 *   MUL_BWD_CHANNEL   db[c] = sum over channel c of dy * a: the gradient of a per-channel b
 *   AFFINE            y = x * s[c] + t[c]: frozen BatchNormalization, Mul/Add/Sub/Div by a constant
 * The gradient of a (and of AFFINE's x) is MUL(dy, b) (MUL(dy, s)): no op of its own. */
#include "mt_core.h"

typedef struct {
    mt_rec_t h;
    uint32_t a, b, c, y;          /* c: AFFINE's shift t; unused by the others */
    uint32_t C, inner;            /* channels, elements per channel (1 when b is a's size) */
} mul_rec_t;

/* b (n_b elements) broadcast onto a: the same size, or one value per channel of (1,C,...)
 * a; the number of channels that gives (n_b), or 0 if it fits neither way */
static uint32_t channels_of(const mt_tensor_t *a, uint32_t n_b) {
    if (n_b == a->n) {
        return n_b;
    }
    return a->ndim >= 2 && a->dim[0] == 1 && n_b == a->dim[1] ? n_b : 0;
}

static void mul_geom(const mt_tensor_t *a, uint32_t n_b, mul_rec_t *r) {
    r->C = n_b;
    r->inner = a->n / n_b;
}

/* ---- MUL ---- */

static int mul_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return channels_of(&t[MT_MUL_A], t[MT_MUL_B].n) != 0 && t[MT_MUL_A].n == t[MT_MUL_Y].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t mul_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    mul_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->a = op->t[MT_MUL_A].ref;
        r->b = op->t[MT_MUL_B].ref;
        r->c = MT_REF_NONE;
        r->y = op->t[MT_MUL_Y].ref;
        mul_geom(&op->t[MT_MUL_A], op->t[MT_MUL_B].n, r);
    }
    return sizeof(mul_rec_t);
}

/* y may be a (or b, when they are the same size): each element is read before it is written */
static int mul_run(mt_ctx_t *ctx, const void *rec) {
    const mul_rec_t *r = rec;
    const float *a = MT_F32(ctx, r->a), *b = MT_F32(ctx, r->b);
    float *y = MT_F32(ctx, r->y);
    const uint32_t inner = r->inner;
    if (inner == 1) {
        for (uint32_t i = 0; i < r->C; i++) {
            y[i] = a[i] * b[i];
        }
        return MT_OK;
    }
    for (uint32_t c = 0; c < r->C; c++, a += inner, y += inner) {
        const float s = b[c];
        for (uint32_t i = 0; i < inner; i++) {
            y[i] = a[i] * s;
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_MUL = {mul_check, mul_prepare, mul_run};

/* ---- MUL_BWD_CHANNEL ---- */

static int mul_bwd_channel_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return t[MT_MUL_BWD_CHANNEL_DY].n == t[MT_MUL_BWD_CHANNEL_A].n
           && channels_of(&t[MT_MUL_BWD_CHANNEL_A], t[MT_MUL_BWD_CHANNEL_DB].n) != 0 ? MT_OK : MT_E_SHAPE;
}

static uint32_t mul_bwd_channel_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    mul_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->a = op->t[MT_MUL_BWD_CHANNEL_A].ref;
        r->b = op->t[MT_MUL_BWD_CHANNEL_DY].ref;
        r->c = MT_REF_NONE;
        r->y = op->t[MT_MUL_BWD_CHANNEL_DB].ref;
        mul_geom(&op->t[MT_MUL_BWD_CHANNEL_A], op->t[MT_MUL_BWD_CHANNEL_DB].n, r);
    }
    return sizeof(mul_rec_t);
}

static int mul_bwd_channel_run(mt_ctx_t *ctx, const void *rec) {
    const mul_rec_t *r = rec;
    const float *a = MT_F32(ctx, r->a), *dy = MT_F32(ctx, r->b);
    float *db = MT_F32(ctx, r->y);
    const uint32_t inner = r->inner;
    for (uint32_t c = 0; c < r->C; c++, a += inner, dy += inner) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < inner; i++) {
            acc += dy[i] * a[i];
        }
        db[c] = acc;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_MUL_BWD_CHANNEL = {mul_bwd_channel_check, mul_bwd_channel_prepare, mul_bwd_channel_run};

/* ---- AFFINE ---- */

static int affine_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return channels_of(&t[MT_AFFINE_X], t[MT_AFFINE_S].n) != 0 && t[MT_AFFINE_S].n == t[MT_AFFINE_T].n
           && t[MT_AFFINE_X].n == t[MT_AFFINE_Y].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t affine_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    mul_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->a = op->t[MT_AFFINE_X].ref;
        r->b = op->t[MT_AFFINE_S].ref;
        r->c = op->t[MT_AFFINE_T].ref;
        r->y = op->t[MT_AFFINE_Y].ref;
        mul_geom(&op->t[MT_AFFINE_X], op->t[MT_AFFINE_S].n, r);
    }
    return sizeof(mul_rec_t);
}

/* y may be x */
static int affine_run(mt_ctx_t *ctx, const void *rec) {
    const mul_rec_t *r = rec;
    const float *x = MT_F32(ctx, r->a), *s = MT_F32(ctx, r->b), *t = MT_F32(ctx, r->c);
    float *y = MT_F32(ctx, r->y);
    const uint32_t inner = r->inner;
    for (uint32_t c = 0; c < r->C; c++, x += inner, y += inner) {
        const float sc = s[c], sh = t[c];
        for (uint32_t i = 0; i < inner; i++) {
            y[i] = x[i] * sc + sh;
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_AFFINE = {affine_check, affine_prepare, affine_run};
