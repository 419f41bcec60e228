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
 * prepare picks one of three implementations for the geometry (the record's kind):
 *   KIND_K3          filters 3 wide at stride 1 (3x3, 2x3, 1-D k=3; depthwise
 *                    included): whole rows with the filter in registers
 *   KIND_POINTWISE   1x1 at stride 1 without padding: a matrix product per group
 *   KIND_GENERIC     anything else (strides, dilations, other sizes): tap by tap
 * All three give each output the same order of summation (bias, then channels,
 * filter rows, filter columns), and each weight gradient its terms in output order.
 */
#include <string.h>
#include "mt_q8.h"

#define MT_W8_BUF 64   /* floats of dequantized weights on the stack (W8 ops, below): filters of <= 64 taps */

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

/* ---- 3-tap rows: filters 3 wide (at most 3 high), stride 1, dilation 1 ----
 * Output column j reads input columns j - pl .. j - pl + 2. The interior
 * columns [pl, OW - pr) read only the input, four outputs a turn, with the
 * filter in registers for the whole pass; the at most two edge columns on each
 * side take the taps that exist (PyTorch's zero padding adds nothing else); a
 * filter row whose input row is outside is skipped. Every output sums its taps
 * in (row, column) order, and every gradient its terms in output order. */

typedef struct {
    int32_t pl, pr;               /* edge columns on the left and on the right */
    int32_t iw, ow;
} cols_t;

/* One filter row (w0, w1, w2) over input row r, added into output row o. */
MT_INLINE void k3_row(float *o, const float *r, const cols_t *c, float w0, float w1, float w2) {
    for (int32_t j = 0; j < c->pl; j++) {          /* left edge: the taps at columns >= 0 */
        const int32_t i = j - c->pl;
        float s = o[j];
        if (i >= 0) {
            s += r[i] * w0;
        }
        if (i + 1 >= 0) {
            s += r[i + 1] * w1;
        }
        o[j] = s + r[i + 2] * w2;
    }
    float *oj = o + c->pl;
    const float *x = r;
    int32_t n = c->ow - c->pl - c->pr;
    for (; n >= 4; n -= 4) {
        const float x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3], x4 = x[4], x5 = x[5];
        oj[0] = ((oj[0] + x0 * w0) + x1 * w1) + x2 * w2;
        oj[1] = ((oj[1] + x1 * w0) + x2 * w1) + x3 * w2;
        oj[2] = ((oj[2] + x2 * w0) + x3 * w1) + x4 * w2;
        oj[3] = ((oj[3] + x3 * w0) + x4 * w1) + x5 * w2;
        oj += 4;
        x += 4;
    }
    for (; n > 0; n--) {
        *oj = ((*oj + x[0] * w0) + x[1] * w1) + x[2] * w2;
        oj++;
        x++;
    }
    for (int32_t j = c->ow - c->pr; j < c->ow; j++) {   /* right edge: taps inside the row */
        const int32_t i = j - c->pl;
        float s = o[j] + r[i] * w0;
        if (i + 1 < c->iw) {
            s += r[i + 1] * w1;
        }
        o[j] = s;
    }
}

/* Gradient of one filter row: g[t] += sum_j d[j] * v(j - pl + t), in j order. */
MT_INLINE void k3_row_grad(const float *d, const float *r, const cols_t *c, float *g) {
    float g0 = g[0], g1 = g[1], g2 = g[2];
    for (int32_t j = 0; j < c->pl; j++) {
        const int32_t i = j - c->pl;
        if (i >= 0) {
            g0 += d[j] * r[i];
        }
        if (i + 1 >= 0) {
            g1 += d[j] * r[i + 1];
        }
        g2 += d[j] * r[i + 2];
    }
    const float *dj = d + c->pl, *x = r;
    int32_t n = c->ow - c->pl - c->pr;
    for (; n >= 2; n -= 2) {
        const float d0 = dj[0], d1 = dj[1], x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
        g0 += d0 * x0;
        g1 += d0 * x1;
        g2 += d0 * x2;
        g0 += d1 * x1;
        g1 += d1 * x2;
        g2 += d1 * x3;
        dj += 2;
        x += 2;
    }
    if (n > 0) {
        g0 += dj[0] * x[0];
        g1 += dj[0] * x[1];
        g2 += dj[0] * x[2];
    }
    for (int32_t j = c->ow - c->pr; j < c->ow; j++) {
        const int32_t i = j - c->pl;
        g0 += d[j] * r[i];
        if (i + 1 < c->iw) {
            g1 += d[j] * r[i + 1];
        }
    }
    g[0] = g0;
    g[1] = g1;
    g[2] = g2;
}

/* An edge output of three filter rows: s plus the taps inside the input, rows in
 * order. i = j - pl is its first tap's column: -1 or -2 on the left (taps from
 * -i on, at columns 0...), iw - 2 or iw - 1 on the right (taps up to iw - 1 - i). */
MT_INLINE float k3_edge3(float s, int32_t i, int32_t iw, const float *r0, const float *r1, const float *r2,
    const float *w) {
    if (i == -1) {
        s = (s + r0[0] * w[1]) + r0[1] * w[2];
        s = (s + r1[0] * w[4]) + r1[1] * w[5];
        return (s + r2[0] * w[7]) + r2[1] * w[8];
    }
    if (i == -2) {
        s += r0[0] * w[2];
        s += r1[0] * w[5];
        return s + r2[0] * w[8];
    }
    if (i == iw - 2) {
        s = (s + r0[i] * w[0]) + r0[i + 1] * w[1];
        s = (s + r1[i] * w[3]) + r1[i + 1] * w[4];
        return (s + r2[i] * w[6]) + r2[i + 1] * w[7];
    }
    s += r0[i] * w[0];
    s += r1[i] * w[3];
    return s + r2[i] * w[6];
}

/* Three filter rows w (row-major 3x3) over input rows r0, r1, r2. */
MT_INLINE void k3_rows3(float *o, const float *r0, const float *r1, const float *r2, const cols_t *c, const float *w) {
    for (int32_t j = 0; j < c->pl; j++) {
        o[j] = k3_edge3(o[j], j - c->pl, c->iw, r0, r1, r2, w);
    }
    const float w00 = w[0], w01 = w[1], w02 = w[2], w10 = w[3], w11 = w[4], w12 = w[5];
    const float w20 = w[6], w21 = w[7], w22 = w[8];
    float *oj = o + c->pl;
    float *const end = o + (c->ow - c->pr);
    const float *x = r0, *y = r1, *z = r2;
    for (; end - oj >= 4; oj += 4, x += 4, y += 4, z += 4) {
        float s0 = oj[0], s1 = oj[1], s2 = oj[2], s3 = oj[3];
        float v0 = x[0], v1 = x[1], v2 = x[2], v3 = x[3], v4 = x[4], v5 = x[5];
        s0 = ((s0 + v0 * w00) + v1 * w01) + v2 * w02;
        s1 = ((s1 + v1 * w00) + v2 * w01) + v3 * w02;
        s2 = ((s2 + v2 * w00) + v3 * w01) + v4 * w02;
        s3 = ((s3 + v3 * w00) + v4 * w01) + v5 * w02;
        v0 = y[0], v1 = y[1], v2 = y[2], v3 = y[3], v4 = y[4], v5 = y[5];
        s0 = ((s0 + v0 * w10) + v1 * w11) + v2 * w12;
        s1 = ((s1 + v1 * w10) + v2 * w11) + v3 * w12;
        s2 = ((s2 + v2 * w10) + v3 * w11) + v4 * w12;
        s3 = ((s3 + v3 * w10) + v4 * w11) + v5 * w12;
        v0 = z[0], v1 = z[1], v2 = z[2], v3 = z[3], v4 = z[4], v5 = z[5];
        s0 = ((s0 + v0 * w20) + v1 * w21) + v2 * w22;
        s1 = ((s1 + v1 * w20) + v2 * w21) + v3 * w22;
        s2 = ((s2 + v2 * w20) + v3 * w21) + v4 * w22;
        s3 = ((s3 + v3 * w20) + v4 * w21) + v5 * w22;
        oj[0] = s0;
        oj[1] = s1;
        oj[2] = s2;
        oj[3] = s3;
    }
    if (end - oj >= 2) {
        float s0 = oj[0], s1 = oj[1];
        s0 = ((s0 + x[0] * w00) + x[1] * w01) + x[2] * w02;
        s1 = ((s1 + x[1] * w00) + x[2] * w01) + x[3] * w02;
        s0 = ((s0 + y[0] * w10) + y[1] * w11) + y[2] * w12;
        s1 = ((s1 + y[1] * w10) + y[2] * w11) + y[3] * w12;
        s0 = ((s0 + z[0] * w20) + z[1] * w21) + z[2] * w22;
        s1 = ((s1 + z[1] * w20) + z[2] * w21) + z[3] * w22;
        oj[0] = s0;
        oj[1] = s1;
        oj += 2;
        x += 2;
        y += 2;
        z += 2;
    }
    for (; oj < end; oj++, x++, y++, z++) {
        float s = *oj;
        s = ((s + x[0] * w00) + x[1] * w01) + x[2] * w02;
        s = ((s + y[0] * w10) + y[1] * w11) + y[2] * w12;
        s = ((s + z[0] * w20) + z[1] * w21) + z[2] * w22;
        *oj = s;
    }
    for (int32_t j = c->ow - c->pr; j < c->ow; j++) {
        o[j] = k3_edge3(o[j], j - c->pl, c->iw, r0, r1, r2, w);
    }
}

