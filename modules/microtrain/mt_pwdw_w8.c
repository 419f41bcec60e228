/* microtrain core: an expansion block's float convolutions, a channel at a time.
 *
 *   PWDW_W8      e = clip(conv1x1(x, W') [+ conv1x1(xg, Wt')]) or clip(conv1x1(x, Wt)) (a weight
 *                trained whole; Wt int8 codes x scales or float32), m its 1-bit mask,
 *                y = depthwise(e, D'); with W2: y2 = clip2(y), m2 its mask, z = conv1x1(y2, W2')
 *   PWDW_W8_BWD  [dy2 = m2 * conv1x1_bwd_input(dz, W2'), the depthwise bias's gradient]
 *                de = m * depthwise_bwd_input(dy, D'); dx = conv1x1_bwd_input(de, W'),
 *                dxg = conv1x1_bwd_input(de, Wt'), Wt and b take their gradients
 * Channel c of e is made from x by row c of the 1x1 weights and read by channel c of the
 * depthwise conv only, whose output channel c the second 1x1 conv reads as its input channel c:
 * so e and y (and their gradients) exist one plane at a time, in s and y (s2). In the blocks of
 * an MCU network that a sparse update's gradient passes through, those are the largest float
 * tensors (MCUNet-5fps 49kb: blocks.9's 48 KB, blocks.10's 60 KB, forward and backward;
 * dw_stream.py fuses them). Every value is summed by the loops of the ops replaced (mt_conv.c's
 * W8 kernels, CONV2D_BWD_INPUT_Q8's order, the sinks of CONV2D_BWD_WEIGHT and BIAS_BWD), in
 * their order, so the results are theirs bit for bit: a 1x1 output sums its bias then its input
 * channels in increasing order, a 1x1 input gradient its output channels in increasing order,
 * which streaming the channels in increasing order keeps.
 *
 * Both consume their constants in blocks of output channels (opdef blocks: mt_stream.c): a plan
 * that streams an expansion block's constants a group at a time cuts them into blocks of E of the
 * c_total channels (stream.py), each group holding the rows of w and dw and the columns of w2 of
 * its channels in the same layout, and the executor runs the op once per block, ctx->block the
 * block: channels [block E, block E + E) of c_total, fewer in the last. Its constants are indexed
 * by the channel within the block, c; what the whole block shares (b, db, the trained weight and
 * their state, the masks, y without w2) by block E + c. Block 0 clears the masks and starts z (or
 * dx, dxg) from its bias; the others add their channels' terms in the same order, so the blocks in
 * turn give the one op's bits. An op whose constants are not in blocks runs once, E = c_total.
 */
#include <string.h>
#include "mt_q8.h"

/* a tensor shaped as t with c channels: the whole of a tensor only a plane of which exists */
static int with_channels(const mt_tensor_t *t, uint32_t c, mt_tensor_t *out) {
    if (!mt_is_nchw(t) || (uint64_t)c * t->dim[2] * t->dim[3] >= (1u << 28)) {
        return 0;
    }
    *out = *t;
    out->dim[1] = c;
    out->n = c * t->dim[2] * t->dim[3];
    return 1;
}

/* a 1x1 weight over in (1, K, H, W) with E outputs */
static int pw_shape_ok(const mt_tensor_t *w, const mt_tensor_t *in, uint32_t E) {
    return w->ndim == 4 && w->dim[0] == E && mt_is_nchw(in) && w->dim[1] == in->dim[1] && w->dim[2] == 1
           && w->dim[3] == 1;
}

static int mask_fits(const mt_tensor_t *m, uint32_t n) {
    return m->n == n / 8u + (n % 8u != 0u);
}

/* the depthwise conv's shapes e -> y (the op's channels; groups = E, filters of more than one tap); the
 * mask fits the whole block's expansion, c_total planes of e's */
static int dw_shape_ok(const int32_t *a, const mt_tensor_t *e, const mt_tensor_t *dw, const mt_tensor_t *y,
    const mt_tensor_t *m, uint32_t c_total) {
    return mt_conv_check_shapes(a, e, dw, y) && (uint32_t)a[MT_CONV_A_GROUPS] == e->dim[1] && dw->dim[1] == 1
           && (uint64_t)dw->dim[2] * dw->dim[3] > 1 && mask_fits(m, c_total * e->dim[2] * e->dim[3]);
}

