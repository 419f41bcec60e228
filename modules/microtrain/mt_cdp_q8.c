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
 *
 *   CONV_DW_PW_Q8_TO_PIPE, CONV_DW_PW_Q8_FROM_PIPE  two of them in a row, the second's x the
 * first's y: y exists as `pipe`, its last rows, as many as a window of the second's first conv
 * spans. The first op's run does nothing; the second runs the first a row of y at a time (its
 * record just before the second's: the loader checks the pair) whenever its first conv needs a
 * row not yet made. The stem's output then never exists whole either.
 *
 * A ring of R rows of ONE channel (R x W1, where the ring otherwise holds all E) runs each row of
 * d a channel at a time: the window's R rows of e channel c, then row oy of d's channel c, so e
 * rows are made again for every row of d whose window holds them (R / dw stride times as many
 * first-conv sums) for E times less ring. With x a pipe, the pipe then holds the rows of x that
 * R rows of e span. The sums are the same integers: y is bit for bit the same.
 */
#include "mt_q8.h"

typedef struct {
    mt_rec_t h;
    uint32_t x, w0, b0, mult0, shift0, w1, b1, mult1, shift1, w, b, mult, shift, ring, row, y;
    mt_conv_geom_t g0, g1;        /* the first conv (over x), the depthwise conv (over e) */
    uint32_t O, R;                /* the 1x1 conv's outputs; ring rows */
    uint32_t x_rows, y_rows;      /* x, y a pipe of that many rows (0: the whole tensor) */
    uint32_t chan;                /* 1: the ring holds one channel (run a channel at a time) */
    int32_t x_zp, e_zp, d_zp, y_zp, lo0, hi0, lo1, hi1, lo, hi;
} cdp_q8_rec_t;

#define CDP_REC_BYTES ((sizeof(cdp_q8_rec_t) + 3u) & ~3u)   /* as the loader lays records out */

/* the pipe ops have CONV_DW_PW_Q8's slots and attributes (and one more attribute) */
typedef char cdp_pipe_slots_match[(MT_CONV_DW_PW_Q8_TO_PIPE_X == MT_CONV_DW_PW_Q8_X
    && MT_CONV_DW_PW_Q8_TO_PIPE_Y == MT_CONV_DW_PW_Q8_Y && MT_CONV_DW_PW_Q8_FROM_PIPE_Y == MT_CONV_DW_PW_Q8_Y
    && MT_CONV_DW_PW_Q8_FROM_PIPE_RING == MT_CONV_DW_PW_Q8_RING && MT_CONV_DW_PW_Q8_TO_PIPE_ROW == MT_CONV_DW_PW_Q8_ROW
    && MT_CONV_DW_PW_Q8_TO_PIPE_A_ACT_MAX == MT_CONV_DW_PW_Q8_A_ACT_MAX
    && MT_CONV_DW_PW_Q8_FROM_PIPE_A_ACT_MAX == MT_CONV_DW_PW_Q8_A_ACT_MAX
    && MT_CONV_DW_PW_Q8_TO_PIPE_A_OUT_H == MT_CONV_DW_PW_Q8_A_ACT_MAX + 1
    && MT_CONV_DW_PW_Q8_FROM_PIPE_A_IN_H == MT_CONV_DW_PW_Q8_A_ACT_MAX + 1) ? 1 : -1];

/* the depthwise stage's attributes in CONV2D's order, groups = E */
static void dw_attrs(const int32_t *a, uint32_t E, int32_t *d) {
    for (int i = 0; i < MT_CONV_A_GROUPS; i++) {
        d[i] = a[MT_CONV_DW_PW_Q8_A_DW_STRIDE_H + i];
    }
    d[MT_CONV_A_GROUPS] = (int32_t)E;
}

/* e (1, E, H1, W1), the first conv's output, and d (1, E, OH, OW), the depthwise output (y's
 * rows and columns); 0 if the first conv has no output */
static int stage_shapes(const mt_op_t *op, const mt_tensor_t *x, const mt_tensor_t *y, mt_tensor_t *e,
    mt_tensor_t *d) {
    const mt_tensor_t *w0 = &op->t[MT_CONV_DW_PW_Q8_W0];
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
    *d = *y;
    d->dim[1] = e->dim[1];
    d->n = d->dim[1] * d->dim[2] * d->dim[3];
    return 1;
}

