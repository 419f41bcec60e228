/* microtrain core: int8 max, average and global average pooling.
 *   MAXPOOL_Q8  the window's largest q (input and output share scale and zero point)
 *   AVGPOOL_Q8  y = clamp(y_zp + requant(sum(q - x_zp), mult[n-1], shift[n-1])) for a window
 *               of n inputs (counted as the float op counts them, count_include_pad): the
 *               mean's 1/n is in the multiplier, so the average is rounded once
 *   GAP_Q8      y = clamp(y_zp + requant(sum(q - x_zp), mult, shift)), 1/(H*W) likewise
 *   MAXPOOL_BWD_Q8  the float gradient of max pooling, routed by the int8 input
 * Averages round ties to even (mt_q8_requant_even), as onnxruntime does.
 * The windows are the float pooling's (mt_pool_window), so padding is never read.
 */
#include <string.h>
#include "mt_q8.h"

typedef struct {
    mt_rec_t h;
    uint32_t x, y, mult, shift;   /* mult, shift: AVGPOOL_Q8's tables by window size, else MT_REF_NONE */
    mt_pool_geom_t g;
    int32_t x_zp, y_zp;
} pool_q8_rec_t;

#define AVG_TABLE_MAX 65536   /* window sizes a table covers: kernel_h * kernel_w */

/* x and y: the same scale and zero point */
static int same_quant(const mt_ctx_t *ctx, const mt_tensor_t *x, const mt_tensor_t *y) {
    mt_quant_t a, b;
    return mt_quant_of(ctx, x, &a) && mt_quant_of(ctx, y, &b) && a.scale == b.scale && a.zero_point == b.zero_point;
}

static int maxpool_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_MAXPOOL_Q8_X], *y = &op->t[MT_MAXPOOL_Q8_Y];
    return mt_pool_check_shapes(op->a, x, y) && mt_q8_activation_ok(ctx, x) && mt_q8_activation_ok(ctx, y)
           && same_quant(ctx, x, y) ? MT_OK : MT_E_SHAPE;
}

static int avgpool_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_AVGPOOL_Q8_X], *y = &op->t[MT_AVGPOOL_Q8_Y];
    if (!mt_pool_check_shapes(op->a, x, y) || !mt_q8_activation_ok(ctx, x) || !mt_q8_activation_ok(ctx, y)) {
        return MT_E_SHAPE;
    }
    uint64_t taps = (uint64_t)op->a[MT_POOL_A_KERNEL_H] * (uint64_t)op->a[MT_POOL_A_KERNEL_W];
    const mt_tensor_t none = {0};
    return taps <= AVG_TABLE_MAX
           && mt_q8_rescale_ok(ctx, &op->t[MT_AVGPOOL_Q8_MULT], &op->t[MT_AVGPOOL_Q8_SHIFT], &none, (uint32_t)taps)
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t pool_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pool_q8_rec_t *r = rec;
    if (r != NULL) {
        int avg = op->code == MT_OP_AVGPOOL_Q8;
        const mt_tensor_t *x = &op->t[avg ? MT_AVGPOOL_Q8_X : MT_MAXPOOL_Q8_X];
        const mt_tensor_t *y = &op->t[avg ? MT_AVGPOOL_Q8_Y : MT_MAXPOOL_Q8_Y];
        r->x = x->ref;
        r->y = y->ref;
        r->mult = avg ? op->t[MT_AVGPOOL_Q8_MULT].ref : MT_REF_NONE;
        r->shift = avg ? op->t[MT_AVGPOOL_Q8_SHIFT].ref : MT_REF_NONE;
        mt_pool_prepare_geom(op, x, y, &r->g);
        r->x_zp = mt_q8_zero_point(ctx, x);
        r->y_zp = mt_q8_zero_point(ctx, y);
    }
    return sizeof(pool_q8_rec_t);
}

static int pool_q8_run(mt_ctx_t *ctx, const void *rec) {
    const pool_q8_rec_t *r = rec;
    const mt_pool_geom_t *g = &r->g;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x);
    const int32_t *mult = (const int32_t *)mt_ptr(ctx, r->mult), *shift = (const int32_t *)mt_ptr(ctx, r->shift);
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    const int is_max = r->h.code == MT_OP_MAXPOOL_Q8;
    const size_t plane = (size_t)g->H * g->W;
    for (uint32_t c = 0; c < g->C; c++) {
        const int8_t *xc = x + c * plane;
        for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
            for (int32_t ox = 0; ox < (int32_t)g->OW; ox++) {
                mt_window_t w;
                mt_pool_window(g, oy, ox, &w);
                int32_t best = -129, sum = 0;
                for (int32_t ky = w.ky0; ky < w.ky1; ky++) {
                    const int8_t *row = xc + (size_t)(w.by + ky * g->dh) * g->W + w.bx;
                    for (int32_t kx = w.kx0; kx < w.kx1; kx++) {
                        int32_t v = row[kx * g->dw];
                        best = v > best ? v : best;
                        sum += v - r->x_zp;
                    }
                }
                int32_t out;
                if (is_max) {
                    out = best >= -128 ? best : r->y_zp;   /* a window without input: real 0 */
                } else {
                    int32_t n = mt_pool_window_count(g, &w);
                    out = n > 0 ? mt_q8_requant_even(sum, mult[n - 1], shift[n - 1]) : 0;
                }
                y[c * (size_t)g->OH * g->OW + (size_t)oy * g->OW + (size_t)ox] =
                    is_max ? (int8_t)out : mt_q8_out(out, r->y_zp, -128, 127);
            }
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_MAXPOOL_Q8 = {maxpool_q8_check, pool_q8_prepare, pool_q8_run};
const mt_opdef_t mt_op_AVGPOOL_Q8 = {avgpool_q8_check, pool_q8_prepare, pool_q8_run};

/* ---- MAXPOOL_BWD_Q8: (x int8, dy) -> dx, each output's gradient to the first maximum
 * of its window (rows, then columns: as PyTorch and MAXPOOL_BWD) ---- */

typedef struct {
    mt_rec_t h;
    uint32_t x, dy, dx;
    mt_pool_geom_t g;
} maxpool_bwd_q8_rec_t;

static int maxpool_bwd_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_MAXPOOL_BWD_Q8_X], *dx = &op->t[MT_MAXPOOL_BWD_Q8_DX];
    (void)ctx;
    return mt_pool_check_shapes(op->a, x, &op->t[MT_MAXPOOL_BWD_Q8_DY]) && dx->n == x->n ? MT_OK : MT_E_SHAPE;
}

