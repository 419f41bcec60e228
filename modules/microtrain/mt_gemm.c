/* microtrain core: fully connected layer y = W x + b, forward and backward.
 * W is [O, K] (layout OUT_IN) or [K, O] (IN_OUT), as the ONNX model stores it.
 * Every product is one of two matrix-vector shapes over a row-major M[R][C]:
 * rows (y[r] = M[r,:] . v) or columns (y[c] = M[:,c] . v). */
#include "mt_core.h"

/* y[r] = init[r] + sum_c M[r][c] v[c] (init NULL: 0), summed in c order. */
static void mv_rows(const float *M, uint32_t R, uint32_t C, const float *v, const float *init, float *y) {
    for (uint32_t r = 0; r < R; r++) {
        const float *row = M + (size_t)r * C;
        float acc = init != NULL ? init[r] : 0.0f;
        for (uint32_t c = 0; c < C; c++) {
            acc += row[c] * v[c];
        }
        y[r] = acc;
    }
}

/* y[c] = init[c] + sum_r M[r][c] v[r] (init NULL: 0), summed in r order; M streamed row by row. */
static void mv_cols(const float *M, uint32_t R, uint32_t C, const float *v, const float *init, float *y) {
    for (uint32_t c = 0; c < C; c++) {
        y[c] = init != NULL ? init[c] : 0.0f;
    }
    for (uint32_t r = 0; r < R; r++) {
        const float *row = M + (size_t)r * C;
        const float d = v[r];
        for (uint32_t c = 0; c < C; c++) {
            y[c] += row[c] * d;
        }
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
           && mt_sink_check(ctx, &t[MT_GEMM_BWD_WEIGHT_W], &t[MT_GEMM_BWD_WEIGHT_M], &t[MT_GEMM_BWD_WEIGHT_ACC], 1)
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
 * gets x[k] * dy[o0..o1). (A channel list would replace the row ranges.) */
static int gemm_bwd_weight_run(mt_ctx_t *ctx, const void *rec) {
    const gemm_bwd_weight_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->dy), *x = MT_F32(ctx, r->x);
    if (r->h.kind == MT_W_LAYOUT_OUT_IN) {
        for (uint32_t o = r->o0; o < r->o1; o++) {
            mt_sink_outer(ctx, &r->s, o * r->K + r->k0, dy[o], x + r->k0, r->k1 - r->k0);
        }
    } else {
        for (uint32_t k = r->k0; k < r->k1; k++) {
            mt_sink_outer(ctx, &r->s, k * r->O + r->o0, x[k], dy + r->o0, r->o1 - r->o0);
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GEMM_BWD_WEIGHT = {gemm_bwd_weight_check, gemm_bwd_weight_prepare, gemm_bwd_weight_run};