/* Gradient of three filter rows: g[3*ky + t] += sum_j d[j] * v_ky(j - pl + t), in j order. */
MT_INLINE void k3_rows3_grad(const float *d, const float *r0, const float *r1, const float *r2, const cols_t *c,
    float *g) {
    if (c->pl > 0) {   /* the left edge columns, one filter row at a time */
        const cols_t left = {c->pl, 0, c->iw, c->pl};
        k3_row_grad(d, r0, &left, g);
        k3_row_grad(d, r1, &left, g + 3);
        k3_row_grad(d, r2, &left, g + 6);
    }
    float g00 = g[0], g01 = g[1], g02 = g[2], g10 = g[3], g11 = g[4], g12 = g[5], g20 = g[6], g21 = g[7], g22 = g[8];
    const float *dj = d + c->pl, *const end = d + (c->ow - c->pr), *x = r0, *y = r1, *z = r2;
    for (; end - dj >= 4; dj += 4, x += 4, y += 4, z += 4) {
        const float d0 = dj[0], d1 = dj[1], d2 = dj[2], d3 = dj[3];
        float v0 = x[0], v1 = x[1], v2 = x[2], v3 = x[3], v4 = x[4], v5 = x[5];
        g00 = (((g00 + d0 * v0) + d1 * v1) + d2 * v2) + d3 * v3;
        g01 = (((g01 + d0 * v1) + d1 * v2) + d2 * v3) + d3 * v4;
        g02 = (((g02 + d0 * v2) + d1 * v3) + d2 * v4) + d3 * v5;
        v0 = y[0], v1 = y[1], v2 = y[2], v3 = y[3], v4 = y[4], v5 = y[5];
        g10 = (((g10 + d0 * v0) + d1 * v1) + d2 * v2) + d3 * v3;
        g11 = (((g11 + d0 * v1) + d1 * v2) + d2 * v3) + d3 * v4;
        g12 = (((g12 + d0 * v2) + d1 * v3) + d2 * v4) + d3 * v5;
        v0 = z[0], v1 = z[1], v2 = z[2], v3 = z[3], v4 = z[4], v5 = z[5];
        g20 = (((g20 + d0 * v0) + d1 * v1) + d2 * v2) + d3 * v3;
        g21 = (((g21 + d0 * v1) + d1 * v2) + d2 * v3) + d3 * v4;
        g22 = (((g22 + d0 * v2) + d1 * v3) + d2 * v4) + d3 * v5;
    }
    for (; dj < end; dj++, x++, y++, z++) {
        const float d0 = dj[0];
        g00 += d0 * x[0];
        g01 += d0 * x[1];
        g02 += d0 * x[2];
        g10 += d0 * y[0];
        g11 += d0 * y[1];
        g12 += d0 * y[2];
        g20 += d0 * z[0];
        g21 += d0 * z[1];
        g22 += d0 * z[2];
    }
    g[0] = g00;
    g[1] = g01;
    g[2] = g02;
    g[3] = g10;
    g[4] = g11;
    g[5] = g12;
    g[6] = g20;
    g[7] = g21;
    g[8] = g22;
    for (int32_t j = c->ow - c->pr; j < c->ow; j++) {   /* right edge: taps up to iw - 1 - i */
        const int32_t i = j - c->pl;
        const float dv = d[j];
        g[0] += dv * r0[i];
        g[3] += dv * r1[i];
        g[6] += dv * r2[i];
        if (i + 1 < c->iw) {
            g[1] += dv * r0[i + 1];
            g[4] += dv * r1[i + 1];
            g[7] += dv * r2[i + 1];
        }
    }
}

/* pass_gather for a 3-wide filter w (row-major, KH rows): interior rows (all KH
 * filter rows inside the input) take three rows at once. */
static void pass_gather_k3(const pass_t *p, const float *in, float *out, const float *w) {
    const cols_t c = {p->pl, p->OW - p->IW + 2 - p->pl, p->IW, p->OW};
    for (int32_t oy = 0; oy < p->OH; oy++) {
        int32_t ky0, ky1;
        mt_window_range(oy - p->pt, 1, p->KH, p->IH, &ky0, &ky1);
        float *o = out + (size_t)oy * p->OW;
        const float *r = in + (size_t)(oy - p->pt + ky0) * p->IW;   /* under filter row ky0 */
        if (ky1 - ky0 == 3) {
            k3_rows3(o, r, r + p->IW, r + 2 * p->IW, &c, w);
            continue;
        }
        for (int32_t ky = ky0; ky < ky1; ky++, r += p->IW) {
            k3_row(o, r, &c, w[3 * ky], w[3 * ky + 1], w[3 * ky + 2]);
        }
    }
}

/* g[3*ky + kx] += the gradient of tap (ky, kx) over the whole pass, in output order. */
static void pass_grad_k3(const pass_t *p, const float *x, const float *dy, float *g) {
    const cols_t c = {p->pl, p->OW - p->IW + 2 - p->pl, p->IW, p->OW};
    for (int32_t oy = 0; oy < p->OH; oy++) {
        int32_t ky0, ky1;
        mt_window_range(oy - p->pt, 1, p->KH, p->IH, &ky0, &ky1);
        const float *r = x + (size_t)(oy - p->pt + ky0) * p->IW, *d = dy + (size_t)oy * p->OW;
        if (ky1 - ky0 == 3) {
            k3_rows3_grad(d, r, r + p->IW, r + 2 * p->IW, &c, g);
            continue;
        }
        for (int32_t ky = ky0; ky < ky1; ky++, r += p->IW) {
            k3_row_grad(d, r, &c, g + 3 * ky);
        }
    }
}

/* ---- pointwise: 1x1 filters, stride 1, no padding ----
 * Per group a matrix product over the P = H*W pixels: y[o][p] = b[o] +
 * sum_c w[o][c] x[c][p]; two output rows and four pixels a turn keep eight sums
 * in registers, and each sum runs over c in order, as the plane passes do. */

/* Y[r][p] = init[r] + sum_k A(r, k) X[k][p] for r < R, p < P; A(r, k) = a[r*ars + k*aks]
 * (the weight, or its transpose for the backward input pass). With acc, each sum starts from
 * acc[r][p] instead (acc may be Y itself). */
