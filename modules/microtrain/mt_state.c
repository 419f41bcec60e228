/* microtrain core: settings, facts, trainable parameters and training-state
 * checkpoints. Each setter checks everything before it changes anything. */
#include <string.h>
#include "mt_core.h"

static int ready(const mt_ctx_t *ctx) {
    return ctx->plan != NULL && ctx->ram != NULL;
}

int mt_set_lr(mt_ctx_t *ctx, float lr) {
    mt_clear_error(ctx);
    if (!mt_f32_finite(lr) || lr < 0.0f) {
        return MT_E_LR;
    }
    ctx->lr = lr;
    return MT_OK;
}

int mt_info(const mt_ctx_t *ctx, mt_info_t *info) {
    memset(info, 0, sizeof *info);
    info->format_version = MT_VERSION;
    if (ctx->plan == NULL) {
        return MT_E_DETACHED;
    }
    info->plan_bytes = ctx->plan_bytes;
    info->arena_bytes = ctx->arena_bytes;
    info->state_bytes = ctx->state_bytes;
    info->context_bytes = ctx->context_bytes;
    info->ram_bytes = mt_ram_bytes(ctx);
    info->naive_bytes = ctx->naive_bytes;
    info->const_bytes = ctx->const_bytes;
    info->macs = ctx->macs;
    info->n_tensors = ctx->n_tensors;
    info->n_ops = ctx->n_ops;
    info->n_params = ctx->n_params;
    info->n_train_ops = ctx->n_train_ops;
    info->state_size = mt_state_size(ctx);
    info->steps = ctx->steps;
    info->updates = ctx->updates;
    info->in_batch = ctx->in_batch;
    info->rejected = ctx->rejected;
    info->loss = ctx->loss;
    info->lr = ctx->lr;
    info->momentum = ctx->momentum;
    info->weight_decay = ctx->weight_decay;
    info->batch = ctx->batch;
    info->loss_kind = ctx->loss_kind;
    info->input_dtype = ctx->input_dtype;
    info->context_in_plan = ctx->context_in_plan;
    info->streamed = ctx->read != NULL && ctx->stream_off != 0;
    info->head_bytes = ctx->stream_off != 0 ? ctx->stream_off : ctx->plan_bytes;
    info->stream_bytes = ctx->stream_bytes;
    info->n_groups = ctx->n_groups;
    info->stream_reads = ctx->stream_reads;
    info->stream_read_bytes = ctx->stream_read_bytes;
    return MT_OK;
}

/* ---- parameters ---- */

uint32_t mt_param_count(const mt_ctx_t *ctx) {
    return ctx->plan != NULL ? ctx->n_params : 0;
}

int mt_param_info(const mt_ctx_t *ctx, uint32_t k, mt_tensor_info_t *info) {
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (k >= ctx->n_params) {
        return MT_E_INDEX;
    }
    const mt_param_rec_t *p = mt_param_rec(ctx, k);
    info->name = mt_name_of(ctx, p->name, &info->name_len);
    info->data = ctx->ram + p->state_off;
    info->bytes = p->bytes;
    info->n = p->n;
    memcpy(info->dim, p->dim, sizeof info->dim);
    info->ndim = p->ndim;
    info->dtype = p->dtype;
    info->storage = MT_STORAGE_STATE;
    info->flags = MT_TFLAG_PARAM;
    return MT_OK;
}

int mt_check_param(mt_ctx_t *ctx, uint32_t k, const float *data, size_t n) {
    mt_clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (k >= ctx->n_params) {
        return MT_E_INDEX;
    }
    const mt_param_rec_t *p = mt_param_rec(ctx, k);
    ctx->err_tensor = (int32_t)p->tensor;
    if (data == NULL || n != p->n) {
        return MT_E_PARAM_LEN;
    }
    if (!mt_all_finite(data, p->n)) {
        return MT_E_PARAM_NONFINITE;
    }
    if (p->q8.scales != MT_REF_NONE) {   /* an int8 weight: each value within 127.5 steps of its channel's scale */
        const float *sc = (const float *)mt_ptr(ctx, p->q8.scales);
        for (uint32_t e = 0; e < p->n; e++) {
            float v;
            memcpy(&v, (const uint8_t *)data + 4u * e, sizeof v);
            v = v / sc[(e / p->q8.inner) % p->q8.nch];
            if (!(v > -127.5f && v < 127.5f)) {
                return MT_E_PARAM_RANGE;
            }
        }
    }
    ctx->err_tensor = -1;
    return MT_OK;
}

int mt_set_param(mt_ctx_t *ctx, uint32_t k, const float *data, size_t n) {
    int err = mt_check_param(ctx, k, data, n);
    if (err != MT_OK) {
        return err;
    }
    const mt_param_rec_t *p = mt_param_rec(ctx, k);
    if (p->q8.scales == MT_REF_NONE) {
        memcpy(ctx->ram + p->state_off, data, p->bytes);
        return MT_OK;
    }
    const float *sc = (const float *)mt_ptr(ctx, p->q8.scales);   /* the sink's rounding, mt_q8state.c */
    int8_t *w = (int8_t *)(ctx->ram + p->state_off);
    for (uint32_t e = 0; e < p->n; e++) {
        float v;
        memcpy(&v, (const uint8_t *)data + 4u * e, sizeof v);
        w[e] = mt_q8w_round(v / sc[(e / p->q8.inner) % p->q8.nch]);
    }
    return MT_OK;
}