static uint32_t ring_rows(const mt_op_t *op) {
    return (op->t[MT_CONV_DW_PW_Q8_W1].dim[2] - 1) * (uint32_t)op->a[MT_CONV_DW_PW_Q8_A_DW_DIL_H] + 1;
}

/* rows of x that n consecutive rows of e span */
static uint32_t x_span(const mt_op_t *op, uint32_t n) {
    const int32_t *a = op->a;
    return (n - 1) * (uint32_t)a[MT_CONV_A_STRIDE_H] + (op->t[MT_CONV_DW_PW_Q8_W0].dim[2] - 1) * (uint32_t)a[MT_CONV_A_DIL_H]
           + 1;
}

/* A pipe of rows x C x W (int8) standing for the whole (1, C, h, W) tensor t: as in *whole */
static int pipe_of(const mt_tensor_t *pipe, int32_t h, mt_tensor_t *whole) {
    if (pipe->ndim != 3 || pipe->dim[0] < 1 || !mt_in_range(h, 1, MT_LIMIT) || pipe->dim[0] > (uint32_t)h) {
        return 0;
    }
    *whole = *pipe;
    whole->ndim = 4;
    whole->dim[0] = 1;
    whole->dim[1] = pipe->dim[1];
    whole->dim[2] = (uint32_t)h;
    whole->dim[3] = pipe->dim[2];
    if ((uint64_t)whole->dim[1] * whole->dim[2] * whole->dim[3] >= (1u << 28)) {
        return 0;
    }
    whole->n = whole->dim[1] * whole->dim[2] * whole->dim[3];
    return 1;
}

/* the op's x and y as whole tensors: a pipe (CONV_DW_PW_Q8_FROM_PIPE's x, _TO_PIPE's y) stands
 * for the tensor its `in_h`/`out_h` attribute gives the rows of */
static int whole_io(const mt_op_t *op, mt_tensor_t *x, mt_tensor_t *y) {
    *x = op->t[MT_CONV_DW_PW_Q8_X];
    *y = op->t[MT_CONV_DW_PW_Q8_Y];
    if (op->code == MT_OP_CONV_DW_PW_Q8_FROM_PIPE) {
        return pipe_of(&op->t[MT_CONV_DW_PW_Q8_X], op->a[MT_CONV_DW_PW_Q8_FROM_PIPE_A_IN_H], x);
    }
    if (op->code == MT_OP_CONV_DW_PW_Q8_TO_PIPE) {
        return pipe_of(&op->t[MT_CONV_DW_PW_Q8_Y], op->a[MT_CONV_DW_PW_Q8_TO_PIPE_A_OUT_H], y);
    }
    return 1;
}

