/* microtrain core: the optimizer. The sink every parameter-gradient op hands its
 * gradients to, the bias gradient (BIAS_BWD) and the SGD op that ends a batch.
 *
 * PyTorch's SGD, element by element: g += wd*w; m = momentum*m + g; w -= lr*m
 * (the momentum buffer starts at zero, so its first value is g, as PyTorch's).
 * Which of those terms exist is fixed when the plan is decoded, so each case is
 * its own loop with no test inside. An int8 parameter (mt_q8state.c) takes the same
 * step on its float value w * s and is rounded back: sink_q8.
 */
#include "mt_core.h"

/* With batch 1 a gradient op updates its parameter at once (momentum buffer
 * present iff momentum > 0); otherwise it adds into an accumulator (no momentum
 * buffer) that an SGD op applies when a batch ends, also with batch 1 (a
 * parameter shared by two layers sums both gradients first). The SGD op itself
 * needs the accumulator. */
int mt_sink_check(const mt_ctx_t *ctx, const mt_tensor_t *w, const mt_tensor_t *m, const mt_tensor_t *acc,
    int is_grad_op, uint32_t part_n) {
    int has_m = m->n != 0, has_acc = acc->n != 0, want_m = ctx->momentum > 0.0f;
    mt_q8w_t q;
    if (w->dtype != MT_DTYPE_F32 && !mt_q8w_of(ctx, w, &q)) {
        return 0;
    }
    int ok = is_grad_op ? (has_acc ? !has_m : ctx->batch == 1 && has_m == want_m) : has_acc && has_m == want_m;
    return ok && (!has_m || ((m->n == w->n || m->n == part_n) && (m->flags & MT_TFLAG_MOMENTUM)))
           && (!has_acc || ((acc->n == w->n || acc->n == part_n) && (acc->flags & MT_TFLAG_GRAD_ACC)));
}

/* acc NULL: the sink updates the parameter (the SGD op reads the accumulator itself). */
void mt_sink_prepare(const mt_ctx_t *ctx, const mt_tensor_t *w, const mt_tensor_t *m, const mt_tensor_t *acc,
    mt_sink_rec_t *s) {
    int has_m = m->n != 0, has_wd = ctx->weight_decay != 0.0f;
    s->w = w->ref;
    s->m = has_m ? m->ref : MT_REF_NONE;
    s->acc = acc != NULL && acc->n != 0 ? acc->ref : MT_REF_NONE;
    s->parts = (uint8_t)((has_m && m->n != w->n ? MT_SINK_M_PART : 0)
        | (s->acc != MT_REF_NONE && acc->n != w->n ? MT_SINK_ACC_PART : 0));
    s->q8_param = w->dtype == MT_DTYPE_I8 ? mt_param_of(ctx, w->ref) : MT_NO_TENSOR;
    s->mode = (uint8_t)(s->acc != MT_REF_NONE ? MT_SINK_ACC
        : has_m ? (has_wd ? MT_SINK_MOM_WD : MT_SINK_MOM) : (has_wd ? MT_SINK_SGD_WD : MT_SINK_SGD));
}

/* Where g comes from: computed by the caller (VEC), d * v[i] (OUTER, the weight
 * gradient of a fully connected layer), or an accumulator read, scaled to the
 * batch mean and cleared (BATCH, the SGD op). */
enum { FORM_VEC, FORM_OUTER, FORM_BATCH };

typedef struct {
    float *w, *m, *acc;
    const float *v;
    float d, lr, mu, wd, scale;
    uint32_t ws, ms, as;          /* row strides of w, m, acc (outer products) */
} sink_args_t;

/* The update of element k (a constant in each unrolled copy) given its gradient g. */
MT_INLINE void sink_update(const int mode, float *w, float *m, float *acc, int k, float g, float lr, float mu,
    float wd) {
    if (mode == MT_SINK_ACC) {
        acc[k] += g;
        return;
    }
    if (mode == MT_SINK_SGD_WD || mode == MT_SINK_MOM_WD) {
        g = g + wd * w[k];
    }
    if (mode == MT_SINK_MOM || mode == MT_SINK_MOM_WD) {
        g = mu * m[k] + g;
        m[k] = g;
    }
    w[k] -= lr * g;
}

