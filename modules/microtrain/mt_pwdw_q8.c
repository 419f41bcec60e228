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
 *
 *   PWDW_DQ_W8, PWDW_DQ  the same, streamed into the float 1x1 conv w2 that reads the
 * depthwise output (the first float layer after an int8 prefix): each depthwise output
 * row goes to `row`, is dequantized K channels at a time into xs (K x OW floats) and its
 * output rows summed on into yrow, then copied to y. Each output sums its terms channel
 * after channel (mt_conv.c), whatever the rows, so y is CONV2D_W8's (CONV2D's) on the
 * dequantized whole, bit for bit. MbV2-w0.35 138kb: blocks.5's 24 KB depthwise output
 * and its float planes never exist.
 */
#include <string.h>
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

static const int32_t pointwise[MT_CONV_A_GROUPS + 1] = {1, 1, 0, 0, 0, 0, 1, 1, 1};

/* y: the depthwise output (PWDW_DQ: its shape, with the row's quantization) */
static int pwdw_q8_check_into(const mt_ctx_t *ctx, const mt_op_t *op, const mt_tensor_t *y) {
    const mt_tensor_t *t = op->t, *w1 = &t[MT_PWDW_Q8_W1], *w = &t[MT_PWDW_Q8_W], *ring = &t[MT_PWDW_Q8_RING];
    const int32_t *a = op->a;
    mt_tensor_t e;
    if (w1->ndim != 4 || w1->dim[2] != 1 || w1->dim[3] != 1 || !mt_is_nchw(&t[MT_PWDW_Q8_X])) {
        return MT_E_SHAPE;
    }
    expanded_shape(op, &e);
    const uint32_t E = w1->dim[0];
    if (!mt_conv_check_shapes(pointwise, &t[MT_PWDW_Q8_X], w1, &e) || !mt_conv_check_shapes(a, &e, w, y)
        || (uint32_t)a[MT_PWDW_Q8_A_GROUPS] != E || w->dim[0] != E
        || w1->dim[1] > MT_Q8_MAX_TAPS || (uint64_t)w->dim[2] * w->dim[3] > MT_Q8_MAX_TAPS) {
        return MT_E_SHAPE;
    }
    /* the ring: exactly R rows of E x W int8 values, quantized as e */
    if ((uint64_t)ring->n != (uint64_t)ring_rows(op) * E * e.dim[3] || !mt_q8_activation_ok(ctx, ring)) {
        return MT_E_SHAPE;
    }
    return mt_q8_activation_ok(ctx, &t[MT_PWDW_Q8_X]) && mt_q8_activation_ok(ctx, y)
           && mt_q8_weight_ok(ctx, w1, 0, E) && mt_q8_weight_ok(ctx, w, 0, E)
           && mt_q8_rescale_ok(ctx, &t[MT_PWDW_Q8_MULT1], &t[MT_PWDW_Q8_SHIFT1], &t[MT_PWDW_Q8_B1], E)
           && mt_q8_rescale_ok(ctx, &t[MT_PWDW_Q8_MULT], &t[MT_PWDW_Q8_SHIFT], &t[MT_PWDW_Q8_B], E)
           && mt_q8_clamp_ok(a[MT_PWDW_Q8_A_ACT_MIN1], a[MT_PWDW_Q8_A_ACT_MAX1])
           && mt_q8_clamp_ok(a[MT_PWDW_Q8_A_ACT_MIN], a[MT_PWDW_Q8_A_ACT_MAX]) ? MT_OK : MT_E_SHAPE;
}

static int pwdw_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return pwdw_q8_check_into(ctx, op, &op->t[MT_PWDW_Q8_Y]);
}