static void pw_product(const float *a, int32_t ars, int32_t aks, uint32_t R, uint32_t K, const float *X, uint32_t P,
    const float *init, const float *acc, float *Y) {
    uint32_t r = 0;
    for (; r + 2 <= R; r += 2) {
        float *y0 = Y + (size_t)r * P, *y1 = y0 + P;
        const float b0 = init != NULL ? init[r] : 0.0f, b1 = init != NULL ? init[r + 1] : 0.0f;
        uint32_t p = 0;
        for (; p + 4 <= P; p += 4) {
            float s00 = b0, s01 = b0, s02 = b0, s03 = b0, s10 = b1, s11 = b1, s12 = b1, s13 = b1;
            if (acc != NULL) {
                const float *c0 = acc + (size_t)r * P + p, *c1 = c0 + P;
                s00 = c0[0], s01 = c0[1], s02 = c0[2], s03 = c0[3], s10 = c1[0], s11 = c1[1], s12 = c1[2], s13 = c1[3];
            }
            const float *x = X + p, *a0 = a + (size_t)r * ars, *a1 = a0 + ars;
            for (uint32_t k = K; k > 0; k--) {
                const float w0 = *a0, w1 = *a1, x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
                s00 += w0 * x0;
                s01 += w0 * x1;
                s02 += w0 * x2;
                s03 += w0 * x3;
                s10 += w1 * x0;
                s11 += w1 * x1;
                s12 += w1 * x2;
                s13 += w1 * x3;
                a0 += aks;
                a1 += aks;
                x += P;
            }
            y0[p] = s00;
            y0[p + 1] = s01;
            y0[p + 2] = s02;
            y0[p + 3] = s03;
            y1[p] = s10;
            y1[p + 1] = s11;
            y1[p + 2] = s12;
            y1[p + 3] = s13;
        }
        for (; p < P; p++) {
            float s0 = acc != NULL ? acc[(size_t)r * P + p] : b0, s1 = acc != NULL ? acc[(size_t)(r + 1) * P + p] : b1;
            const float *x = X + p, *a0 = a + (size_t)r * ars, *a1 = a0 + ars;
            for (uint32_t k = K; k > 0; k--) {
                s0 += *a0 * *x;
                s1 += *a1 * *x;
                a0 += aks;
                a1 += aks;
                x += P;
            }
            y0[p] = s0;
            y1[p] = s1;
        }
    }
    for (; r < R; r++) {
        float *y0 = Y + (size_t)r * P;
        const float b0 = init != NULL ? init[r] : 0.0f;
        for (uint32_t p = 0; p < P; p++) {
            float s0 = acc != NULL ? acc[(size_t)r * P + p] : b0;
            const float *x = X + p, *a0 = a + (size_t)r * ars;
            for (uint32_t k = K; k > 0; k--) {
                s0 += *a0 * *x;
                a0 += aks;
                x += P;
            }
            y0[p] = s0;
        }
    }
}

/* g[c] = sum_p d[p] x[c][p] for c < n (x rows P apart), two rows a turn, each sum in p order. */
static void pw_grads(const float *d, const float *x, uint32_t n, uint32_t P, float *g) {
    uint32_t c = 0;
    for (; c + 2 <= n; c += 2) {
        const float *x0 = x + (size_t)c * P, *x1 = x0 + P, *dp = d;
        float s0 = 0.0f, s1 = 0.0f;
        uint32_t p = P;
        for (; p >= 2; p -= 2) {
            const float d0 = dp[0], d1 = dp[1];
            s0 = (s0 + d0 * x0[0]) + d1 * x0[1];
            s1 = (s1 + d0 * x1[0]) + d1 * x1[1];
            dp += 2;
            x0 += 2;
            x1 += 2;
        }
        if (p > 0) {
            s0 += dp[0] * x0[0];
            s1 += dp[0] * x1[0];
        }
        g[c] = s0;
        g[c + 1] = s1;
    }
    if (c < n) {
        const float *x0 = x + (size_t)c * P;
        float s0 = 0.0f;
        for (uint32_t p = 0; p < P; p++) {
            s0 += d[p] * x0[p];
        }
        g[c] = s0;
    }
}

/* ---- the ops ---- */

enum { KIND_GENERIC, KIND_K3, KIND_POINTWISE };

/* The 3-tap rows serve filters 3 wide and at most 3 high, stride 1, no dilation,
 * pads left and right of at most 2 (so the backward input pass, padded 2 - pad,
 * fits as well), rows of at least 3 and edges that do not meet. */
static uint8_t conv_kind(const conv_geom_t *g) {
    if (g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->pt == 0 && g->pl == 0 && g->OH == g->H
        && g->OW == g->W) {
        return KIND_POINTWISE;
    }
    int32_t pr = (int32_t)g->OW - (int32_t)g->W + 2 - g->pl;
    return g->KW == 3 && g->KH <= 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 && g->pl <= 2
           && pr >= 0 && pr <= 2 && g->W >= 3 && g->OW >= 3 && g->OW >= g->pl + (uint32_t)pr
           && g->W >= (2 - g->pl) + (uint32_t)(2 - pr) ? KIND_K3 : KIND_GENERIC;
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
        r->h.kind = conv_kind(&r->g);
    }
    return sizeof(conv_rec_t);
}

/* y = b + conv(x, w), or with acc (CONV2D_ACC) y = acc + conv(x, w); acc may be y itself. With
 * scratch (CONV2D_DW_INPLACE: depthwise, not KIND_POINTWISE) each input plane is copied there
 * before its output plane is written, so y may be x itself. */
static void conv_forward(const conv_geom_t *g, uint8_t kind, const float *x, const float *w, const float *b,
    const float *acc, float *scratch, float *y) {
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW, taps = (size_t)g->KH * g->KW;
    if (kind == KIND_POINTWISE) {
        for (uint32_t gi = 0; gi < g->G; gi++) {
            pw_product(w + gi * g->Og * g->Cg, (int32_t)g->Cg, 1, g->Og, g->Cg, x + gi * g->Cg * plane, (uint32_t)plane,
                b != NULL ? b + gi * g->Og : NULL, acc != NULL ? acc + gi * g->Og * oplane : NULL, y + gi * g->Og * oplane);
        }
        return;
    }
    pass_t p;
    pass_of(g, &p);
    for (uint32_t o = 0; o < g->O; o++) {
        const float *xg = x + (o / g->Og) * g->Cg * plane;
        if (scratch != NULL) {
            memcpy(scratch, xg, plane * sizeof(float));
            xg = scratch;
        }
        float *yo = y + o * oplane;
        if (acc != NULL) {   /* acc is y itself or overlaps it nowhere (the load-time alias check) */
            if (acc != y) {
                memcpy(yo, acc + o * oplane, oplane * sizeof(float));
            }
        } else {
            const float init = b != NULL ? b[o] : 0.0f;
            for (size_t i = 0; i < oplane; i++) {
                yo[i] = init;
            }
        }
        for (uint32_t c = 0; c < g->Cg; c++) {
            const float *k = w + (o * g->Cg + c) * taps;
            if (kind == KIND_K3) {
                pass_gather_k3(&p, xg + c * plane, yo, k);
            } else {
                pass_gather(&p, xg + c * plane, yo, k, g->KW, 1);
            }
        }
    }
}

static int conv_run(mt_ctx_t *ctx, const void *rec) {
    const conv_rec_t *r = rec;
    conv_forward(&r->g, r->h.kind, MT_F32(ctx, r->x), MT_F32(ctx, r->w), MT_F32(ctx, r->b), NULL, NULL,
        MT_F32(ctx, r->y));
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D = {conv_check, conv_prepare, conv_run};

/* ---- CONV2D_ACC: y = acc + conv(x, w), y may take acc's memory (split.py: the trained input
 * channels of a weight added to the frozen part's output without a second output tensor) ---- */

static int conv_acc_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return conv_check_shapes(op->a, &t[MT_CONV2D_ACC_X], &t[MT_CONV2D_ACC_W], &t[MT_CONV2D_ACC_Y])
           && t[MT_CONV2D_ACC_ACC].n == t[MT_CONV2D_ACC_Y].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_acc_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_rec_t *r = rec;   /* b holds acc */
    (void)ctx;
    if (r != NULL) {
        r->x = op->t[MT_CONV2D_ACC_X].ref;
        r->w = op->t[MT_CONV2D_ACC_W].ref;
        r->b = op->t[MT_CONV2D_ACC_ACC].ref;
        r->y = op->t[MT_CONV2D_ACC_Y].ref;
        conv_prepare_geom(op->a, &op->t[MT_CONV2D_ACC_X], &op->t[MT_CONV2D_ACC_W], &op->t[MT_CONV2D_ACC_Y], &r->g);
        r->h.kind = conv_kind(&r->g);
    }
    return sizeof(conv_rec_t);
}

