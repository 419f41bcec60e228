/* microtrain core: run a loaded plan. A step is: copy the sample in, run the
 * forward and training ops in plan order, and at the end of a batch the SGD ops. */
#include <string.h>
#include "mt_kernels.h"

static int all_finite(const float *p, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], sizeof u);
        if ((u & 0x7F800000u) == 0x7F800000u) {
            return 0;
        }
    }
    return 1;
}

static int ready(const mt_ctx_t *ctx) {
    return ctx->plan != NULL && ctx->ram != NULL;
}

/* Every entry point starts here: an error names where it happened, never where an earlier one did. */
static void clear_error(mt_ctx_t *ctx) {
    ctx->err_op = -1;
    ctx->err_tensor = -1;
}

/* x may be unaligned (a slice of a byte buffer): copy bytewise, then check. */
int mt_set_input(mt_ctx_t *ctx, const float *x, size_t n_x) {
    clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    mt_tensor_t in;
    mt_tensor_decode(ctx, ctx->input, &in);
    if (x == NULL || n_x != in.n) {
        return MT_E_INPUT_LEN;
    }
    memcpy(in.data, x, n_x * sizeof(float));
    return all_finite(in.data, in.n) ? MT_OK : MT_E_NONFINITE;
}

static mt_sink_t sink_of(const mt_ctx_t *ctx, const mt_op_t *op, int w_slot) {
    mt_sink_t s;
    s.w = op->t[w_slot].data;
    s.m = op->t[w_slot + 1].data;
    s.acc = op->t[w_slot + 2].data;
    s.lr = ctx->lr;
    s.mu = ctx->momentum;
    s.wd = ctx->weight_decay;
    s.scale = 1.0f;
    return s;
}

int mt_op_run(mt_ctx_t *ctx, const mt_op_t *op) {
    mt_sink_t sink;
    float loss;
    switch (op->code) {
        case MT_OP_CONV2D: mt_k_conv2d(op); break;
        case MT_OP_CONV2D_BWD_INPUT: mt_k_conv2d_bwd_input(op); break;
        case MT_OP_CONV2D_BWD_WEIGHT:
            sink = sink_of(ctx, op, MT_CONV2D_BWD_WEIGHT_W);
            mt_k_conv2d_bwd_weight(op, &sink);
            break;
        case MT_OP_GEMM: mt_k_gemm(op); break;
        case MT_OP_GEMM_BWD_INPUT: mt_k_gemm_bwd_input(op); break;
        case MT_OP_GEMM_BWD_WEIGHT:
            sink = sink_of(ctx, op, MT_GEMM_BWD_WEIGHT_W);
            mt_k_gemm_bwd_weight(op, &sink);
            break;
        case MT_OP_BIAS_BWD:
            sink = sink_of(ctx, op, MT_BIAS_BWD_W);
            mt_k_bias_bwd(op, &sink);
            break;
        case MT_OP_CLIP: mt_k_clip(op); break;
        case MT_OP_CLIP_BWD: mt_k_clip_bwd(op); break;
        case MT_OP_MAXPOOL: mt_k_maxpool(op); break;
        case MT_OP_MAXPOOL_BWD: mt_k_maxpool_bwd(op); break;
        case MT_OP_AVGPOOL: mt_k_avgpool(op); break;
        case MT_OP_AVGPOOL_BWD: mt_k_avgpool_bwd(op); break;
        case MT_OP_GAP: mt_k_gap(op); break;
        case MT_OP_GAP_BWD: mt_k_gap_bwd(op); break;
        case MT_OP_ADD: mt_k_add(op); break;
        case MT_OP_SOFTMAX_CE:
        case MT_OP_MSE: {
            if (op->code == MT_OP_SOFTMAX_CE) {
                int32_t label = *(const int32_t *)op->t[MT_SOFTMAX_CE_LABEL].data;
                if (label < 0 || (uint32_t)label >= op->t[MT_SOFTMAX_CE_LOGITS].n) {
                    return MT_E_LABEL;
                }
                loss = mt_k_softmax_ce(op);
            } else {
                loss = mt_k_mse(op);
            }
            ctx->loss = loss;
            if (!all_finite(&loss, 1)) {
                return MT_E_LOSS;
            }
            break;
        }
        case MT_OP_SGD:
            sink = sink_of(ctx, op, MT_SGD_W);
            sink.scale = 1.0f / (float)ctx->batch;
            mt_k_sgd(op, &sink);
            break;
        default:
            return MT_E_OPCODE;
    }
    return MT_OK;
}

