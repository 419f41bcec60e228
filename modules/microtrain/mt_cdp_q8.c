/* microtrain core: an int8 conv, depthwise conv and 1x1 conv, streamed row by row.
 *
 *   CONV_DW_PW_Q8  e = CONV2D_Q8(x, w0), d = CONV2D_Q8(e, w1 depthwise), y = CONV2D_Q8(d, w 1x1)
 * Neither e nor d exists whole: the rows of e are computed when the depthwise conv
 * first needs them, into `ring` (the last R = (KH1-1)*dil_h+1 rows, all E channels,
 * row r in slot r % R, as PWDW_Q8 does), and each row of d into `row`, which the 1x1
 * conv reads at once. So an MCU network's stem and first block hold only their
 * input and output (MCUNet-5fps: 48 KB + 32 KB instead of 64 KB + 64 KB), and an
 * expansion block neither its expanded tensor nor its depthwise output. Each element
 * is summed and requantized by the integer arithmetic of CONV2D_Q8 (the row loops of
 * mt_q8.h), so y is bit for bit that of the three ops.
 */
#include "mt_q8.h"

typedef struct {
    mt_rec_t h;
    uint32_t x, w0, b0, mult0, shift0, w1, b1, mult1, shift1, w, b, mult, shift, ring, row, y;
    mt_conv_geom_t g0, g1;        /* the first conv (over x), the depthwise conv (over e) */
    uint32_t O, R;                /* the 1x1 conv's outputs; ring rows */
    int32_t x_zp, e_zp, d_zp, y_zp, lo0, hi0, lo1, hi1, lo, hi;
} cdp_q8_rec_t;

/* the depthwise stage's attributes in CONV2D's order, groups = E */
static void dw_attrs(const int32_t *a, uint32_t E, int32_t *d) {
    for (int i = 0; i < MT_CONV_A_GROUPS; i++) {
        d[i] = a[MT_CONV_DW_PW_Q8_A_DW_STRIDE_H + i];
    }
    d[MT_CONV_A_GROUPS] = (int32_t)E;
}

/* e (1, E, H1, W1), the first conv's output, and d (1, E, OH, OW), the depthwise output (y's
 * rows and columns); 0 if the first conv has no output */
static int stage_shapes(const mt_op_t *op, mt_tensor_t *e, mt_tensor_t *d) {
    const mt_tensor_t *x = &op->t[MT_CONV_DW_PW_Q8_X], *w0 = &op->t[MT_CONV_DW_PW_Q8_W0];
    const int32_t *a = op->a;
    if (!mt_is_nchw(x) || w0->ndim != 4 || !mt_in_range(a[MT_CONV_A_STRIDE_H], 1, MT_LIMIT)
        || !mt_in_range(a[MT_CONV_A_STRIDE_W], 1, MT_LIMIT) || !mt_in_range(a[MT_CONV_A_DIL_H], 1, MT_LIMIT)
        || !mt_in_range(a[MT_CONV_A_DIL_W], 1, MT_LIMIT) || w0->dim[2] > MT_LIMIT || w0->dim[3] > MT_LIMIT) {
        return 0;
    }
    for (int i = MT_CONV_A_PAD_T; i <= MT_CONV_A_PAD_R; i++) {
        if (!mt_in_range(a[i], 0, MT_LIMIT)) {
            return 0;
        }
    }
    int64_t H1 = mt_out_extent(x->dim[2], a[MT_CONV_A_PAD_T], a[MT_CONV_A_PAD_B], w0->dim[2], a[MT_CONV_A_DIL_H],
        a[MT_CONV_A_STRIDE_H], 0);
    int64_t W1 = mt_out_extent(x->dim[3], a[MT_CONV_A_PAD_L], a[MT_CONV_A_PAD_R], w0->dim[3], a[MT_CONV_A_DIL_W],
        a[MT_CONV_A_STRIDE_W], 0);
    if (H1 < 1 || W1 < 1 || H1 > MT_LIMIT || W1 > MT_LIMIT) {
        return 0;
    }
    *e = *x;
    e->dim[1] = w0->dim[0];
    e->dim[2] = (uint32_t)H1;
    e->dim[3] = (uint32_t)W1;
    e->n = e->dim[1] * e->dim[2] * e->dim[3];
    *d = op->t[MT_CONV_DW_PW_Q8_Y];
    d->dim[1] = e->dim[1];
    d->n = d->dim[1] * d->dim[2] * d->dim[3];
    return 1;
}