static int cdp_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    static const int32_t pointwise[MT_CONV_A_GROUPS + 1] = {1, 1, 0, 0, 0, 0, 1, 1, 1};
    const mt_tensor_t *t = op->t, *w0 = &t[MT_CONV_DW_PW_Q8_W0], *w1 = &t[MT_CONV_DW_PW_Q8_W1];
    const mt_tensor_t *w = &t[MT_CONV_DW_PW_Q8_W];
    const int32_t *a = op->a;
    int32_t da[MT_CONV_A_GROUPS + 1];
    mt_tensor_t x, y, e, d;
    if (!whole_io(op, &x, &y) || a[MT_CONV_A_GROUPS] != 1 || !mt_is_nchw(&x) || !mt_is_nchw(&y)
        || !stage_shapes(op, &x, &y, &e, &d)) {
        return MT_E_SHAPE;
    }
    const uint32_t E = e.dim[1], O = w->dim[0];
    dw_attrs(a, E, da);
    if (!mt_conv_check_shapes(a, &x, w0, &e) || !mt_conv_check_shapes(da, &e, w1, &d)
        || !mt_conv_check_shapes(pointwise, &d, w, &y) || w1->dim[0] != E
        || (uint64_t)w0->dim[1] * w0->dim[2] * w0->dim[3] > MT_Q8_MAX_TAPS
        || (uint64_t)w1->dim[2] * w1->dim[3] > MT_Q8_MAX_TAPS || E > MT_Q8_MAX_TAPS) {
        return MT_E_SHAPE;
    }
    /* the ring: exactly R rows of E x W1 values, or of one channel (W1 values), quantized as e; the
     * row: E x OW, quantized as d */
    const mt_tensor_t *ring = &t[MT_CONV_DW_PW_Q8_RING], *row = &t[MT_CONV_DW_PW_Q8_ROW];
    const uint64_t ring_n = (uint64_t)ring_rows(op) * e.dim[3];
    const int chan = E > 1 && ring->n == ring_n;
    /* a pipe into this op: exactly the rows one window of the first conv spans (all the ring's
     * rows of e span, when it holds one channel) */
    if (op->code == MT_OP_CONV_DW_PW_Q8_FROM_PIPE
        && t[MT_CONV_DW_PW_Q8_X].dim[0] != x_span(op, chan ? ring_rows(op) : 1)) {
        return MT_E_SHAPE;
    }
    if ((ring->n != ring_n * E && !chan) || !mt_q8_activation_ok(ctx, ring)
        || (uint64_t)row->n != (uint64_t)E * d.dim[3] || !mt_q8_activation_ok(ctx, row)) {
        return MT_E_SHAPE;
    }
    return mt_q8_activation_ok(ctx, &t[MT_CONV_DW_PW_Q8_X]) && mt_q8_activation_ok(ctx, &t[MT_CONV_DW_PW_Q8_Y])
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
        mt_tensor_t x, y, e, d;
        whole_io(op, &x, &y);
        stage_shapes(op, &x, &y, &e, &d);
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
        mt_conv_prepare_geom(op->a, &x, &t[MT_CONV_DW_PW_Q8_W0], &e, &r->g0);
        mt_conv_prepare_geom(da, &e, &t[MT_CONV_DW_PW_Q8_W1], &d, &r->g1);
        r->O = t[MT_CONV_DW_PW_Q8_W].dim[0];
        r->R = ring_rows(op);
        r->x_rows = op->code == MT_OP_CONV_DW_PW_Q8_FROM_PIPE ? t[MT_CONV_DW_PW_Q8_X].dim[0] : 0;
        r->y_rows = op->code == MT_OP_CONV_DW_PW_Q8_TO_PIPE ? t[MT_CONV_DW_PW_Q8_Y].dim[0] : 0;
        r->chan = e.dim[1] > 1 && t[MT_CONV_DW_PW_Q8_RING].n == r->R * e.dim[3];
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

/* Row `row` of x's channel c: x whole, or a pipe of its last x_rows rows (C x W each) */
static const int8_t *x_row(const cdp_q8_rec_t *r, const int8_t *x, uint32_t c, int32_t row) {
    const mt_conv_geom_t *g = &r->g0;
    return r->x_rows != 0 ? x + ((size_t)((uint32_t)row % r->x_rows) * g->C + c) * g->W
                          : x + ((size_t)c * g->H + (uint32_t)row) * g->W;
}

/* Row `row` of e, channels [e0, e1), into its ring slot (channel e at (e - e0) x W1 in it):
 * CONV2D_Q8's output row. */
