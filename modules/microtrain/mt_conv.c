/* microtrain core: 2-D convolution (any group count) forward and backward.
 * 1-D convolutions reach here as H = 1.
 *
 * Every kernel is a sequence of plane passes: one input plane, one output plane
 * and one KH x KW filter. A pass walks output rows; for each row it takes the
 * filter rows whose input row exists and, for each tap, the outputs whose input
 * column exists (mt_window_range), so no inner loop tests a bound.
 *   forward          y[o]  += x[c] (*) w[o,c]              (gather)
 *   backward input   dx[c] += dy[o] (*) flip(w[o,c])        (gather, stride 1;
 *                    a strided convolution scatters each tap over its outputs)
 *   backward weight  dw[o,c,ky,kx] = sum dy[o] * x[c] shifted, into the sink
 */
#include <string.h>
#include "mt_core.h"

typedef mt_conv_geom_t conv_geom_t;   /* mt_core.h: the int8 kernels share it */

/* x (1,C,H,W) * w (O, C/g, KH, KW) -> y (1,O,OH,OW) */
static int conv_check_shapes(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y) {
    if (!mt_in_range(a[MT_CONV_A_STRIDE_H], 1, MT_LIMIT) || !mt_in_range(a[MT_CONV_A_STRIDE_W], 1, MT_LIMIT)
        || !mt_in_range(a[MT_CONV_A_DIL_H], 1, MT_LIMIT) || !mt_in_range(a[MT_CONV_A_DIL_W], 1, MT_LIMIT)) {
        return 0;
    }
    for (int i = MT_CONV_A_PAD_T; i <= MT_CONV_A_PAD_R; i++) {
        if (!mt_in_range(a[i], 0, MT_LIMIT)) {
            return 0;
        }
    }
    int32_t g = a[MT_CONV_A_GROUPS];
    if (!mt_is_nchw(x) || !mt_is_nchw(y) || w->ndim != 4 || !mt_in_range(g, 1, MT_LIMIT)) {
        return 0;
    }
    if (w->dim[2] > MT_LIMIT || w->dim[3] > MT_LIMIT) {
        return 0;
    }
    uint32_t C = x->dim[1], O = w->dim[0];
    if (C % (uint32_t)g != 0 || O % (uint32_t)g != 0 || (uint64_t)w->dim[1] * (uint64_t)g != C || y->dim[1] != O) {
        return 0;
    }
    return mt_out_extent(x->dim[2], a[MT_CONV_A_PAD_T], a[MT_CONV_A_PAD_B], w->dim[2], a[MT_CONV_A_DIL_H],
               a[MT_CONV_A_STRIDE_H], 0) == (int64_t)y->dim[2]
           && mt_out_extent(x->dim[3], a[MT_CONV_A_PAD_L], a[MT_CONV_A_PAD_R], w->dim[3], a[MT_CONV_A_DIL_W],
               a[MT_CONV_A_STRIDE_W], 0) == (int64_t)y->dim[3];
}

static void conv_prepare_geom(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y,
    conv_geom_t *g) {
    g->C = x->dim[1];
    g->H = x->dim[2];
    g->W = x->dim[3];
    g->O = w->dim[0];
    g->Cg = w->dim[1];
    g->KH = (uint16_t)w->dim[2];
    g->KW = (uint16_t)w->dim[3];
    g->OH = y->dim[2];
    g->OW = y->dim[3];
    g->G = (uint32_t)a[MT_CONV_A_GROUPS];
    g->Og = g->O / g->G;
    g->sh = (uint16_t)a[MT_CONV_A_STRIDE_H];
    g->sw = (uint16_t)a[MT_CONV_A_STRIDE_W];
    g->dh = (uint16_t)a[MT_CONV_A_DIL_H];
    g->dw = (uint16_t)a[MT_CONV_A_DIL_W];
    g->pt = (uint16_t)a[MT_CONV_A_PAD_T];
    g->pl = (uint16_t)a[MT_CONV_A_PAD_L];
}

/* ---- plane passes ---- */

/* One pass: input plane IH x IW, output plane OH x OW; output (oy, ox) meets tap
 * (ky, kx) at input (oy*sh - pt + ky*dh, ox*sw - pl + kx*dw). */
typedef struct {
    int32_t IH, IW, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
} pass_t;