/* y as in pwdw_q8_check_into; r->y its reference (PWDW_DQ: the row's) */
static void pwdw_q8_prepare_into(const mt_ctx_t *ctx, const mt_op_t *op, const mt_tensor_t *y, pwdw_q8_rec_t *r) {
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
    r->y = y->ref;
    mt_conv_prepare_geom(op->a, &e, &t[MT_PWDW_Q8_W], y, &r->g);
    r->C = t[MT_PWDW_Q8_X].dim[1];
    r->R = ring_rows(op);
    r->x_zp = mt_q8_zero_point(ctx, &t[MT_PWDW_Q8_X]);
    r->e_zp = mt_q8_zero_point(ctx, &t[MT_PWDW_Q8_RING]);
    r->y_zp = mt_q8_zero_point(ctx, y);
    r->lo1 = op->a[MT_PWDW_Q8_A_ACT_MIN1];
    r->hi1 = op->a[MT_PWDW_Q8_A_ACT_MAX1];
    r->lo = op->a[MT_PWDW_Q8_A_ACT_MIN];
    r->hi = op->a[MT_PWDW_Q8_A_ACT_MAX];
}

static uint32_t pwdw_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    if (rec != NULL) {
        pwdw_q8_prepare_into(ctx, op, &op->t[MT_PWDW_Q8_Y], rec);
    }
    return sizeof(pwdw_q8_rec_t);
}

/* Row `row` of e, all E channels, into its ring slot: CONV2D_Q8 of a 1x1 kernel (mt_q8_pw). */
static void expand_row(mt_ctx_t *ctx, const pwdw_q8_rec_t *r, int32_t row) {
    const mt_conv_geom_t *g = &r->g;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x) + (size_t)row * g->W;
    int8_t *slot = (int8_t *)mt_ptr(ctx, r->ring) + (size_t)((uint32_t)row % r->R) * g->C * g->W;
    mt_q8_pw(x, (size_t)g->H * g->W, r->C, r->x_zp, (const int8_t *)mt_ptr(ctx, r->w1),
        (const int32_t *)mt_ptr(ctx, r->b1), (const int32_t *)mt_ptr(ctx, r->mult1),
        (const int32_t *)mt_ptr(ctx, r->shift1), g->C, slot, g->W, g->W, r->e_zp, r->lo1, r->hi1);
}

/* Depthwise output row oy into yrow (channel c at yrow + c * stride), the rows of e it needs
 * expanded into the ring first (*next: rows of e below it are there; rows come in order). */
static void pwdw_q8_row(mt_ctx_t *ctx, const pwdw_q8_rec_t *r, int32_t oy, int32_t *next, int8_t *yrow, size_t stride,
    int32_t *acc) {
    const mt_conv_geom_t *g = &r->g;
    int32_t by = oy * g->sh - g->pt, ky0, ky1;
    mt_window_range(by, g->dh, g->KH, (int32_t)g->H, &ky0, &ky1);
    if (ky0 < ky1) {   /* the window's rows of e into the ring (those it shares with the last are there) */
        int32_t row = by + ky0 * g->dh, end = by + (ky1 - 1) * g->dh + 1;
        for (row = row > *next ? row : *next; row < end; row++) {
            expand_row(ctx, r, row);
        }
        *next = *next > end ? *next : end;
    }
    mt_q8_dw_ring_row((const int8_t *)mt_ptr(ctx, r->ring), r->R, g, oy, ky0, ky1, (const int8_t *)mt_ptr(ctx, r->w),
        (const int32_t *)mt_ptr(ctx, r->b), (const int32_t *)mt_ptr(ctx, r->mult),
        (const int32_t *)mt_ptr(ctx, r->shift), r->e_zp, r->y_zp, r->lo, r->hi, yrow, stride, acc);
}