/* The gradient of element k in each form (the BATCH form also clears the accumulator). */
MT_INLINE float sink_grad(const int form, float *acc, const float *v, int k, float d, float scale) {
    if (form == FORM_OUTER) {
        return d * v[k];
    }
    if (form == FORM_VEC) {
        return v[k];
    }
    const float g = v[k] * scale;
    acc[k] = 0.0f;
    return g;
}

#define MT_USES_W(mode) ((mode) != MT_SINK_ACC)
#define MT_USES_M(mode) ((mode) == MT_SINK_MOM || (mode) == MT_SINK_MOM_WD)

/* One loop per (mode, form): mode and form are constants at every call, so
 * each call below compiles to a loop without branches, four elements a turn. */
MT_INLINE void sink_loop(const int mode, const int form, const sink_args_t *a, uint32_t n) {
    float *w = a->w, *m = a->m, *acc = a->acc;
    const float *v = a->v;
    const float d = a->d, lr = a->lr, mu = a->mu, wd = a->wd, scale = a->scale;
    const int uses_acc = mode == MT_SINK_ACC || form == FORM_BATCH;
    for (; n >= 4; n -= 4) {
        const float g0 = sink_grad(form, acc, v, 0, d, scale), g1 = sink_grad(form, acc, v, 1, d, scale);
        const float g2 = sink_grad(form, acc, v, 2, d, scale), g3 = sink_grad(form, acc, v, 3, d, scale);
        sink_update(mode, w, m, acc, 0, g0, lr, mu, wd);
        sink_update(mode, w, m, acc, 1, g1, lr, mu, wd);
        sink_update(mode, w, m, acc, 2, g2, lr, mu, wd);
        sink_update(mode, w, m, acc, 3, g3, lr, mu, wd);
        v += 4;
        w += MT_USES_W(mode) ? 4 : 0;
        m += MT_USES_M(mode) ? 4 : 0;
        acc += uses_acc ? 4 : 0;
    }
    for (; n > 0; n--) {
        sink_update(mode, w, m, acc, 0, sink_grad(form, acc, v, 0, d, scale), lr, mu, wd);
        v++;
        w += MT_USES_W(mode);
        m += MT_USES_M(mode);
        acc += uses_acc;
    }
}

/* Rows of an outer product two at a time: row r (r < rows) of the parameter, at
 * a->w + r*a->ws (its state at a->m + r*a->ms, a->acc + r*a->as), gets d[r] * v[0..n);
 * each v[k] is loaded once for both rows. */
