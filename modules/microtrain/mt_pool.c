/* microtrain core: max, average and global average pooling, forward and backward.
 * Every window is clipped to the input (mt_window_range), so padding is never
 * read; with ceil_mode a window may hang past the padded edge. */
#include <string.h>
#include "mt_core.h"

typedef mt_pool_geom_t pool_geom_t;   /* mt_core.h: the int8 kernels share it */

/* One record for the four window ops: MAXPOOL (x, y), MAXPOOL_BWD (dy, dx, aux = x),
 * AVGPOOL (x, y), AVGPOOL_BWD (dy, dx). */
typedef struct {
    mt_rec_t h;
    uint32_t in, out, aux;
    pool_geom_t g;
} pool_rec_t;

/* x (1,C,H,W) -> y (1,C,OH,OW), OH from floor or ceil rounding */
static int pool_check_shapes(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *y) {
    for (int i = MT_POOL_A_KERNEL_H; i <= MT_POOL_A_STRIDE_W; i++) {
        if (!mt_in_range(a[i], 1, MT_LIMIT)) {
            return 0;
        }
    }
    for (int i = MT_POOL_A_PAD_T; i <= MT_POOL_A_PAD_R; i++) {
        if (!mt_in_range(a[i], 0, MT_LIMIT)) {
            return 0;
        }
    }
    if (!mt_in_range(a[MT_POOL_A_DIL_H], 1, MT_LIMIT) || !mt_in_range(a[MT_POOL_A_DIL_W], 1, MT_LIMIT)
        || !mt_in_range(a[MT_POOL_A_COUNT_INCLUDE_PAD], 0, 1)) {
        return 0;
    }
    if (!mt_is_nchw(x) || !mt_is_nchw(y) || x->dim[1] != y->dim[1]) {
        return 0;
    }
    int64_t oh = y->dim[2], ow = y->dim[3];
    return (mt_out_extent(x->dim[2], a[MT_POOL_A_PAD_T], a[MT_POOL_A_PAD_B], a[MT_POOL_A_KERNEL_H], a[MT_POOL_A_DIL_H],
                a[MT_POOL_A_STRIDE_H], 0) == oh
            || mt_out_extent(x->dim[2], a[MT_POOL_A_PAD_T], a[MT_POOL_A_PAD_B], a[MT_POOL_A_KERNEL_H],
                a[MT_POOL_A_DIL_H], a[MT_POOL_A_STRIDE_H], 1) == oh)
           && (mt_out_extent(x->dim[3], a[MT_POOL_A_PAD_L], a[MT_POOL_A_PAD_R], a[MT_POOL_A_KERNEL_W],
                   a[MT_POOL_A_DIL_W], a[MT_POOL_A_STRIDE_W], 0) == ow
               || mt_out_extent(x->dim[3], a[MT_POOL_A_PAD_L], a[MT_POOL_A_PAD_R], a[MT_POOL_A_KERNEL_W],
                   a[MT_POOL_A_DIL_W], a[MT_POOL_A_STRIDE_W], 1) == ow);
}

/* x: the input-shaped tensor, y: the output-shaped one */
static void pool_prepare_geom(const mt_op_t *op, const mt_tensor_t *x, const mt_tensor_t *y, pool_geom_t *g) {
    const int32_t *a = op->a;
    g->C = x->dim[1];
    g->H = x->dim[2];
    g->W = x->dim[3];
    g->OH = y->dim[2];
    g->OW = y->dim[3];
    g->kh = (uint16_t)a[MT_POOL_A_KERNEL_H];
    g->kw = (uint16_t)a[MT_POOL_A_KERNEL_W];
    g->sh = (uint16_t)a[MT_POOL_A_STRIDE_H];
    g->sw = (uint16_t)a[MT_POOL_A_STRIDE_W];
    g->dh = (uint16_t)a[MT_POOL_A_DIL_H];
    g->dw = (uint16_t)a[MT_POOL_A_DIL_W];
    g->pt = (uint16_t)a[MT_POOL_A_PAD_T];
    g->pl = (uint16_t)a[MT_POOL_A_PAD_L];
    g->pb = (uint16_t)a[MT_POOL_A_PAD_B];
    g->pr = (uint16_t)a[MT_POOL_A_PAD_R];
    g->include_pad = (uint16_t)a[MT_POOL_A_COUNT_INCLUDE_PAD];
    g->reserved = 0;
}

