/* microtrain core: run an attached plan. A step is: copy the sample in, run the
 * forward and training records of the runtime context in order, and at the end
 * of a batch the BATCH_END records. */
#include <string.h>
#include "mt_core.h"

static int ready(const mt_ctx_t *ctx) {
    return ctx->plan != NULL && ctx->ram != NULL;
}

static int input_in_place(const mt_ctx_t *ctx) {
    return (ctx->in_ref & 7u) == MT_REGION_INPUT;
}

/* x may be unaligned (a slice of a byte buffer): copy bytewise, then check a
 * float input. An integer input needs no check; a uint8 one becomes int8 by
 * flipping its top bit (q - 128: the plan's zero point was moved with it).
 * A plan that reads its input in place (MT_STORAGE_INPUT) copies nothing: the
 * ops read x where it is (a float x must then be 4-byte aligned), until the
 * step or prediction ends, or for mt_run_op until the next mt_set_input. */
int mt_set_input(mt_ctx_t *ctx, const void *x, size_t n_x) {
    mt_clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (x == NULL || n_x != ctx->n_in) {
        return MT_E_INPUT_LEN;
    }
    if (input_in_place(ctx)) {
        ctx->base[MT_REGION_INPUT] = 0;
        if (ctx->input_dtype == MT_DTYPE_F32) {
            if (((uintptr_t)x & 3u) != 0) {
                return MT_E_ALIGN;
            }
            if (!mt_all_finite((const float *)x, ctx->n_in)) {
                return MT_E_NONFINITE;
            }
        }
        ctx->base[MT_REGION_INPUT] = (uintptr_t)x - MT_REGION_INPUT;
        return MT_OK;
    }
    /* x may be the input tensor itself (mt_input_buffer): nothing to copy then */
    if (ctx->input_dtype != MT_DTYPE_F32) {
        int8_t *in = (int8_t *)mt_ptr(ctx, ctx->in_ref);
        if ((const void *)in != x) {
            memcpy(in, x, n_x);
        }
        if (ctx->input_dtype == MT_DTYPE_U8) {
            for (size_t i = 0; i < n_x; i++) {
                in[i] = (int8_t)((uint8_t)in[i] ^ 0x80u);
            }
        }
        return MT_OK;
    }
    float *in = MT_F32(ctx, ctx->in_ref);
    if ((const void *)in != x) {
        memcpy(in, x, n_x * sizeof(float));
    }
    return mt_all_finite(in, ctx->n_in) ? MT_OK : MT_E_NONFINITE;
}

void *mt_input_buffer(const mt_ctx_t *ctx) {
    return ready(ctx) && !input_in_place(ctx) ? mt_ptr(ctx, ctx->in_ref) : NULL;
}

/* Run the records in [begin, end) of the context; first is the index of the first. A plan read by
 * its head has each group of constants read into its window before the first op that needs it
 * (mt_stream.c); the window is free for other tensors after its last op, so nothing is assumed
 * loaded when a run starts, or after a failure. */
static int run_ops(mt_ctx_t *ctx, uint32_t begin, uint32_t end, uint32_t first) {
    const uint8_t *p = mt_context(ctx) + begin, *stop = mt_context(ctx) + end;
    uint32_t cursor = 0;
    ctx->loaded = -1;
    while (p < stop) {
        const mt_rec_t *r = (const mt_rec_t *)p;
        int32_t g = mt_group_of(ctx, first, &cursor);
        const uint32_t blocks = mt_group_blocks(ctx, g);
        int err = MT_OK;
        for (uint32_t b = 0; b < blocks && err == MT_OK; b++) {   /* an op on blocks of constants: each in turn */
            ctx->block = b;
            err = mt_stream_load(ctx, g, b);
            if (err == MT_OK) {
                err = mt_opdefs[r->code]->run(ctx, r);
            }
        }
        if (blocks > 1) {
            mt_stream_done(ctx);
        }
        if (err != MT_OK) {
            ctx->loaded = -1;
            ctx->err_op = (int32_t)first;
            return err;
        }
        if (g >= 0 && (blocks > 1 || mt_rd_u16(ctx->groups + (uint32_t)g * MT_GROUP_BYTES + MT_G_LAST_OP) == first)) {
            ctx->loaded = -1;
        }
        p += r->bytes;
        first++;
    }
    return MT_OK;
}