static int pwdw_q8_run(mt_ctx_t *ctx, const void *rec) {
    const pwdw_q8_rec_t *r = rec;
    const mt_conv_geom_t *g = &r->g;
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    int32_t acc[MT_Q8_ROW], next = 0;
    for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
        pwdw_q8_row(ctx, r, oy, &next, y + (size_t)oy * g->OW, (size_t)g->OH * g->OW, acc);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_PWDW_Q8 = {pwdw_q8_check, pwdw_q8_prepare, pwdw_q8_run};

/* ---- PWDW_DQ_W8, PWDW_DQ: PWDW_Q8 streamed into the float 1x1 conv w2 (bias b2) that reads
 * its output: the depthwise output exists a row at a time (row, int8), dequantized (xs) and
 * projected (yrow) before the next row is made. ---- */

typedef char pwdw_dq_slots_match[(MT_PWDW_DQ_W8_X == MT_PWDW_Q8_X && MT_PWDW_DQ_W8_W1 == MT_PWDW_Q8_W1
    && MT_PWDW_DQ_W8_B1 == MT_PWDW_Q8_B1 && MT_PWDW_DQ_W8_MULT1 == MT_PWDW_Q8_MULT1
    && MT_PWDW_DQ_W8_SHIFT1 == MT_PWDW_Q8_SHIFT1 && MT_PWDW_DQ_W8_W == MT_PWDW_Q8_W && MT_PWDW_DQ_W8_B == MT_PWDW_Q8_B
    && MT_PWDW_DQ_W8_MULT == MT_PWDW_Q8_MULT && MT_PWDW_DQ_W8_SHIFT == MT_PWDW_Q8_SHIFT
    && MT_PWDW_DQ_W8_RING == MT_PWDW_Q8_RING && MT_PWDW_DQ_W8_A_ACT_MAX1 == MT_PWDW_Q8_A_ACT_MAX1
    && MT_PWDW_DQ_W8_A_ACT_MIN == MT_PWDW_Q8_A_ACT_MIN && MT_PWDW_DQ_X == MT_PWDW_DQ_W8_X
    && MT_PWDW_DQ_ROW == MT_PWDW_DQ_W8_ROW && MT_PWDW_DQ_W2 == MT_PWDW_DQ_W8_W2 && MT_PWDW_DQ_B2 == MT_PWDW_DQ_W8_B2
    && MT_PWDW_DQ_XS == MT_PWDW_DQ_W8_XS && MT_PWDW_DQ_YROW == MT_PWDW_DQ_W8_YROW && MT_PWDW_DQ_Y == MT_PWDW_DQ_W8_Y
    && MT_PWDW_DQ_NATTRS == MT_PWDW_Q8_NATTRS && MT_PWDW_DQ_W8_NATTRS == MT_PWDW_Q8_NATTRS) ? 1 : -1];

typedef struct {
    pwdw_q8_rec_t q;        /* the expansion and depthwise conv over the whole output; q.y the row */
    mt_conv_geom_t g2;      /* the 1x1 conv on one row: (E, 1, OW) -> (O, 1, OW) */
    uint32_t w2, b2, scales, xs, yrow, y;   /* scales: MT_REF_NONE for a float32 w2 (PWDW_DQ) */
    uint32_t K;             /* channels dequantized at a time (xs: K x OW floats) */
    float scale;            /* the depthwise output's (the row's) */
} pwdw_dq_rec_t;

/* the depthwise output's shape (1, E, OH, OW), OH and OW y's, and the row's dtype and
 * quantization: what PWDW_Q8 would have written whole */
static void depthwise_output(const mt_op_t *op, mt_tensor_t *d) {
    const mt_tensor_t *y = &op->t[MT_PWDW_DQ_W8_Y];
    *d = op->t[MT_PWDW_DQ_W8_ROW];
    d->ndim = 4;
    d->dim[0] = 1;
    d->dim[1] = op->t[MT_PWDW_DQ_W8_W1].dim[0];
    d->dim[2] = y->dim[2];
    d->dim[3] = y->dim[3];
    d->n = d->dim[1] * d->dim[2] * d->dim[3];
}

static int pwdw_dq_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *w2 = &t[MT_PWDW_DQ_W8_W2], *y = &t[MT_PWDW_DQ_W8_Y];
    mt_tensor_t d;
    if (!mt_is_nchw(y) || t[MT_PWDW_DQ_W8_W1].ndim != 4) {
        return MT_E_SHAPE;
    }
    depthwise_output(op, &d);
    int err = pwdw_q8_check_into(ctx, op, &d);
    if (err != MT_OK) {
        return err;
    }
    /* w2 (O, E, 1, 1), y (1, O, OH, OW); row one row of d, xs its floats, yrow one row of y */
    const uint64_t E = d.dim[1], OW = d.dim[3], O = w2->dim[0];
    if (OW == 0 || w2->ndim != 4 || w2->dim[1] != E || w2->dim[2] != 1 || w2->dim[3] != 1 || y->dim[1] != O
        || (t[MT_PWDW_DQ_W8_B2].n != 0 && t[MT_PWDW_DQ_W8_B2].n != O) || t[MT_PWDW_DQ_W8_ROW].n != E * OW
        || t[MT_PWDW_DQ_W8_XS].n % OW != 0 || t[MT_PWDW_DQ_W8_XS].n / OW < 1 || t[MT_PWDW_DQ_W8_XS].n / OW > E
        || t[MT_PWDW_DQ_W8_YROW].n != O * OW) {
        return MT_E_SHAPE;
    }
    return op->code == MT_OP_PWDW_DQ_W8 && !mt_conv_w8_weight_ok(ctx, w2, NULL) ? MT_E_W8_SCALES : MT_OK;
}

