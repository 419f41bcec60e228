/* microtrain core: 2-D convolution (any group count) forward and backward.
 * Reference kernels: plain loops, float32 accumulation. 1-D convolutions reach
 * here as H = 1. */
#include <string.h>
#include "mt_kernels.h"

typedef struct {
    int32_t C, H, W, O, OH, OW, KH, KW, G, Cg, Og;
    int32_t sh, sw, pt, pl, dh, dw;
} conv_geom_t;

static void geom(const mt_op_t *op, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y,
    conv_geom_t *g) {
    g->C = (int32_t)x->dim[1];
    g->H = (int32_t)x->dim[2];
    g->W = (int32_t)x->dim[3];
    g->O = (int32_t)w->dim[0];
    g->Cg = (int32_t)w->dim[1];
    g->KH = (int32_t)w->dim[2];
    g->KW = (int32_t)w->dim[3];
    g->OH = (int32_t)y->dim[2];
    g->OW = (int32_t)y->dim[3];
    g->sh = op->a[MT_CONV2D_A_STRIDE_H];
    g->sw = op->a[MT_CONV2D_A_STRIDE_W];
    g->pt = op->a[MT_CONV2D_A_PAD_T];
    g->pl = op->a[MT_CONV2D_A_PAD_L];
    g->dh = op->a[MT_CONV2D_A_DIL_H];
    g->dw = op->a[MT_CONV2D_A_DIL_W];
    g->G = op->a[MT_CONV2D_A_GROUPS];
    g->Og = g->O / g->G;
}

void mt_k_conv2d(const mt_op_t *op) {
    conv_geom_t g;
    geom(op, &op->t[MT_CONV2D_X], &op->t[MT_CONV2D_W], &op->t[MT_CONV2D_Y], &g);
    const float *x = op->t[MT_CONV2D_X].data, *w = op->t[MT_CONV2D_W].data, *b = op->t[MT_CONV2D_B].data;
    float *y = op->t[MT_CONV2D_Y].data;
    for (int32_t o = 0; o < g.O; o++) {
        const int32_t c0 = (o / g.Og) * g.Cg;
        const float *wo = w + (size_t)o * g.Cg * g.KH * g.KW;
        for (int32_t oy = 0; oy < g.OH; oy++) {
            for (int32_t ox = 0; ox < g.OW; ox++) {
                float acc = b != NULL ? b[o] : 0.0f;
                for (int32_t c = 0; c < g.Cg; c++) {
                    const float *xc = x + (size_t)(c0 + c) * g.H * g.W;
                    const float *wc = wo + (size_t)c * g.KH * g.KW;
                    for (int32_t ky = 0; ky < g.KH; ky++) {
                        int32_t iy = oy * g.sh - g.pt + ky * g.dh;
                        if (iy < 0 || iy >= g.H) {
                            continue;
                        }
                        for (int32_t kx = 0; kx < g.KW; kx++) {
                            int32_t ix = ox * g.sw - g.pl + kx * g.dw;
                            if (ix >= 0 && ix < g.W) {
                                acc += xc[iy * g.W + ix] * wc[ky * g.KW + kx];
                            }
                        }
                    }
                }
                y[((size_t)o * g.OH + oy) * g.OW + ox] = acc;
            }
        }
    }
}