/* the block's c_total channels, its constants' E rows (the depthwise weight's): E >= 1, c_total >= 1 and
 * c_total planes within 2^28 elements */
static int block_ok(int32_t ct, uint32_t E, const mt_tensor_t *plane) {
    return E >= 1 && ct >= 1 && (uint64_t)(uint32_t)ct * plane->dim[2] * plane->dim[3] < (1u << 28);
}

/* the channels the op runs now: [*c0, *c0 + return) of c_total, block ctx->block of E (none past the end) */
static uint32_t block_channels(const mt_ctx_t *ctx, uint32_t E, uint32_t ct, uint32_t *c0) {
    uint64_t first = (uint64_t)ctx->block * E;
    *c0 = first < ct ? (uint32_t)first : ct;
    return ct - *c0 < E ? ct - *c0 : E;
}

/* the second 1x1 conv over y (the depthwise output, the op's E channels) into z, its bias b2, mask m2
 * (of the whole block's c_total channels), and the plane of y p (OH x OW) */
static int pw2_shape_ok(const mt_tensor_t *y, const mt_tensor_t *w2, const mt_tensor_t *b2, const mt_tensor_t *z,
    const mt_tensor_t *m2, const mt_tensor_t *p, uint32_t c_total) {
    return pw_shape_ok(w2, y, w2->dim[0]) && mt_is_nchw(z) && z->dim[1] == w2->dim[0] && z->dim[2] == y->dim[2]
           && z->dim[3] == y->dim[3] && (b2->n == 0 || b2->n == z->dim[1])
           && mask_fits(m2, c_total * y->dim[2] * y->dim[3]) && p->n == y->dim[2] * y->dim[3];
}

/* every int8 weight present has one scale per output channel (and filters that fit the W8 loops) */
static int scales_ok(const mt_ctx_t *ctx, const mt_tensor_t *const *w, int n) {
    for (int i = 0; i < n; i++) {
        if (w[i]->n != 0 && !mt_conv_w8_weight_ok(ctx, w[i], NULL)) {
            return MT_E_W8_SCALES;
        }
    }
    return MT_OK;
}

static uint32_t scales_of(const mt_ctx_t *ctx, const mt_tensor_t *w) {
    uint32_t s = MT_REF_NONE;
    if (w->n != 0) {
        mt_conv_w8_weight_ok(ctx, w, &s);
    }
    return s;
}

/* the 1x1 geometry of one output channel over C channels of the depthwise conv's plane: built at
 * run time, so a record holds one geometry (52 B) instead of three */
static void pw_geom(uint32_t C, const mt_conv_geom_t *dwg, mt_conv_geom_t *g) {
    memset(g, 0, sizeof *g);
    g->C = g->Cg = C;
    g->H = g->OH = dwg->H;
    g->W = g->OW = dwg->W;
    g->O = g->Og = g->G = 1;
    g->KH = g->KW = g->sh = g->sw = g->dh = g->dw = 1;
}

/* the depthwise geometry of one channel */
static void dw_geom(const int32_t *a, const mt_tensor_t *e, const mt_tensor_t *dw, const mt_tensor_t *y,
    mt_conv_geom_t *g) {
    mt_conv_prepare_geom(a, e, dw, y, g);
    g->C = g->Cg = g->O = g->Og = g->G = 1;
}

/* v clipped to [lo, hi] as CLIP (NaN stays NaN), and MASK_PACK's bit of the clipped value */
MT_INLINE float clip_bit(float v, float lo, float hi, uint8_t *m, uint32_t bit) {
    v = v < lo ? lo : (v > hi ? hi : v);
    m[bit / 8u] |= (uint8_t)((uint32_t)(v > lo && v < hi) << (bit % 8u));
    return v;
}

MT_INLINE int bit_set(const uint8_t *m, uint32_t bit) {
    return (m[bit / 8u] >> (bit % 8u)) & 1u;
}