static uint32_t maxpool_bwd_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    maxpool_bwd_q8_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->x = op->t[MT_MAXPOOL_BWD_Q8_X].ref;
        r->dy = op->t[MT_MAXPOOL_BWD_Q8_DY].ref;
        r->dx = op->t[MT_MAXPOOL_BWD_Q8_DX].ref;
        mt_pool_prepare_geom(op, &op->t[MT_MAXPOOL_BWD_Q8_X], &op->t[MT_MAXPOOL_BWD_Q8_DY], &r->g);
    }
    return sizeof(maxpool_bwd_q8_rec_t);
}

static int maxpool_bwd_q8_run(mt_ctx_t *ctx, const void *rec) {
    const maxpool_bwd_q8_rec_t *r = rec;
    const mt_pool_geom_t *g = &r->g;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x);
    const float *dy = MT_F32(ctx, r->dy);
    float *dx = MT_F32(ctx, r->dx);
    const size_t plane = (size_t)g->H * g->W;
    memset(dx, 0, (size_t)g->C * plane * sizeof(float));
    for (uint32_t c = 0; c < g->C; c++) {
        const int8_t *xc = x + c * plane;
        for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
            for (int32_t ox = 0; ox < (int32_t)g->OW; ox++) {
                mt_window_t w;
                mt_pool_window(g, oy, ox, &w);
                int32_t best = -1, m = 0;
                for (int32_t ky = w.ky0; ky < w.ky1; ky++) {
                    int32_t row = (w.by + ky * g->dh) * (int32_t)g->W + w.bx;
                    for (int32_t kx = w.kx0; kx < w.kx1; kx++) {
                        int32_t i = row + kx * g->dw;
                        if (best < 0 || xc[i] > m) {
                            best = i;
                            m = xc[i];
                        }
                    }
                }
                if (best >= 0) {
                    dx[c * plane + (size_t)best] += dy[c * (size_t)g->OH * g->OW + (size_t)oy * g->OW + (size_t)ox];
                }
            }
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_MAXPOOL_BWD_Q8 = {maxpool_bwd_q8_check, maxpool_bwd_q8_prepare, maxpool_bwd_q8_run};

/* ---- GAP_Q8: (1,C,H,W) -> (1,C) ---- */

typedef struct {
    mt_rec_t h;
    uint32_t x, y, C, hw;
    int32_t x_zp, y_zp, mult, shift;
} gap_q8_rec_t;

static int gap_q8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_GAP_Q8_X], *y = &op->t[MT_GAP_Q8_Y];
    return mt_is_nchw(x) && y->n == x->dim[1] && (uint64_t)x->dim[2] * x->dim[3] <= (1u << 23)
           && mt_q8_activation_ok(ctx, x) && mt_q8_activation_ok(ctx, y)
           && mt_q8_pair_ok(op->a[MT_GAP_Q8_A_MULT], op->a[MT_GAP_Q8_A_SHIFT]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t gap_q8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gap_q8_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *x = &op->t[MT_GAP_Q8_X], *y = &op->t[MT_GAP_Q8_Y];
        r->x = x->ref;
        r->y = y->ref;
        r->C = x->dim[1];
        r->hw = x->dim[2] * x->dim[3];
        r->x_zp = mt_q8_zero_point(ctx, x);
        r->y_zp = mt_q8_zero_point(ctx, y);
        r->mult = op->a[MT_GAP_Q8_A_MULT];
        r->shift = op->a[MT_GAP_Q8_A_SHIFT];
    }
    return sizeof(gap_q8_rec_t);
}

static int gap_q8_run(mt_ctx_t *ctx, const void *rec) {
    const gap_q8_rec_t *r = rec;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->x);
    int8_t *y = (int8_t *)mt_ptr(ctx, r->y);
    for (uint32_t c = 0; c < r->C; c++, x += r->hw) {
        int32_t sum = 0;
        for (uint32_t i = 0; i < r->hw; i++) {
            sum += (int32_t)x[i] - r->x_zp;
        }
        y[c] = mt_q8_out(mt_q8_requant_even(sum, r->mult, r->shift), r->y_zp, -128, 127);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GAP_Q8 = {gap_q8_check, gap_q8_prepare, gap_q8_run};