int mt_run_op(mt_ctx_t *ctx, uint32_t index) {
    mt_clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (input_in_place(ctx) && ctx->base[MT_REGION_INPUT] == 0) {
        return MT_E_NO_INPUT;
    }
    if (index >= ctx->n_ops) {
        return MT_E_INDEX;
    }
    uint32_t at = 0;
    for (uint32_t i = 0; i < index; i++) {
        at += ((const mt_rec_t *)(mt_context(ctx) + at))->bytes;
    }
    return run_ops(ctx, at, at + ((const mt_rec_t *)(mt_context(ctx) + at))->bytes, index);
}

/* A batch ends after every batch-th sample (counted in batch, so no counter
 * wrap can move the boundary); its BATCH_END ops run then, also with batch 1. */
static int step(mt_ctx_t *ctx, float *loss) {
    int err = run_ops(ctx, 0, ctx->phase_at[MT_PHASE_BATCH_END], 0);
    ctx->base[MT_REGION_INPUT] = 0;   /* an input read in place is the caller's for this call only */
    if (err != MT_OK) {
        ctx->rejected += err == MT_E_LOSS;
        return err;
    }
    ctx->steps++;
    if (++ctx->in_batch >= ctx->batch) {
        ctx->in_batch = 0;
        err = run_ops(ctx, ctx->phase_at[MT_PHASE_BATCH_END], ctx->params_at, ctx->phase_op[MT_PHASE_BATCH_END]);
        if (err != MT_OK) {
            ctx->rejected += err == MT_E_GRAD;   /* a non-finite gradient norm: nothing was updated */
            return err;
        }
        ctx->updates++;
    }
    if (loss != NULL) {
        *loss = ctx->loss;
    }
    return MT_OK;
}

static int can_step(mt_ctx_t *ctx, uint8_t loss_kind) {
    mt_clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (ctx->loss_kind != loss_kind) {
        return MT_E_TARGET_KIND;
    }
    return ctx->n_train_ops == 0 ? MT_E_NOT_TRAINABLE : MT_OK;
}

int mt_step_label(mt_ctx_t *ctx, const void *x, size_t n_x, int32_t label, float *loss) {
    int err = can_step(ctx, MT_LOSS_CROSS_ENTROPY);
    if (err != MT_OK) {
        return err;
    }
    if (label < 0 || (uint32_t)label >= ctx->n_out) {
        return MT_E_LABEL;
    }
    err = mt_set_input(ctx, x, n_x);
    if (err != MT_OK) {
        return err;
    }
    *(int32_t *)mt_ptr(ctx, ctx->target_ref) = label;
    return step(ctx, loss);
}

int mt_step_target(mt_ctx_t *ctx, const void *x, size_t n_x, const float *target, size_t n_target, float *loss) {
    int err = can_step(ctx, MT_LOSS_MSE);
    if (err != MT_OK) {
        return err;
    }
    if (target == NULL || n_target != ctx->n_target) {
        return MT_E_TARGET_LEN;
    }
    err = mt_set_input(ctx, x, n_x);
    if (err != MT_OK) {
        return err;
    }
    float *t = MT_F32(ctx, ctx->target_ref);
    memcpy(t, target, n_target * sizeof(float));
    if (!mt_all_finite(t, ctx->n_target)) {
        ctx->base[MT_REGION_INPUT] = 0;
        return MT_E_TARGET_NONFINITE;
    }
    return step(ctx, loss);
}

int mt_predict(mt_ctx_t *ctx, const void *x, size_t n_x, float *out, size_t n_out) {
    mt_clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (out == NULL || n_out != ctx->n_out) {
        return MT_E_OUTPUT_LEN;
    }
    int err = mt_set_input(ctx, x, n_x);
    if (err == MT_OK) {
        err = run_ops(ctx, 0, ctx->phase_at[MT_PHASE_TRAIN], 0);
    }
    ctx->base[MT_REGION_INPUT] = 0;
    if (err == MT_OK) {
        memcpy(out, MT_F32(ctx, ctx->out_ref), n_out * sizeof(float));
    }
    return err;
}

uint32_t mt_input_len(const mt_ctx_t *ctx) {
    return ctx->plan != NULL ? ctx->n_in : 0;
}

uint8_t mt_input_dtype(const mt_ctx_t *ctx) {
    return ctx->plan != NULL ? ctx->input_dtype : 0;
}

uint32_t mt_output_len(const mt_ctx_t *ctx) {
    return ctx->plan != NULL ? ctx->n_out : 0;
}

uint32_t mt_target_len(const mt_ctx_t *ctx) {
    return ctx->plan != NULL ? ctx->n_target : 0;
}