static uint32_t ring_rows(const mt_op_t *op) {
    return (op->t[MT_CONV_DW_PW_Q8_W1].dim[2] - 1) * (uint32_t)op->a[MT_CONV_DW_PW_Q8_A_DW_DIL_H] + 1;
}

static int cdp_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    static const int32_t pointwise[MT_CONV_A_GROUPS + 1] = {1, 1, 0, 0, 0, 0, 1, 1, 1};
    const mt_tensor_t *t = op->t, *w0 = &t[MT_CONV_DW_PW_Q8_W0], *w1 = &t[MT_CONV_DW_PW_Q8_W1];
    const mt_tensor_t *w = &t[MT_CONV_DW_PW_Q8_W], *y = &t[MT_CONV_DW_PW_Q8_Y];
    const int32_t *a = op->a;
    int32_t da[MT_CONV_A_GROUPS + 1];
    mt_tensor_t e, d;
    if (a[MT_CONV_A_GROUPS] != 1 || !mt_is_nchw(y) || !stage_shapes(op, &e, &d)) {
        return MT_E_SHAPE;
    }
    const uint32_t E = e.dim[1], O = w->dim[0];
    dw_attrs(a, E, da);
    if (!mt_conv_check_shapes(a, &t[MT_CONV_DW_PW_Q8_X], w0, &e) || !mt_conv_check_shapes(da, &e, w1, &d)
        || !mt_conv_check_shapes(pointwise, &d, w, y) || w1->dim[0] != E
        || (uint64_t)w0->dim[1] * w0->dim[2] * w0->dim[3] > MT_Q8_MAX_TAPS
        || (uint64_t)w1->dim[2] * w1->dim[3] > MT_Q8_MAX_TAPS || E > MT_Q8_MAX_TAPS) {
        return MT_E_SHAPE;
    }
    /* the ring: exactly R rows of E x W1 values, quantized as e; the row: E x OW, quantized as d */
    const mt_tensor_t *ring = &t[MT_CONV_DW_PW_Q8_RING], *row = &t[MT_CONV_DW_PW_Q8_ROW];
    if ((uint64_t)ring->n != (uint64_t)ring_rows(op) * E * e.dim[3] || !mt_q8_activation_ok(ctx, ring)
        || (uint64_t)row->n != (uint64_t)E * d.dim[3] || !mt_q8_activation_ok(ctx, row)) {
        return MT_E_SHAPE;
    }
    return mt_q8_activation_ok(ctx, &t[MT_CONV_DW_PW_Q8_X]) && mt_q8_activation_ok(ctx, y)
           && mt_q8_weight_ok(ctx, w0, 0, E) && mt_q8_weight_ok(ctx, w1, 0, E) && mt_q8_weight_ok(ctx, w, 0, O)
           && mt_q8_rescale_ok(ctx, &t[MT_CONV_DW_PW_Q8_MULT0], &t[MT_CONV_DW_PW_Q8_SHIFT0], &t[MT_CONV_DW_PW_Q8_B0], E)
           && mt_q8_rescale_ok(ctx, &t[MT_CONV_DW_PW_Q8_MULT1], &t[MT_CONV_DW_PW_Q8_SHIFT1], &t[MT_CONV_DW_PW_Q8_B1], E)
           && mt_q8_rescale_ok(ctx, &t[MT_CONV_DW_PW_Q8_MULT], &t[MT_CONV_DW_PW_Q8_SHIFT], &t[MT_CONV_DW_PW_Q8_B], O)
           && mt_q8_clamp_ok(a[MT_CONV_DW_PW_Q8_A_ACT_MIN0], a[MT_CONV_DW_PW_Q8_A_ACT_MAX0])
           && mt_q8_clamp_ok(a[MT_CONV_DW_PW_Q8_A_ACT_MIN1], a[MT_CONV_DW_PW_Q8_A_ACT_MAX1])
           && mt_q8_clamp_ok(a[MT_CONV_DW_PW_Q8_A_ACT_MIN], a[MT_CONV_DW_PW_Q8_A_ACT_MAX]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t cdp_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    cdp_q8_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        int32_t da[MT_CONV_A_GROUPS + 1];
        mt_tensor_t e, d;
        stage_shapes(op, &e, &d);
        dw_attrs(op->a, e.dim[1], da);
        r->x = t[MT_CONV_DW_PW_Q8_X].ref;
        r->w0 = t[MT_CONV_DW_PW_Q8_W0].ref;
        r->b0 = t[MT_CONV_DW_PW_Q8_B0].ref;
        r->mult0 = t[MT_CONV_DW_PW_Q8_MULT0].ref;
        r->shift0 = t[MT_CONV_DW_PW_Q8_SHIFT0].ref;
        r->w1 = t[MT_CONV_DW_PW_Q8_W1].ref;
        r->b1 = t[MT_CONV_DW_PW_Q8_B1].ref;
        r->mult1 = t[MT_CONV_DW_PW_Q8_MULT1].ref;
        r->shift1 = t[MT_CONV_DW_PW_Q8_SHIFT1].ref;
        r->w = t[MT_CONV_DW_PW_Q8_W].ref;
        r->b = t[MT_CONV_DW_PW_Q8_B].ref;
        r->mult = t[MT_CONV_DW_PW_Q8_MULT].ref;
        r->shift = t[MT_CONV_DW_PW_Q8_SHIFT].ref;
        r->ring = t[MT_CONV_DW_PW_Q8_RING].ref;
        r->row = t[MT_CONV_DW_PW_Q8_ROW].ref;
        r->y = t[MT_CONV_DW_PW_Q8_Y].ref;
        mt_conv_prepare_geom(op->a, &t[MT_CONV_DW_PW_Q8_X], &t[MT_CONV_DW_PW_Q8_W0], &e, &r->g0);
        mt_conv_prepare_geom(da, &e, &t[MT_CONV_DW_PW_Q8_W1], &d, &r->g1);
        r->O = t[MT_CONV_DW_PW_Q8_W].dim[0];
        r->R = ring_rows(op);
        r->x_zp = mt_q8_zero_point(ctx, &t[MT_CONV_DW_PW_Q8_X]);
        r->e_zp = mt_q8_zero_point(ctx, &t[MT_CONV_DW_PW_Q8_RING]);
        r->d_zp = mt_q8_zero_point(ctx, &t[MT_CONV_DW_PW_Q8_ROW]);
        r->y_zp = mt_q8_zero_point(ctx, &t[MT_CONV_DW_PW_Q8_Y]);
        r->lo0 = op->a[MT_CONV_DW_PW_Q8_A_ACT_MIN0];
        r->hi0 = op->a[MT_CONV_DW_PW_Q8_A_ACT_MAX0];
        r->lo1 = op->a[MT_CONV_DW_PW_Q8_A_ACT_MIN1];
        r->hi1 = op->a[MT_CONV_DW_PW_Q8_A_ACT_MAX1];
        r->lo = op->a[MT_CONV_DW_PW_Q8_A_ACT_MIN];
        r->hi = op->a[MT_CONV_DW_PW_Q8_A_ACT_MAX];
    }
    return sizeof(cdp_q8_rec_t);
}

