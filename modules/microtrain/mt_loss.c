/* microtrain core: losses. Each writes the gradient of the loss with respect to
 * the model output and sets ctx->loss; a non-finite loss is an error, raised
 * before any parameter changes (the loss is the first training op). */
#include "mt_core.h"

typedef struct {
    mt_rec_t h;
    uint32_t out, target, dout, n;   /* SOFTMAX_CE: logits, label, dlogits */
} loss_rec_t;

static int finish(mt_ctx_t *ctx, float loss) {
    ctx->loss = loss;
    return mt_f32_finite(loss) ? MT_OK : MT_E_LOSS;
}

/* ---- SOFTMAX_CE: softmax fused with cross-entropy: loss = logsumexp(z) - z[label],
 * dz = softmax(z) - onehot(label) ---- */

static int softmax_ce_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return t[MT_SOFTMAX_CE_LABEL].n == 1 && t[MT_SOFTMAX_CE_LOGITS].n == t[MT_SOFTMAX_CE_DLOGITS].n
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t softmax_ce_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    loss_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->out = op->t[MT_SOFTMAX_CE_LOGITS].ref;
        r->target = op->t[MT_SOFTMAX_CE_LABEL].ref;
        r->dout = op->t[MT_SOFTMAX_CE_DLOGITS].ref;
        r->n = op->t[MT_SOFTMAX_CE_LOGITS].n;
    }
    return sizeof(loss_rec_t);
}

static int softmax_ce_run(mt_ctx_t *ctx, const void *rec) {
    const loss_rec_t *r = rec;
    const float *z = MT_F32(ctx, r->out);
    const int32_t label = *(const int32_t *)mt_ptr(ctx, r->target);
    float *dz = MT_F32(ctx, r->dout);
    const uint32_t n = r->n;
    if (label < 0 || (uint32_t)label >= n) {   /* the label tensor is arena memory: check it here */
        return MT_E_LABEL;
    }
    float m = z[0];
    for (uint32_t i = 1; i < n; i++) {
        m = z[i] > m ? z[i] : m;
    }
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        dz[i] = mt_expf(z[i] - m);
        s += dz[i];
    }
    const float loss = mt_logf(s) + m - z[label];
    const float inv = 1.0f / s;
    for (uint32_t i = 0; i < n; i++) {
        dz[i] *= inv;
    }
    dz[label] -= 1.0f;
    return finish(ctx, loss);
}

const mt_opdef_t mt_op_SOFTMAX_CE = {softmax_ce_check, softmax_ce_prepare, softmax_ce_run};

/* ---- MSE: mean squared error over all outputs, as torch.nn.MSELoss(reduction='mean') ---- */

static int mse_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return t[MT_MSE_OUT].n == t[MT_MSE_TARGET].n && t[MT_MSE_TARGET].n == t[MT_MSE_DOUT].n ? MT_OK : MT_E_SHAPE;
}

static uint32_t mse_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    loss_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->out = op->t[MT_MSE_OUT].ref;
        r->target = op->t[MT_MSE_TARGET].ref;
        r->dout = op->t[MT_MSE_DOUT].ref;
        r->n = op->t[MT_MSE_OUT].n;
    }
    return sizeof(loss_rec_t);
}

static int mse_run(mt_ctx_t *ctx, const void *rec) {
    const loss_rec_t *r = rec;
    const float *o = MT_F32(ctx, r->out), *t = MT_F32(ctx, r->target);
    float *d = MT_F32(ctx, r->dout);
    const uint32_t n = r->n;
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        const float e = o[i] - t[i];
        s += e * e;
        d[i] = 2.0f * e / (float)n;
    }
    return finish(ctx, s / (float)n);
}

const mt_opdef_t mt_op_MSE = {mse_check, mse_prepare, mse_run};
