/* microtrain core: fully connected layer y = W x + b, forward and backward.
 * W is [O, K] (layout OUT_IN) or [K, O] (IN_OUT), as the ONNX model stores it.
 * Every product is one of two matrix-vector shapes over a row-major M[R][C]:
 * rows (y[r] = M[r,:] . v) or columns (y[c] = M[:,c] . v). */
#include "mt_core.h"

/* y[r] = init[r] + sum_c M[r][c] v[c] (init NULL: 0), summed in c order.
 * Four rows at a time share each load of v; four columns a turn. */
static void mv_rows(const float *M, uint32_t R, uint32_t C, const float *v, const float *init, float *y) {
    uint32_t r = 0;
    for (; r + 4 <= R; r += 4) {
        const float *m0 = M + (size_t)r * C, *m1 = m0 + C, *m2 = m1 + C, *m3 = m2 + C, *x = v;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        if (init != NULL) {
            a0 = init[r];
            a1 = init[r + 1];
            a2 = init[r + 2];
            a3 = init[r + 3];
        }
        uint32_t c = C;
        for (; c >= 4; c -= 4) {
            const float x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
            a0 += m0[0] * x0;
            a1 += m1[0] * x0;
            a2 += m2[0] * x0;
            a3 += m3[0] * x0;
            a0 += m0[1] * x1;
            a1 += m1[1] * x1;
            a2 += m2[1] * x1;
            a3 += m3[1] * x1;
            a0 += m0[2] * x2;
            a1 += m1[2] * x2;
            a2 += m2[2] * x2;
            a3 += m3[2] * x2;
            a0 += m0[3] * x3;
            a1 += m1[3] * x3;
            a2 += m2[3] * x3;
            a3 += m3[3] * x3;
            m0 += 4;
            m1 += 4;
            m2 += 4;
            m3 += 4;
            x += 4;
        }
        for (; c > 0; c--) {
            const float x0 = *x++;
            a0 += *m0++ * x0;
            a1 += *m1++ * x0;
            a2 += *m2++ * x0;
            a3 += *m3++ * x0;
        }
        y[r] = a0;
        y[r + 1] = a1;
        y[r + 2] = a2;
        y[r + 3] = a3;
    }
    if (r + 2 <= R) {
        const float *m0 = M + (size_t)r * C, *m1 = m0 + C, *x = v;
        float a0 = init != NULL ? init[r] : 0.0f, a1 = init != NULL ? init[r + 1] : 0.0f;
        for (uint32_t c = C; c > 0; c--) {
            const float x0 = *x++;
            a0 += *m0++ * x0;
            a1 += *m1++ * x0;
        }
        y[r] = a0;
        y[r + 1] = a1;
        r += 2;
    }
    for (; r < R; r++) {
        const float *m0 = M + (size_t)r * C, *x = v;
        float a0 = init != NULL ? init[r] : 0.0f;
        uint32_t c = C;
        for (; c >= 4; c -= 4) {
            a0 += m0[0] * x[0];
            a0 += m0[1] * x[1];
            a0 += m0[2] * x[2];
            a0 += m0[3] * x[3];
            m0 += 4;
            x += 4;
        }
        for (; c > 0; c--) {
            a0 += *m0++ * *x++;
        }
        y[r] = a0;
    }
}

/* y[c] = init[c] + sum_r M[r][c] v[r] (init NULL: 0), summed in r order: eight
 * columns at a time in registers, M read row by row along them. */
static void mv_cols(const float *M, uint32_t R, uint32_t C, const float *v, const float *init, float *y) {
    uint32_t c = 0;
    for (; c + 8 <= C; c += 8) {
        float a[8];
        for (int i = 0; i < 8; i++) {
            a[i] = init != NULL ? init[c + i] : 0.0f;
        }
        float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7];
        const float *m = M + c, *x = v;
        for (uint32_t r = R; r > 0; r--) {
            const float d = *x++;
            a0 += m[0] * d;
            a1 += m[1] * d;
            a2 += m[2] * d;
            a3 += m[3] * d;
            a4 += m[4] * d;
            a5 += m[5] * d;
            a6 += m[6] * d;
            a7 += m[7] * d;
            m += C;
        }
        y[c] = a0;
        y[c + 1] = a1;
        y[c + 2] = a2;
        y[c + 3] = a3;
        y[c + 4] = a4;
        y[c + 5] = a5;
        y[c + 6] = a6;
        y[c + 7] = a7;
    }
    for (; c < C; c++) {
        float a0 = init != NULL ? init[c] : 0.0f;
        const float *m = M + c, *x = v;
        for (uint32_t r = R; r > 0; r--) {
            a0 += *m * *x++;
            m += C;
        }
        y[c] = a0;
    }
}