MT_INLINE void sink_rows(const int mode, const sink_args_t *a, const float *d, uint32_t rows, uint32_t n) {
    const float lr = a->lr, mu = a->mu, wd = a->wd;
    uint32_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        float *w0 = a->w + (size_t)r * a->ws, *w1 = w0 + a->ws, *m0 = a->m + (size_t)r * a->ms, *m1 = m0 + a->ms;
        float *c0 = a->acc + (size_t)r * a->as, *c1 = c0 + a->as;
        const float *v = a->v;
        const float d0 = d[r], d1 = d[r + 1];
        uint32_t k = n;
        for (; k >= 4; k -= 4) {
            const float v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
            sink_update(mode, w0, m0, c0, 0, d0 * v0, lr, mu, wd);
            sink_update(mode, w1, m1, c1, 0, d1 * v0, lr, mu, wd);
            sink_update(mode, w0, m0, c0, 1, d0 * v1, lr, mu, wd);
            sink_update(mode, w1, m1, c1, 1, d1 * v1, lr, mu, wd);
            sink_update(mode, w0, m0, c0, 2, d0 * v2, lr, mu, wd);
            sink_update(mode, w1, m1, c1, 2, d1 * v2, lr, mu, wd);
            sink_update(mode, w0, m0, c0, 3, d0 * v3, lr, mu, wd);
            sink_update(mode, w1, m1, c1, 3, d1 * v3, lr, mu, wd);
            v += 4;
            w0 += MT_USES_W(mode) ? 4 : 0;
            w1 += MT_USES_W(mode) ? 4 : 0;
            m0 += MT_USES_M(mode) ? 4 : 0;
            m1 += MT_USES_M(mode) ? 4 : 0;
            c0 += mode == MT_SINK_ACC ? 4 : 0;
            c1 += mode == MT_SINK_ACC ? 4 : 0;
        }
        for (; k > 0; k--) {
            const float v0 = *v++;
            sink_update(mode, w0, m0, c0, 0, d0 * v0, lr, mu, wd);
            sink_update(mode, w1, m1, c1, 0, d1 * v0, lr, mu, wd);
            w0 += MT_USES_W(mode);
            w1 += MT_USES_W(mode);
            m0 += MT_USES_M(mode);
            m1 += MT_USES_M(mode);
            c0 += mode == MT_SINK_ACC;
            c1 += mode == MT_SINK_ACC;
        }
    }
    if (r < rows) {
        sink_args_t last = *a;
        last.w += (size_t)r * a->ws;
        last.m += (size_t)r * a->ms;
        last.acc += (size_t)r * a->as;
        last.d = d[r];
        sink_loop(mode, FORM_OUTER, &last, n);
    }
}

/* The sink's arrays from element at on (pat in a part-sized state); an absent one aliases
 * the parameter (never used then). */
MT_INLINE void sink_args(const mt_ctx_t *ctx, const mt_sink_rec_t *s, uint32_t at, uint32_t pat, sink_args_t *a) {
    a->w = MT_F32(ctx, s->w) + at;
    a->m = s->m != MT_REF_NONE ? MT_F32(ctx, s->m) + ((s->parts & MT_SINK_M_PART) ? pat : at) : a->w;
    a->acc = s->acc != MT_REF_NONE ? MT_F32(ctx, s->acc) + ((s->parts & MT_SINK_ACC_PART) ? pat : at) : a->w;
    a->lr = ctx->lr;
    a->mu = ctx->momentum;
    a->wd = ctx->weight_decay;
}

/* An int8 parameter: rows of n elements as mt_sink_outer's (one row for VEC and BATCH),
 * each element's float step as sink_update's on w * s, then rounded back to int8 with its
 * channel's scale s. Not unrolled: the channel of each element is looked up. */
static void sink_q8(const int form, const mt_ctx_t *ctx, const mt_sink_rec_t *s, uint32_t at, uint32_t stride,
    uint32_t pat, uint32_t pstride, const float *d, uint32_t rows, const float *v, uint32_t n, float scale) {
    int8_t *w = (int8_t *)mt_ptr(ctx, s->w);
    float *m = s->m != MT_REF_NONE ? MT_F32(ctx, s->m) : NULL, *acc = s->acc != MT_REF_NONE ? MT_F32(ctx, s->acc) : NULL;
    const mt_q8w_t q = mt_param_rec(ctx, s->q8_param)->q8;
    const float *sc = (const float *)mt_ptr(ctx, q.scales);
    const float lr = ctx->lr, mu = ctx->momentum, wd = ctx->weight_decay;
    const int mode = s->mode;
    for (uint32_t r = 0; r < rows; r++) {
        const uint32_t e0 = at + r * stride, p0 = pat + r * pstride;
        const uint32_t m0 = (s->parts & MT_SINK_M_PART) ? p0 : e0, a0 = (s->parts & MT_SINK_ACC_PART) ? p0 : e0;
        for (uint32_t k = 0; k < n; k++) {
            float g;
            if (form == FORM_OUTER) {
                g = d[r] * v[k];
            } else if (form == FORM_VEC) {
                g = v[k];
            } else {
                g = v[k] * scale;
                acc[a0 + k] = 0.0f;
            }
            if (mode == MT_SINK_ACC) {
                acc[a0 + k] += g;
                continue;
            }
            const uint32_t e = e0 + k;
            const float sv = sc[(e / q.inner) % q.nch], wf = (float)w[e] * sv;
            if (mode == MT_SINK_SGD_WD || mode == MT_SINK_MOM_WD) {
                g = g + wd * wf;
            }
            if (mode == MT_SINK_MOM || mode == MT_SINK_MOM_WD) {
                g = mu * m[m0 + k] + g;
                m[m0 + k] = g;
            }
            w[e] = mt_q8w_round((wf - lr * g) / sv);
        }
    }
}

