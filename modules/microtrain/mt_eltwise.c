/* microtrain core: element-wise ops. Each may run in place (output == input). */
#include "mt_core.h"

/* ---- CLIP: Relu is Clip(0, +inf); ReLU6 is Clip(0, 6) ---- */

typedef struct {
    mt_rec_t h;
    uint32_t x, y, n;
    float lo, hi;
} clip_rec_t;

/* lo <= hi is false for NaN bounds too */
static int clip_bounds_ok(const mt_op_t *op) {
    return mt_f32_from_bits(op->a[MT_CLIP_A_LO_BITS]) <= mt_f32_from_bits(op->a[MT_CLIP_A_HI_BITS]);
}

static int clip_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    return clip_bounds_ok(op) && op->t[MT_CLIP_X].n == op->t[MT_CLIP_Y].n ? MT_OK : MT_E_SHAPE;
}

enum { KIND_CLIP, KIND_RELU };

static uint32_t clip_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    clip_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->x = op->t[MT_CLIP_X].ref;
        r->y = op->t[MT_CLIP_Y].ref;
        r->n = op->t[MT_CLIP_Y].n;
        r->lo = mt_f32_from_bits(op->a[MT_CLIP_A_LO_BITS]);
        r->hi = mt_f32_from_bits(op->a[MT_CLIP_A_HI_BITS]);
        /* Relu: Clip(+0, +inf), the bits exactly */
        r->h.kind = op->a[MT_CLIP_A_LO_BITS] == 0 && op->a[MT_CLIP_A_HI_BITS] == 0x7F800000 ? KIND_RELU : KIND_CLIP;
    }
    return sizeof(clip_rec_t);
}

/* v < lo ? lo : (v > hi ? hi : v); NaN stays NaN. For Relu the upper test never holds. */
MT_INLINE float clip1(const int kind, float v, float lo, float hi) {
    if (kind == KIND_RELU) {
        return v < 0.0f ? 0.0f : v;
    }
    return v < lo ? lo : (v > hi ? hi : v);
}

MT_INLINE void clip_loop(const int kind, const float *x, float *y, uint32_t n, float lo, float hi) {
    for (; n >= 4; n -= 4, x += 4, y += 4) {
        const float a = x[0], b = x[1], c = x[2], d = x[3];
        y[0] = clip1(kind, a, lo, hi);
        y[1] = clip1(kind, b, lo, hi);
        y[2] = clip1(kind, c, lo, hi);
        y[3] = clip1(kind, d, lo, hi);
    }
    for (; n > 0; n--) {
        *y++ = clip1(kind, *x++, lo, hi);
    }
}

static int clip_run(mt_ctx_t *ctx, const void *rec) {
    const clip_rec_t *r = rec;
    if (r->h.kind == KIND_RELU) {
        clip_loop(KIND_RELU, MT_F32(ctx, r->x), MT_F32(ctx, r->y), r->n, r->lo, r->hi);
    } else {
        clip_loop(KIND_CLIP, MT_F32(ctx, r->x), MT_F32(ctx, r->y), r->n, r->lo, r->hi);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CLIP = {clip_check, clip_prepare, clip_run};

/* ---- CLIP_BWD: the gradient passes where the output lies strictly inside
 * (lo, hi); the output alone decides, so the forward may overwrite its input ---- */

typedef struct {
    mt_rec_t h;
    uint32_t y, dy, dx, n;
    float lo, hi;
} clip_bwd_rec_t;

static int clip_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return clip_bounds_ok(op) && t[MT_CLIP_BWD_Y].n == t[MT_CLIP_BWD_DY].n && t[MT_CLIP_BWD_DY].n == t[MT_CLIP_BWD_DX].n
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t clip_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    clip_bwd_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->y = op->t[MT_CLIP_BWD_Y].ref;
        r->dy = op->t[MT_CLIP_BWD_DY].ref;
        r->dx = op->t[MT_CLIP_BWD_DX].ref;
        r->n = op->t[MT_CLIP_BWD_DX].n;
        r->lo = mt_f32_from_bits(op->a[MT_CLIP_BWD_A_LO_BITS]);
        r->hi = mt_f32_from_bits(op->a[MT_CLIP_BWD_A_HI_BITS]);
    }
    return sizeof(clip_bwd_rec_t);
}

static int clip_bwd_run(mt_ctx_t *ctx, const void *rec) {
    const clip_bwd_rec_t *r = rec;
    const float lo = r->lo, hi = r->hi;
    const float *y = MT_F32(ctx, r->y), *dy = MT_F32(ctx, r->dy);
    float *dx = MT_F32(ctx, r->dx);
    uint32_t n = r->n;
    for (; n >= 2; n -= 2, y += 2, dy += 2, dx += 2) {
        const float a = y[0], b = y[1], da = dy[0], db = dy[1];
        dx[0] = (a > lo && a < hi) ? da : 0.0f;
        dx[1] = (b > lo && b < hi) ? db : 0.0f;
    }
    if (n > 0) {
        dx[0] = (y[0] > lo && y[0] < hi) ? dy[0] : 0.0f;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CLIP_BWD = {clip_bwd_check, clip_bwd_prepare, clip_bwd_run};

/* ---- ADD ---- */

typedef struct {
    mt_rec_t h;
    uint32_t a, b, y, n;
} add_rec_t;

static int add_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return t[MT_ADD_A].n == t[MT_ADD_B].n && t[MT_ADD_B].n == t[MT_ADD_Y].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t add_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    add_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->a = op->t[MT_ADD_A].ref;
        r->b = op->t[MT_ADD_B].ref;
        r->y = op->t[MT_ADD_Y].ref;
        r->n = op->t[MT_ADD_Y].n;
    }
    return sizeof(add_rec_t);
}

static int add_run(mt_ctx_t *ctx, const void *rec) {
    const add_rec_t *r = rec;
    const float *a = MT_F32(ctx, r->a), *b = MT_F32(ctx, r->b);
    float *y = MT_F32(ctx, r->y);
    for (uint32_t i = 0; i < r->n; i++) {
        y[i] = a[i] + b[i];
    }
    return MT_OK;
}

const mt_opdef_t mt_op_ADD = {add_check, add_prepare, add_run};
