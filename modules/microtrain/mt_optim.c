/* microtrain core: the optimizer step that ends a batch (batch > 1). With batch 1
 * the update happens inside the gradient kernels, through mt_sink_put. */
#include "mt_kernels.h"

/* End of a batch: apply the mean of the accumulated gradients, then clear them. */
void mt_k_sgd(const mt_op_t *op, const mt_sink_t *sink) {
    float *acc = op->t[MT_SGD_ACC].data;
    mt_sink_t s = *sink;
    s.acc = NULL;   /* the sink must update the parameter, not add the gradient back to the accumulator */
    for (uint32_t i = 0; i < op->t[MT_SGD_ACC].n; i++) {
        const float g = acc[i];
        acc[i] = 0.0f;
        mt_sink_put(&s, i, g);
    }
}
