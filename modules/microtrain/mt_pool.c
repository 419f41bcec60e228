/* microtrain core: max, average and global average pooling, forward and backward.
 * Windows are clipped to the input, so padding never reads memory; with
 * ceil_mode a window may hang past the padded edge. */
#include <string.h>
#include "mt_kernels.h"

typedef struct {
    int32_t C, H, W, OH, OW, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, include_pad;
} pool_geom_t;

static void geom(const mt_op_t *op, const mt_tensor_t *x, const mt_tensor_t *y, pool_geom_t *g) {
    const int32_t *a = op->a;
    g->C = (int32_t)x->dim[1];
    g->H = (int32_t)x->dim[2];
    g->W = (int32_t)x->dim[3];
    g->OH = (int32_t)y->dim[2];
    g->OW = (int32_t)y->dim[3];
    g->kh = a[MT_MAXPOOL_A_KERNEL_H];
    g->kw = a[MT_MAXPOOL_A_KERNEL_W];
    g->sh = a[MT_MAXPOOL_A_STRIDE_H];
    g->sw = a[MT_MAXPOOL_A_STRIDE_W];
    g->pt = a[MT_MAXPOOL_A_PAD_T];
    g->pl = a[MT_MAXPOOL_A_PAD_L];
    g->pb = a[MT_MAXPOOL_A_PAD_B];
    g->pr = a[MT_MAXPOOL_A_PAD_R];
    g->dh = a[MT_MAXPOOL_A_DIL_H];
    g->dw = a[MT_MAXPOOL_A_DIL_W];
    g->include_pad = a[MT_MAXPOOL_A_COUNT_INCLUDE_PAD];
}

/* Index into channel plane of the first maximum of window (oy, ox), scanning
 * rows then columns as PyTorch does; -1 if the window holds no input element. */
static int32_t window_argmax(const pool_geom_t *g, const float *xc, int32_t oy, int32_t ox) {
    int32_t best = -1;
    float m = 0.0f;
    for (int32_t ky = 0; ky < g->kh; ky++) {
        int32_t iy = oy * g->sh - g->pt + ky * g->dh;
        if (iy < 0 || iy >= g->H) {
            continue;
        }
        for (int32_t kx = 0; kx < g->kw; kx++) {
            int32_t ix = ox * g->sw - g->pl + kx * g->dw;
            if (ix >= 0 && ix < g->W && (best < 0 || xc[iy * g->W + ix] > m)) {
                best = iy * g->W + ix;
                m = xc[best];
            }
        }
    }
    return best;
}

void mt_k_maxpool(const mt_op_t *op) {
    pool_geom_t g;
    geom(op, &op->t[MT_MAXPOOL_X], &op->t[MT_MAXPOOL_Y], &g);
    const float *x = op->t[MT_MAXPOOL_X].data;
    float *y = op->t[MT_MAXPOOL_Y].data;
    for (int32_t c = 0; c < g.C; c++) {
        const float *xc = x + (size_t)c * g.H * g.W;
        for (int32_t oy = 0; oy < g.OH; oy++) {
            for (int32_t ox = 0; ox < g.OW; ox++) {
                int32_t i = window_argmax(&g, xc, oy, ox);
                y[((size_t)c * g.OH + oy) * g.OW + ox] = i >= 0 ? xc[i] : 0.0f;
            }
        }
    }
}

void mt_k_maxpool_bwd(const mt_op_t *op) {
    pool_geom_t g;
    geom(op, &op->t[MT_MAXPOOL_BWD_X], &op->t[MT_MAXPOOL_BWD_DY], &g);
    const float *x = op->t[MT_MAXPOOL_BWD_X].data, *dy = op->t[MT_MAXPOOL_BWD_DY].data;
    float *dx = op->t[MT_MAXPOOL_BWD_DX].data;
    memset(dx, 0, (size_t)op->t[MT_MAXPOOL_BWD_DX].n * sizeof(float));
    for (int32_t c = 0; c < g.C; c++) {
        const size_t plane = (size_t)c * g.H * g.W;
        for (int32_t oy = 0; oy < g.OH; oy++) {
            for (int32_t ox = 0; ox < g.OW; ox++) {
                int32_t i = window_argmax(&g, x + plane, oy, ox);
                if (i >= 0) {
                    dx[plane + (size_t)i] += dy[((size_t)c * g.OH + oy) * g.OW + ox];
                }
            }
        }
    }
}

/* Divisor of window (oy, ox): with count_include_pad, the window clipped to the
 * padded input (PyTorch's rule); otherwise the number of input elements in it. */
