/* microtrain core: an int8 inverted-residual expansion, streamed.
 *
 *   PWDW_Q8  e = CONV2D_Q8(x, w1 1x1), y = CONV2D_Q8(e, w depthwise kxk)
 * The expanded tensor e (E channels, the largest tensor of an MCU network's first
 * blocks) never exists: its rows are computed when the depthwise first needs them,
 * into `ring`, which holds the last R = (KH-1)*dil_h + 1 rows (all E channels x W,
 * row r in slot r % R). A depthwise output row reads rows by .. by+R-1 only, and
 * those rows come in increasing order, so each row of e is computed once (rows no
 * window reads, with stride > R, never) and is still in the ring while a window
 * needs it. Each element is summed and requantized by the same integer arithmetic
 * as CONV2D_Q8 (the row loops of mt_q8.h), so y is bit for bit that of the two ops.
 */
#include "mt_q8.h"

typedef struct {
    mt_rec_t h;
    uint32_t x, w1, b1, mult1, shift1, w, b, mult, shift, ring, y;
    mt_conv_geom_t g;             /* the depthwise conv, over e */
    uint32_t C, R;                /* input channels; ring rows */
    int32_t x_zp, e_zp, y_zp, lo1, hi1, lo, hi;
} pwdw_q8_rec_t;

/* the shape of e: (1, E, H, W), E the 1x1 weight's outputs */
static void expanded_shape(const mt_op_t *op, mt_tensor_t *e) {
    const mt_tensor_t *x = &op->t[MT_PWDW_Q8_X];
    *e = *x;
    e->dim[1] = op->t[MT_PWDW_Q8_W1].dim[0];
    e->n = e->dim[1] * x->dim[2] * x->dim[3];
}

static uint32_t ring_rows(const mt_op_t *op) {
    return (op->t[MT_PWDW_Q8_W].dim[2] - 1) * (uint32_t)op->a[MT_PWDW_Q8_A_DIL_H] + 1;
}

static int pwdw_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    static const int32_t pointwise[MT_CONV_A_GROUPS + 1] = {1, 1, 0, 0, 0, 0, 1, 1, 1};
    const mt_tensor_t *t = op->t, *w1 = &t[MT_PWDW_Q8_W1], *w = &t[MT_PWDW_Q8_W], *ring = &t[MT_PWDW_Q8_RING];
    const int32_t *a = op->a;
    mt_tensor_t e;
    if (w1->ndim != 4 || w1->dim[2] != 1 || w1->dim[3] != 1 || !mt_is_nchw(&t[MT_PWDW_Q8_X])) {
        return MT_E_SHAPE;
    }
    expanded_shape(op, &e);
    const uint32_t E = w1->dim[0];
    if (!mt_conv_check_shapes(pointwise, &t[MT_PWDW_Q8_X], w1, &e) || !mt_conv_check_shapes(a, &e, w, &t[MT_PWDW_Q8_Y])
        || (uint32_t)a[MT_PWDW_Q8_A_GROUPS] != E || w->dim[0] != E
        || w1->dim[1] > MT_Q8_MAX_TAPS || (uint64_t)w->dim[2] * w->dim[3] > MT_Q8_MAX_TAPS) {
        return MT_E_SHAPE;
    }
    /* the ring: exactly R rows of E x W int8 values, quantized as e */
    if ((uint64_t)ring->n != (uint64_t)ring_rows(op) * E * e.dim[3] || !mt_q8_activation_ok(ctx, ring)) {
        return MT_E_SHAPE;
    }
    return mt_q8_activation_ok(ctx, &t[MT_PWDW_Q8_X]) && mt_q8_activation_ok(ctx, &t[MT_PWDW_Q8_Y])
           && mt_q8_weight_ok(ctx, w1, 0, E) && mt_q8_weight_ok(ctx, w, 0, E)
           && mt_q8_rescale_ok(ctx, &t[MT_PWDW_Q8_MULT1], &t[MT_PWDW_Q8_SHIFT1], &t[MT_PWDW_Q8_B1], E)
           && mt_q8_rescale_ok(ctx, &t[MT_PWDW_Q8_MULT], &t[MT_PWDW_Q8_SHIFT], &t[MT_PWDW_Q8_B], E)
           && mt_q8_clamp_ok(a[MT_PWDW_Q8_A_ACT_MIN1], a[MT_PWDW_Q8_A_ACT_MAX1])
           && mt_q8_clamp_ok(a[MT_PWDW_Q8_A_ACT_MIN], a[MT_PWDW_Q8_A_ACT_MAX]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t pwdw_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pwdw_q8_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        mt_tensor_t e;
        expanded_shape(op, &e);
        r->x = t[MT_PWDW_Q8_X].ref;
        r->w1 = t[MT_PWDW_Q8_W1].ref;
        r->b1 = t[MT_PWDW_Q8_B1].ref;
        r->mult1 = t[MT_PWDW_Q8_MULT1].ref;
        r->shift1 = t[MT_PWDW_Q8_SHIFT1].ref;
        r->w = t[MT_PWDW_Q8_W].ref;
        r->b = t[MT_PWDW_Q8_B].ref;
        r->mult = t[MT_PWDW_Q8_MULT].ref;
        r->shift = t[MT_PWDW_Q8_SHIFT].ref;
        r->ring = t[MT_PWDW_Q8_RING].ref;
        r->y = t[MT_PWDW_Q8_Y].ref;
        mt_conv_prepare_geom(op->a, &e, &t[MT_PWDW_Q8_W], &t[MT_PWDW_Q8_Y], &r->g);
        r->C = t[MT_PWDW_Q8_X].dim[1];
        r->R = ring_rows(op);
        r->x_zp = mt_q8_zero_point(ctx, &t[MT_PWDW_Q8_X]);
        r->e_zp = mt_q8_zero_point(ctx, &t[MT_PWDW_Q8_RING]);
        r->y_zp = mt_q8_zero_point(ctx, &t[MT_PWDW_Q8_Y]);
        r->lo1 = op->a[MT_PWDW_Q8_A_ACT_MIN1];
        r->hi1 = op->a[MT_PWDW_Q8_A_ACT_MAX1];
        r->lo = op->a[MT_PWDW_Q8_A_ACT_MIN];
        r->hi = op->a[MT_PWDW_Q8_A_ACT_MAX];
    }
    return sizeof(pwdw_q8_rec_t);
}