static void first_row(mt_ctx_t *ctx, const cdp_q8_rec_t *r, int32_t row, uint32_t e0, uint32_t e1, int32_t *acc) {
    const mt_conv_geom_t *g = &r->g0;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x), *w0 = (const int8_t *)mt_ptr(ctx, r->w0);
    const int32_t *b0 = (const int32_t *)mt_ptr(ctx, r->b0);
    const int32_t *mult0 = (const int32_t *)mt_ptr(ctx, r->mult0), *shift0 = (const int32_t *)mt_ptr(ctx, r->shift0);
    int8_t *slot = (int8_t *)mt_ptr(ctx, r->ring) + (size_t)((uint32_t)row % r->R) * (e1 - e0) * g->OW;
    const int32_t OW = (int32_t)g->OW, by = row * g->sh - g->pt;
    const size_t taps = (size_t)g->KH * g->KW;
    if (taps == 1 && g->sw == 1 && g->pl == 0 && g->OW == g->W && by >= 0 && by < (int32_t)g->H) {   /* a 1x1 conv */
        mt_q8_pw(x_row(r, x, 0, by), r->x_rows != 0 ? g->W : (size_t)g->H * g->W, g->C, r->x_zp,
            w0 + (size_t)e0 * g->C, b0 != NULL ? b0 + e0 : NULL, mult0 + e0, shift0 + e0, e1 - e0, slot, (size_t)OW,
            g->W, r->e_zp, r->lo0, r->hi0);
        return;
    }
    int32_t ky0, ky1;
    mt_window_range(by, g->dh, g->KH, (int32_t)g->H, &ky0, &ky1);
    const int8_t *rows[MT_Q8_DW_ROWS], *wrows[MT_Q8_DW_ROWS];
    for (uint32_t e = e0; e < e1; e++) {
        const int8_t *we = w0 + (size_t)e * g->C * taps;
        const int32_t init = b0 != NULL ? b0[e] : 0;
        for (int32_t x0 = 0; x0 < OW; x0 += MT_Q8_ROW) {
            const int32_t n = mt_q8_chunk(acc, x0, OW, init);
            for (uint32_t c = 0; c < g->C; c++) {
                if (ky1 - ky0 <= MT_Q8_DW_ROWS) {   /* each input channel's windows at once */
                    for (int32_t k = 0; k < ky1 - ky0; k++) {
                        rows[k] = x_row(r, x, c, by + (ky0 + k) * g->dh);
                        wrows[k] = we + c * taps + (size_t)(ky0 + k) * g->KW;
                    }
                    mt_q8_win(rows, wrows, ky1 - ky0, g, r->x_zp, x0, x0 + n, acc);
                    continue;
                }
                for (int32_t ky = ky0; ky < ky1; ky++) {
                    mt_q8_mac_taps(acc, x_row(r, x, c, by + ky * g->dh), we + c * taps + ky * g->KW, g, x0, n, r->x_zp);
                }
            }
            mt_q8_store_row(slot + (size_t)(e - e0) * OW + x0, acc, n, mult0[e], shift0[e], r->e_zp, r->lo0, r->hi0);
        }
    }
}

/* How far an op has got: rows of e below `next` and rows of y below `done` are made. */
typedef struct {
    int32_t next, done;
} cdp_progress_t;

/* Rows [p->done, upto) of y (whole, or its pipe); with src (this op's x a pipe), src's rows of y
 * as the first conv needs them, src's progress in sp. */