/* into[k][p] += plane[p] * (float32(w[k * ws]) * scale(k)) for k < n: one 1x1 input gradient's terms
 * (scales[k] per row k, or the one scale s when scales is NULL) */
static void pw_scatter(float *into, const float *plane, const int8_t *w, uint32_t ws, const float *scales, float s,
    uint32_t n, uint32_t P) {
    for (uint32_t k = 0; k < n; k++) {
        const float wv = (float)w[(size_t)k * ws] * (scales != NULL ? scales[k] : s);
        float *d = into + (size_t)k * P;
        for (uint32_t p = 0; p < P; p++) {
            d[p] += wv * plane[p];
        }
    }
}

/* the same with a float32 weight */
static void pw_scatter_f32(float *into, const float *plane, const float *w, uint32_t n, uint32_t P) {
    for (uint32_t k = 0; k < n; k++) {
        const float wv = w[k];
        float *d = into + (size_t)k * P;
        for (uint32_t p = 0; p < P; p++) {
            d[p] += wv * plane[p];
        }
    }
}

/* ---- PWDW_W8 ---- */

typedef struct {
    mt_rec_t h;
    uint32_t x, w, ws, b, xg, wt, wts, wtf, m, dw, dws, db, s, y, m2, w2, w2s, b2, z;
    mt_conv_geom_t dwg;           /* one channel */
    uint32_t C, K, E, O2;         /* x's and xg's channels (K 0 without a trained weight); the op's channels */
    uint32_t ct;                  /* the block's channels (E of them in each block of constants) */
    float lo, hi, lo2, hi2;
} pwdw_rec_t;

static int pwdw_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *xg = &t[MT_PWDW_W8_XG], *w2 = &t[MT_PWDW_W8_W2], *x = &t[MT_PWDW_W8_X];
    const mt_tensor_t *wt = t[MT_PWDW_W8_WT].n != 0 ? &t[MT_PWDW_W8_WT] : &t[MT_PWDW_W8_WTF];
    const int32_t *a = op->a;
    const uint32_t E = t[MT_PWDW_W8_DW].dim[0], ct = (uint32_t)a[MT_PWDW_W8_A_C_TOTAL];
    mt_tensor_t e, y;
    /* the frozen weight (the op's E rows), or a weight trained whole (over xg = x: all c_total rows)
     * makes e; at most one trained weight */
    if ((t[MT_PWDW_W8_WT].n != 0 && t[MT_PWDW_W8_WTF].n != 0) || (t[MT_PWDW_W8_W].n == 0 && wt->n == 0)
        || !mt_is_nchw(x) || !block_ok((int32_t)ct, E, x) || !with_channels(x, E, &e)
        || (t[MT_PWDW_W8_W].n != 0 && !pw_shape_ok(&t[MT_PWDW_W8_W], x, E))) {
        return MT_E_SHAPE;
    }
    /* the depthwise output: the op's channels of y, or with w2 the block output's rows and columns */
    const int ok = w2->n == 0 ? mt_is_nchw(&t[MT_PWDW_W8_Y]) && t[MT_PWDW_W8_Y].dim[1] == ct
                                && with_channels(&t[MT_PWDW_W8_Y], E, &y)
                              : with_channels(&t[MT_PWDW_W8_Z], E, &y);
    if (!ok || !(mt_f32_from_bits(a[MT_PWDW_W8_A_LO_BITS]) <= mt_f32_from_bits(a[MT_PWDW_W8_A_HI_BITS]))
        || (t[MT_PWDW_W8_B].n != 0 && t[MT_PWDW_W8_B].n != ct) || (t[MT_PWDW_W8_DB].n != 0 && t[MT_PWDW_W8_DB].n != ct)
        || (xg->n == 0) != (wt->n == 0) || t[MT_PWDW_W8_S].n != e.dim[2] * e.dim[3]
        || (xg->n != 0 && (!mt_is_nchw(xg) || xg->dim[2] != e.dim[2] || xg->dim[3] != e.dim[3]
            || !pw_shape_ok(wt, xg, ct)))
        || !block_ok((int32_t)ct, E, &y)
        || !dw_shape_ok(a, &e, &t[MT_PWDW_W8_DW], &y, &t[MT_PWDW_W8_M], ct)) {
        return MT_E_SHAPE;
    }
    /* the second stage: all of w2, z and m2 or none, b2 only with them */
    if (w2->n == 0 ? t[MT_PWDW_W8_Z].n != 0 || t[MT_PWDW_W8_M2].n != 0 || t[MT_PWDW_W8_B2].n != 0
                   : !(mt_f32_from_bits(a[MT_PWDW_W8_A_LO2_BITS]) <= mt_f32_from_bits(a[MT_PWDW_W8_A_HI2_BITS]))
                     || !pw2_shape_ok(&y, w2, &t[MT_PWDW_W8_B2], &t[MT_PWDW_W8_Z], &t[MT_PWDW_W8_M2],
                         &t[MT_PWDW_W8_Y], ct)) {
        return MT_E_SHAPE;
    }
    const mt_tensor_t *w8[] = {&t[MT_PWDW_W8_W], &t[MT_PWDW_W8_WT], &t[MT_PWDW_W8_DW], w2};
    return scales_ok(ctx, w8, 4);   /* wtf is float32 */
}