static int32_t window_count(const pool_geom_t *g, int32_t oy, int32_t ox) {
    int32_t ny = 0, nx = 0, py = 0, px = 0;
    for (int32_t ky = 0; ky < g->kh; ky++) {
        int32_t iy = oy * g->sh - g->pt + ky * g->dh;
        ny += iy >= 0 && iy < g->H;
        py += iy < g->H + g->pb;
    }
    for (int32_t kx = 0; kx < g->kw; kx++) {
        int32_t ix = ox * g->sw - g->pl + kx * g->dw;
        nx += ix >= 0 && ix < g->W;
        px += ix < g->W + g->pr;
    }
    return g->include_pad ? py * px : ny * nx;
}

void mt_k_avgpool(const mt_op_t *op) {
    pool_geom_t g;
    geom(op, &op->t[MT_AVGPOOL_X], &op->t[MT_AVGPOOL_Y], &g);
    const float *x = op->t[MT_AVGPOOL_X].data;
    float *y = op->t[MT_AVGPOOL_Y].data;
    for (int32_t c = 0; c < g.C; c++) {
        const float *xc = x + (size_t)c * g.H * g.W;
        for (int32_t oy = 0; oy < g.OH; oy++) {
            for (int32_t ox = 0; ox < g.OW; ox++) {
                float acc = 0.0f;
                for (int32_t ky = 0; ky < g.kh; ky++) {
                    int32_t iy = oy * g.sh - g.pt + ky * g.dh;
                    for (int32_t kx = 0; kx < g.kw && iy >= 0 && iy < g.H; kx++) {
                        int32_t ix = ox * g.sw - g.pl + kx * g.dw;
                        if (ix >= 0 && ix < g.W) {
                            acc += xc[iy * g.W + ix];
                        }
                    }
                }
                int32_t n = window_count(&g, oy, ox);
                y[((size_t)c * g.OH + oy) * g.OW + ox] = n > 0 ? acc / (float)n : 0.0f;
            }
        }
    }
}

void mt_k_avgpool_bwd(const mt_op_t *op) {
    pool_geom_t g;
    geom(op, &op->t[MT_AVGPOOL_BWD_DX], &op->t[MT_AVGPOOL_BWD_DY], &g);
    const float *dy = op->t[MT_AVGPOOL_BWD_DY].data;
    float *dx = op->t[MT_AVGPOOL_BWD_DX].data;
    memset(dx, 0, (size_t)op->t[MT_AVGPOOL_BWD_DX].n * sizeof(float));
    for (int32_t c = 0; c < g.C; c++) {
        float *dxc = dx + (size_t)c * g.H * g.W;
        for (int32_t oy = 0; oy < g.OH; oy++) {
            for (int32_t ox = 0; ox < g.OW; ox++) {
                int32_t n = window_count(&g, oy, ox);
                if (n == 0) {
                    continue;
                }
                const float d = dy[((size_t)c * g.OH + oy) * g.OW + ox] / (float)n;
                for (int32_t ky = 0; ky < g.kh; ky++) {
                    int32_t iy = oy * g.sh - g.pt + ky * g.dh;
                    for (int32_t kx = 0; kx < g.kw && iy >= 0 && iy < g.H; kx++) {
                        int32_t ix = ox * g.sw - g.pl + kx * g.dw;
                        if (ix >= 0 && ix < g.W) {
                            dxc[iy * g.W + ix] += d;
                        }
                    }
                }
            }
        }
    }
}

void mt_k_gap(const mt_op_t *op) {
    const mt_tensor_t *xt = &op->t[MT_GAP_X];
    const float *x = xt->data;
    float *y = op->t[MT_GAP_Y].data;
    const uint32_t C = xt->dim[1], hw = xt->dim[2] * xt->dim[3];
    for (uint32_t c = 0; c < C; c++) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < hw; i++) {
            acc += x[(size_t)c * hw + i];
        }
        y[c] = acc / (float)hw;
    }
}

void mt_k_gap_bwd(const mt_op_t *op) {
    const mt_tensor_t *dxt = &op->t[MT_GAP_BWD_DX];
    const float *dy = op->t[MT_GAP_BWD_DY].data;
    float *dx = dxt->data;
    const uint32_t C = dxt->dim[1], hw = dxt->dim[2] * dxt->dim[3];
    for (uint32_t c = 0; c < C; c++) {
        const float d = dy[c] / (float)hw;
        for (uint32_t i = 0; i < hw; i++) {
            dx[(size_t)c * hw + i] = d;
        }
    }
}
