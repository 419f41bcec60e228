/* microtrain core: channel gather and its gradient, for weights that train on some input
 * channels only (docs/sparse.md). Such a convolution runs as a frozen convolution over every
 * channel (the trained channels' weights zero, in flash) plus a trained one over the gathered
 * channels, so that only the trained slice of the weight lives in RAM.
 * GATHER_CH: y[k] = x[idx[k]] (whole channel planes); SCATTER_CH: dx = 0, dx[idx[k]] += dy[k];
 * SCATTER_ACC_CH: y = acc, y[idx[k]] += t[k] (a depthwise weight's trained channels added to
 * the frozen convolution's output, a gathered input's gradient added to the frozen one's). */
#include <string.h>
#include "mt_core.h"

typedef struct {
    mt_rec_t h;
    uint32_t src, dst, idx;       /* GATHER_CH: x, y; SCATTER_CH: dy, dx */
    uint32_t k, plane, n_dst;     /* gathered channels, elements per channel, elements of dst */
} gather_rec_t;

/* full: the tensor with every channel (1,C,...); part: (1,K,...) with the same plane; idx: K
 * constant int32 channel numbers, each in [0, C) and none twice (validated here, at load) */
static int gather_shapes_ok(const mt_ctx_t *ctx, const mt_tensor_t *full, const mt_tensor_t *part,
    const mt_tensor_t *idx) {
    if (full->ndim < 2 || full->ndim != part->ndim || full->dim[0] != 1 || part->dim[0] != 1 || full->dim[1] == 0
        || part->dim[1] == 0 || part->dim[1] > full->dim[1]
        || (idx->storage != MT_STORAGE_CONST && idx->storage != MT_STORAGE_STREAM)
        || idx->dtype != MT_DTYPE_I32 || idx->n != part->dim[1]) {
        return 0;
    }
    for (uint32_t d = 2; d < full->ndim; d++) {
        if (full->dim[d] != part->dim[d]) {
            return 0;
        }
    }
    const uint8_t *p = (const uint8_t *)mt_ptr(ctx, idx->ref);
    for (uint32_t i = 0; i < idx->n; i++) {
        uint32_t c = mt_rd_u32(p + 4 * i);
        if (c >= full->dim[1]) {
            return 0;
        }
        for (uint32_t j = 0; j < i; j++) {
            if (mt_rd_u32(p + 4 * j) == c) {
                return 0;
            }
        }
    }
    return 1;
}

static uint32_t gather_fill(const mt_op_t *op, void *rec, int src, int dst, int idx, const mt_tensor_t *part) {
    gather_rec_t *r = rec;
    if (r != NULL) {
        r->src = op->t[src].ref;
        r->dst = op->t[dst].ref;
        r->idx = op->t[idx].ref;
        r->k = part->dim[1];
        r->plane = part->n / part->dim[1];
        r->n_dst = op->t[dst].n;
    }
    return sizeof(gather_rec_t);
}

static int gather_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return gather_shapes_ok(ctx, &op->t[MT_GATHER_CH_X], &op->t[MT_GATHER_CH_Y], &op->t[MT_GATHER_CH_IDX])
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t gather_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    (void)ctx;
    return gather_fill(op, rec, MT_GATHER_CH_X, MT_GATHER_CH_Y, MT_GATHER_CH_IDX, &op->t[MT_GATHER_CH_Y]);
}

/* y overlaps no input (the load-time alias check) */
static int gather_run(mt_ctx_t *ctx, const void *rec) {
    const gather_rec_t *r = rec;
    const float *x = MT_F32(ctx, r->src);
    float *y = MT_F32(ctx, r->dst);
    const uint8_t *idx = (const uint8_t *)mt_ptr(ctx, r->idx);
    for (uint32_t k = 0; k < r->k; k++) {
        memcpy(y + (size_t)k * r->plane, x + (size_t)mt_rd_u32(idx + 4 * k) * r->plane, r->plane * sizeof(float));
    }
    return MT_OK;
}

const mt_opdef_t mt_op_GATHER_CH = {gather_check, gather_prepare, gather_run};

static int scatter_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    return gather_shapes_ok(ctx, &op->t[MT_SCATTER_CH_DX], &op->t[MT_SCATTER_CH_DY], &op->t[MT_SCATTER_CH_IDX])
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t scatter_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    (void)ctx;
    return gather_fill(op, rec, MT_SCATTER_CH_DY, MT_SCATTER_CH_DX, MT_SCATTER_CH_IDX, &op->t[MT_SCATTER_CH_DY]);
}

/* the channels are distinct (checked at load), so each plane of dx is written once */
static int scatter_run(mt_ctx_t *ctx, const void *rec) {
    const gather_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->src);
    float *dx = MT_F32(ctx, r->dst);
    const uint8_t *idx = (const uint8_t *)mt_ptr(ctx, r->idx);
    memset(dx, 0, r->n_dst * sizeof(float));
    for (uint32_t k = 0; k < r->k; k++) {
        memcpy(dx + (size_t)mt_rd_u32(idx + 4 * k) * r->plane, dy + (size_t)k * r->plane, r->plane * sizeof(float));
    }
    return MT_OK;
}

const mt_opdef_t mt_op_SCATTER_CH = {scatter_check, scatter_prepare, scatter_run};

static int scatter_acc_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *acc = &op->t[MT_SCATTER_ACC_CH_ACC], *y = &op->t[MT_SCATTER_ACC_CH_Y];
    if (acc->ndim != y->ndim || acc->n != y->n) {
        return MT_E_SHAPE;
    }
    for (uint32_t d = 0; d < y->ndim; d++) {
        if (acc->dim[d] != y->dim[d]) {
            return MT_E_SHAPE;
        }
    }
    return gather_shapes_ok(ctx, y, &op->t[MT_SCATTER_ACC_CH_T], &op->t[MT_SCATTER_ACC_CH_IDX]) ? MT_OK : MT_E_SHAPE;
}

typedef struct {
    gather_rec_t g;               /* src: t, dst: y */
    uint32_t acc;
} scatter_acc_rec_t;

static uint32_t scatter_acc_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    (void)ctx;
    scatter_acc_rec_t *r = rec;
    if (r != NULL) {
        gather_fill(op, &r->g, MT_SCATTER_ACC_CH_T, MT_SCATTER_ACC_CH_Y, MT_SCATTER_ACC_CH_IDX,
            &op->t[MT_SCATTER_ACC_CH_T]);
        r->acc = op->t[MT_SCATTER_ACC_CH_ACC].ref;
    }
    return sizeof(scatter_acc_rec_t);
}

/* y is acc itself (in place) or overlaps neither input (the load-time alias check) */
static int scatter_acc_run(mt_ctx_t *ctx, const void *rec) {
    const scatter_acc_rec_t *r = rec;
    const float *t = MT_F32(ctx, r->g.src);
    float *y = MT_F32(ctx, r->g.dst);
    const uint8_t *idx = (const uint8_t *)mt_ptr(ctx, r->g.idx);
    if (r->acc != r->g.dst) {
        memcpy(y, MT_F32(ctx, r->acc), r->g.n_dst * sizeof(float));
    }
    for (uint32_t k = 0; k < r->g.k; k++) {
        float *yk = y + (size_t)mt_rd_u32(idx + 4 * k) * r->g.plane;
        const float *tk = t + (size_t)k * r->g.plane;
        for (uint32_t i = 0; i < r->g.plane; i++) {
            yk[i] += tk[i];
        }
    }
    return MT_OK;
}

const mt_opdef_t mt_op_SCATTER_ACC_CH = {scatter_acc_check, scatter_acc_prepare, scatter_acc_run};
