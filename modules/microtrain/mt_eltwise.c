/* microtrain core: element-wise ops. Each may run in place (output == input). */
#include "mt_kernels.h"

/* Relu is Clip(0, +inf); ReLU6 is Clip(0, 6). */
void mt_k_clip(const mt_op_t *op) {
    const float lo = mt_f32_from_bits(op->a[MT_CLIP_A_LO_BITS]), hi = mt_f32_from_bits(op->a[MT_CLIP_A_HI_BITS]);
    const float *x = op->t[MT_CLIP_X].data;
    float *y = op->t[MT_CLIP_Y].data;
    for (uint32_t i = 0; i < op->t[MT_CLIP_Y].n; i++) {
        float v = x[i];
        y[i] = v < lo ? lo : (v > hi ? hi : v);
    }
}

/* The gradient passes where the output lies strictly inside (lo, hi); the
 * output alone decides, so the forward may overwrite its input. */
void mt_k_clip_bwd(const mt_op_t *op) {
    const float lo = mt_f32_from_bits(op->a[MT_CLIP_BWD_A_LO_BITS]);
    const float hi = mt_f32_from_bits(op->a[MT_CLIP_BWD_A_HI_BITS]);
    const float *y = op->t[MT_CLIP_BWD_Y].data, *dy = op->t[MT_CLIP_BWD_DY].data;
    float *dx = op->t[MT_CLIP_BWD_DX].data;
    for (uint32_t i = 0; i < op->t[MT_CLIP_BWD_DX].n; i++) {
        dx[i] = (y[i] > lo && y[i] < hi) ? dy[i] : 0.0f;
    }
}

void mt_k_add(const mt_op_t *op) {
    const float *a = op->t[MT_ADD_A].data, *b = op->t[MT_ADD_B].data;
    float *y = op->t[MT_ADD_Y].data;
    for (uint32_t i = 0; i < op->t[MT_ADD_Y].n; i++) {
        y[i] = a[i] + b[i];
    }
}