static uint32_t pwdw_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pwdw_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        mt_tensor_t e, y;
        const mt_tensor_t *wt = t[MT_PWDW_W8_WT].n != 0 ? &t[MT_PWDW_W8_WT] : &t[MT_PWDW_W8_WTF];
        const uint32_t E = t[MT_PWDW_W8_DW].dim[0];
        with_channels(&t[MT_PWDW_W8_X], E, &e);
        with_channels(t[MT_PWDW_W8_W2].n != 0 ? &t[MT_PWDW_W8_Z] : &t[MT_PWDW_W8_Y], E, &y);
        r->x = t[MT_PWDW_W8_X].ref;
        r->w = t[MT_PWDW_W8_W].ref;
        r->b = t[MT_PWDW_W8_B].ref;
        r->xg = t[MT_PWDW_W8_XG].ref;
        r->wt = t[MT_PWDW_W8_WT].ref;
        r->wtf = t[MT_PWDW_W8_WTF].ref;
        r->m = t[MT_PWDW_W8_M].ref;
        r->dw = t[MT_PWDW_W8_DW].ref;
        r->db = t[MT_PWDW_W8_DB].ref;
        r->s = t[MT_PWDW_W8_S].ref;
        r->y = t[MT_PWDW_W8_Y].ref;
        r->m2 = t[MT_PWDW_W8_M2].ref;
        r->w2 = t[MT_PWDW_W8_W2].ref;
        r->b2 = t[MT_PWDW_W8_B2].ref;
        r->z = t[MT_PWDW_W8_Z].ref;
        r->ws = scales_of(ctx, &t[MT_PWDW_W8_W]);
        r->wts = scales_of(ctx, &t[MT_PWDW_W8_WT]);
        r->dws = scales_of(ctx, &t[MT_PWDW_W8_DW]);
        r->w2s = scales_of(ctx, &t[MT_PWDW_W8_W2]);
        dw_geom(op->a, &e, &t[MT_PWDW_W8_DW], &y, &r->dwg);
        r->C = t[MT_PWDW_W8_X].dim[1];
        r->K = wt->n != 0 ? t[MT_PWDW_W8_XG].dim[1] : 0;
        r->E = E;
        r->ct = (uint32_t)op->a[MT_PWDW_W8_A_C_TOTAL];
        r->O2 = t[MT_PWDW_W8_W2].n != 0 ? t[MT_PWDW_W8_W2].dim[0] : 0;
        r->lo = mt_f32_from_bits(op->a[MT_PWDW_W8_A_LO_BITS]);
        r->hi = mt_f32_from_bits(op->a[MT_PWDW_W8_A_HI_BITS]);
        r->lo2 = mt_f32_from_bits(op->a[MT_PWDW_W8_A_LO2_BITS]);
        r->hi2 = mt_f32_from_bits(op->a[MT_PWDW_W8_A_HI2_BITS]);
    }
    return sizeof(pwdw_rec_t);
}