typedef mt_window_t window_t;

MT_INLINE void window_at(const pool_geom_t *g, int32_t oy, int32_t ox, window_t *w) {
    w->by = oy * g->sh - g->pt;
    w->bx = ox * g->sw - g->pl;
    mt_window_range(w->by, g->dh, g->kh, (int32_t)g->H, &w->ky0, &w->ky1);
    mt_window_range(w->bx, g->dw, g->kw, (int32_t)g->W, &w->kx0, &w->kx1);
}

/* Index into the channel plane of the window's first maximum, scanning rows then
 * columns as PyTorch does; -1 if the window holds no input element. */
static int32_t window_argmax(const pool_geom_t *g, const window_t *w, const float *xc) {
    int32_t best = -1;
    float m = 0.0f;
    for (int32_t ky = w->ky0; ky < w->ky1; ky++) {
        int32_t row = (w->by + ky * g->dh) * g->W + w->bx;
        for (int32_t kx = w->kx0; kx < w->kx1; kx++) {
            int32_t i = row + kx * g->dw;
            if (best < 0 || xc[i] > m) {
                best = i;
                m = xc[i];
            }
        }
    }
    return best;
}

/* Divisor of the window: with count_include_pad, the window clipped to the
 * padded input (PyTorch's rule); otherwise the number of input elements in it. */
static int32_t window_count(const pool_geom_t *g, const window_t *w) {
    if (!g->include_pad) {
        return (w->ky1 - w->ky0) * (w->kx1 - w->kx0);
    }
    int32_t lo, py, px;
    mt_window_range(w->by + g->pt, g->dh, g->kh, (int32_t)g->H + g->pt + g->pb, &lo, &py);
    mt_window_range(w->bx + g->pl, g->dw, g->kw, (int32_t)g->W + g->pl + g->pr, &lo, &px);
    return py * px;
}

/* The one window walk of the four ops; kind is a constant in each caller, so
 * each gets its own loop with no test of kind inside. */
enum { KIND_MAX, KIND_MAX_BWD, KIND_AVG, KIND_AVG_BWD };

/* 2x2 max pooling with no padding or dilation whose every window lies inside the input (the
 * common MaxPool(2)): no clipping, and the first maximum in the same scan order as
 * window_argmax (rows, then columns; strictly greater replaces), so both give the same index. */
static int pool_is_plain_2x2(const pool_geom_t *g) {
    return g->kh == 2 && g->kw == 2 && g->dh == 1 && g->dw == 1 && g->pt == 0 && g->pl == 0
           && ((int32_t)g->OH - 1) * g->sh + 2 <= (int32_t)g->H && ((int32_t)g->OW - 1) * g->sw + 2 <= (int32_t)g->W;
}

MT_INLINE int32_t argmax_2x2(const float *p, int32_t W) {
    int32_t best = 0;
    float m = p[0];
    if (p[1] > m) {
        best = 1;
        m = p[1];
    }
    if (p[W] > m) {
        best = W;
        m = p[W];
    }
    return p[W + 1] > m ? W + 1 : best;
}

/* MAXPOOL (kind KIND_MAX: in = x, out = y) or MAXPOOL_BWD (in = dy, out = dx, already zero) */
MT_INLINE void maxpool_2x2(const int kind, const pool_geom_t *g, const float *in, float *out, const float *x) {
    const int32_t W = (int32_t)g->W, rows = g->sh * W;
    const size_t plane = (size_t)g->H * W;
    for (uint32_t c = 0; c < g->C; c++) {
        const float *xc = (kind == KIND_MAX ? in : x) + c * plane;
        float *dxc = out + c * plane;
        for (uint32_t oy = 0; oy < g->OH; oy++) {
            const float *row = xc + (size_t)oy * rows;
            for (uint32_t ox = 0; ox < g->OW; ox++) {
                const float *p = row + ox * g->sw;
                int32_t i = argmax_2x2(p, W);
                if (kind == KIND_MAX) {
                    *out++ = p[i];
                } else {
                    dxc[(p - xc) + i] += *in++;
                }
            }
        }
    }
}