static void cdp_rows(mt_ctx_t *ctx, const cdp_q8_rec_t *r, cdp_progress_t *p, int32_t upto, int32_t *acc,
    const cdp_q8_rec_t *src, cdp_progress_t *sp) {
    const mt_conv_geom_t *g = &r->g1, *g0 = &r->g0;
    const int8_t *w1 = (const int8_t *)mt_ptr(ctx, r->w1), *ring = (const int8_t *)mt_ptr(ctx, r->ring);
    const int8_t *w = (const int8_t *)mt_ptr(ctx, r->w);
    const int32_t *b1 = (const int32_t *)mt_ptr(ctx, r->b1), *b = (const int32_t *)mt_ptr(ctx, r->b);
    const int32_t *mult1 = (const int32_t *)mt_ptr(ctx, r->mult1), *shift1 = (const int32_t *)mt_ptr(ctx, r->shift1);
    const int32_t *mult = (const int32_t *)mt_ptr(ctx, r->mult), *shift = (const int32_t *)mt_ptr(ctx, r->shift);
    int8_t *drow = (int8_t *)mt_ptr(ctx, r->row), *y = (int8_t *)mt_ptr(ctx, r->y);
    const int32_t OW = (int32_t)g->OW;
    const uint32_t E = g->C;
    for (int32_t oy = p->done; oy < upto; oy++) {
        int32_t by = oy * g->sh - g->pt, ky0, ky1;
        mt_window_range(by, g->dh, g->KH, (int32_t)g->H, &ky0, &ky1);
        if (r->chan) {   /* a channel at a time: the window's rows of e channel c, then row oy of d's channel c */
            if (ky0 < ky1 && src != NULL) {   /* the rows of x those rows of e read, into the pipe */
                int32_t last = (by + (ky1 - 1) * g->dh) * g0->sh - g0->pt + (g0->KH - 1) * g0->dh;
                last = last < (int32_t)g0->H - 1 ? last : (int32_t)g0->H - 1;
                cdp_rows(ctx, src, sp, last + 1, acc, NULL, NULL);
            }
            mt_conv_geom_t one = *g;
            const size_t taps = (size_t)g->KH * g->KW;
            one.C = 1;
            one.O = 1;
            for (uint32_t c = 0; c < E; c++) {
                for (int32_t ky = ky0; ky < ky1; ky++) {
                    first_row(ctx, r, by + ky * g->dh, c, c + 1, acc);
                }
                mt_q8_dw_ring_row(ring, r->R, &one, oy, ky0, ky1, w1 + c * taps, b1 != NULL ? b1 + c : NULL, mult1 + c,
                    shift1 + c, r->e_zp, r->d_zp, r->lo1, r->hi1, drow + (size_t)c * OW, (size_t)OW, acc);
            }
        } else if (ky0 < ky1) {   /* the window's rows of e into the ring (those it shares with the last are there) */
            int32_t row = by + ky0 * g->dh, end = by + (ky1 - 1) * g->dh + 1;
            for (row = row > p->next ? row : p->next; row < end; row++) {
                if (src != NULL) {   /* the rows of x this row of e reads, made by src into the pipe */
                    int32_t last = row * g0->sh - g0->pt + (g0->KH - 1) * g0->dh;
                    last = last < (int32_t)g0->H - 1 ? last : (int32_t)g0->H - 1;
                    cdp_rows(ctx, src, sp, last + 1, acc, NULL, NULL);
                }
                first_row(ctx, r, row, 0, E, acc);
            }
            p->next = p->next > end ? p->next : end;
        }
        if (!r->chan) {   /* row oy of d */
            mt_q8_dw_ring_row(ring, r->R, g, oy, ky0, ky1, w1, b1, mult1, shift1, r->e_zp, r->d_zp, r->lo1, r->hi1,
                drow, (size_t)OW, acc);
        }
        /* row oy of y: the 1x1 conv of that row (into y whole, or its pipe) */
        int8_t *yrow = r->y_rows != 0 ? y + (size_t)((uint32_t)oy % r->y_rows) * r->O * OW : y + (size_t)oy * OW;
        mt_q8_pw(drow, (size_t)OW, E, r->d_zp, w, b, mult, shift, r->O, yrow,
            r->y_rows != 0 ? (size_t)OW : (size_t)g->OH * OW, (uint32_t)OW, r->y_zp, r->lo, r->hi);
    }
    p->done = upto > p->done ? upto : p->done;
}

static int cdp_q8_run(mt_ctx_t *ctx, const void *rec) {
    const cdp_q8_rec_t *r = rec;
    int32_t acc[MT_Q8_ROW];
    cdp_progress_t p = {0, 0};
    cdp_rows(ctx, r, &p, (int32_t)r->g1.OH, acc, NULL, NULL);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV_DW_PW_Q8 = {cdp_q8_check, cdp_q8_prepare, cdp_q8_run};

/* Its y is the next op's pipe: that op runs it (the loader checks the pair, mt_plan.c). */
static int cdp_to_pipe_run(mt_ctx_t *ctx, const void *rec) {
    (void)ctx;
    (void)rec;
    return MT_OK;
}

const mt_opdef_t mt_op_CONV_DW_PW_Q8_TO_PIPE = {cdp_q8_check, cdp_q8_prepare, cdp_to_pipe_run};

/* The op before it (a CONV_DW_PW_Q8_TO_PIPE, its record just before this one) makes the rows of
 * the pipe as this op's first conv needs them. */
static int cdp_from_pipe_run(mt_ctx_t *ctx, const void *rec) {
    const cdp_q8_rec_t *r = rec, *src = (const cdp_q8_rec_t *)(const void *)((const uint8_t *)rec - CDP_REC_BYTES);
    int32_t acc[MT_Q8_ROW];
    cdp_progress_t p = {0, 0}, sp = {0, 0};
    cdp_rows(ctx, r, &p, (int32_t)r->g1.OH, acc, src, &sp);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV_DW_PW_Q8_FROM_PIPE = {cdp_q8_check, cdp_q8_prepare, cdp_from_pipe_run};
