/* microtrain core: int8 element-wise ops.
 *   ADD_Q8       y = clamp(y_zp + R(R((a - a_zp) << left_shift, a) + R((b - b_zp) << left_shift, b), y))
 *                with R(v, t) = requant(v, t_mult, t_shift): TFLite's quantized Add, the inputs
 *                brought to a common scale (twice the larger input scale, 2^-left_shift finer)
 *                before they are summed.
 *   CLIP_BWD_Q8  dx = dy where act_min < y < act_max (the saved int8 output), else 0: the
 *                backward of ReLU/ReLU6 folded into an int8 op's clamp, and of saturation.
 */
#include "mt_q8.h"

#define ADD_LEFT_SHIFT_MAX 22   /* 255 * 2^22 < 2^31 */

typedef struct {
    mt_rec_t h;
    uint32_t a, b, y, n;
    int32_t a_zp, b_zp, y_zp, left, a_mult, a_shift, b_mult, b_shift, y_mult, y_shift, lo, hi;
} add_q8_rec_t;

static int add_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    const int32_t *a = op->a;
    return t[MT_ADD_Q8_A].n == t[MT_ADD_Q8_B].n && t[MT_ADD_Q8_B].n == t[MT_ADD_Q8_Y].n
           && mt_q8_activation_ok(ctx, &t[MT_ADD_Q8_A]) && mt_q8_activation_ok(ctx, &t[MT_ADD_Q8_B])
           && mt_q8_activation_ok(ctx, &t[MT_ADD_Q8_Y])
           && mt_in_range(a[MT_ADD_Q8_A_LEFT_SHIFT], 0, ADD_LEFT_SHIFT_MAX)
           && mt_q8_pair_ok(a[MT_ADD_Q8_A_A_MULT], a[MT_ADD_Q8_A_A_SHIFT])
           && mt_q8_pair_ok(a[MT_ADD_Q8_A_B_MULT], a[MT_ADD_Q8_A_B_SHIFT])
           && mt_q8_pair_ok(a[MT_ADD_Q8_A_Y_MULT], a[MT_ADD_Q8_A_Y_SHIFT])
           && mt_q8_clamp_ok(a[MT_ADD_Q8_A_ACT_MIN], a[MT_ADD_Q8_A_ACT_MAX]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t add_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    add_q8_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        const int32_t *a = op->a;
        r->a = t[MT_ADD_Q8_A].ref;
        r->b = t[MT_ADD_Q8_B].ref;
        r->y = t[MT_ADD_Q8_Y].ref;
        r->n = t[MT_ADD_Q8_Y].n;
        r->a_zp = mt_q8_zero_point(ctx, &t[MT_ADD_Q8_A]);
        r->b_zp = mt_q8_zero_point(ctx, &t[MT_ADD_Q8_B]);
        r->y_zp = mt_q8_zero_point(ctx, &t[MT_ADD_Q8_Y]);
        r->left = a[MT_ADD_Q8_A_LEFT_SHIFT];
        r->a_mult = a[MT_ADD_Q8_A_A_MULT];
        r->a_shift = a[MT_ADD_Q8_A_A_SHIFT];
        r->b_mult = a[MT_ADD_Q8_A_B_MULT];
        r->b_shift = a[MT_ADD_Q8_A_B_SHIFT];
        r->y_mult = a[MT_ADD_Q8_A_Y_MULT];
        r->y_shift = a[MT_ADD_Q8_A_Y_SHIFT];
        r->lo = a[MT_ADD_Q8_A_ACT_MIN];
        r->hi = a[MT_ADD_Q8_A_ACT_MAX];
    }
    return sizeof(add_q8_rec_t);
}

static int add_q8_run(mt_ctx_t *ctx, const void *rec) {
    const add_q8_rec_t *r = rec;
    const int8_t *a = (const int8_t *)mt_ptr(ctx, r->a), *b = (const int8_t *)mt_ptr(ctx, r->b);
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    const int32_t scale = (int32_t)1 << r->left;
    for (uint32_t i = 0; i < r->n; i++) {
        int32_t sa = mt_q8_requant(((int32_t)a[i] - r->a_zp) * scale, r->a_mult, r->a_shift);
        int32_t sb = mt_q8_requant(((int32_t)b[i] - r->b_zp) * scale, r->b_mult, r->b_shift);
        /* each may saturate at an int32 bound (multipliers no compiler writes): add in 64 bits */
        const int64_t s = (int64_t)sa + sb;
        const int32_t sum = (int32_t)(s > INT32_MAX ? INT32_MAX : (s < INT32_MIN ? INT32_MIN : s));
        y[i] = mt_q8_out(mt_q8_requant(sum, r->y_mult, r->y_shift), r->y_zp, r->lo, r->hi);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_ADD_Q8 = {add_q8_check, add_q8_prepare, add_q8_run};

/* ---- CLIP_BWD_Q8 ---- */

typedef struct {
    mt_rec_t h;
    uint32_t y, dy, dx, n;
    int32_t lo, hi;
} clip_bwd_q8_rec_t;

static int clip_bwd_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return t[MT_CLIP_BWD_Q8_Y].n == t[MT_CLIP_BWD_Q8_DY].n && t[MT_CLIP_BWD_Q8_DY].n == t[MT_CLIP_BWD_Q8_DX].n
           && mt_q8_clamp_ok(op->a[MT_CLIP_BWD_Q8_A_ACT_MIN], op->a[MT_CLIP_BWD_Q8_A_ACT_MAX]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t clip_bwd_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    clip_bwd_q8_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->y = op->t[MT_CLIP_BWD_Q8_Y].ref;
        r->dy = op->t[MT_CLIP_BWD_Q8_DY].ref;
        r->dx = op->t[MT_CLIP_BWD_Q8_DX].ref;
        r->n = op->t[MT_CLIP_BWD_Q8_DX].n;
        r->lo = op->a[MT_CLIP_BWD_Q8_A_ACT_MIN];
        r->hi = op->a[MT_CLIP_BWD_Q8_A_ACT_MAX];
    }
    return sizeof(clip_bwd_q8_rec_t);
}

static int clip_bwd_q8_run(mt_ctx_t *ctx, const void *rec) {
    const clip_bwd_q8_rec_t *r = rec;
    const int8_t *y = (const int8_t *)mt_ptr(ctx, r->y);
    const float *dy = MT_F32(ctx, r->dy);
    float *dx = MT_F32(ctx, r->dx);
    for (uint32_t i = 0; i < r->n; i++) {
        dx[i] = (y[i] > r->lo && y[i] < r->hi) ? dy[i] : 0.0f;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CLIP_BWD_Q8 = {clip_bwd_q8_check, clip_bwd_q8_prepare, clip_bwd_q8_run};