static int conv_acc_run(mt_ctx_t *ctx, const void *rec) {
    const conv_rec_t *r = rec;
    conv_forward(&r->g, r->h.kind, MT_F32(ctx, r->x), MT_F32(ctx, r->w), NULL, MT_F32(ctx, r->b), NULL,
        MT_F32(ctx, r->y));
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_ACC = {conv_acc_check, conv_acc_prepare, conv_acc_run};

/* ---- CONV2D_DW_INPLACE: a depthwise CONV2D whose output may take its input's memory ----
 * Channel o of y depends on channel o of x only: each input plane is copied to the scratch
 * plane s before output plane o is written, and output plane o ends no later than input plane
 * o does (oplane <= plane), so y may overwrite x. The same passes as CONV2D, so the same bits. */

typedef struct {
    mt_rec_t h;
    uint32_t x, w, b, s, y;
    conv_geom_t g;
} conv_dw_rec_t;

static int conv_dw_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    if (!conv_check_shapes(op->a, &t[MT_CONV2D_DW_INPLACE_X], &t[MT_CONV2D_DW_INPLACE_W], &t[MT_CONV2D_DW_INPLACE_Y])) {
        return MT_E_SHAPE;
    }
    const mt_tensor_t *x = &t[MT_CONV2D_DW_INPLACE_X], *w = &t[MT_CONV2D_DW_INPLACE_W], *y = &t[MT_CONV2D_DW_INPLACE_Y];
    uint32_t C = x->dim[1];
    return (uint32_t)op->a[MT_CONV_A_GROUPS] == C && w->dim[0] == C && w->dim[1] == 1
           && t[MT_CONV2D_DW_INPLACE_S].n == x->dim[2] * x->dim[3] && y->dim[2] * y->dim[3] <= x->dim[2] * x->dim[3]
           && (t[MT_CONV2D_DW_INPLACE_B].n == 0 || t[MT_CONV2D_DW_INPLACE_B].n == C) ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_dw_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_dw_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->x = op->t[MT_CONV2D_DW_INPLACE_X].ref;
        r->w = op->t[MT_CONV2D_DW_INPLACE_W].ref;
        r->b = op->t[MT_CONV2D_DW_INPLACE_B].ref;
        r->s = op->t[MT_CONV2D_DW_INPLACE_S].ref;
        r->y = op->t[MT_CONV2D_DW_INPLACE_Y].ref;
        conv_prepare_geom(op->a, &op->t[MT_CONV2D_DW_INPLACE_X], &op->t[MT_CONV2D_DW_INPLACE_W],
            &op->t[MT_CONV2D_DW_INPLACE_Y], &r->g);
        r->h.kind = conv_kind(&r->g) == KIND_K3 ? KIND_K3 : KIND_GENERIC;
    }
    return sizeof(conv_dw_rec_t);
}

static int conv_dw_run(mt_ctx_t *ctx, const void *rec) {
    const conv_dw_rec_t *r = rec;
    conv_forward(&r->g, r->h.kind, MT_F32(ctx, r->x), MT_F32(ctx, r->w), MT_F32(ctx, r->b), NULL, MT_F32(ctx, r->s),
        MT_F32(ctx, r->y));
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_DW_INPLACE = {conv_dw_check, conv_dw_prepare, conv_dw_run};

/* ---- CONV2D_PW_INPLACE: a 1x1 CONV2D with O <= C outputs whose output may take its input's
 * first O planes ----
 * Pixel p of every output channel depends on pixel p of the input only: its C input values
 * are copied to the scratch s (C floats) before its O outputs are written, and output element
 * (o, p) lies at o*P + p <= o*P + p of the input, a pixel of a plane already copied (o < C), so
 * y may overwrite x. Each output is the bias plus w[o][c] * x[c] summed in channel order, the
 * order of CONV2D's pw_product, so the same bits. */

typedef struct {
    mt_rec_t h;
    uint32_t x, w, b, s, y;
    uint32_t C, O, P;
} conv_pw_rec_t;

static int conv_pw_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *x = &t[MT_CONV2D_PW_INPLACE_X], *w = &t[MT_CONV2D_PW_INPLACE_W],
                      *y = &t[MT_CONV2D_PW_INPLACE_Y];
    (void)ctx;
    if (!conv_check_shapes(op->a, x, w, y)) {
        return MT_E_SHAPE;
    }
    conv_geom_t g;
    conv_prepare_geom(op->a, x, w, y, &g);
    return g.G == 1 && conv_kind(&g) == KIND_POINTWISE && g.O <= g.C && t[MT_CONV2D_PW_INPLACE_S].n == g.C
           && (t[MT_CONV2D_PW_INPLACE_B].n == 0 || t[MT_CONV2D_PW_INPLACE_B].n == g.O) ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_pw_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_pw_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        r->x = t[MT_CONV2D_PW_INPLACE_X].ref;
        r->w = t[MT_CONV2D_PW_INPLACE_W].ref;
        r->b = t[MT_CONV2D_PW_INPLACE_B].ref;
        r->s = t[MT_CONV2D_PW_INPLACE_S].ref;
        r->y = t[MT_CONV2D_PW_INPLACE_Y].ref;
        r->C = t[MT_CONV2D_PW_INPLACE_X].dim[1];
        r->O = t[MT_CONV2D_PW_INPLACE_Y].dim[1];
        r->P = t[MT_CONV2D_PW_INPLACE_X].dim[2] * t[MT_CONV2D_PW_INPLACE_X].dim[3];
    }
    return sizeof(conv_pw_rec_t);
}

/* int8 filters dequantized (the W8 ops, below) */
static void w8_filters(const int8_t *q, const float *scales, uint32_t o, uint32_t n, size_t taps, float *out);

/* The float weight w, or (CONV2D_PW_INPLACE_W8) the int8 weight wq with its scales, each row
 * w'[o] dequantized into the caller's buf (MT_W8_BUF floats) a chunk at a time and summed on into
 * the same acc: the same terms in the same order either way. The int8 form dequantizes the whole
 * weight once per pixel (y overwrites x, so the pixel loop must stay outermost). */
static void conv_pw(const conv_pw_rec_t *r, mt_ctx_t *ctx, const float *w, const int8_t *wq, const float *scales,
    float *buf) {
    const float *b = MT_F32(ctx, r->b);
    float *x = MT_F32(ctx, r->x), *s = MT_F32(ctx, r->s), *y = MT_F32(ctx, r->y);
    const size_t P = r->P;
    const uint32_t chunk = wq != NULL ? MT_W8_BUF : r->C;
    for (size_t p = 0; p < P; p++) {
        for (uint32_t c = 0; c < r->C; c++) {
            s[c] = x[c * P + p];
        }
        for (uint32_t o = 0; o < r->O; o++) {
            float acc = b != NULL ? b[o] : 0.0f;
            for (uint32_t c0 = 0; c0 < r->C; c0 += chunk) {
                const uint32_t nc = r->C - c0 < chunk ? r->C - c0 : chunk;
                if (wq != NULL) {
                    w8_filters(wq + (size_t)o * r->C + c0, scales, o, nc, 1, buf);
                }
                const float *wo = wq != NULL ? buf : w + (size_t)o * r->C + c0;   /* w is NULL with wq */
                for (uint32_t c = 0; c < nc; c++) {
                    acc += wo[c] * s[c0 + c];
                }
            }
            y[o * P + p] = acc;
        }
    }
}

static int conv_pw_run(mt_ctx_t *ctx, const void *rec) {
    const conv_pw_rec_t *r = rec;
    conv_pw(r, ctx, MT_F32(ctx, r->w), NULL, NULL, NULL);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_PW_INPLACE = {conv_pw_check, conv_pw_prepare, conv_pw_run};

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
        r->h.kind = conv_kind(&r->g);
    }
    return sizeof(conv_bwd_input_rec_t);
}

/* The pass of the input gradient at stride 1: a convolution of dy with the flipped filter,
 * padded by the rest of its extent. */