static int pwdw_run(mt_ctx_t *ctx, const void *rec) {
    const pwdw_rec_t *r = rec;
    const float *x = MT_F32(ctx, r->x), *ws = MT_F32(ctx, r->ws), *b = MT_F32(ctx, r->b);
    const float *xg = MT_F32(ctx, r->xg), *dws = MT_F32(ctx, r->dws), *db = MT_F32(ctx, r->db);
    const float *w2s = MT_F32(ctx, r->w2s), *b2 = MT_F32(ctx, r->b2);
    const int8_t *w = (const int8_t *)mt_ptr(ctx, r->w), *wt = (const int8_t *)mt_ptr(ctx, r->wt);
    const int8_t *dw = (const int8_t *)mt_ptr(ctx, r->dw), *w2 = (const int8_t *)mt_ptr(ctx, r->w2);
    const float *wtf = MT_F32(ctx, r->wtf);
    uint8_t *m = (uint8_t *)mt_ptr(ctx, r->m), *m2 = (uint8_t *)mt_ptr(ctx, r->m2);
    float *s = MT_F32(ctx, r->s), *y = MT_F32(ctx, r->y), *z = MT_F32(ctx, r->z);
    const uint32_t P = r->dwg.H * r->dwg.W, OP = r->dwg.OH * r->dwg.OW, C = r->C, ct = r->ct;
    const uint32_t K = r->K, taps = (uint32_t)r->dwg.KH * r->dwg.KW;
    uint32_t c0;
    const uint32_t E = block_channels(ctx, r->E, ct, &c0);
    mt_conv_geom_t pw, pwt;
    pw_geom(C, &r->dwg, &pw);
    pw_geom(K, &r->dwg, &pwt);
    if (c0 == 0) {   /* the block's first channels: the masks from nothing */
        memset(m, 0, ct * P / 8u + ((ct * P) % 8u != 0u));
    }
    if (w2 != NULL && c0 == 0) {   /* z starts at its bias; each channel of y adds its terms */
        memset(m2, 0, ct * OP / 8u + ((ct * OP) % 8u != 0u));
        for (uint32_t o = 0; o < r->O2; o++) {
            const float init = b2 != NULL ? b2[o] : 0.0f;
            for (uint32_t p = 0; p < OP; p++) {
                z[(size_t)o * OP + p] = init;
            }
        }
    }
    for (uint32_t c = 0; c < E; c++) {
        const uint32_t g = c0 + c;   /* in the whole block: the trained tensors, the masks, y */
        /* the frozen part from its bias, then the trained part added (CONV2D_W8, CONV2D_ACC[_W8]); or
         * the weight trained whole from the bias (CONV2D[_W8]) */
        const float *bc = b != NULL ? b + g : NULL;
        if (w != NULL) {
            mt_conv_forward_w8(&pw, x, w + (size_t)c * C, ws + c, bc, NULL, s);
        }
        if (wt != NULL) {
            mt_conv_forward_w8(&pwt, xg, wt + (size_t)g * K, MT_F32(ctx, r->wts) + g, w != NULL ? NULL : bc,
                w != NULL ? s : NULL, s);
        } else if (wtf != NULL) {
            mt_conv_forward_f32(&pwt, xg, wtf + (size_t)g * K, w != NULL ? NULL : bc, w != NULL ? s : NULL, s);
        }
        for (uint32_t i = 0; i < P; i++) {
            s[i] = clip_bit(s[i], r->lo, r->hi, m, g * P + i);
        }
        float *yc = w2 != NULL ? y : y + (size_t)g * OP;
        mt_conv_forward_w8(&r->dwg, s, dw + (size_t)c * taps, dws + c, db != NULL ? db + g : NULL, NULL, yc);
        if (w2 != NULL) {
            for (uint32_t i = 0; i < OP; i++) {
                yc[i] = clip_bit(yc[i], r->lo2, r->hi2, m2, g * OP + i);
            }
            pw_scatter(z, yc, w2 + c, r->E, w2s, 0.0f, r->O2, OP);
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_PWDW_W8 = {pwdw_check, pwdw_prepare, pwdw_run};

/* ---- PWDW_W8_BWD ---- */

typedef struct {
    mt_rec_t h;
    uint32_t dy, w2, w2s, m2, s2, dw, dws, m, s, w, ws, dx, xg, wts, dxg;
    mt_sink_rec_t sd, st, sb;     /* the depthwise bias's, the trained weight's, the 1x1 bias's (w MT_REF_NONE: none) */
    mt_conv_geom_t dwg;           /* one channel */
    uint32_t E, C, K, P, O2;
    uint32_t ct;                  /* the block's channels (E of them in each block of constants) */
    uint8_t wt_i8;                /* the trained weight: int8 codes (wts its scales) or float32 */
} pwdw_bwd_rec_t;

/* a parameter slot with its momentum and accumulator: all absent, or a sink of n elements */
static int sink_ok(const mt_ctx_t *ctx, const mt_tensor_t *t, uint32_t n) {
    return t[0].n == 0 ? t[1].n == 0 && t[2].n == 0 : t[0].n == n && mt_sink_check(ctx, &t[0], &t[1], &t[2], 1, n);
}

static void sink_of(const mt_ctx_t *ctx, const mt_tensor_t *t, mt_sink_rec_t *s) {
    s->w = MT_REF_NONE;
    if (t[0].n != 0) {
        mt_sink_prepare(ctx, &t[0], &t[1], &t[2], s);
    }
}

/* e (the 1x1 output, from s's plane) and y (the depthwise output, dy's plane) with the op's channels, the
 * depthwise weight's rows */
static int bwd_shapes(const mt_op_t *op, mt_tensor_t *e, mt_tensor_t *y) {
    const mt_tensor_t *t = op->t, *dy = &t[MT_PWDW_W8_BWD_DY], *s = &t[MT_PWDW_W8_BWD_S];
    const uint32_t E = t[MT_PWDW_W8_BWD_DW].dim[0];
    return mt_is_nchw(s) && s->dim[1] == 1 && with_channels(s, E, e) && with_channels(dy, E, y);
}

static int pwdw_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t, *dy = &t[MT_PWDW_W8_BWD_DY], *w2 = &t[MT_PWDW_W8_BWD_W2];
    const mt_tensor_t *w = &t[MT_PWDW_W8_BWD_W], *dx = &t[MT_PWDW_W8_BWD_DX], *xg = &t[MT_PWDW_W8_BWD_XG];
    const mt_tensor_t *wt = &t[MT_PWDW_W8_BWD_WT], *dxg = &t[MT_PWDW_W8_BWD_DXG];
    mt_tensor_t e, y;
    const uint32_t ct = (uint32_t)op->a[MT_PWDW_W8_BWD_A_C_TOTAL];
    if (!mt_is_nchw(dy) || !bwd_shapes(op, &e, &y) || !block_ok((int32_t)ct, e.dim[1], &e)
        || !block_ok((int32_t)ct, e.dim[1], &y)
        || !dw_shape_ok(op->a, &e, &t[MT_PWDW_W8_BWD_DW], &y, &t[MT_PWDW_W8_BWD_M], ct)
        || (w2->n == 0 && dy->dim[1] != ct)) {   /* without w2 dy is the whole block's depthwise output's */
        return MT_E_SHAPE;
    }
    const uint32_t E = e.dim[1];
    const mt_tensor_t no_bias = {0};   /* the second 1x1 conv's bias trains in a BIAS_BWD of its own */
    /* each part present with what it needs, and something to do */
    if ((w->n == 0) != (dx->n == 0) || (wt->n == 0) != (xg->n == 0) || (dxg->n != 0 && wt->n == 0)
        || (w->n == 0 && wt->n == 0 && t[MT_PWDW_W8_BWD_B].n == 0)
        || (w2->n == 0 ? t[MT_PWDW_W8_BWD_M2].n != 0 || t[MT_PWDW_W8_BWD_S2].n != 0 || t[MT_PWDW_W8_BWD_DB].n != 0
                       : !pw2_shape_ok(&y, w2, &no_bias, dy, &t[MT_PWDW_W8_BWD_M2],
                           &t[MT_PWDW_W8_BWD_S2], ct))) {
        return MT_E_SHAPE;
    }
    if ((w->n != 0 && !(mt_is_nchw(dx) && dx->dim[2] == e.dim[2] && dx->dim[3] == e.dim[3] && pw_shape_ok(w, dx, E)))
        || (wt->n != 0 && (!mt_is_nchw(xg) || xg->dim[2] != e.dim[2] || xg->dim[3] != e.dim[3]
            || !pw_shape_ok(wt, xg, ct)))
        || (dxg->n != 0 && (!mt_is_nchw(dxg) || dxg->n != xg->n || dxg->dim[1] != xg->dim[1]))
        || !sink_ok(ctx, &t[MT_PWDW_W8_BWD_WT], wt->n) || !sink_ok(ctx, &t[MT_PWDW_W8_BWD_B], ct)
        || !sink_ok(ctx, &t[MT_PWDW_W8_BWD_DB], ct)) {
        return MT_E_SHAPE;
    }
    const mt_tensor_t none = {0};
    const mt_tensor_t *w8[] = {w2, &t[MT_PWDW_W8_BWD_DW], w, wt->dtype == MT_DTYPE_I8 ? wt : &none};
    return scales_ok(ctx, w8, 4);
}

static uint32_t pwdw_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    pwdw_bwd_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *t = op->t;
        mt_tensor_t e, y;
        bwd_shapes(op, &e, &y);
        r->dy = t[MT_PWDW_W8_BWD_DY].ref;
        r->w2 = t[MT_PWDW_W8_BWD_W2].ref;
        r->m2 = t[MT_PWDW_W8_BWD_M2].ref;
        r->s2 = t[MT_PWDW_W8_BWD_S2].ref;
        r->dw = t[MT_PWDW_W8_BWD_DW].ref;
        r->m = t[MT_PWDW_W8_BWD_M].ref;
        r->s = t[MT_PWDW_W8_BWD_S].ref;
        r->w = t[MT_PWDW_W8_BWD_W].ref;
        r->dx = t[MT_PWDW_W8_BWD_DX].ref;
        r->xg = t[MT_PWDW_W8_BWD_XG].ref;
        r->dxg = t[MT_PWDW_W8_BWD_DXG].ref;
        r->w2s = scales_of(ctx, &t[MT_PWDW_W8_BWD_W2]);
        r->dws = scales_of(ctx, &t[MT_PWDW_W8_BWD_DW]);
        r->ws = scales_of(ctx, &t[MT_PWDW_W8_BWD_W]);
        r->wt_i8 = t[MT_PWDW_W8_BWD_WT].n != 0 && t[MT_PWDW_W8_BWD_WT].dtype == MT_DTYPE_I8;
        r->wts = r->wt_i8 ? scales_of(ctx, &t[MT_PWDW_W8_BWD_WT]) : MT_REF_NONE;
        sink_of(ctx, &t[MT_PWDW_W8_BWD_DB], &r->sd);
        sink_of(ctx, &t[MT_PWDW_W8_BWD_WT], &r->st);
        sink_of(ctx, &t[MT_PWDW_W8_BWD_B], &r->sb);
        dw_geom(op->a, &e, &t[MT_PWDW_W8_BWD_DW], &y, &r->dwg);
        r->E = e.dim[1];
        r->ct = (uint32_t)op->a[MT_PWDW_W8_BWD_A_C_TOTAL];
        r->C = t[MT_PWDW_W8_BWD_DX].n != 0 ? t[MT_PWDW_W8_BWD_DX].dim[1] : 0;
        r->K = t[MT_PWDW_W8_BWD_XG].n != 0 ? t[MT_PWDW_W8_BWD_XG].dim[1] : 0;
        r->P = e.dim[2] * e.dim[3];
        r->O2 = t[MT_PWDW_W8_BWD_W2].n != 0 ? t[MT_PWDW_W8_BWD_W2].dim[0] : 0;
    }
    return sizeof(pwdw_bwd_rec_t);
}

