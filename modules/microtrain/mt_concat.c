/* microtrain core: channel concatenation and its gradient.
 * Activations hold one sample, (1,C,...): concatenating along the channels puts
 * the inputs' elements one after another, so CONCAT is a copy per input (two to
 * four) and the gradient of each input
 * is a contiguous SLICE of dy. */
#include <string.h>
#include "mt_core.h"

typedef struct {
    mt_rec_t h;
    uint32_t y, n_in;             /* CONCAT: output and number of inputs (2 to 4) */
    uint32_t x[4], n[4];          /* CONCAT: inputs and their sizes; SLICE: x[0], n[0] = begin, n[1] = size */
} concat_rec_t;

static const int concat_slots[4] = {MT_CONCAT_A, MT_CONCAT_B, MT_CONCAT_C, MT_CONCAT_D};

/* the inputs present: a and b, then c, then d (no d without c) */
static uint32_t concat_inputs(const mt_op_t *op) {
    const uint16_t *tid = op->tid;
    return tid[MT_CONCAT_C] == MT_NO_TENSOR ? (tid[MT_CONCAT_D] == MT_NO_TENSOR ? 2 : 0)
                                             : (tid[MT_CONCAT_D] == MT_NO_TENSOR ? 3 : 4);
}

static int concat_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const uint32_t k = concat_inputs(op);
    uint64_t total = 0;
    (void)ctx;
    for (uint32_t i = 0; i < k; i++) {
        total += op->t[concat_slots[i]].n;
    }
    return k != 0 && total == op->t[MT_CONCAT_Y].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t concat_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    concat_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->y = op->t[MT_CONCAT_Y].ref;
        r->n_in = concat_inputs(op);
        for (uint32_t i = 0; i < 4; i++) {
            r->x[i] = i < r->n_in ? op->t[concat_slots[i]].ref : MT_REF_NONE;
            r->n[i] = i < r->n_in ? op->t[concat_slots[i]].n : 0;
        }
    }
    return sizeof(concat_rec_t);
}

/* y overlaps no input (the load-time alias check): plain copies */
static int concat_run(mt_ctx_t *ctx, const void *rec) {
    const concat_rec_t *r = rec;
    float *y = MT_F32(ctx, r->y);
    for (uint32_t i = 0; i < r->n_in; i++) {
        memcpy(y, MT_F32(ctx, r->x[i]), r->n[i] * sizeof(float));
        y += r->n[i];
    }
    return MT_OK;
}

const mt_opdef_t mt_op_CONCAT = {concat_check, concat_prepare, concat_run};

static int slice_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const int32_t begin = op->a[MT_SLICE_A_BEGIN];
    (void)ctx;
    return begin >= 0 && (uint64_t)(uint32_t)begin + op->t[MT_SLICE_Y].n <= op->t[MT_SLICE_X].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t slice_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    concat_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->x[0] = op->t[MT_SLICE_X].ref;
        r->y = op->t[MT_SLICE_Y].ref;
        r->n[0] = (uint32_t)op->a[MT_SLICE_A_BEGIN];
        r->n[1] = op->t[MT_SLICE_Y].n;
    }
    return sizeof(concat_rec_t);
}

static int slice_run(mt_ctx_t *ctx, const void *rec) {
    const concat_rec_t *r = rec;
    memcpy(MT_F32(ctx, r->y), MT_F32(ctx, r->x[0]) + r->n[0], r->n[1] * sizeof(float));
    return MT_OK;
}

const mt_opdef_t mt_op_SLICE = {slice_check, slice_prepare, slice_run};