static uint32_t pwdw_dq_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pwdw_dq_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        mt_tensor_t d;
        mt_quant_t q;
        depthwise_output(op, &d);
        pwdw_q8_prepare_into(ctx, op, &d, &r->q);
        mt_quant_of(ctx, &t[MT_PWDW_DQ_W8_ROW], &q);
        r->scale = q.scale;
        r->g2 = (mt_conv_geom_t){.C = d.dim[1], .H = 1, .W = d.dim[3], .O = t[MT_PWDW_DQ_W8_W2].dim[0], .OH = 1,
            .OW = d.dim[3], .G = 1, .Cg = d.dim[1], .Og = t[MT_PWDW_DQ_W8_W2].dim[0], .KH = 1, .KW = 1, .sh = 1,
            .sw = 1, .dh = 1, .dw = 1, .pt = 0, .pl = 0};
        r->w2 = t[MT_PWDW_DQ_W8_W2].ref;
        r->b2 = t[MT_PWDW_DQ_W8_B2].ref;
        r->scales = MT_REF_NONE;
        if (op->code == MT_OP_PWDW_DQ_W8) {
            mt_conv_w8_weight_ok(ctx, &t[MT_PWDW_DQ_W8_W2], &r->scales);
        }
        r->xs = t[MT_PWDW_DQ_W8_XS].ref;
        r->K = t[MT_PWDW_DQ_W8_XS].n / d.dim[3];
        r->yrow = t[MT_PWDW_DQ_W8_YROW].ref;
        r->y = t[MT_PWDW_DQ_W8_Y].ref;
    }
    return sizeof(pwdw_dq_rec_t);
}

static int pwdw_dq_run(mt_ctx_t *ctx, const void *rec) {
    const pwdw_dq_rec_t *r = rec;
    const mt_conv_geom_t *g = &r->q.g;
    int8_t *row = (int8_t *)mt_ptr(ctx, r->q.y);
    float *xs = MT_F32(ctx, r->xs), *yrow = MT_F32(ctx, r->yrow), *y = MT_F32(ctx, r->y);
    const float *b2 = MT_F32(ctx, r->b2), *scales = MT_F32(ctx, r->scales);
    const int8_t *w2 = r->scales != MT_REF_NONE ? (const int8_t *)mt_ptr(ctx, r->w2) : NULL;
    const float *w2f = r->scales != MT_REF_NONE ? NULL : MT_F32(ctx, r->w2);
    const size_t oplane = (size_t)g->OH * g->OW;
    int32_t acc[MT_Q8_ROW], next = 0;
    for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
        pwdw_q8_row(ctx, &r->q, oy, &next, row, g->OW, acc);
        for (uint32_t k0 = 0; k0 < g->C; k0 += r->K) {
            const uint32_t nk = g->C - k0 < r->K ? g->C - k0 : r->K;
            const int8_t *rk = row + (size_t)k0 * g->OW;
            for (size_t i = 0; i < (size_t)nk * g->OW; i++) {   /* as DEQUANTIZE */
                xs[i] = (float)((int32_t)rk[i] - r->q.y_zp) * r->scale;
            }
            mt_conv_forward_range(&r->g2, xs, w2, w2f, scales, b2, yrow, k0, k0 + nk);
        }
        for (uint32_t o = 0; o < r->g2.O; o++) {
            memcpy(y + o * oplane + (size_t)oy * g->OW, yrow + (size_t)o * g->OW, g->OW * sizeof(float));
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_PWDW_DQ_W8 = {pwdw_dq_check, pwdw_dq_prepare, pwdw_dq_run};
const mt_opdef_t mt_op_PWDW_DQ = {pwdw_dq_check, pwdw_dq_prepare, pwdw_dq_run};