/* Row `row` of e, all E channels, into its ring slot: CONV2D_Q8 of a 1x1 kernel. */
static void expand_row(mt_ctx_t *ctx, const pwdw_q8_rec_t *r, int32_t row, int32_t *acc) {
    const mt_conv_geom_t *g = &r->g;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x) + (size_t)row * g->W;
    const int8_t *w1 = (const int8_t *)mt_ptr(ctx, r->w1);
    const int32_t *b1 = (const int32_t *)mt_ptr(ctx, r->b1);
    const int32_t *mult1 = (const int32_t *)mt_ptr(ctx, r->mult1), *shift1 = (const int32_t *)mt_ptr(ctx, r->shift1);
    int8_t *slot = (int8_t *)mt_ptr(ctx, r->ring) + (size_t)((uint32_t)row % r->R) * g->C * g->W;
    const int32_t W = (int32_t)g->W;
    const size_t plane = (size_t)g->H * g->W;
    for (uint32_t e = 0; e < g->C; e++) {
        const int8_t *we = w1 + (size_t)e * r->C;
        const int32_t init = b1 != NULL ? b1[e] : 0;
        for (int32_t x0 = 0; x0 < W; x0 += MT_Q8_ROW) {
            const int32_t n = mt_q8_chunk(acc, x0, W, init);
            for (uint32_t c = 0; c < r->C; c++) {
                mt_q8_mac_row(acc, x + c * plane + x0, 1, we[c], r->x_zp, n);
            }
            mt_q8_store_row(slot + (size_t)e * W + x0, acc, n, mult1[e], shift1[e], r->e_zp, r->lo1, r->hi1);
        }
    }
}

static int pwdw_q8_run(mt_ctx_t *ctx, const void *rec) {
    const pwdw_q8_rec_t *r = rec;
    const mt_conv_geom_t *g = &r->g;
    const int8_t *w = (const int8_t *)mt_ptr(ctx, r->w), *ring = (const int8_t *)mt_ptr(ctx, r->ring);
    const int32_t *b = (const int32_t *)mt_ptr(ctx, r->b);
    const int32_t *mult = (const int32_t *)mt_ptr(ctx, r->mult), *shift = (const int32_t *)mt_ptr(ctx, r->shift);
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    int32_t acc[MT_Q8_ROW], next = 0;   /* rows of e below `next` have been computed */
    for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
        int32_t by = oy * g->sh - g->pt, ky0, ky1;
        mt_window_range(by, g->dh, g->KH, (int32_t)g->H, &ky0, &ky1);
        if (ky0 < ky1) {   /* the window's rows of e into the ring (those it shares with the last are there) */
            int32_t row = by + ky0 * g->dh, end = by + (ky1 - 1) * g->dh + 1;
            for (row = row > next ? row : next; row < end; row++) {
                expand_row(ctx, r, row, acc);
            }
            next = next > end ? next : end;
        }
        mt_q8_dw_ring_row(ring, r->R, g, oy, ky0, ky1, w, b, mult, shift, r->e_zp, r->y_zp, r->lo, r->hi,
            y + (size_t)oy * g->OW, (size_t)g->OH * g->OW, acc);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_PWDW_Q8 = {pwdw_q8_check, pwdw_q8_prepare, pwdw_q8_run};