static void bwd_input_pass_of(const pass_t *p, pass_t *q) {
    *q = *p;
    q->IH = p->OH;
    q->IW = p->OW;
    q->OH = p->IH;
    q->OW = p->IW;
    q->pt = p->dh * (p->KH - 1) - p->pt;
    q->pl = p->dw * (p->KW - 1) - p->pl;
}

/* dx[c] += the input gradient through filter k = w[o, c] of dy[o]: at stride 1 a gather of dy
 * with the flipped filter (pass q), otherwise each tap scattered over the inputs it read. */
static void bwd_input_pair(const pass_t *p, const pass_t *q, uint8_t kind, const float *dyo, float *dxc,
    const float *k) {
    if (p->sh != 1 || p->sw != 1) {
        pass_scatter(p, dyo, dxc, k);
        return;
    }
    const float *last = k + p->KH * p->KW - 1;
    if (kind == KIND_K3) {
        float flipped[9];
        for (int32_t i = 0; i < p->KH * 3; i++) {
            flipped[i] = last[-i];
        }
        pass_gather_k3(q, dyo, dxc, flipped);
    } else {
        pass_gather(q, dyo, dxc, last, -(int32_t)p->KW, -1);
    }
}

static void bwd_input_pw_w8(const conv_geom_t *g, const float *dy, const int8_t *w, const float *scales, float *buf,
    float *dx);

/* The float weight w, or (CONV2D_BWD_INPUT_W8) the int8 weight wq with its scales, dequantized into
 * the caller's buf (MT_W8_BUF floats) a filter, or for a 1x1 a block of the product, at a time. */
static void conv_bwd_input(const conv_bwd_input_rec_t *r, mt_ctx_t *ctx, const float *w, const int8_t *wq,
    const float *scales, float *buf) {
    const conv_geom_t *g = &r->g;
    const float *dy = MT_F32(ctx, r->dy);
    float *dx = MT_F32(ctx, r->dx);
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW, taps = (size_t)g->KH * g->KW;
    if (r->h.kind == KIND_POINTWISE) {   /* dx[c] = sum_o w[o][c] dy[o]: the transposed product */
        if (wq != NULL) {
            bwd_input_pw_w8(g, dy, wq, scales, buf, dx);
            return;
        }
        for (uint32_t gi = 0; gi < g->G; gi++) {
            pw_product(w + gi * g->Og * g->Cg, 1, (int32_t)g->Cg, g->Cg, g->Og, dy + gi * g->Og * oplane,
                (uint32_t)plane, NULL, NULL, dx + gi * g->Cg * plane);
        }
        return;
    }
    memset(dx, 0, (size_t)g->C * plane * sizeof(float));
    pass_t p, q;
    pass_of(g, &p);
    bwd_input_pass_of(&p, &q);
    /* each dx[c] sums its filters' terms in increasing o */
    for (uint32_t c = 0; c < g->C; c++) {
        uint32_t gi = c / g->Cg, cg = c - gi * g->Cg;
        for (uint32_t o = gi * g->Og; o < (gi + 1) * g->Og; o++) {
            const size_t at = (o * g->Cg + cg) * taps;
            if (wq != NULL) {
                w8_filters(wq + at, scales, o, 1, taps, buf);
            }
            bwd_input_pair(&p, &q, r->h.kind, dy + o * oplane, dx + c * plane, wq != NULL ? buf : w + at);
        }
    }
}

static int conv_bwd_input_run(mt_ctx_t *ctx, const void *rec) {
    const conv_bwd_input_rec_t *r = rec;
    conv_bwd_input(r, ctx, MT_F32(ctx, r->w), NULL, NULL, NULL);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_BWD_INPUT = {conv_bwd_input_check, conv_bwd_input_prepare, conv_bwd_input_run};

/* ---- CONV2D_BWD_INPUT_DW_INPLACE: a depthwise CONV2D_BWD_INPUT whose dx may take dy's memory ----
 * dx[c] depends on dy[c] only: each dy plane is copied to the scratch plane s before dx[c] is
 * cleared and written, and dx[c] ends no later than dy[c] does (plane <= oplane). */

typedef struct {
    mt_rec_t h;
    uint32_t dy, w, s, dx;
    conv_geom_t g;
} conv_bwd_input_dw_rec_t;

static int conv_bwd_input_dw_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    const mt_tensor_t *dx = &t[MT_CONV2D_BWD_INPUT_DW_INPLACE_DX], *w = &t[MT_CONV2D_BWD_INPUT_DW_INPLACE_W],
                      *dy = &t[MT_CONV2D_BWD_INPUT_DW_INPLACE_DY];
    (void)ctx;
    if (!conv_check_shapes(op->a, dx, w, dy)) {
        return MT_E_SHAPE;
    }
    uint32_t C = dx->dim[1];
    return (uint32_t)op->a[MT_CONV_A_GROUPS] == C && w->dim[0] == C && w->dim[1] == 1
           && t[MT_CONV2D_BWD_INPUT_DW_INPLACE_S].n == dy->dim[2] * dy->dim[3]
           && dx->dim[2] * dx->dim[3] <= dy->dim[2] * dy->dim[3] ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_bwd_input_dw_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_bwd_input_dw_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->dy = op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_DY].ref;
        r->w = op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_W].ref;
        r->s = op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_S].ref;
        r->dx = op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_DX].ref;
        conv_prepare_geom(op->a, &op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_DX], &op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_W],
            &op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_DY], &r->g);
        r->h.kind = conv_kind(&r->g) == KIND_K3 ? KIND_K3 : KIND_GENERIC;
    }
    return sizeof(conv_bwd_input_dw_rec_t);
}

/* The float weight w, or (CONV2D_BWD_INPUT_DW_INPLACE_W8) the int8 weight wq with its scales,
 * each filter dequantized into the caller's `filter` (MT_W8_BUF floats) before its pass. */
static void conv_bwd_input_dw(const conv_bwd_input_dw_rec_t *r, mt_ctx_t *ctx, const float *w, const int8_t *wq,
    const float *scales, float *filter) {
    const conv_geom_t *g = &r->g;
    const float *dy = MT_F32(ctx, r->dy);
    float *s = MT_F32(ctx, r->s), *dx = MT_F32(ctx, r->dx);
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW, taps = (size_t)g->KH * g->KW;
    pass_t p, q;
    pass_of(g, &p);
    bwd_input_pass_of(&p, &q);
    for (uint32_t c = 0; c < g->C; c++) {
        memcpy(s, dy + c * oplane, oplane * sizeof(float));
        memset(dx + c * plane, 0, plane * sizeof(float));
        if (wq != NULL) {
            w8_filters(wq + c * taps, scales, c, 1, taps, filter);
        }
        bwd_input_pair(&p, &q, r->h.kind, s, dx + c * plane, wq != NULL ? filter : w + c * taps);
    }
}

