/* microtrain core: kernel signatures and the optimizer sink they share.
 * Kernels trust the op: mt_load checked every shape and attribute. */
#ifndef MT_KERNELS_H
#define MT_KERNELS_H

#include "mt_core.h"

/* Where a parameter gradient goes the moment it is computed: straight into an
 * SGD update of the parameter (batch 1, so no gradient buffer exists at all), or
 * into an accumulator that the SGD op applies at the end of the batch. */
typedef struct {
    float *w;      /* parameter */
    float *m;      /* momentum buffer or NULL */
    float *acc;    /* gradient accumulator or NULL */
    float lr, mu, wd, scale;
} mt_sink_t;

static inline void mt_sink_put(const mt_sink_t *s, uint32_t i, float g) {
    if (s->acc != NULL) {
        s->acc[i] += g;
        return;
    }
    g = g * s->scale + s->wd * s->w[i];   /* PyTorch SGD: weight decay, then momentum */
    if (s->m != NULL) {
        s->m[i] = s->mu * s->m[i] + g;
        g = s->m[i];
    }
    s->w[i] -= s->lr * g;
}

void mt_k_conv2d(const mt_op_t *op);
void mt_k_conv2d_bwd_input(const mt_op_t *op);
void mt_k_conv2d_bwd_weight(const mt_op_t *op, const mt_sink_t *sink);
void mt_k_gemm(const mt_op_t *op);
void mt_k_gemm_bwd_input(const mt_op_t *op);
void mt_k_gemm_bwd_weight(const mt_op_t *op, const mt_sink_t *sink);
void mt_k_bias_bwd(const mt_op_t *op, const mt_sink_t *sink);
void mt_k_clip(const mt_op_t *op);
void mt_k_clip_bwd(const mt_op_t *op);
void mt_k_maxpool(const mt_op_t *op);
void mt_k_maxpool_bwd(const mt_op_t *op);
void mt_k_avgpool(const mt_op_t *op);
void mt_k_avgpool_bwd(const mt_op_t *op);
void mt_k_gap(const mt_op_t *op);
void mt_k_gap_bwd(const mt_op_t *op);
void mt_k_add(const mt_op_t *op);
float mt_k_softmax_ce(const mt_op_t *op);
float mt_k_mse(const mt_op_t *op);
void mt_k_sgd(const mt_op_t *op, const mt_sink_t *sink);

#endif /* MT_KERNELS_H */