MT_INLINE void pool_walk(const int kind, mt_ctx_t *ctx, const pool_rec_t *r) {
    const pool_geom_t *g = &r->g;
    const float *in = MT_F32(ctx, r->in);
    float *out = MT_F32(ctx, r->out);
    const float *x = MT_F32(ctx, r->aux);
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW;
    if (kind == KIND_MAX_BWD || kind == KIND_AVG_BWD) {
        memset(out, 0, (size_t)g->C * plane * sizeof(float));
    }
    if ((kind == KIND_MAX || kind == KIND_MAX_BWD) && pool_is_plain_2x2(g)) {
        maxpool_2x2(kind, g, in, out, x);
        return;
    }
    for (uint32_t c = 0; c < g->C; c++) {
        for (int32_t oy = 0; oy < (int32_t)g->OH; oy++) {
            for (int32_t ox = 0; ox < (int32_t)g->OW; ox++) {
                window_t w;
                window_at(g, oy, ox, &w);
                const size_t o = c * oplane + (size_t)oy * g->OW + (size_t)ox;
                if (kind == KIND_MAX) {
                    int32_t i = window_argmax(g, &w, in + c * plane);
                    out[o] = i >= 0 ? in[c * plane + (size_t)i] : 0.0f;
                } else if (kind == KIND_MAX_BWD) {
                    int32_t i = window_argmax(g, &w, x + c * plane);
                    if (i >= 0) {
                        out[c * plane + (size_t)i] += in[o];
                    }
                } else {
                    int32_t n = window_count(g, &w);
                    float d = kind == KIND_AVG_BWD && n > 0 ? in[o] / (float)n : 0.0f, acc = 0.0f;
                    for (int32_t ky = w.ky0; ky < w.ky1; ky++) {
                        size_t row = c * plane + (size_t)(w.by + ky * g->dh) * g->W + (size_t)w.bx;
                        for (int32_t kx = w.kx0; kx < w.kx1; kx++) {
                            if (kind == KIND_AVG) {
                                acc += in[row + (size_t)(kx * g->dw)];
                            } else {
                                out[row + (size_t)(kx * g->dw)] += d;
                            }
                        }
                    }
                    if (kind == KIND_AVG) {
                        out[o] = n > 0 ? acc / (float)n : 0.0f;
                    }
                }
            }
        }
    }
}

static int pool_run(mt_ctx_t *ctx, const void *rec) {
    const pool_rec_t *r = rec;
    switch (r->h.kind) {
        case KIND_MAX: pool_walk(KIND_MAX, ctx, r); break;
        case KIND_MAX_BWD: pool_walk(KIND_MAX_BWD, ctx, r); break;
        case KIND_AVG: pool_walk(KIND_AVG, ctx, r); break;
        default: pool_walk(KIND_AVG_BWD, ctx, r); break;
    }
    return MT_OK;
}

/* ---- MAXPOOL, AVGPOOL: x -> y ---- */

static int pool_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    return pool_check_shapes(op->a, &op->t[MT_MAXPOOL_X], &op->t[MT_MAXPOOL_Y]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t pool_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pool_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->h.kind = op->code == MT_OP_MAXPOOL ? KIND_MAX : KIND_AVG;
        r->in = op->t[MT_MAXPOOL_X].ref;
        r->out = op->t[MT_MAXPOOL_Y].ref;
        r->aux = MT_REF_NONE;
        pool_prepare_geom(op, &op->t[MT_MAXPOOL_X], &op->t[MT_MAXPOOL_Y], &r->g);
    }
    return sizeof(pool_rec_t);
}

const mt_opdef_t mt_op_MAXPOOL = {pool_check, pool_prepare, pool_run};
const mt_opdef_t mt_op_AVGPOOL = {pool_check, pool_prepare, pool_run};

/* ---- MAXPOOL_BWD: (x, dy) -> dx, the gradient to each window's maximum ---- */

static int maxpool_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_MAXPOOL_BWD_X], *dx = &op->t[MT_MAXPOOL_BWD_DX];
    (void)ctx;
    return pool_check_shapes(op->a, x, &op->t[MT_MAXPOOL_BWD_DY]) && dx->ndim == x->ndim
           && memcmp(dx->dim, x->dim, sizeof x->dim) == 0 ? MT_OK : MT_E_SHAPE;
}