static void pass_of(const conv_geom_t *g, pass_t *p) {
    p->IH = (int32_t)g->H;
    p->IW = (int32_t)g->W;
    p->OH = (int32_t)g->OH;
    p->OW = (int32_t)g->OW;
    p->KH = g->KH;
    p->KW = g->KW;
    p->sh = g->sh;
    p->sw = g->sw;
    p->dh = g->dh;
    p->dw = g->dw;
    p->pt = g->pt;
    p->pl = g->pl;
}

/* y[i*ys] += w * x[i*xs], i < n */
static void axpy(float *y, int32_t ys, const float *x, int32_t xs, float w, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        y[i * ys] += w * x[i * xs];
    }
}

/* out += in correlated with filter k, tap (ky, kx) at k[ky*kys + kx*kxs]
 * (negative steps read the filter flipped). */
static void pass_gather(const pass_t *p, const float *in, float *out, const float *k, int32_t kys, int32_t kxs) {
    for (int32_t oy = 0; oy < p->OH; oy++) {
        int32_t by = oy * p->sh - p->pt, ky0, ky1;
        float *orow = out + (size_t)oy * p->OW;
        mt_window_range(by, p->dh, p->KH, p->IH, &ky0, &ky1);
        for (int32_t ky = ky0; ky < ky1; ky++) {
            const float *irow = in + (size_t)(by + ky * p->dh) * p->IW;
            for (int32_t kx = 0; kx < p->KW; kx++) {
                int32_t off = kx * p->dw - p->pl, lo, hi;
                mt_window_range(off, p->sw, p->OW, p->IW, &lo, &hi);
                axpy(orow + lo, 1, irow + lo * p->sw + off, p->sw, k[ky * kys + kx * kxs], hi - lo);
            }
        }
    }
}

/* The transpose of pass_gather: in is the output-shaped plane (dy), out the
 * input-shaped one (dx); each tap adds its outputs' gradients to the inputs it read. */
static void pass_scatter(const pass_t *p, const float *in, float *out, const float *k) {
    for (int32_t oy = 0; oy < p->OH; oy++) {
        int32_t by = oy * p->sh - p->pt, ky0, ky1;
        const float *irow = in + (size_t)oy * p->OW;
        mt_window_range(by, p->dh, p->KH, p->IH, &ky0, &ky1);
        for (int32_t ky = ky0; ky < ky1; ky++) {
            float *orow = out + (size_t)(by + ky * p->dh) * p->IW;
            for (int32_t kx = 0; kx < p->KW; kx++) {
                int32_t off = kx * p->dw - p->pl, lo, hi;
                mt_window_range(off, p->sw, p->OW, p->IW, &lo, &hi);
                axpy(orow + lo * p->sw + off, p->sw, irow + lo, 1, k[ky * p->KW + kx], hi - lo);
            }
        }
    }
}

/* g[ky*KW + kx] = sum over outputs of dy * the input under tap (ky, kx), in output order. */
static float tap_gradient(const pass_t *p, const float *x, const float *dy, int32_t ky, int32_t kx) {
    int32_t off = kx * p->dw - p->pl, lo, hi, oy0, oy1;
    mt_window_range(off, p->sw, p->OW, p->IW, &lo, &hi);
    mt_window_range(ky * p->dh - p->pt, p->sh, p->OH, p->IH, &oy0, &oy1);
    float acc = 0.0f;
    for (int32_t oy = oy0; oy < oy1; oy++) {
        const float *d = dy + (size_t)oy * p->OW + lo;
        const float *xi = x + (size_t)(oy * p->sh - p->pt + ky * p->dh) * p->IW + lo * p->sw + off;
        for (int32_t i = 0; i < hi - lo; i++) {
            acc += d[i] * xi[i * p->sw];
        }
    }
    return acc;
}

/* ---- CONV2D ---- */

typedef struct {
    mt_rec_t h;
    uint32_t x, w, b, y;
    conv_geom_t g;
} conv_rec_t;