/* BIAS_BWD's sum of a plane, handed to the sink as element c */
static void bias_grad(const mt_ctx_t *ctx, const mt_sink_rec_t *sk, const float *plane, uint32_t n, uint32_t c) {
    float g = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        g += plane[i];
    }
    mt_sink_vec(ctx, sk, c, c, &g, 1);
}

static int pwdw_bwd_run(mt_ctx_t *ctx, const void *rec) {
    const pwdw_bwd_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->dy), *dws = MT_F32(ctx, r->dws), *xg = MT_F32(ctx, r->xg);
    const int8_t *dw = (const int8_t *)mt_ptr(ctx, r->dw), *w = (const int8_t *)mt_ptr(ctx, r->w);
    const int8_t *wt = (const int8_t *)mt_ptr(ctx, r->st.w), *w2 = (const int8_t *)mt_ptr(ctx, r->w2);
    const uint8_t *m = (const uint8_t *)mt_ptr(ctx, r->m), *m2 = (const uint8_t *)mt_ptr(ctx, r->m2);
    float *s = MT_F32(ctx, r->s), *s2 = MT_F32(ctx, r->s2), *dx = MT_F32(ctx, r->dx), *dxg = MT_F32(ctx, r->dxg);
    const uint32_t P = r->P, OP = r->dwg.OH * r->dwg.OW, taps = (uint32_t)r->dwg.KH * r->dwg.KW, C = r->C, K = r->K;
    uint32_t c0;
    const uint32_t E = block_channels(ctx, r->E, r->ct, &c0);
    if (dx != NULL && c0 == 0) {   /* the block's first channels: the input gradients from zero */
        memset(dx, 0, (size_t)C * P * sizeof(float));
    }
    if (dxg != NULL && c0 == 0) {
        memset(dxg, 0, (size_t)K * P * sizeof(float));
    }
    for (uint32_t c = 0; c < E; c++) {
        const uint32_t g = c0 + c;   /* in the whole block: dy without w2, the masks, the trained tensors */
        const float *dyc = dy + (size_t)g * OP;
        if (w2 != NULL) {   /* the depthwise output's gradient, channel c: dz through w2's column c, then m2 */
            const float *w2s = MT_F32(ctx, r->w2s);
            memset(s2, 0, OP * sizeof(float));
            for (uint32_t o = 0; o < r->O2; o++) {
                pw_scatter(s2, dy + (size_t)o * OP, w2 + (size_t)o * r->E + c, 0, NULL, w2s[o], 1, OP);
            }
            for (uint32_t i = 0; i < OP; i++) {
                s2[i] = bit_set(m2, g * OP + i) ? s2[i] : 0.0f;
            }
            if (r->sd.w != MT_REF_NONE) {
                bias_grad(ctx, &r->sd, s2, OP, g);
            }
            dyc = s2;
        }
        mt_conv_bwd_input_plane_w8(&r->dwg, dyc, dw + (size_t)c * taps, dws[c], s);
        for (uint32_t i = 0; i < P; i++) {   /* MASK_BWD */
            s[i] = bit_set(m, g * P + i) ? s[i] : 0.0f;
        }
        if (dx != NULL) {
            pw_scatter(dx, s, w + (size_t)c * C, 1, NULL, MT_F32(ctx, r->ws)[c], C, P);
        }
        if (wt != NULL) {
            if (dxg != NULL && r->wt_i8) {   /* reads row g before its update */
                pw_scatter(dxg, s, wt + (size_t)g * K, 1, NULL, MT_F32(ctx, r->wts)[g], K, P);
            } else if (dxg != NULL) {
                pw_scatter_f32(dxg, s, (const float *)(const void *)wt + (size_t)g * K, K, P);
            }
            float grad[16];
            for (uint32_t k = 0; k < K; k += 16) {
                const uint32_t n = K - k < 16 ? K - k : 16;
                mt_conv_pw_grads(s, xg + (size_t)k * P, n, P, grad);
                mt_sink_vec(ctx, &r->st, g * K + k, g * K + k, grad, n);
            }
        }
        if (r->sb.w != MT_REF_NONE) {
            bias_grad(ctx, &r->sb, s, P, g);
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_PWDW_W8_BWD = {pwdw_bwd_check, pwdw_bwd_prepare, pwdw_bwd_run};
