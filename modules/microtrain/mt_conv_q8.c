/* microtrain core: int8 2-D convolution (any group count: 1x1, kxk, depthwise),
 * and the float input gradient of a frozen int8 convolution.
 *
 *   CONV2D_Q8  y[o] = clamp(y_zp + requant(b[o] + sum w[o,c,ky,kx] * (x[c] - x_zp), mult[o], shift[o]))
 *   CONV2D_Q8_DW_INPLACE  the same, depthwise, y written over x through one plane of scratch
 * Padding stands for the input zero point (real 0), so a padded tap adds
 * nothing: the window walk skips it (mt_window_range), as for float. Each
 * output row is summed in int32 chunks of MT_Q8_ROW outputs, the inner loop over
 * contiguous outputs.
 *
 *   CONV2D_BWD_INPUT_Q8  dx[c] += dy[o] (*) flip(w[o,c]) * w_scale[o]
 * The gradient of the real-valued (dequantized) convolution, in float, with the
 * weight read as int8 from the plan and scaled per output channel on the fly:
 * a frozen int8 layer between trainable ones keeps its weights in flash.
 */
#include <string.h>
#include "mt_q8.h"

typedef struct {
    mt_rec_t h;
    uint32_t x, w, b, mult, shift, y;
    mt_conv_geom_t g;
    int32_t x_zp, y_zp, lo, hi;
} conv_q8_rec_t;

static int conv_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *w = &t[MT_CONV2D_Q8_W];
    const int32_t *a = op->a;
    uint32_t O = w->dim[0];
    return mt_conv_check_shapes(a, &t[MT_CONV2D_Q8_X], w, &t[MT_CONV2D_Q8_Y])
           && (uint64_t)w->dim[1] * w->dim[2] * w->dim[3] <= MT_Q8_MAX_TAPS
           && mt_q8_activation_ok(ctx, &t[MT_CONV2D_Q8_X]) && mt_q8_activation_ok(ctx, &t[MT_CONV2D_Q8_Y])
           && mt_q8_weight_ok(ctx, w, 0, O)
           && mt_q8_rescale_ok(ctx, &t[MT_CONV2D_Q8_MULT], &t[MT_CONV2D_Q8_SHIFT], &t[MT_CONV2D_Q8_B], O)
           && mt_q8_clamp_ok(a[MT_CONV2D_Q8_A_ACT_MIN], a[MT_CONV2D_Q8_A_ACT_MAX]) ? MT_OK : MT_E_SHAPE;
}

/* The record from the slots x w b mult shift (CONV2D_Q8's first five, CONV2D_Q8_DW_INPLACE's
 * too) and y at y_slot; the clamp is the last two attributes of both. */
static void conv_q8_fill(const mt_ctx_t *ctx, const mt_op_t *op, int y_slot, conv_q8_rec_t *r) {
    const mt_tensor_t *t = op->t;
    r->x = t[MT_CONV2D_Q8_X].ref;
    r->w = t[MT_CONV2D_Q8_W].ref;
    r->b = t[MT_CONV2D_Q8_B].ref;
    r->mult = t[MT_CONV2D_Q8_MULT].ref;
    r->shift = t[MT_CONV2D_Q8_SHIFT].ref;
    r->y = t[y_slot].ref;
    mt_conv_prepare_geom(op->a, &t[MT_CONV2D_Q8_X], &t[MT_CONV2D_Q8_W], &t[y_slot], &r->g);
    r->x_zp = mt_q8_zero_point(ctx, &t[MT_CONV2D_Q8_X]);
    r->y_zp = mt_q8_zero_point(ctx, &t[y_slot]);
    r->lo = op->a[MT_CONV2D_Q8_A_ACT_MIN];
    r->hi = op->a[MT_CONV2D_Q8_A_ACT_MAX];
}

static uint32_t conv_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    if (rec != NULL) {
        conv_q8_fill(ctx, op, MT_CONV2D_Q8_Y, rec);
    }
    return sizeof(conv_q8_rec_t);
}

/* The int8 convolution of r; with scratch (CONV2D_Q8_DW_INPLACE: depthwise) each input plane is
 * copied there before its output plane is written, so y may be x itself. A 1x1 conv at stride 1
 * without padding runs mt_q8_pw over the whole planes, a depthwise conv mt_q8_dw row by row; any
 * other the row loop below (the same sums, in another order). */