static int conv_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return conv_check_shapes(op->a, &t[MT_CONV2D_X], &t[MT_CONV2D_W], &t[MT_CONV2D_Y])
           && (t[MT_CONV2D_B].n == 0 || t[MT_CONV2D_B].n == t[MT_CONV2D_W].dim[0]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->x = op->t[MT_CONV2D_X].ref;
        r->w = op->t[MT_CONV2D_W].ref;
        r->b = op->t[MT_CONV2D_B].ref;
        r->y = op->t[MT_CONV2D_Y].ref;
        conv_prepare_geom(op->a, &op->t[MT_CONV2D_X], &op->t[MT_CONV2D_W], &op->t[MT_CONV2D_Y], &r->g);
    }
    return sizeof(conv_rec_t);
}

static int conv_run(mt_ctx_t *ctx, const void *rec) {
    const conv_rec_t *r = rec;
    const conv_geom_t *g = &r->g;
    const float *x = MT_F32(ctx, r->x), *w = MT_F32(ctx, r->w), *b = MT_F32(ctx, r->b);
    float *y = MT_F32(ctx, r->y);
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW, taps = (size_t)g->KH * g->KW;
    pass_t p;
    pass_of(g, &p);
    for (uint32_t o = 0; o < g->O; o++) {
        float *yo = y + o * oplane;
        const float init = b != NULL ? b[o] : 0.0f;
        for (size_t i = 0; i < oplane; i++) {
            yo[i] = init;
        }
        const float *xg = x + (o / g->Og) * g->Cg * plane;
        for (uint32_t c = 0; c < g->Cg; c++) {
            pass_gather(&p, xg + c * plane, yo, w + (o * g->Cg + c) * taps, g->KW, 1);
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D = {conv_check, conv_prepare, conv_run};

/* ---- CONV2D_BWD_INPUT ---- */

typedef struct {
    mt_rec_t h;
    uint32_t dy, w, dx;
    conv_geom_t g;
} conv_bwd_input_rec_t;

static int conv_bwd_input_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return conv_check_shapes(op->a, &t[MT_CONV2D_BWD_INPUT_DX], &t[MT_CONV2D_BWD_INPUT_W], &t[MT_CONV2D_BWD_INPUT_DY])
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_bwd_input_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_bwd_input_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->dy = op->t[MT_CONV2D_BWD_INPUT_DY].ref;
        r->w = op->t[MT_CONV2D_BWD_INPUT_W].ref;
        r->dx = op->t[MT_CONV2D_BWD_INPUT_DX].ref;
        conv_prepare_geom(op->a, &op->t[MT_CONV2D_BWD_INPUT_DX], &op->t[MT_CONV2D_BWD_INPUT_W],
            &op->t[MT_CONV2D_BWD_INPUT_DY], &r->g);
    }
    return sizeof(conv_bwd_input_rec_t);
}

static int conv_bwd_input_run(mt_ctx_t *ctx, const void *rec) {
    const conv_bwd_input_rec_t *r = rec;
    const conv_geom_t *g = &r->g;
    const float *dy = MT_F32(ctx, r->dy), *w = MT_F32(ctx, r->w);
    float *dx = MT_F32(ctx, r->dx);
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW, taps = (size_t)g->KH * g->KW;
    memset(dx, 0, (size_t)g->C * plane * sizeof(float));
    pass_t p;
    pass_of(g, &p);
    if (g->sh == 1 && g->sw == 1) {
        /* stride 1: a convolution of dy with the flipped filter, padded by the rest of its extent */
        pass_t q = p;
        q.IH = p.OH;
        q.IW = p.OW;
        q.OH = p.IH;
        q.OW = p.IW;
        q.pt = p.dh * (p.KH - 1) - p.pt;
        q.pl = p.dw * (p.KW - 1) - p.pl;
        for (uint32_t c = 0; c < g->C; c++) {
            uint32_t gi = c / g->Cg, cg = c - gi * g->Cg;
            for (uint32_t o = gi * g->Og; o < (gi + 1) * g->Og; o++) {
                const float *last = w + (o * g->Cg + cg) * taps + taps - 1;
                pass_gather(&q, dy + o * oplane, dx + c * plane, last, -(int32_t)g->KW, -1);
            }
        }
    } else {
        for (uint32_t o = 0; o < g->O; o++) {
            uint32_t c0 = (o / g->Og) * g->Cg;
            for (uint32_t c = 0; c < g->Cg; c++) {
                pass_scatter(&p, dy + o * oplane, dx + (c0 + c) * plane, w + (o * g->Cg + c) * taps);
            }
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_BWD_INPUT = {conv_bwd_input_check, conv_bwd_input_prepare, conv_bwd_input_run};

/* ---- CONV2D_BWD_WEIGHT: each weight's gradient summed completely, then handed
 * to the sink, so with batch 1 no gradient buffer exists. The trained part is
 * output channels [o0, o1) and input channels (within a group) [i0, i1). ---- */

typedef struct {
    mt_rec_t h;
    uint32_t dy, x;
    mt_sink_rec_t s;
    conv_geom_t g;
    uint32_t o0, o1, i0, i1;
} conv_bwd_weight_rec_t;

static int conv_bwd_weight_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *w = &t[MT_CONV2D_BWD_WEIGHT_W];
    const int32_t *a = op->a;
    return conv_check_shapes(a, &t[MT_CONV2D_BWD_WEIGHT_X], w, &t[MT_CONV2D_BWD_WEIGHT_DY])
           && mt_range_ok(a[MT_CONV2D_BWD_WEIGHT_A_O_BEGIN], a[MT_CONV2D_BWD_WEIGHT_A_O_COUNT], w->dim[0])
           && mt_range_ok(a[MT_CONV2D_BWD_WEIGHT_A_I_BEGIN], a[MT_CONV2D_BWD_WEIGHT_A_I_COUNT], w->dim[1])
           && mt_sink_check(ctx, w, &t[MT_CONV2D_BWD_WEIGHT_M], &t[MT_CONV2D_BWD_WEIGHT_ACC], 1) ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_bwd_weight_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_bwd_weight_rec_t *r = rec;
    if (r != NULL) {
        const int32_t *a = op->a;
        const mt_tensor_t *t = op->t;
        r->dy = t[MT_CONV2D_BWD_WEIGHT_DY].ref;
        r->x = t[MT_CONV2D_BWD_WEIGHT_X].ref;
        mt_sink_prepare(ctx, &t[MT_CONV2D_BWD_WEIGHT_W], &t[MT_CONV2D_BWD_WEIGHT_M], &t[MT_CONV2D_BWD_WEIGHT_ACC],
            &r->s);
        conv_prepare_geom(a, &t[MT_CONV2D_BWD_WEIGHT_X], &t[MT_CONV2D_BWD_WEIGHT_W], &t[MT_CONV2D_BWD_WEIGHT_DY],
            &r->g);
        r->o0 = (uint32_t)a[MT_CONV2D_BWD_WEIGHT_A_O_BEGIN];
        r->o1 = r->o0 + (uint32_t)a[MT_CONV2D_BWD_WEIGHT_A_O_COUNT];
        r->i0 = (uint32_t)a[MT_CONV2D_BWD_WEIGHT_A_I_BEGIN];
        r->i1 = r->i0 + (uint32_t)a[MT_CONV2D_BWD_WEIGHT_A_I_COUNT];
    }
    return sizeof(conv_bwd_weight_rec_t);
}

static int conv_bwd_weight_run(mt_ctx_t *ctx, const void *rec) {
    const conv_bwd_weight_rec_t *r = rec;
    const conv_geom_t *g = &r->g;
    const float *dy = MT_F32(ctx, r->dy), *x = MT_F32(ctx, r->x);
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW;
    pass_t p;
    pass_of(g, &p);
    for (uint32_t o = r->o0; o < r->o1; o++) {
        const float *dyo = dy + o * oplane;
        const float *xg = x + (o / g->Og) * g->Cg * plane;
        for (uint32_t c = r->i0; c < r->i1; c++) {
            for (int32_t ky = 0; ky < p.KH; ky++) {
                for (int32_t kx = 0; kx < p.KW; kx++) {
                    float acc = tap_gradient(&p, xg + c * plane, dyo, ky, kx);
                    mt_sink_vec(ctx, &r->s, ((o * g->Cg + c) * g->KH + (uint32_t)ky) * g->KW + (uint32_t)kx, &acc, 1);
                }
            }
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_BWD_WEIGHT = {conv_bwd_weight_check, conv_bwd_weight_prepare, conv_bwd_weight_run};

/* ---- the geometry, for the int8 convolution (mt_conv_q8.c) ---- */

int mt_conv_check_shapes(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y) {
    return conv_check_shapes(a, x, w, y);
}

void mt_conv_prepare_geom(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y,
    mt_conv_geom_t *g) {
    conv_prepare_geom(a, x, w, y, g);
}