static int conv_bwd_input_dw_run(mt_ctx_t *ctx, const void *rec) {
    const conv_bwd_input_dw_rec_t *r = rec;
    conv_bwd_input_dw(r, ctx, MT_F32(ctx, r->w), NULL, NULL, NULL);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_BWD_INPUT_DW_INPLACE = {conv_bwd_input_dw_check, conv_bwd_input_dw_prepare,
    conv_bwd_input_dw_run};

/* ---- CONV2D_BWD_WEIGHT: each weight's gradient summed completely, then handed
 * to the sink, so with batch 1 no gradient buffer exists. The trained part is
 * output channels [o0, o1) and input channels (within a group) [i0, i1); a
 * part-sized momentum/accumulator holds it as [o1-o0, i1-i0, KH, KW]. ---- */

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
           && mt_sink_check(ctx, w, &t[MT_CONV2D_BWD_WEIGHT_M], &t[MT_CONV2D_BWD_WEIGHT_ACC], 1,
               (uint32_t)a[MT_CONV2D_BWD_WEIGHT_A_O_COUNT] * (uint32_t)a[MT_CONV2D_BWD_WEIGHT_A_I_COUNT]
               * w->dim[2] * w->dim[3]) ? MT_OK : MT_E_SHAPE;
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
        r->h.kind = conv_kind(&r->g);
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
    const uint32_t ic = r->i1 - r->i0, taps = (uint32_t)(g->KH * g->KW);
    for (uint32_t o = r->o0; o < r->o1; o++) {
        const float *dyo = dy + o * oplane;
        const float *xg = x + (o / g->Og) * g->Cg * plane;
        const uint32_t prow = (o - r->o0) * ic;   /* row o in a part-sized state */
        if (r->h.kind == KIND_POINTWISE) {   /* dw[o][c] = dy[o] . x[c], a chunk of channels at a time */
            float grad[16];
            for (uint32_t c = r->i0; c < r->i1; c += 16) {
                uint32_t n = r->i1 - c < 16 ? r->i1 - c : 16;
                pw_grads(dyo, xg + c * plane, n, (uint32_t)plane, grad);
                mt_sink_vec(ctx, &r->s, o * g->Cg + c, prow + c - r->i0, grad, n);
            }
            continue;
        }
        for (uint32_t c = r->i0; c < r->i1; c++) {
            const uint32_t at = (o * g->Cg + c) * taps, pat = (prow + c - r->i0) * taps;
            if (r->h.kind == KIND_K3) {
                float grad[9] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                pass_grad_k3(&p, xg + c * plane, dyo, grad);
                mt_sink_vec(ctx, &r->s, at, pat, grad, (uint32_t)p.KH * 3u);
                continue;
            }
            for (int32_t ky = 0; ky < p.KH; ky++) {
                for (int32_t kx = 0; kx < p.KW; kx++) {
                    float acc = tap_gradient(&p, xg + c * plane, dyo, ky, kx);
                    const uint32_t tap = (uint32_t)(ky * p.KW + kx);
                    mt_sink_vec(ctx, &r->s, at + tap, pat + tap, &acc, 1);
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

/* ---- float convolutions with a frozen int8 weight (W8: compile(frozen_weights="int8"), w8.py) ----
 * The weight is int8 with one scale per output channel (its quantization record, axis 0, zero
 * points 0). Each op runs its float op's own loops on W' = float32(q) * scale[o]: the forward is
 * cut into sub-convolutions of one output channel (two for a 1x1 product) and as many input
 * channels as MT_W8_BUF floats hold, dequantized into a stack buffer; each sub-convolution sums
 * on from where the last one stopped (acc = y), so every output sums the same terms in the same
 * order as the float op on W', bit for bit. The input gradients dequantize a filter at a time
 * (conv_bwd_input, conv_bwd_input_dw above), a 1x1 one a block of two input channels by up to
 * MT_W8_BUF / 2 output channels (bwd_input_pw_w8). */

typedef char w8_slots_match_float[(MT_CONV2D_W8_W == MT_CONV2D_W && MT_CONV2D_W8_B == MT_CONV2D_B
    && MT_CONV2D_W8_Y == MT_CONV2D_Y && MT_CONV2D_DW_INPLACE_W8_S == MT_CONV2D_DW_INPLACE_S
    && MT_CONV2D_DW_INPLACE_W8_Y == MT_CONV2D_DW_INPLACE_Y && MT_CONV2D_BWD_INPUT_W8_W == MT_CONV2D_BWD_INPUT_W
    && MT_CONV2D_BWD_INPUT_W8_DX == MT_CONV2D_BWD_INPUT_DX && MT_CONV2D_BWD_INPUT_DW_INPLACE_W8_S == MT_CONV2D_BWD_INPUT_DW_INPLACE_S
    && MT_CONV2D_BWD_INPUT_DW_INPLACE_W8_DX == MT_CONV2D_BWD_INPUT_DW_INPLACE_DX
    && MT_CONV2D_ACC_W8_X == MT_CONV2D_ACC_X && MT_CONV2D_ACC_W8_W == MT_CONV2D_ACC_W
    && MT_CONV2D_ACC_W8_ACC == MT_CONV2D_ACC_ACC && MT_CONV2D_ACC_W8_Y == MT_CONV2D_ACC_Y
    && MT_CONV2D_PW_INPLACE_W8_X == MT_CONV2D_PW_INPLACE_X && MT_CONV2D_PW_INPLACE_W8_W == MT_CONV2D_PW_INPLACE_W
    && MT_CONV2D_PW_INPLACE_W8_B == MT_CONV2D_PW_INPLACE_B && MT_CONV2D_PW_INPLACE_W8_S == MT_CONV2D_PW_INPLACE_S
    && MT_CONV2D_PW_INPLACE_W8_Y == MT_CONV2D_PW_INPLACE_Y) ? 1 : -1];

/* out = the n filters of output channel o (taps each) of int8 q, times scale[o] */
static void w8_filters(const int8_t *q, const float *scales, uint32_t o, uint32_t n, size_t taps, float *out) {
    const float s = scales[o];
    for (size_t i = 0; i < n * taps; i++) {
        out[i] = (float)q[i] * s;
    }
}

/* w: an int8 weight whose quantization record has one scale per output channel, filters that fit
 * the buffer; *scales its scales' reference */
static int w8_weight_ok(const mt_ctx_t *ctx, const mt_tensor_t *w, uint32_t *scales) {
    mt_quant_t q;
    if (w->ndim != 4 || (uint64_t)w->dim[2] * w->dim[3] > MT_W8_BUF || !mt_quant_of(ctx, w, &q)
        || q.axis != 0 || q.scales == MT_REF_NONE || !mt_q8_weight_ok(ctx, w, 0, w->dim[0])) {
        return 0;
    }
    if (scales != NULL) {
        *scales = q.scales;
    }
    return 1;
}

/* conv_forward over each group's input channels [c_lo, c_hi), x at the first group's channel c_lo,
 * on the dequantized weight W' (w int8 with its scales) or on the float weight wf: from c_lo = 0
 * y = b + conv(x, W') (or acc + ...), else y summed on. The filters go through the stack buffer a
 * chunk at a time. Each output adds its terms channel after channel onto its running value
 * (pw_product, pass_gather), so splitting the channels anywhere gives the whole op's sums bit for
 * bit, the float op's as well (CONV2D_DQ). */
static void conv_forward_channels(const conv_geom_t *g, uint8_t kind, const float *x, const int8_t *w,
    const float *wf, const float *scales, const float *b, const float *acc, float *scratch, float *y, uint32_t c_lo,
    uint32_t c_hi) {
    const size_t plane = (size_t)g->H * g->W, oplane = (size_t)g->OH * g->OW, taps = (size_t)g->KH * g->KW;
    const uint32_t rows = kind == KIND_POINTWISE ? 2 : 1;
    const uint32_t chunk = (uint32_t)(MT_W8_BUF / (rows * taps));
    float buf[MT_W8_BUF];
    uint32_t nr;
    for (uint32_t o = 0; o < g->O; o += nr) {
        const uint32_t gi = o / g->Og;
        nr = rows == 2 && o + 1 < (gi + 1) * g->Og ? 2 : 1;
        float *yo = y + o * oplane;
        for (uint32_t c0 = c_lo; c0 < c_hi; c0 += chunk) {
            const uint32_t nc = c_hi - c0 < chunk ? c_hi - c0 : chunk;
            for (uint32_t k = 0; k < nr; k++) {
                if (wf != NULL) {
                    memcpy(buf + k * nc * taps, wf + ((o + k) * g->Cg + c0) * taps, nc * taps * sizeof(float));
                } else {
                    w8_filters(w + ((o + k) * g->Cg + c0) * taps, scales, o + k, nc, taps, buf + k * nc * taps);
                }
            }
            conv_geom_t sub = *g;
            sub.C = sub.Cg = nc;
            sub.O = sub.Og = nr;
            sub.G = 1;
            conv_forward(&sub, kind, x + (gi * g->Cg + c0 - c_lo) * plane, buf, c0 == 0 && b != NULL ? b + o : NULL,
                c0 == 0 ? (acc != NULL ? acc + o * oplane : NULL) : yo, scratch, yo);
        }
    }
}

/* conv_forward on the dequantized weight: y = b + conv(x, W'), or acc + conv(x, W') */
static void conv_forward_w8(const conv_geom_t *g, uint8_t kind, const float *x, const int8_t *w, const float *scales,
    const float *b, const float *acc, float *scratch, float *y) {
    conv_forward_channels(g, kind, x, w, NULL, scales, b, acc, scratch, y, 0, g->Cg);
}

typedef struct {
    conv_rec_t f;   /* as CONV2D */
    uint32_t scales;
} conv_w8_rec_t;

/* the float op's check, then the weight's scales */
static int w8_check(int float_check, const mt_ctx_t *ctx, const mt_tensor_t *w) {
    return float_check != MT_OK ? float_check : w8_weight_ok(ctx, w, NULL) ? MT_OK : MT_E_W8_SCALES;
}

static int conv_w8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return w8_check(conv_check(ctx, op), ctx, &op->t[MT_CONV2D_W8_W]);
}

static uint32_t conv_w8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_w8_rec_t *r = rec;
    if (r != NULL) {
        conv_prepare(ctx, op, &r->f);
        w8_weight_ok(ctx, &op->t[MT_CONV2D_W8_W], &r->scales);
    }
    return sizeof(conv_w8_rec_t);
}

static int conv_w8_run(mt_ctx_t *ctx, const void *rec) {
    const conv_w8_rec_t *r = rec;
    conv_forward_w8(&r->f.g, r->f.h.kind, MT_F32(ctx, r->f.x), (const int8_t *)mt_ptr(ctx, r->f.w),
        MT_F32(ctx, r->scales), MT_F32(ctx, r->f.b), NULL, NULL, MT_F32(ctx, r->f.y));
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_W8 = {conv_w8_check, conv_w8_prepare, conv_w8_run};

/* ---- CONV2D_DQ_W8, CONV2D_DQ: DEQUANTIZE then CONV2D_W8 or CONV2D (groups 1) without the float
 * input whole (dq_conv.py). x's channels are dequantized K at a time into xs (K planes,
 * (x - zp) * scale as DEQUANTIZE) and summed on into y: y is the pair's bit for bit, whatever K
 * (conv_forward_channels). The float input of an int8 prefix's last layer is 4x its int8 bytes:
 * MbV2-w0.35 138kb's was 96 KB. ---- */

typedef char dq_slots_match[(MT_CONV2D_DQ_W8_X == MT_CONV2D_X && MT_CONV2D_DQ_W8_W == MT_CONV2D_W
    && MT_CONV2D_DQ_W8_B == MT_CONV2D_B && MT_CONV2D_DQ_W8_Y == MT_CONV2D_Y && MT_CONV2D_DQ_X == MT_CONV2D_X
    && MT_CONV2D_DQ_W == MT_CONV2D_W && MT_CONV2D_DQ_B == MT_CONV2D_B && MT_CONV2D_DQ_Y == MT_CONV2D_Y
    && MT_CONV2D_DQ_XS == MT_CONV2D_DQ_W8_XS) ? 1 : -1];

typedef struct {
    conv_w8_rec_t c;   /* as CONV2D_W8's, c.f.x the int8 input (CONV2D_DQ: c.scales MT_REF_NONE) */
    uint32_t xs, K;    /* the scratch planes and how many */
    int32_t zp;
    float scale;
} conv_dq_rec_t;

/* groups 1 (the checked shapes then give x 4-D), x an int8 activation, xs whole planes of x (1 to
 * C of them), the filters within the stack buffer */
static int conv_dq_shapes_ok(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *x = &op->t[MT_CONV2D_DQ_X], *xs = &op->t[MT_CONV2D_DQ_XS], *w = &op->t[MT_CONV2D_DQ_W];
    const uint32_t plane = x->dim[2] * x->dim[3];
    return op->a[MT_CONV_A_GROUPS] == 1 && mt_q8_activation_ok(ctx, x) && plane != 0 && xs->n % plane == 0
           && xs->n / plane >= 1 && xs->n / plane <= x->dim[1] && w->ndim == 4
           && (uint64_t)w->dim[2] * w->dim[3] <= MT_W8_BUF;
}

static int conv_dq_w8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const int err = w8_check(conv_check(ctx, op), ctx, &op->t[MT_CONV2D_DQ_W8_W]);
    return err != MT_OK ? err : conv_dq_shapes_ok(ctx, op) ? MT_OK : MT_E_SHAPE;
}

static int conv_dq_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const int err = conv_check(ctx, op);
    return err != MT_OK ? err : conv_dq_shapes_ok(ctx, op) ? MT_OK : MT_E_SHAPE;
}

static uint32_t conv_dq_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_dq_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *x = &op->t[MT_CONV2D_DQ_X];
        mt_quant_t q;
        conv_prepare(ctx, op, &r->c.f);
        r->c.scales = MT_REF_NONE;
        if (op->code == MT_OP_CONV2D_DQ_W8) {
            w8_weight_ok(ctx, &op->t[MT_CONV2D_DQ_W8_W], &r->c.scales);
        }
        mt_quant_of(ctx, x, &q);
        r->xs = op->t[MT_CONV2D_DQ_XS].ref;
        r->K = op->t[MT_CONV2D_DQ_XS].n / (x->dim[2] * x->dim[3]);
        r->zp = q.zero_point;
        r->scale = q.scale;
    }
    return sizeof(conv_dq_rec_t);
}

