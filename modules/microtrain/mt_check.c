/* microtrain core: per-op shape and attribute checks, run once at load.
 *
 * Each check proves what its kernel's index arithmetic assumes, so a plan
 * that passes cannot make a kernel read or write outside its tensors.
 */
#include "mt.h"

#define LIMIT 65535

static int in_range(int32_t v, int32_t lo, int32_t hi) {
    return v >= lo && v <= hi;
}

/* (1, C, H, W) activation */
static int is_nchw(const mt_tensor_t *t) {
    return t->ndim == 4 && t->dim[0] == 1;
}

static int same_n(const mt_tensor_t *a, const mt_tensor_t *b) {
    return a->n == b->n;
}

/* Output extent of a sliding window; ceil selects ceil_mode rounding. */
static int64_t out_extent(int64_t in, int64_t pad0, int64_t pad1, int64_t k, int64_t dil, int64_t stride, int ceil) {
    int64_t eff = dil * (k - 1) + 1;
    int64_t span = in + pad0 + pad1 - eff;
    if (span < (ceil ? 1 - stride : 0)) {   /* ceil_mode keeps a window hanging past the padded input */
        return -1;
    }
    return (ceil ? (span + stride - 1) / stride : span / stride) + 1;
}

/* x (1,C,H,W) * w (O, C/g, KH, KW) -> y (1,O,OH,OW) */
static int check_conv(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y) {
    for (int i = 0; i < 2; i++) {
        if (!in_range(a[i], 1, LIMIT) || !in_range(a[6 + i], 1, LIMIT)) {   /* strides, dilations */
            return 0;
        }
    }
    for (int i = 2; i < 6; i++) {
        if (!in_range(a[i], 0, LIMIT)) {   /* pads */
            return 0;
        }
    }
    int32_t g = a[8];
    if (!is_nchw(x) || !is_nchw(y) || w->ndim != 4 || !in_range(g, 1, LIMIT)) {
        return 0;
    }
    uint32_t C = x->dim[1], O = w->dim[0];
    if (C % (uint32_t)g != 0 || O % (uint32_t)g != 0 || (uint64_t)w->dim[1] * (uint64_t)g != C || y->dim[1] != O) {
        return 0;
    }
    return out_extent(x->dim[2], a[2], a[4], w->dim[2], a[6], a[0], 0) == (int64_t)y->dim[2]
           && out_extent(x->dim[3], a[3], a[5], w->dim[3], a[7], a[1], 0) == (int64_t)y->dim[3];
}

/* x (1,C,H,W) -> y (1,C,OH,OW), OH from floor or ceil rounding */
static int check_pool(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *y) {
    for (int i = 0; i < 4; i++) {
        if (!in_range(a[i], 1, LIMIT)) {   /* kernel, stride */
            return 0;
        }
    }
    for (int i = 4; i < 8; i++) {
        if (!in_range(a[i], 0, LIMIT)) {
            return 0;
        }
    }
    if (!in_range(a[8], 1, LIMIT) || !in_range(a[9], 1, LIMIT) || !in_range(a[10], 0, 1)) {
        return 0;
    }
    if (!is_nchw(x) || !is_nchw(y) || x->dim[1] != y->dim[1]) {
        return 0;
    }
    int64_t oh = y->dim[2], ow = y->dim[3];
    return (out_extent(x->dim[2], a[4], a[6], a[0], a[8], a[2], 0) == oh
            || out_extent(x->dim[2], a[4], a[6], a[0], a[8], a[2], 1) == oh)
           && (out_extent(x->dim[3], a[5], a[7], a[1], a[9], a[3], 0) == ow
               || out_extent(x->dim[3], a[5], a[7], a[1], a[9], a[3], 1) == ow);
}