MT_INLINE void sink_dispatch(const int form, const mt_ctx_t *ctx, const mt_sink_rec_t *s, uint32_t at,
    uint32_t pat, const float *v, float d, uint32_t n, float scale) {
    if (s->q8_param != MT_NO_TENSOR) {
        sink_q8(form, ctx, s, at, 0, pat, 0, &d, 1, v, n, scale);
        return;
    }
    sink_args_t a;
    sink_args(ctx, s, at, pat, &a);
    a.v = v;
    a.d = d;
    a.scale = scale;
    switch (s->mode) {
        case MT_SINK_ACC: sink_loop(MT_SINK_ACC, form, &a, n); break;
        case MT_SINK_SGD: sink_loop(MT_SINK_SGD, form, &a, n); break;
        case MT_SINK_SGD_WD: sink_loop(MT_SINK_SGD_WD, form, &a, n); break;
        case MT_SINK_MOM: sink_loop(MT_SINK_MOM, form, &a, n); break;
        default: sink_loop(MT_SINK_MOM_WD, form, &a, n); break;
    }
}

void mt_sink_vec(const mt_ctx_t *ctx, const mt_sink_rec_t *s, uint32_t at, uint32_t pat, const float *g,
    uint32_t n) {
    sink_dispatch(FORM_VEC, ctx, s, at, pat, g, 0.0f, n, 1.0f);
}

void mt_sink_outer(const mt_ctx_t *ctx, const mt_sink_rec_t *s, uint32_t at, uint32_t stride, uint32_t pat,
    uint32_t pstride, const float *d, uint32_t rows, const float *v, uint32_t n) {
    if (s->q8_param != MT_NO_TENSOR) {
        sink_q8(FORM_OUTER, ctx, s, at, stride, pat, pstride, d, rows, v, n, 1.0f);
        return;
    }
    sink_args_t a;
    sink_args(ctx, s, at, pat, &a);
    a.v = v;
    a.ws = stride;
    a.ms = (s->parts & MT_SINK_M_PART) ? pstride : stride;
    a.as = (s->parts & MT_SINK_ACC_PART) ? pstride : stride;
    switch (s->mode) {
        case MT_SINK_ACC: sink_rows(MT_SINK_ACC, &a, d, rows, n); break;
        case MT_SINK_SGD: sink_rows(MT_SINK_SGD, &a, d, rows, n); break;
        case MT_SINK_SGD_WD: sink_rows(MT_SINK_SGD_WD, &a, d, rows, n); break;
        case MT_SINK_MOM: sink_rows(MT_SINK_MOM, &a, d, rows, n); break;
        default: sink_rows(MT_SINK_MOM_WD, &a, d, rows, n); break;
    }
}

/* ---- BIAS_BWD: dy summed over everything after the channel axis ---- */

typedef struct {
    mt_rec_t h;
    uint32_t dy;
    mt_sink_rec_t s;
    uint32_t per, o0, o1;
} bias_bwd_rec_t;