/* Row `row` of e, all E channels, into its ring slot: CONV2D_Q8's output row. */
static void first_row(mt_ctx_t *ctx, const cdp_q8_rec_t *r, int32_t row, int32_t *acc) {
    const mt_conv_geom_t *g = &r->g0;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x), *w0 = (const int8_t *)mt_ptr(ctx, r->w0);
    const int32_t *b0 = (const int32_t *)mt_ptr(ctx, r->b0);
    const int32_t *mult0 = (const int32_t *)mt_ptr(ctx, r->mult0), *shift0 = (const int32_t *)mt_ptr(ctx, r->shift0);
    int8_t *slot = (int8_t *)mt_ptr(ctx, r->ring) + (size_t)((uint32_t)row % r->R) * g->O * g->OW;
    const int32_t OW = (int32_t)g->OW, by = row * g->sh - g->pt;
    const size_t plane = (size_t)g->H * g->W, taps = (size_t)g->KH * g->KW;
    int32_t ky0, ky1;
    mt_window_range(by, g->dh, g->KH, (int32_t)g->H, &ky0, &ky1);
    for (uint32_t e = 0; e < g->O; e++) {
        const int8_t *we = w0 + (size_t)e * g->C * taps;
        const int32_t init = b0 != NULL ? b0[e] : 0;
        for (int32_t x0 = 0; x0 < OW; x0 += MT_Q8_ROW) {
            const int32_t n = mt_q8_chunk(acc, x0, OW, init);
            for (uint32_t c = 0; c < g->C; c++) {
                for (int32_t ky = ky0; ky < ky1; ky++) {
                    mt_q8_mac_taps(acc, x + c * plane + (size_t)(by + ky * g->dh) * g->W, we + c * taps + ky * g->KW,
                        g, x0, n, r->x_zp);
                }
            }
            mt_q8_store_row(slot + (size_t)e * OW + x0, acc, n, mult0[e], shift0[e], r->e_zp, r->lo0, r->hi0);
        }
    }
}