/* Gemm weight is 2-D: [O, K] (layout OUT_IN) or [K, O] (IN_OUT). */
static int gemm_dims(int32_t layout, const mt_tensor_t *w, uint32_t *O, uint32_t *K) {
    if (w->ndim != 2 || (layout != MT_W_LAYOUT_OUT_IN && layout != MT_W_LAYOUT_IN_OUT)) {
        return 0;
    }
    *O = layout == MT_W_LAYOUT_OUT_IN ? w->dim[0] : w->dim[1];
    *K = layout == MT_W_LAYOUT_OUT_IN ? w->dim[1] : w->dim[0];
    return 1;
}

/* ---- GEMM: y = W x + b ---- */

typedef struct {
    mt_rec_t h;                   /* kind: the layout */
    uint32_t x, w, b, y, O, K;
} gemm_rec_t;

static int gemm_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    uint32_t O, K;
    (void)ctx;
    return gemm_dims(op->a[MT_GEMM_A_W_LAYOUT], &t[MT_GEMM_W], &O, &K) && t[MT_GEMM_X].n == K
           && t[MT_GEMM_Y].n == O && (t[MT_GEMM_B].n == 0 || t[MT_GEMM_B].n == O) ? MT_OK : MT_E_SHAPE;
}

static uint32_t gemm_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gemm_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->h.kind = (uint8_t)op->a[MT_GEMM_A_W_LAYOUT];
        gemm_dims(op->a[MT_GEMM_A_W_LAYOUT], &op->t[MT_GEMM_W], &r->O, &r->K);
        r->x = op->t[MT_GEMM_X].ref;
        r->w = op->t[MT_GEMM_W].ref;
        r->b = op->t[MT_GEMM_B].ref;
        r->y = op->t[MT_GEMM_Y].ref;
    }
    return sizeof(gemm_rec_t);
}

static int gemm_run(mt_ctx_t *ctx, const void *rec) {
    const gemm_rec_t *r = rec;
    const float *x = MT_F32(ctx, r->x), *w = MT_F32(ctx, r->w), *b = MT_F32(ctx, r->b);
    float *y = MT_F32(ctx, r->y);
    if (r->h.kind == MT_W_LAYOUT_OUT_IN) {
        mv_rows(w, r->O, r->K, x, b, y);
    } else {
        mv_cols(w, r->K, r->O, x, b, y);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GEMM = {gemm_check, gemm_prepare, gemm_run};

/* ---- GEMM_BWD_INPUT: dx = W^T dy ---- */

typedef struct {
    mt_rec_t h;                   /* kind: the layout */
    uint32_t dy, w, dx, O, K;
} gemm_bwd_input_rec_t;

static int gemm_bwd_input_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    uint32_t O, K;
    (void)ctx;
    return gemm_dims(op->a[MT_GEMM_BWD_INPUT_A_W_LAYOUT], &t[MT_GEMM_BWD_INPUT_W], &O, &K)
           && t[MT_GEMM_BWD_INPUT_DY].n == O && t[MT_GEMM_BWD_INPUT_DX].n == K ? MT_OK : MT_E_SHAPE;
}

static uint32_t gemm_bwd_input_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gemm_bwd_input_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->h.kind = (uint8_t)op->a[MT_GEMM_BWD_INPUT_A_W_LAYOUT];
        gemm_dims(op->a[MT_GEMM_BWD_INPUT_A_W_LAYOUT], &op->t[MT_GEMM_BWD_INPUT_W], &r->O, &r->K);
        r->dy = op->t[MT_GEMM_BWD_INPUT_DY].ref;
        r->w = op->t[MT_GEMM_BWD_INPUT_W].ref;
        r->dx = op->t[MT_GEMM_BWD_INPUT_DX].ref;
    }
    return sizeof(gemm_bwd_input_rec_t);
}