static uint32_t maxpool_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pool_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->h.kind = KIND_MAX_BWD;
        r->in = op->t[MT_MAXPOOL_BWD_DY].ref;
        r->out = op->t[MT_MAXPOOL_BWD_DX].ref;
        r->aux = op->t[MT_MAXPOOL_BWD_X].ref;
        pool_prepare_geom(op, &op->t[MT_MAXPOOL_BWD_X], &op->t[MT_MAXPOOL_BWD_DY], &r->g);
    }
    return sizeof(pool_rec_t);
}

const mt_opdef_t mt_op_MAXPOOL_BWD = {maxpool_bwd_check, maxpool_bwd_prepare, pool_run};

/* ---- AVGPOOL_BWD: dy -> dx, each output's gradient spread over its window ---- */

static int avgpool_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    return pool_check_shapes(op->a, &op->t[MT_AVGPOOL_BWD_DX], &op->t[MT_AVGPOOL_BWD_DY]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t avgpool_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pool_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->h.kind = KIND_AVG_BWD;
        r->in = op->t[MT_AVGPOOL_BWD_DY].ref;
        r->out = op->t[MT_AVGPOOL_BWD_DX].ref;
        r->aux = MT_REF_NONE;
        pool_prepare_geom(op, &op->t[MT_AVGPOOL_BWD_DX], &op->t[MT_AVGPOOL_BWD_DY], &r->g);
    }
    return sizeof(pool_rec_t);
}

const mt_opdef_t mt_op_AVGPOOL_BWD = {avgpool_bwd_check, avgpool_bwd_prepare, pool_run};

/* ---- GAP, GAP_BWD: global average pooling (1,C,H,W) <-> (1,C) ---- */

typedef struct {
    mt_rec_t h;
    uint32_t in, out, C, hw;
} gap_rec_t;

static int gap_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    return mt_is_nchw(&op->t[MT_GAP_X]) && op->t[MT_GAP_Y].n == op->t[MT_GAP_X].dim[1] ? MT_OK : MT_E_SHAPE;
}

static uint32_t gap_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gap_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        const mt_tensor_t *x = &op->t[MT_GAP_X];
        r->in = x->ref;
        r->out = op->t[MT_GAP_Y].ref;
        r->C = x->dim[1];
        r->hw = x->dim[2] * x->dim[3];
    }
    return sizeof(gap_rec_t);
}

static int gap_run(mt_ctx_t *ctx, const void *rec) {
    const gap_rec_t *r = rec;
    const float *x = MT_F32(ctx, r->in);
    float *y = MT_F32(ctx, r->out);
    const uint32_t hw = r->hw;
    for (uint32_t c = 0; c < r->C; c++, x += hw) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < hw; i++) {
            acc += x[i];
        }
        y[c] = acc / (float)hw;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GAP = {gap_check, gap_prepare, gap_run};

static int gap_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    return mt_is_nchw(&op->t[MT_GAP_BWD_DX]) && op->t[MT_GAP_BWD_DY].n == op->t[MT_GAP_BWD_DX].dim[1]
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t gap_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gap_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        const mt_tensor_t *dx = &op->t[MT_GAP_BWD_DX];
        r->in = op->t[MT_GAP_BWD_DY].ref;
        r->out = dx->ref;
        r->C = dx->dim[1];
        r->hw = dx->dim[2] * dx->dim[3];
    }
    return sizeof(gap_rec_t);
}

static int gap_bwd_run(mt_ctx_t *ctx, const void *rec) {
    const gap_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->in);
    float *dx = MT_F32(ctx, r->out);
    const uint32_t hw = r->hw;
    for (uint32_t c = 0; c < r->C; c++, dx += hw) {
        const float d = dy[c] / (float)hw;
        for (uint32_t i = 0; i < hw; i++) {
            dx[i] = d;
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GAP_BWD = {gap_bwd_check, gap_bwd_prepare, gap_bwd_run};

/* ---- the geometry, for the int8 pooling (mt_pool_q8.c) ---- */

int mt_pool_check_shapes(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *y) {
    return pool_check_shapes(a, x, y);
}

void mt_pool_prepare_geom(const mt_op_t *op, const mt_tensor_t *x, const mt_tensor_t *y, mt_pool_geom_t *g) {
    pool_prepare_geom(op, x, y, g);
}

void mt_pool_window(const mt_pool_geom_t *g, int32_t oy, int32_t ox, mt_window_t *w) {
    window_at(g, oy, ox, w);
}

int32_t mt_pool_window_count(const mt_pool_geom_t *g, const mt_window_t *w) {
    return window_count(g, w);
}