static int cdp_q8_run(mt_ctx_t *ctx, const void *rec) {
    const cdp_q8_rec_t *r = rec;
    const mt_conv_geom_t *g = &r->g1;
    const int8_t *w1 = (const int8_t *)mt_ptr(ctx, r->w1), *ring = (const int8_t *)mt_ptr(ctx, r->ring);
    const int8_t *w = (const int8_t *)mt_ptr(ctx, r->w);
    const int32_t *b1 = (const int32_t *)mt_ptr(ctx, r->b1), *b = (const int32_t *)mt_ptr(ctx, r->b);
    const int32_t *mult1 = (const int32_t *)mt_ptr(ctx, r->mult1), *shift1 = (const int32_t *)mt_ptr(ctx, r->shift1);
    const int32_t *mult = (const int32_t *)mt_ptr(ctx, r->mult), *shift = (const int32_t *)mt_ptr(ctx, r->shift);
    int8_t *drow = (int8_t *)mt_ptr(ctx, r->row), *y = (int8_t *)mt_ptr(ctx, r->y);
    const int32_t OW = (int32_t)g->OW;
    const uint32_t E = g->C;
    int32_t acc[MT_Q8_ROW], next = 0;   /* rows of e below `next` have been computed */
    for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
        int32_t by = oy * g->sh - g->pt, ky0, ky1;
        mt_window_range(by, g->dh, g->KH, (int32_t)g->H, &ky0, &ky1);
        if (ky0 < ky1) {   /* the window's rows of e into the ring (those it shares with the last are there) */
            int32_t row = by + ky0 * g->dh, end = by + (ky1 - 1) * g->dh + 1;
            for (row = row > next ? row : next; row < end; row++) {
                first_row(ctx, r, row, acc);
            }
            next = next > end ? next : end;
        }
        mt_q8_dw_ring_row(ring, r->R, g, oy, ky0, ky1, w1, b1, mult1, shift1, r->e_zp, r->d_zp, r->lo1, r->hi1, drow,
            (size_t)OW, acc);   /* row oy of d */
        for (uint32_t o = 0; o < r->O; o++) {   /* row oy of y: the 1x1 conv of that row */
            const int8_t *wo = w + (size_t)o * E;
            const int32_t init = b != NULL ? b[o] : 0;
            for (int32_t x0 = 0; x0 < OW; x0 += MT_Q8_ROW) {
                const int32_t n = mt_q8_chunk(acc, x0, OW, init);
                for (uint32_t e = 0; e < E; e++) {
                    mt_q8_mac_row(acc, drow + (size_t)e * OW + x0, 1, wo[e], r->d_zp, n);
                }
                mt_q8_store_row(y + ((size_t)o * g->OH + oy) * OW + x0, acc, n, mult[o], shift[o], r->y_zp, r->lo,
                    r->hi);
            }
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CONV_DW_PW_Q8 = {cdp_q8_check, cdp_q8_prepare, cdp_q8_run};