static void conv_q8_forward(mt_ctx_t *ctx, const conv_q8_rec_t *r, int8_t *scratch) {
    const mt_conv_geom_t *g = &r->g;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x), *w = (const int8_t *)mt_ptr(ctx, r->w);
    const int32_t *b = (const int32_t *)mt_ptr(ctx, r->b);
    const int32_t *mult = (const int32_t *)mt_ptr(ctx, r->mult), *shift = (const int32_t *)mt_ptr(ctx, r->shift);
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    const int32_t H = (int32_t)g->H, W = (int32_t)g->W, OW = (int32_t)g->OW, KH = g->KH, KW = g->KW;
    const int32_t sh = g->sh, dh = g->dh, pt = g->pt;
    const size_t plane = (size_t)g->H * g->W, taps = (size_t)KH * KW;
    if (scratch == NULL && g->G == 1 && KH == 1 && KW == 1 && g->sh == 1 && g->sw == 1 && g->OH == g->H
        && g->OW == g->W) {
        mt_q8_pw(x, plane, g->C, r->x_zp, w, b, mult, shift, g->O, y, plane, (uint32_t)plane, r->y_zp, r->lo, r->hi);
        return;
    }
    const int depthwise = g->Cg == 1 && g->Og == 1 && KH <= MT_Q8_DW_ROWS;
    int32_t acc[MT_Q8_ROW];
    const int8_t *rows[MT_Q8_DW_ROWS], *wrows[MT_Q8_DW_ROWS];
    for (uint32_t o = 0; o < g->O; o++) {
        const int8_t *xg = x + (o / g->Og) * g->Cg * plane, *wo = w + (size_t)o * g->Cg * taps;
        if (scratch != NULL) {
            memcpy(scratch, xg, plane);
            xg = scratch;
        }
        const int32_t init = b != NULL ? b[o] : 0, m = mult[o], s = shift[o];
        int8_t *yo = y + (size_t)o * g->OH * g->OW;
        for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
            int32_t by = oy * sh - pt, ky0, ky1;
            mt_window_range(by, dh, KH, H, &ky0, &ky1);
            if (depthwise) {
                for (int32_t k = 0; k < ky1 - ky0; k++) {
                    rows[k] = xg + (size_t)(by + (ky0 + k) * dh) * W;
                    wrows[k] = wo + (ky0 + k) * KW;
                }
                mt_q8_dw(rows, wrows, ky1 - ky0, g, r->x_zp, init, m, s, r->y_zp, r->lo, r->hi, yo + (size_t)oy * OW);
                continue;
            }
            for (int32_t x0 = 0; x0 < OW; x0 += MT_Q8_ROW) {
                const int32_t n = mt_q8_chunk(acc, x0, OW, init);
                for (uint32_t c = 0; c < g->Cg; c++) {
                    const int8_t *wc = wo + c * taps;
                    if (ky1 - ky0 <= MT_Q8_DW_ROWS) {   /* each input channel's windows at once */
                        for (int32_t k = 0; k < ky1 - ky0; k++) {
                            rows[k] = xg + c * plane + (size_t)(by + (ky0 + k) * dh) * W;
                            wrows[k] = wc + (ky0 + k) * KW;
                        }
                        mt_q8_win(rows, wrows, ky1 - ky0, g, r->x_zp, x0, x0 + n, acc);
                        continue;
                    }
                    for (int32_t ky = ky0; ky < ky1; ky++) {
                        mt_q8_mac_taps(acc, xg + c * plane + (size_t)(by + ky * dh) * W, wc + ky * KW, g, x0, n,
                            r->x_zp);
                    }
                }
                mt_q8_store_row(yo + (size_t)oy * OW + x0, acc, n, m, s, r->y_zp, r->lo, r->hi);
            }
        }
    }
}

static int conv_q8_run(mt_ctx_t *ctx, const void *rec) {
    conv_q8_forward(ctx, rec, NULL);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_Q8 = {conv_q8_check, conv_q8_prepare, conv_q8_run};

/* ---- CONV2D_Q8_DW_INPLACE: a depthwise CONV2D_Q8 whose output may take its input's memory ----
 * Output channel o reads input channel o only: that plane is copied to the scratch plane s
 * first, and output plane o ends no later than input plane o does (oplane <= plane), so y may
 * overwrite x. The same row loop as CONV2D_Q8 (conv_q8_forward), so the same bits. Its slots
 * are CONV2D_Q8's with s before y. */

typedef struct {
    conv_q8_rec_t q;
    uint32_t s;
} conv_q8_dw_rec_t;

static int conv_q8_dw_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *x = &t[MT_CONV2D_Q8_DW_INPLACE_X], *w = &t[MT_CONV2D_Q8_DW_INPLACE_W],
                      *y = &t[MT_CONV2D_Q8_DW_INPLACE_Y];
    const int32_t *a = op->a;
    const uint32_t C = x->dim[1];
    return mt_conv_check_shapes(a, x, w, y) && (uint32_t)a[MT_CONV_A_GROUPS] == C && w->dim[0] == C && w->dim[1] == 1
           && (uint64_t)w->dim[2] * w->dim[3] <= MT_Q8_MAX_TAPS
           && t[MT_CONV2D_Q8_DW_INPLACE_S].n == x->dim[2] * x->dim[3] && y->dim[2] * y->dim[3] <= x->dim[2] * x->dim[3]
           && mt_q8_activation_ok(ctx, x) && mt_q8_activation_ok(ctx, y) && mt_q8_weight_ok(ctx, w, 0, C)
           && mt_q8_rescale_ok(ctx, &t[MT_CONV2D_Q8_DW_INPLACE_MULT], &t[MT_CONV2D_Q8_DW_INPLACE_SHIFT],
               &t[MT_CONV2D_Q8_DW_INPLACE_B], C)
           && mt_q8_clamp_ok(a[MT_CONV2D_Q8_DW_INPLACE_A_ACT_MIN], a[MT_CONV2D_Q8_DW_INPLACE_A_ACT_MAX]) ? MT_OK
                                                                                                         : MT_E_SHAPE;
}