static int conv_dq_run(mt_ctx_t *ctx, const void *rec) {
    const conv_dq_rec_t *r = rec;
    const conv_geom_t *g = &r->c.f.g;
    const int8_t *x = (const int8_t *)mt_ptr(ctx, r->c.f.x);
    const int w8 = r->c.f.h.code == MT_OP_CONV2D_DQ_W8;
    float *xs = MT_F32(ctx, r->xs);
    const size_t plane = (size_t)g->H * g->W;
    for (uint32_t k0 = 0; k0 < g->C; k0 += r->K) {
        const uint32_t nk = g->C - k0 < r->K ? g->C - k0 : r->K;
        const int8_t *xk = x + k0 * plane;
        for (size_t i = 0; i < nk * plane; i++) {
            xs[i] = (float)((int32_t)xk[i] - r->zp) * r->scale;
        }
        conv_forward_channels(g, r->c.f.h.kind, xs, w8 ? (const int8_t *)mt_ptr(ctx, r->c.f.w) : NULL,
            w8 ? NULL : MT_F32(ctx, r->c.f.w), MT_F32(ctx, r->c.scales), MT_F32(ctx, r->c.f.b), NULL, NULL,
            MT_F32(ctx, r->c.f.y), k0, k0 + nk);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_DQ_W8 = {conv_dq_w8_check, conv_dq_prepare, conv_dq_run};
const mt_opdef_t mt_op_CONV2D_DQ = {conv_dq_check, conv_dq_prepare, conv_dq_run};

/* CONV2D_ACC_W8: y = acc + conv(x, W'), y may take acc's memory */
static int conv_acc_w8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return w8_check(conv_acc_check(ctx, op), ctx, &op->t[MT_CONV2D_ACC_W8_W]);
}

static uint32_t conv_acc_w8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_w8_rec_t *r = rec;   /* f.b holds acc, as CONV2D_ACC's */
    if (r != NULL) {
        conv_acc_prepare(ctx, op, &r->f);
        w8_weight_ok(ctx, &op->t[MT_CONV2D_ACC_W8_W], &r->scales);
    }
    return sizeof(conv_w8_rec_t);
}

static int conv_acc_w8_run(mt_ctx_t *ctx, const void *rec) {
    const conv_w8_rec_t *r = rec;
    conv_forward_w8(&r->f.g, r->f.h.kind, MT_F32(ctx, r->f.x), (const int8_t *)mt_ptr(ctx, r->f.w),
        MT_F32(ctx, r->scales), NULL, MT_F32(ctx, r->f.b), NULL, MT_F32(ctx, r->f.y));
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_ACC_W8 = {conv_acc_w8_check, conv_acc_w8_prepare, conv_acc_w8_run};

typedef struct {
    conv_dw_rec_t f;
    uint32_t scales;
} conv_dw_w8_rec_t;

static int conv_dw_w8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return w8_check(conv_dw_check(ctx, op), ctx, &op->t[MT_CONV2D_DW_INPLACE_W8_W]);
}