static int bias_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *dy = &op->t[MT_BIAS_BWD_DY], *b = &op->t[MT_BIAS_BWD_W];
    return dy->ndim >= 2 && dy->dim[0] == 1 && b->n == dy->dim[1]
           && mt_range_ok(op->a[MT_BIAS_BWD_A_O_BEGIN], op->a[MT_BIAS_BWD_A_O_COUNT], b->n)
           && mt_sink_check(ctx, b, &op->t[MT_BIAS_BWD_M], &op->t[MT_BIAS_BWD_ACC], 1,
               (uint32_t)op->a[MT_BIAS_BWD_A_O_COUNT]) ? MT_OK : MT_E_SHAPE;
}

static uint32_t bias_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    bias_bwd_rec_t *r = rec;
    if (r != NULL) {
        const mt_tensor_t *dy = &op->t[MT_BIAS_BWD_DY];
        r->dy = dy->ref;
        mt_sink_prepare(ctx, &op->t[MT_BIAS_BWD_W], &op->t[MT_BIAS_BWD_M], &op->t[MT_BIAS_BWD_ACC], &r->s);
        r->per = dy->n / dy->dim[1];
        r->o0 = (uint32_t)op->a[MT_BIAS_BWD_A_O_BEGIN];
        r->o1 = r->o0 + (uint32_t)op->a[MT_BIAS_BWD_A_O_COUNT];
    }
    return sizeof(bias_bwd_rec_t);
}

#define BIAS_CHUNK 16   /* channel sums handed to the sink at a time */

static int bias_bwd_run(mt_ctx_t *ctx, const void *rec) {
    const bias_bwd_rec_t *r = rec;
    const float *dy = MT_F32(ctx, r->dy);
    const uint32_t per = r->per;
    if (per == 1) {
        mt_sink_vec(ctx, &r->s, r->o0, 0, dy + r->o0, r->o1 - r->o0);
        return MT_OK;
    }
    float g[BIAS_CHUNK];
    for (uint32_t o = r->o0; o < r->o1;) {
        uint32_t n = r->o1 - o < BIAS_CHUNK ? r->o1 - o : BIAS_CHUNK;
        for (uint32_t j = 0; j < n; j++) {
            const float *p = dy + (size_t)(o + j) * per;
            float acc = 0.0f;
            for (uint32_t i = 0; i < per; i++) {
                acc += p[i];
            }
            g[j] = acc;
        }
        mt_sink_vec(ctx, &r->s, o, o - r->o0, g, n);
        o += n;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_BIAS_BWD = {bias_bwd_check, bias_bwd_prepare, bias_bwd_run};

/* ---- SGD: the end of a batch applies the mean of the accumulated gradients and clears them ---- */

typedef struct {
    mt_rec_t h;
    mt_sink_rec_t s;
    uint32_t acc, n;
    float scale;
} sgd_rec_t;

static int sgd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *w = &op->t[MT_SGD_W];   /* the SGD op applies a whole-parameter accumulator */
    return mt_sink_check(ctx, w, &op->t[MT_SGD_M], &op->t[MT_SGD_ACC], 0, w->n) ? MT_OK : MT_E_SHAPE;
}

static uint32_t sgd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    sgd_rec_t *r = rec;
    if (r != NULL) {
        mt_sink_prepare(ctx, &op->t[MT_SGD_W], &op->t[MT_SGD_M], NULL, &r->s);
        r->acc = op->t[MT_SGD_ACC].ref;
        r->n = op->t[MT_SGD_ACC].n;
        r->scale = 1.0f / (float)ctx->batch;
    }
    return sizeof(sgd_rec_t);
}

static int sgd_run(mt_ctx_t *ctx, const void *rec) {
    const sgd_rec_t *r = rec;
    mt_sink_rec_t s = r->s;
    s.acc = r->acc;   /* read and cleared by the BATCH form; the mode still updates the parameter */
    sink_dispatch(FORM_BATCH, ctx, &s, 0, 0, MT_F32(ctx, r->acc), 0.0f, r->n, r->scale);
    return MT_OK;
}

const mt_opdef_t mt_op_SGD = {sgd_check, sgd_prepare, sgd_run};