static int gemm_bwd_input_run(mt_ctx_t *ctx, const void *rec) {
    const gemm_bwd_input_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->dy), *w = MT_F32(ctx, r->w);
    float *dx = MT_F32(ctx, r->dx);
    if (r->h.kind == MT_W_LAYOUT_OUT_IN) {
        mv_cols(w, r->O, r->K, dy, NULL, dx);
    } else {
        mv_rows(w, r->K, r->O, dy, NULL, dx);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GEMM_BWD_INPUT = {gemm_bwd_input_check, gemm_bwd_input_prepare, gemm_bwd_input_run};

/* ---- GEMM_BWD_WEIGHT: dW(o, k) = dy[o] x[k], into the sink row by row ----
 * The trained part is output rows [o0, o1) and input columns [k0, k1). */

typedef struct {
    mt_rec_t h;                   /* kind: the layout */
    uint32_t dy, x;
    mt_sink_rec_t s;
    uint32_t O, K, o0, o1, k0, k1;
} gemm_bwd_weight_rec_t;

static int gemm_bwd_weight_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    const int32_t *a = op->a;
    uint32_t O, K;
    return gemm_dims(a[MT_GEMM_BWD_WEIGHT_A_W_LAYOUT], &t[MT_GEMM_BWD_WEIGHT_W], &O, &K)
           && t[MT_GEMM_BWD_WEIGHT_DY].n == O && t[MT_GEMM_BWD_WEIGHT_X].n == K
           && mt_range_ok(a[MT_GEMM_BWD_WEIGHT_A_O_BEGIN], a[MT_GEMM_BWD_WEIGHT_A_O_COUNT], O)
           && mt_range_ok(a[MT_GEMM_BWD_WEIGHT_A_I_BEGIN], a[MT_GEMM_BWD_WEIGHT_A_I_COUNT], K)
           && mt_sink_check(ctx, &t[MT_GEMM_BWD_WEIGHT_W], &t[MT_GEMM_BWD_WEIGHT_M], &t[MT_GEMM_BWD_WEIGHT_ACC], 1,
               (uint32_t)a[MT_GEMM_BWD_WEIGHT_A_O_COUNT] * (uint32_t)a[MT_GEMM_BWD_WEIGHT_A_I_COUNT])
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t gemm_bwd_weight_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    gemm_bwd_weight_rec_t *r = rec;
    if (r != NULL) {
        const int32_t *a = op->a;
        r->h.kind = (uint8_t)a[MT_GEMM_BWD_WEIGHT_A_W_LAYOUT];
        gemm_dims(a[MT_GEMM_BWD_WEIGHT_A_W_LAYOUT], &op->t[MT_GEMM_BWD_WEIGHT_W], &r->O, &r->K);
        r->dy = op->t[MT_GEMM_BWD_WEIGHT_DY].ref;
        r->x = op->t[MT_GEMM_BWD_WEIGHT_X].ref;
        mt_sink_prepare(ctx, &op->t[MT_GEMM_BWD_WEIGHT_W], &op->t[MT_GEMM_BWD_WEIGHT_M],
            &op->t[MT_GEMM_BWD_WEIGHT_ACC], &r->s);
        r->o0 = (uint32_t)a[MT_GEMM_BWD_WEIGHT_A_O_BEGIN];
        r->o1 = r->o0 + (uint32_t)a[MT_GEMM_BWD_WEIGHT_A_O_COUNT];
        r->k0 = (uint32_t)a[MT_GEMM_BWD_WEIGHT_A_I_BEGIN];
        r->k1 = r->k0 + (uint32_t)a[MT_GEMM_BWD_WEIGHT_A_I_COUNT];
    }
    return sizeof(gemm_bwd_weight_rec_t);
}

/* Each row of W is contiguous: OUT_IN row o gets dy[o] * x[k0..k1), IN_OUT row k
 * gets x[k] * dy[o0..o1); a part-sized state holds the trained block in the same
 * layout. (A channel list is several ops, one per contiguous run.) */
static int gemm_bwd_weight_run(mt_ctx_t *ctx, const void *rec) {
    const gemm_bwd_weight_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->dy), *x = MT_F32(ctx, r->x);
    const uint32_t no = r->o1 - r->o0, nk = r->k1 - r->k0;
    if (r->h.kind == MT_W_LAYOUT_OUT_IN) {
        mt_sink_outer(ctx, &r->s, r->o0 * r->K + r->k0, r->K, 0, nk, dy + r->o0, no, x + r->k0, nk);
    } else {
        mt_sink_outer(ctx, &r->s, r->k0 * r->O + r->o0, r->O, 0, no, x + r->k0, nk, dy + r->o0, no);
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GEMM_BWD_WEIGHT = {gemm_bwd_weight_check, gemm_bwd_weight_prepare, gemm_bwd_weight_run};