static uint32_t conv_q8_dw_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_q8_dw_rec_t *r = rec;
    if (r != NULL) {
        conv_q8_fill(ctx, op, MT_CONV2D_Q8_DW_INPLACE_Y, &r->q);
        r->s = op->t[MT_CONV2D_Q8_DW_INPLACE_S].ref;
    }
    return sizeof(conv_q8_dw_rec_t);
}

static int conv_q8_dw_run(mt_ctx_t *ctx, const void *rec) {
    const conv_q8_dw_rec_t *r = rec;
    conv_q8_forward(ctx, &r->q, (int8_t *)mt_ptr(ctx, r->s));
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_Q8_DW_INPLACE = {conv_q8_dw_check, conv_q8_dw_prepare, conv_q8_dw_run};

/* ---- CONV2D_BWD_INPUT_Q8: dx from dy (float) and the int8 weight ---- */

typedef struct {
    mt_rec_t h;
    uint32_t dy, w, dx, scales;   /* scales: the weight's per-channel scales, or MT_REF_NONE */
    float scale;                  /* its per-tensor scale */
    mt_conv_geom_t g;
} conv_bwd_input_q8_rec_t;

static int conv_bwd_input_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *w = &t[MT_CONV2D_BWD_INPUT_Q8_W];
    return mt_conv_check_shapes(op->a, &t[MT_CONV2D_BWD_INPUT_Q8_DX], w, &t[MT_CONV2D_BWD_INPUT_Q8_DY])
           && mt_q8_weight_ok(ctx, w, 0, w->dim[0]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_bwd_input_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_bwd_input_q8_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        mt_quant_t q;
        mt_quant_of(ctx, &t[MT_CONV2D_BWD_INPUT_Q8_W], &q);
        r->dy = t[MT_CONV2D_BWD_INPUT_Q8_DY].ref;
        r->w = t[MT_CONV2D_BWD_INPUT_Q8_W].ref;
        r->dx = t[MT_CONV2D_BWD_INPUT_Q8_DX].ref;
        r->scales = q.scales;
        r->scale = q.scale;
        mt_conv_prepare_geom(op->a, &t[MT_CONV2D_BWD_INPUT_Q8_DX], &t[MT_CONV2D_BWD_INPUT_Q8_W],
            &t[MT_CONV2D_BWD_INPUT_Q8_DY], &r->g);
    }
    return sizeof(conv_bwd_input_q8_rec_t);
}

/* Each output's gradient, times each tap's real weight, goes to the input the tap read. */
static int conv_bwd_input_q8_run(mt_ctx_t *ctx, const void *rec) {
    const conv_bwd_input_q8_rec_t *r = rec;
    const mt_conv_geom_t *g = &r->g;
    const float *dy = MT_F32(ctx, r->dy), *scales = MT_F32(ctx, r->scales);
    const int8_t *w = (const int8_t *)mt_ptr(ctx, r->w);
    float *dx = MT_F32(ctx, r->dx);
    const int32_t H = (int32_t)g->H, W = (int32_t)g->W, OW = (int32_t)g->OW, KH = g->KH, KW = g->KW;
    const size_t plane = (size_t)g->H * g->W, taps = (size_t)KH * KW;
    memset(dx, 0, (size_t)g->C * plane * sizeof(float));
    for (uint32_t o = 0; o < g->O; o++) {
        const float s = scales != NULL ? scales[o] : r->scale;
        const float *dyo = dy + (size_t)o * g->OH * g->OW;
        float *dxg = dx + (o / g->Og) * g->Cg * plane;
        for (uint32_t c = 0; c < g->Cg; c++) {
            const int8_t *wc = w + ((size_t)o * g->Cg + c) * taps;
            for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
                int32_t by = oy * g->sh - g->pt, ky0, ky1;
                mt_window_range(by, g->dh, KH, H, &ky0, &ky1);
                for (int32_t ky = ky0; ky < ky1; ky++) {
                    float *drow = dxg + c * plane + (size_t)(by + ky * g->dh) * W;
                    for (int32_t kx = 0; kx < KW; kx++) {
                        int32_t off = kx * g->dw - g->pl, lo, hi;
                        mt_window_range(off, g->sw, OW, W, &lo, &hi);
                        const float wv = (float)wc[ky * KW + kx] * s;
                        for (int32_t j = lo; j < hi; j++) {
                            drow[j * g->sw + off] += dyo[(size_t)oy * OW + j] * wv;
                        }
                    }
                }
            }
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_BWD_INPUT_Q8 = {conv_bwd_input_q8_check, conv_bwd_input_q8_prepare,
    conv_bwd_input_q8_run};
