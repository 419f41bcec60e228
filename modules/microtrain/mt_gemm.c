/* microtrain core: fully connected layer y = W x + b, forward and backward.
 * W is [O, K] (layout OUT_IN) or [K, O] (IN_OUT), as the ONNX model stores it. */
#include "mt_kernels.h"

/* Strides of W(o, k) for a layout. */
static void strides(int32_t layout, uint32_t O, uint32_t K, uint32_t *so, uint32_t *sk) {
    *so = layout == MT_W_LAYOUT_OUT_IN ? K : 1;
    *sk = layout == MT_W_LAYOUT_OUT_IN ? 1 : O;
}

void mt_k_gemm(const mt_op_t *op) {
    const float *x = op->t[MT_GEMM_X].data, *w = op->t[MT_GEMM_W].data, *b = op->t[MT_GEMM_B].data;
    float *y = op->t[MT_GEMM_Y].data;
    const uint32_t O = op->t[MT_GEMM_Y].n, K = op->t[MT_GEMM_X].n;
    uint32_t so, sk;
    strides(op->a[MT_GEMM_A_W_LAYOUT], O, K, &so, &sk);
    for (uint32_t o = 0; o < O; o++) {
        float acc = b != NULL ? b[o] : 0.0f;
        for (uint32_t k = 0; k < K; k++) {
            acc += w[o * so + k * sk] * x[k];
        }
        y[o] = acc;
    }
}

void mt_k_gemm_bwd_input(const mt_op_t *op) {
    const float *dy = op->t[MT_GEMM_BWD_INPUT_DY].data, *w = op->t[MT_GEMM_BWD_INPUT_W].data;
    float *dx = op->t[MT_GEMM_BWD_INPUT_DX].data;
    const uint32_t O = op->t[MT_GEMM_BWD_INPUT_DY].n, K = op->t[MT_GEMM_BWD_INPUT_DX].n;
    uint32_t so, sk;
    strides(op->a[MT_GEMM_BWD_INPUT_A_W_LAYOUT], O, K, &so, &sk);
    for (uint32_t k = 0; k < K; k++) {
        float acc = 0.0f;
        for (uint32_t o = 0; o < O; o++) {
            acc += w[o * so + k * sk] * dy[o];
        }
        dx[k] = acc;
    }
}

/* dW(o, k) = dy[o] * x[k], each element handed to the sink as it is formed. */
void mt_k_gemm_bwd_weight(const mt_op_t *op, const mt_sink_t *sink) {
    const float *dy = op->t[MT_GEMM_BWD_WEIGHT_DY].data, *x = op->t[MT_GEMM_BWD_WEIGHT_X].data;
    const uint32_t O = op->t[MT_GEMM_BWD_WEIGHT_DY].n, K = op->t[MT_GEMM_BWD_WEIGHT_X].n;
    uint32_t so, sk;
    strides(op->a[MT_GEMM_BWD_WEIGHT_A_W_LAYOUT], O, K, &so, &sk);
    const uint32_t o0 = (uint32_t)op->a[MT_GEMM_BWD_WEIGHT_A_O_BEGIN];
    const uint32_t o1 = o0 + (uint32_t)op->a[MT_GEMM_BWD_WEIGHT_A_O_COUNT];
    const uint32_t k0 = (uint32_t)op->a[MT_GEMM_BWD_WEIGHT_A_I_BEGIN];
    const uint32_t k1 = k0 + (uint32_t)op->a[MT_GEMM_BWD_WEIGHT_A_I_COUNT];
    for (uint32_t o = o0; o < o1; o++) {
        for (uint32_t k = k0; k < k1; k++) {
            mt_sink_put(sink, o * so + k * sk, dy[o] * x[k]);
        }
    }
}