/* Run every op whose phase is in [lo, hi]; phases are sorted, so stop past hi. */
static int run_phases(mt_ctx_t *ctx, uint8_t lo, uint8_t hi) {
    uint32_t pos = 0, next;
    mt_op_t op;
    for (uint32_t i = 0; i < ctx->n_ops; i++, pos = next) {
        int err = mt_decode_at(ctx, pos, &op, &next);
        if (err != MT_OK) {
            return err;
        }
        if (op.phase > hi) {
            break;
        }
        if (op.phase < lo) {
            continue;
        }
        for (int s = 0; s < op.n_t; s++) {
            mt_tensor_decode(ctx, op.tid[s], &op.t[s]);
        }
        err = mt_op_run(ctx, &op);
        if (err != MT_OK) {
            ctx->err_op = (int32_t)i;
            return err;
        }
    }
    return MT_OK;
}

int mt_run_op(mt_ctx_t *ctx, uint32_t index) {
    clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    mt_op_t op;
    int err = mt_op_decode(ctx, index, &op);
    return err != MT_OK ? err : mt_op_run(ctx, &op);
}

static int step(mt_ctx_t *ctx, float *loss) {
    int err = run_phases(ctx, MT_PHASE_FORWARD, MT_PHASE_TRAIN);
    if (err != MT_OK) {
        return err;
    }
    ctx->steps++;
    if (ctx->steps % ctx->batch == 0) {   /* BATCH_END ops run with batch 1 too (shared parameters) */
        err = run_phases(ctx, MT_PHASE_BATCH_END, MT_PHASE_BATCH_END);
        if (err != MT_OK) {
            return err;
        }
        ctx->updates++;
    }
    if (loss != NULL) {
        *loss = ctx->loss;
    }
    return MT_OK;
}

int mt_step_label(mt_ctx_t *ctx, const float *x, size_t n_x, int32_t label, float *loss) {
    clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (ctx->loss_kind != MT_LOSS_CROSS_ENTROPY) {
        return MT_E_TARGET_KIND;
    }
    if (ctx->n_train_ops == 0) {
        return MT_E_NOT_TRAINABLE;
    }
    if (label < 0 || (uint32_t)label >= mt_output_len(ctx)) {
        return MT_E_LABEL;
    }
    int err = mt_set_input(ctx, x, n_x);
    if (err != MT_OK) {
        return err;
    }
    mt_tensor_t t;
    mt_tensor_decode(ctx, ctx->target, &t);
    *(int32_t *)t.data = label;
    return step(ctx, loss);
}

int mt_step_target(mt_ctx_t *ctx, const float *x, size_t n_x, const float *target, size_t n_target, float *loss) {
    clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    if (ctx->loss_kind != MT_LOSS_MSE) {
        return MT_E_TARGET_KIND;
    }
    if (ctx->n_train_ops == 0) {
        return MT_E_NOT_TRAINABLE;
    }
    mt_tensor_t t;
    mt_tensor_decode(ctx, ctx->target, &t);
    if (target == NULL || n_target != t.n) {
        return MT_E_TARGET_LEN;
    }
    int err = mt_set_input(ctx, x, n_x);
    if (err != MT_OK) {
        return err;
    }
    memcpy(t.data, target, n_target * sizeof(float));
    if (!all_finite(t.data, t.n)) {
        return MT_E_TARGET_NONFINITE;
    }
    return step(ctx, loss);
}

int mt_predict(mt_ctx_t *ctx, const float *x, size_t n_x, float *out, size_t n_out) {
    clear_error(ctx);
    if (!ready(ctx)) {
        return MT_E_DETACHED;
    }
    mt_tensor_t y;
    mt_tensor_decode(ctx, ctx->output, &y);
    if (out == NULL || n_out != y.n) {
        return MT_E_OUTPUT_LEN;
    }
    int err = mt_set_input(ctx, x, n_x);
    if (err == MT_OK) {
        err = run_phases(ctx, MT_PHASE_FORWARD, MT_PHASE_FORWARD);
    }
    if (err == MT_OK) {
        memcpy(out, y.data, n_out * sizeof(float));
    }
    return err;
}

static uint32_t len_of(const mt_ctx_t *ctx, uint16_t tid) {
    if (ctx->plan == NULL) {
        return 0;
    }
    mt_tensor_t t;
    mt_tensor_decode(ctx, tid, &t);
    return t.n;
}

uint32_t mt_input_len(const mt_ctx_t *ctx) {
    return len_of(ctx, ctx->input);
}

uint32_t mt_output_len(const mt_ctx_t *ctx) {
    return len_of(ctx, ctx->output);
}

uint32_t mt_target_len(const mt_ctx_t *ctx) {
    return len_of(ctx, ctx->target);
}
