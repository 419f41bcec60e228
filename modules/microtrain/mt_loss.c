/* microtrain core: losses. Each writes the gradient of the loss with respect to
 * the model output and returns the loss; the caller rejects a non-finite loss
 * before any parameter changes. */
#include "mt_kernels.h"

/* Softmax fused with cross-entropy: loss = logsumexp(z) - z[label],
 * dz = softmax(z) - onehot(label). The label was range-checked on entry. */
float mt_k_softmax_ce(const mt_op_t *op) {
    const float *z = op->t[MT_SOFTMAX_CE_LOGITS].data;
    const int32_t label = *(const int32_t *)op->t[MT_SOFTMAX_CE_LABEL].data;
    float *dz = op->t[MT_SOFTMAX_CE_DLOGITS].data;
    const uint32_t n = op->t[MT_SOFTMAX_CE_LOGITS].n;
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
    return loss;
}

/* Mean squared error over all outputs, as torch.nn.MSELoss(reduction='mean'). */
float mt_k_mse(const mt_op_t *op) {
    const float *o = op->t[MT_MSE_OUT].data, *t = op->t[MT_MSE_TARGET].data;
    float *d = op->t[MT_MSE_DOUT].data;
    const uint32_t n = op->t[MT_MSE_OUT].n;
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        const float e = o[i] - t[i];
        s += e * e;
        d[i] = 2.0f * e / (float)n;
    }
    return s / (float)n;
}