/* dx = transposed convolution of dy with w, scattered output by output. */
void mt_k_conv2d_bwd_input(const mt_op_t *op) {
    conv_geom_t g;
    geom(op, &op->t[MT_CONV2D_BWD_INPUT_DX], &op->t[MT_CONV2D_BWD_INPUT_W], &op->t[MT_CONV2D_BWD_INPUT_DY], &g);
    const float *dy = op->t[MT_CONV2D_BWD_INPUT_DY].data, *w = op->t[MT_CONV2D_BWD_INPUT_W].data;
    float *dx = op->t[MT_CONV2D_BWD_INPUT_DX].data;
    memset(dx, 0, (size_t)op->t[MT_CONV2D_BWD_INPUT_DX].n * sizeof(float));
    for (int32_t o = 0; o < g.O; o++) {
        const int32_t c0 = (o / g.Og) * g.Cg;
        const float *wo = w + (size_t)o * g.Cg * g.KH * g.KW;
        for (int32_t oy = 0; oy < g.OH; oy++) {
            for (int32_t ox = 0; ox < g.OW; ox++) {
                const float d = dy[((size_t)o * g.OH + oy) * g.OW + ox];
                for (int32_t c = 0; c < g.Cg; c++) {
                    float *dxc = dx + (size_t)(c0 + c) * g.H * g.W;
                    const float *wc = wo + (size_t)c * g.KH * g.KW;
                    for (int32_t ky = 0; ky < g.KH; ky++) {
                        int32_t iy = oy * g.sh - g.pt + ky * g.dh;
                        if (iy < 0 || iy >= g.H) {
                            continue;
                        }
                        for (int32_t kx = 0; kx < g.KW; kx++) {
                            int32_t ix = ox * g.sw - g.pl + kx * g.dw;
                            if (ix >= 0 && ix < g.W) {
                                dxc[iy * g.W + ix] += d * wc[ky * g.KW + kx];
                            }
                        }
                    }
                }
            }
        }
    }
}

/* Each weight gradient element is summed completely and handed to the sink at
 * once, so with batch 1 no gradient buffer exists: the update is fused in place. */
void mt_k_conv2d_bwd_weight(const mt_op_t *op, const mt_sink_t *sink) {
    conv_geom_t g;
    geom(op, &op->t[MT_CONV2D_BWD_WEIGHT_X], &op->t[MT_CONV2D_BWD_WEIGHT_W], &op->t[MT_CONV2D_BWD_WEIGHT_DY], &g);
    const float *dy = op->t[MT_CONV2D_BWD_WEIGHT_DY].data, *x = op->t[MT_CONV2D_BWD_WEIGHT_X].data;
    const int32_t o0 = op->a[MT_CONV2D_BWD_WEIGHT_A_O_BEGIN], o1 = o0 + op->a[MT_CONV2D_BWD_WEIGHT_A_O_COUNT];
    const int32_t i0 = op->a[MT_CONV2D_BWD_WEIGHT_A_I_BEGIN], i1 = i0 + op->a[MT_CONV2D_BWD_WEIGHT_A_I_COUNT];
    for (int32_t o = o0; o < o1; o++) {
        const int32_t c0 = (o / g.Og) * g.Cg;
        const float *dyo = dy + (size_t)o * g.OH * g.OW;
        for (int32_t c = i0; c < i1; c++) {
            const float *xc = x + (size_t)(c0 + c) * g.H * g.W;
            for (int32_t ky = 0; ky < g.KH; ky++) {
                for (int32_t kx = 0; kx < g.KW; kx++) {
                    float acc = 0.0f;
                    for (int32_t oy = 0; oy < g.OH; oy++) {
                        int32_t iy = oy * g.sh - g.pt + ky * g.dh;
                        if (iy < 0 || iy >= g.H) {
                            continue;
                        }
                        for (int32_t ox = 0; ox < g.OW; ox++) {
                            int32_t ix = ox * g.sw - g.pl + kx * g.dw;
                            if (ix >= 0 && ix < g.W) {
                                acc += dyo[oy * g.OW + ox] * xc[iy * g.W + ix];
                            }
                        }
                    }
                    mt_sink_put(sink, (((uint32_t)o * g.Cg + c) * g.KH + ky) * g.KW + kx, acc);
                }
            }
        }
    }
}

/* Bias gradient: dy summed over everything after the channel axis. */
void mt_k_bias_bwd(const mt_op_t *op, const mt_sink_t *sink) {
    const mt_tensor_t *t = &op->t[MT_BIAS_BWD_DY];
    const float *dy = t->data;
    const uint32_t per = t->n / t->dim[1];
    const int32_t o0 = op->a[MT_BIAS_BWD_A_O_BEGIN], o1 = o0 + op->a[MT_BIAS_BWD_A_O_COUNT];
    for (int32_t o = o0; o < o1; o++) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < per; i++) {
            acc += dy[(size_t)o * per + i];
        }
        mt_sink_put(sink, (uint32_t)o, acc);
    }
}