static uint32_t conv_dw_w8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_dw_w8_rec_t *r = rec;
    if (r != NULL) {
        conv_dw_prepare(ctx, op, &r->f);
        w8_weight_ok(ctx, &op->t[MT_CONV2D_DW_INPLACE_W8_W], &r->scales);
    }
    return sizeof(conv_dw_w8_rec_t);
}

static int conv_dw_w8_run(mt_ctx_t *ctx, const void *rec) {
    const conv_dw_w8_rec_t *r = rec;
    conv_forward_w8(&r->f.g, r->f.h.kind, MT_F32(ctx, r->f.x), (const int8_t *)mt_ptr(ctx, r->f.w),
        MT_F32(ctx, r->scales), MT_F32(ctx, r->f.b), NULL, MT_F32(ctx, r->f.s), MT_F32(ctx, r->f.y));
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_DW_INPLACE_W8 = {conv_dw_w8_check, conv_dw_w8_prepare, conv_dw_w8_run};

typedef struct {
    conv_pw_rec_t f;
    uint32_t scales;
} conv_pw_w8_rec_t;

static int conv_pw_w8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return w8_check(conv_pw_check(ctx, op), ctx, &op->t[MT_CONV2D_PW_INPLACE_W8_W]);
}

static uint32_t conv_pw_w8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_pw_w8_rec_t *r = rec;
    if (r != NULL) {
        conv_pw_prepare(ctx, op, &r->f);
        w8_weight_ok(ctx, &op->t[MT_CONV2D_PW_INPLACE_W8_W], &r->scales);
    }
    return sizeof(conv_pw_w8_rec_t);
}

static int conv_pw_w8_run(mt_ctx_t *ctx, const void *rec) {
    const conv_pw_w8_rec_t *r = rec;
    float buf[MT_W8_BUF];
    conv_pw(&r->f, ctx, NULL, (const int8_t *)mt_ptr(ctx, r->f.w), MT_F32(ctx, r->scales), buf);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_PW_INPLACE_W8 = {conv_pw_w8_check, conv_pw_w8_prepare, conv_pw_w8_run};

typedef struct {
    conv_bwd_input_dw_rec_t f;
    uint32_t scales;
} conv_bwd_input_dw_w8_rec_t;

static int conv_bwd_input_dw_w8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return w8_check(conv_bwd_input_dw_check(ctx, op), ctx, &op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_W8_W]);
}

static uint32_t conv_bwd_input_dw_w8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_bwd_input_dw_w8_rec_t *r = rec;
    if (r != NULL) {
        conv_bwd_input_dw_prepare(ctx, op, &r->f);
        w8_weight_ok(ctx, &op->t[MT_CONV2D_BWD_INPUT_DW_INPLACE_W8_W], &r->scales);
    }
    return sizeof(conv_bwd_input_dw_w8_rec_t);
}

static int conv_bwd_input_dw_w8_run(mt_ctx_t *ctx, const void *rec) {
    const conv_bwd_input_dw_w8_rec_t *r = rec;
    float filter[MT_W8_BUF];
    conv_bwd_input_dw(&r->f, ctx, NULL, (const int8_t *)mt_ptr(ctx, r->f.w), MT_F32(ctx, r->scales), filter);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_BWD_INPUT_DW_INPLACE_W8 = {conv_bwd_input_dw_w8_check, conv_bwd_input_dw_w8_prepare,
    conv_bwd_input_dw_w8_run};

/* The 1x1 input gradient dx[c] = sum_o w'[o][c] dy[o] as CONV2D_BWD_INPUT's transposed product, in
 * blocks of two input channels by up to MT_W8_BUF / 2 output channels dequantized into buf, each
 * block summing on from where the last stopped: every dx sums its terms in increasing o. */
static void bwd_input_pw_w8(const conv_geom_t *g, const float *dy, const int8_t *w, const float *scales, float *buf,
    float *dx) {
    const size_t plane = (size_t)g->H * g->W;
    const uint32_t chunk = MT_W8_BUF / 2;
    uint32_t nr;
    for (uint32_t gi = 0; gi < g->G; gi++) {
        for (uint32_t c = 0; c < g->Cg; c += nr) {
            nr = c + 1 < g->Cg ? 2 : 1;
            float *dxc = dx + (gi * g->Cg + c) * plane;
            for (uint32_t o0 = 0; o0 < g->Og; o0 += chunk) {
                const uint32_t no = g->Og - o0 < chunk ? g->Og - o0 : chunk;
                for (uint32_t k = 0; k < nr; k++) {
                    for (uint32_t j = 0; j < no; j++) {
                        const uint32_t o = gi * g->Og + o0 + j;
                        buf[k * no + j] = (float)w[o * g->Cg + c + k] * scales[o];
                    }
                }
                pw_product(buf, (int32_t)no, 1, nr, no, dy + (gi * g->Og + o0) * plane, (uint32_t)plane, NULL,
                    o0 == 0 ? NULL : dxc, dxc);
            }
        }
    }
}

typedef struct {
    conv_bwd_input_rec_t f;
    uint32_t scales;
} conv_bwd_input_w8_rec_t;

static int conv_bwd_input_w8_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return w8_check(conv_bwd_input_check(ctx, op), ctx, &op->t[MT_CONV2D_BWD_INPUT_W8_W]);
}

static uint32_t conv_bwd_input_w8_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    conv_bwd_input_w8_rec_t *r = rec;
    if (r != NULL) {
        conv_bwd_input_prepare(ctx, op, &r->f);
        w8_weight_ok(ctx, &op->t[MT_CONV2D_BWD_INPUT_W8_W], &r->scales);
    }
    return sizeof(conv_bwd_input_w8_rec_t);
}

static int conv_bwd_input_w8_run(mt_ctx_t *ctx, const void *rec) {
    const conv_bwd_input_w8_rec_t *r = rec;
    float buf[MT_W8_BUF];
    conv_bwd_input(&r->f, ctx, NULL, (const int8_t *)mt_ptr(ctx, r->f.w), MT_F32(ctx, r->scales), buf);
    return MT_OK;
}

const mt_opdef_t mt_op_CONV2D_BWD_INPUT_W8 = {conv_bwd_input_w8_check, conv_bwd_input_w8_prepare,
    conv_bwd_input_w8_run};

/* ---- for the channel-streamed block ops (mt_pwdw_w8.c): one channel's planes through the same
 * loops as the ops above, so the fused op gives their bits ---- */

int mt_conv_w8_weight_ok(const mt_ctx_t *ctx, const mt_tensor_t *w, uint32_t *scales) {
    return w8_weight_ok(ctx, w, scales);
}

void mt_conv_forward_w8(const mt_conv_geom_t *g, const float *x, const int8_t *w, const float *scales,
    const float *b, const float *acc, float *y) {
    conv_forward_w8(g, conv_kind(g), x, w, scales, b, acc, NULL, y);
}

void mt_conv_bwd_input_plane_w8(const mt_conv_geom_t *g, const float *dy, const int8_t *w, float scale, float *dx) {
    const size_t taps = (size_t)g->KH * g->KW;
    float filter[MT_W8_BUF];
    pass_t p, q;
    pass_of(g, &p);
    bwd_input_pass_of(&p, &q);
    w8_filters(w, &scale, 0, 1, taps, filter);
    memset(dx, 0, (size_t)g->H * g->W * sizeof(float));
    bwd_input_pair(&p, &q, conv_kind(g) == KIND_K3 ? KIND_K3 : KIND_GENERIC, dy, dx, filter);
}

void mt_conv_pw_grads(const float *d, const float *x, uint32_t n, uint32_t P, float *g) {
    pw_grads(d, x, n, P, g);
}

void mt_conv_forward_range(const mt_conv_geom_t *g, const float *x, const int8_t *w, const float *wf,
    const float *scales, const float *b, float *y, uint32_t c_lo, uint32_t c_hi) {
    conv_forward_channels(g, conv_kind(g), x, w, wf, scales, b, NULL, NULL, y, c_lo, c_hi);
}

void mt_conv_forward_f32(const mt_conv_geom_t *g, const float *x, const float *w, const float *b, const float *acc,
    float *y) {
    conv_forward(g, conv_kind(g), x, w, b, acc, NULL, y);
}
