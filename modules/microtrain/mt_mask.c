/* microtrain core: 1-bit masks for the backward of Clip (ReLU, ReLU6), compile(saved="bits").
 * The backward of Clip needs only where lo < y < hi (CLIP_BWD); MASK_PACK keeps that as one bit
 * per element, so the float output can die after its forward readers, and MASK_BWD passes dy
 * where the bit is set. Bit i is bit i % 8 of byte i / 8; the last byte's spare bits are 0.
 * The packed tensor is U8 of ceil(n / 8) bytes, checked at load against the float tensor. */
#include "mt_core.h"

typedef struct {
    mt_rec_t h;
    uint32_t v, m, dy, n;         /* PACK: v = y, m; BWD: m, dy, v = dx */
    float lo, hi;
} mask_rec_t;

/* the packed tensor holds exactly one bit per element of a float tensor of n elements */
static int mask_fits(const mt_tensor_t *m, uint32_t n) {
    return m->n == n / 8u + (n % 8u != 0u);
}

/* ---- MASK_PACK: m bit i = lo < y[i] < hi (NaN: 0), as CLIP_BWD decides ---- */

static int mask_pack_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    (void)ctx;
    /* lo <= hi is false for NaN bounds too */
    return mt_f32_from_bits(op->a[MT_MASK_PACK_A_LO_BITS]) <= mt_f32_from_bits(op->a[MT_MASK_PACK_A_HI_BITS])
           && mask_fits(&op->t[MT_MASK_PACK_M], op->t[MT_MASK_PACK_Y].n) ? MT_OK : MT_E_SHAPE;
}

static uint32_t mask_pack_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    mask_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->v = op->t[MT_MASK_PACK_Y].ref;
        r->m = op->t[MT_MASK_PACK_M].ref;
        r->dy = MT_REF_NONE;
        r->n = op->t[MT_MASK_PACK_Y].n;
        r->lo = mt_f32_from_bits(op->a[MT_MASK_PACK_A_LO_BITS]);
        r->hi = mt_f32_from_bits(op->a[MT_MASK_PACK_A_HI_BITS]);
    }
    return sizeof(mask_rec_t);
}

static int mask_pack_run(mt_ctx_t *ctx, const void *rec) {
    const mask_rec_t *r = rec;
    const float lo = r->lo, hi = r->hi;
    const float *y = MT_F32(ctx, r->v);
    uint8_t *m = (uint8_t *)mt_ptr(ctx, r->m);
    for (uint32_t i = 0; i < r->n; i += 8) {
        const uint32_t k = r->n - i < 8u ? r->n - i : 8u;
        uint32_t bits = 0;
        for (uint32_t j = 0; j < k; j++) {
            const float v = y[i + j];
            bits |= (uint32_t)(v > lo && v < hi) << j;
        }
        m[i / 8u] = (uint8_t)bits;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_MASK_PACK = {mask_pack_check, mask_pack_prepare, mask_pack_run};

/* ---- MASK_BWD: dx = dy where the bit is set, else 0; element by element, so dx may be dy ---- */

static int mask_bwd_check(const mt_ctx_t *ctx, const mt_op_t *op) {
    const mt_tensor_t *t = op->t;
    (void)ctx;
    return t[MT_MASK_BWD_DY].n == t[MT_MASK_BWD_DX].n && mask_fits(&t[MT_MASK_BWD_M], t[MT_MASK_BWD_DX].n)
           ? MT_OK : MT_E_SHAPE;
}

static uint32_t mask_bwd_prepare(const mt_ctx_t *ctx, const mt_op_t *op, void *rec) {
    mask_rec_t *r = rec;
    (void)ctx;
    if (r != NULL) {
        r->m = op->t[MT_MASK_BWD_M].ref;
        r->dy = op->t[MT_MASK_BWD_DY].ref;
        r->v = op->t[MT_MASK_BWD_DX].ref;
        r->n = op->t[MT_MASK_BWD_DX].n;
        r->lo = r->hi = 0.0f;
    }
    return sizeof(mask_rec_t);
}

static int mask_bwd_run(mt_ctx_t *ctx, const void *rec) {
    const mask_rec_t *r = rec;
    const uint8_t *m = (const uint8_t *)mt_ptr(ctx, r->m);
    const float *dy = MT_F32(ctx, r->dy);
    float *dx = MT_F32(ctx, r->v);
    for (uint32_t i = 0; i < r->n; i++) {
        dx[i] = (m[i / 8u] >> (i % 8u)) & 1u ? dy[i] : 0.0f;
    }
    return MT_OK;
}

const mt_opdef_t mt_op_MASK_BWD = {mask_bwd_check, mask_bwd_prepare, mask_bwd_run};