/* A [begin, begin+count) range inside [0, total). */
static int check_range(int32_t begin, int32_t count, uint32_t total) {
    return begin >= 0 && count >= 1 && (int64_t)begin + count <= (int64_t)total;
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

/* Where a gradient op sends its gradient: straight into an SGD update of the
 * parameter (only with batch 1; momentum buffer present iff momentum > 0), or
 * into an accumulator (no momentum buffer) that an SGD op applies when a batch
 * ends, also with batch 1 (a parameter shared by two layers sums both
 * gradients first). The SGD op itself needs the accumulator. */
static int check_sink(const mt_ctx_t *ctx, const mt_tensor_t *w, const mt_tensor_t *m, const mt_tensor_t *acc,
    int is_grad_op) {
    int has_m = m->n != 0, has_acc = acc->n != 0, want_m = ctx->momentum > 0.0f;
    int ok = is_grad_op ? (has_acc ? !has_m : ctx->batch == 1 && has_m == want_m) : has_acc && has_m == want_m;
    return ok && (!has_m || (m->n == w->n && (m->flags & MT_TFLAG_MOMENTUM)))
           && (!has_acc || (acc->n == w->n && (acc->flags & MT_TFLAG_GRAD_ACC)));
}

static int same_shape(const mt_tensor_t *a, const mt_tensor_t *b) {
    for (int d = 0; d < MT_MAX_DIMS; d++) {
        if (a->dim[d] != b->dim[d]) {
            return 0;
        }
    }
    return a->ndim == b->ndim;
}

int mt_op_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    const int32_t *a = op->a;
    uint32_t O, K;
    int ok = 0;
    switch (op->code) {
        case MT_OP_CONV2D:
            ok = check_conv(a, &t[MT_CONV2D_X], &t[MT_CONV2D_W], &t[MT_CONV2D_Y])
                 && (t[MT_CONV2D_B].n == 0 || t[MT_CONV2D_B].n == t[MT_CONV2D_W].dim[0]);
            break;
        case MT_OP_CONV2D_BWD_INPUT:
            ok = check_conv(a, &t[MT_CONV2D_BWD_INPUT_DX], &t[MT_CONV2D_BWD_INPUT_W], &t[MT_CONV2D_BWD_INPUT_DY]);
            break;
        case MT_OP_CONV2D_BWD_WEIGHT: {
            const mt_tensor_t *w = &t[MT_CONV2D_BWD_WEIGHT_W];
            ok = check_conv(a, &t[MT_CONV2D_BWD_WEIGHT_X], w, &t[MT_CONV2D_BWD_WEIGHT_DY])
                 && check_range(a[MT_CONV2D_BWD_WEIGHT_A_O_BEGIN], a[MT_CONV2D_BWD_WEIGHT_A_O_COUNT], w->dim[0])
                 && check_range(a[MT_CONV2D_BWD_WEIGHT_A_I_BEGIN], a[MT_CONV2D_BWD_WEIGHT_A_I_COUNT], w->dim[1])
                 && check_sink(ctx, w, &t[MT_CONV2D_BWD_WEIGHT_M], &t[MT_CONV2D_BWD_WEIGHT_ACC], 1);
            break;
        }
        case MT_OP_GEMM:
            ok = gemm_dims(a[0], &t[MT_GEMM_W], &O, &K) && t[MT_GEMM_X].n == K && t[MT_GEMM_Y].n == O
                 && (t[MT_GEMM_B].n == 0 || t[MT_GEMM_B].n == O);
            break;
        case MT_OP_GEMM_BWD_INPUT:
            ok = gemm_dims(a[0], &t[MT_GEMM_BWD_INPUT_W], &O, &K) && t[MT_GEMM_BWD_INPUT_DY].n == O
                 && t[MT_GEMM_BWD_INPUT_DX].n == K;
            break;
        case MT_OP_GEMM_BWD_WEIGHT: {
            const mt_tensor_t *w = &t[MT_GEMM_BWD_WEIGHT_W];
            ok = gemm_dims(a[0], w, &O, &K) && t[MT_GEMM_BWD_WEIGHT_DY].n == O && t[MT_GEMM_BWD_WEIGHT_X].n == K
                 && check_range(a[MT_GEMM_BWD_WEIGHT_A_O_BEGIN], a[MT_GEMM_BWD_WEIGHT_A_O_COUNT], O)
                 && check_range(a[MT_GEMM_BWD_WEIGHT_A_I_BEGIN], a[MT_GEMM_BWD_WEIGHT_A_I_COUNT], K)
                 && check_sink(ctx, w, &t[MT_GEMM_BWD_WEIGHT_M], &t[MT_GEMM_BWD_WEIGHT_ACC], 1);
            break;
        }
        case MT_OP_BIAS_BWD: {
            const mt_tensor_t *dy = &t[MT_BIAS_BWD_DY], *b = &t[MT_BIAS_BWD_W];
            ok = dy->ndim >= 2 && dy->dim[0] == 1 && b->n == dy->dim[1]
                 && check_range(a[MT_BIAS_BWD_A_O_BEGIN], a[MT_BIAS_BWD_A_O_COUNT], b->n)
                 && check_sink(ctx, b, &t[MT_BIAS_BWD_M], &t[MT_BIAS_BWD_ACC], 1);
            break;
        }
        case MT_OP_CLIP:
        case MT_OP_CLIP_BWD: {
            float lo = mt_f32_from_bits(a[0]), hi = mt_f32_from_bits(a[1]);
            ok = lo <= hi;   /* false for NaN bounds too */
            ok = ok && (op->code == MT_OP_CLIP ? same_n(&t[0], &t[1])
                                               : same_n(&t[0], &t[1]) && same_n(&t[1], &t[2]));
            break;
        }
        case MT_OP_MAXPOOL:
        case MT_OP_AVGPOOL:
            ok = check_pool(a, &t[0], &t[1]);
            break;
        case MT_OP_MAXPOOL_BWD:
            ok = check_pool(a, &t[MT_MAXPOOL_BWD_X], &t[MT_MAXPOOL_BWD_DY])
                 && same_shape(&t[MT_MAXPOOL_BWD_X], &t[MT_MAXPOOL_BWD_DX]);
            break;
        case MT_OP_AVGPOOL_BWD:
            ok = check_pool(a, &t[MT_AVGPOOL_BWD_DX], &t[MT_AVGPOOL_BWD_DY]);
            break;
        case MT_OP_GAP:
            ok = is_nchw(&t[0]) && t[1].n == t[0].dim[1];
            break;
        case MT_OP_GAP_BWD:
            ok = is_nchw(&t[1]) && t[0].n == t[1].dim[1];
            break;
        case MT_OP_ADD:
            ok = same_n(&t[0], &t[1]) && same_n(&t[1], &t[2]);
            break;
        case MT_OP_SOFTMAX_CE:
            ok = t[MT_SOFTMAX_CE_LABEL].n == 1 && same_n(&t[MT_SOFTMAX_CE_LOGITS], &t[MT_SOFTMAX_CE_DLOGITS]);
            break;
        case MT_OP_MSE:
            ok = same_n(&t[0], &t[1]) && same_n(&t[1], &t[2]);
            break;
        case MT_OP_SGD:
            ok = check_sink(ctx, &t[MT_SGD_W], &t[MT_SGD_M], &t[MT_SGD_ACC], 0);
            break;
        default:
            return MT_E_OPCODE;
    }
    return ok ? MT_OK : MT_E_SHAPE;
}