int mt_get_param(const mt_ctx_t *ctx, uint32_t k, float *out, size_t n) {
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (k >= ctx->n_params) {
        return MT_E_INDEX;
    }
    const mt_param_rec_t *p = mt_param_rec(ctx, k);
    if (out == NULL || n != p->n) {
        return MT_E_PARAM_LEN;
    }
    if (p->q8.scales == MT_REF_NONE) {
        memcpy(out, ctx->ram + p->state_off, p->bytes);
        return MT_OK;
    }
    const float *sc = (const float *)mt_ptr(ctx, p->q8.scales);
    const int8_t *w = (const int8_t *)(ctx->ram + p->state_off);
    for (uint32_t e = 0; e < p->n; e++) {
        float v = (float)w[e] * sc[(e / p->q8.inner) % p->q8.nch];
        memcpy((uint8_t *)out + 4u * e, &v, sizeof v);
    }
    return MT_OK;
}

/* ---- training-state blob (layout in format.py: STATE_FIELDS) ---- */

uint32_t mt_state_size(const mt_ctx_t *ctx) {
    return ctx->plan != NULL ? MT_STATE_HEADER_BYTES + ctx->state_bytes + 4u : 0;
}

int mt_state_parts(const mt_ctx_t *ctx, uint8_t *head, const uint8_t **state, uint32_t *crc) {
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    uint8_t *p = head;
    uint32_t lr;
    memcpy(&lr, &ctx->lr, sizeof lr);
    memset(p, 0, MT_STATE_HEADER_BYTES);
    memcpy(p + MT_S_MAGIC, MT_STATE_MAGIC, 4);
    p[MT_S_VERSION] = MT_STATE_VERSION & 0xFF;
    p[MT_S_VERSION + 1] = MT_STATE_VERSION >> 8;
    mt_wr_u32(p + MT_S_PLAN_CRC32, ctx->plan_crc);
    mt_wr_u32(p + MT_S_STATE_BYTES, ctx->state_bytes);
    mt_wr_u32(p + MT_S_STEPS, ctx->steps);
    mt_wr_u32(p + MT_S_UPDATES, ctx->updates);
    mt_wr_u32(p + MT_S_IN_BATCH, ctx->in_batch);
    mt_wr_u32(p + MT_S_REJECTED, ctx->rejected);
    mt_wr_u32(p + MT_S_LR, lr);
    *state = ctx->ram;
    *crc = mt_crc32_more(mt_crc32(head, MT_STATE_HEADER_BYTES), ctx->ram, ctx->state_bytes);
    return MT_OK;
}

int mt_save_state(const mt_ctx_t *ctx, void *buf, size_t n) {
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    uint32_t size = mt_state_size(ctx);
    if (buf == NULL || n != size) {
        return MT_E_STATE_LEN;
    }
    uint8_t *p = (uint8_t *)buf;
    const uint8_t *state;
    uint32_t crc;
    int err = mt_state_parts(ctx, p, &state, &crc);
    if (err != MT_OK) {
        return err;
    }
    memcpy(p + MT_STATE_HEADER_BYTES, state, ctx->state_bytes);
    mt_wr_u32(p + size - 4, crc);
    return MT_OK;
}

int mt_load_state(mt_ctx_t *ctx, const void *buf, size_t n) {
    mt_clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    uint32_t size = mt_state_size(ctx);
    const uint8_t *p = (const uint8_t *)buf;
    if (buf == NULL || n < MT_STATE_HEADER_BYTES + 4u) {
        return MT_E_STATE_LEN;
    }
    if (memcmp(p + MT_S_MAGIC, MT_STATE_MAGIC, 4) != 0 || mt_rd_u16(p + MT_S_VERSION) != MT_STATE_VERSION) {
        return MT_E_STATE_CORRUPT;
    }
    if (mt_rd_u32(p + MT_S_PLAN_CRC32) != ctx->plan_crc || mt_rd_u32(p + MT_S_STATE_BYTES) != ctx->state_bytes) {
        return MT_E_STATE_PLAN;
    }
    if (n != size) {
        return MT_E_STATE_LEN;
    }
    if (mt_crc32(p, size - 4) != mt_rd_u32(p + size - 4)) {
        return MT_E_STATE_CORRUPT;
    }
    float lr = mt_f32_from_bits((int32_t)mt_rd_u32(p + MT_S_LR));
    if (mt_rd_u16(p + MT_S_RESERVED0) != 0 || mt_rd_u32(p + MT_S_RESERVED1) != 0
        || mt_rd_u32(p + MT_S_IN_BATCH) >= ctx->batch || !mt_f32_finite(lr) || lr < 0.0f) {
        return MT_E_STATE_CORRUPT;
    }
    memcpy(ctx->ram, p + MT_STATE_HEADER_BYTES, ctx->state_bytes);
    ctx->steps = mt_rd_u32(p + MT_S_STEPS);
    ctx->updates = mt_rd_u32(p + MT_S_UPDATES);
    ctx->in_batch = mt_rd_u32(p + MT_S_IN_BATCH);
    ctx->rejected = mt_rd_u32(p + MT_S_REJECTED);
    ctx->lr = lr;
    ctx->loss = 0.0f;
    return MT_OK;
}
