/* microtrain core: the private header, shared by the core's files only.
 * Bindings use mt.h. */
#ifndef MT_CORE_H
#define MT_CORE_H

#include "mt.h"

typedef struct {
    uint8_t n_slots;
    uint8_t n_attrs;
    uint8_t slot[MT_MAX_SLOTS];   /* MT_SLOT(role, dtype, optional) */
    uint8_t inplace[4];           /* up to two (out slot, in slot) pairs, 255 = none */
} mt_opspec_t;

/* A decoded tensor: what kernels see. */
typedef struct {
    void *data;                   /* NULL for an absent optional slot */
    uint32_t n;                   /* elements */
    uint32_t dim[MT_MAX_DIMS];    /* unused dims are 1 */
    uint8_t ndim, dtype, storage, flags;
} mt_tensor_t;

/* A decoded op: its tensors and attributes. */
typedef struct {
    uint8_t code, phase, n_t, n_a;
    uint16_t tid[MT_MAX_SLOTS];
    mt_tensor_t t[MT_MAX_SLOTS];
    int32_t a[MT_MAX_ATTRS];
} mt_op_t;

/* Every entry point starts here: an error names where it happened, never where an earlier one did. */
static inline void mt_clear_error(mt_ctx_t *ctx) {
    ctx->err_op = -1;
    ctx->err_tensor = -1;
}

uint32_t mt_rd_u32(const uint8_t *p);
uint16_t mt_rd_u16(const uint8_t *p);
void mt_wr_u32(uint8_t *p, uint32_t v);
float mt_f32_from_bits(int32_t bits);
int mt_f32_finite(float f);
int mt_all_finite(const float *p, uint32_t n);
int mt_op_check(const mt_ctx_t *ctx, const mt_op_t *op);
void mt_tensor_decode(const mt_ctx_t *ctx, uint16_t tid, mt_tensor_t *t);
int mt_decode_at(const mt_ctx_t *ctx, uint32_t pos, mt_op_t *op, uint32_t *next);
int mt_op_decode(const mt_ctx_t *ctx, uint32_t index, mt_op_t *op);
int mt_op_run(mt_ctx_t *ctx, const mt_op_t *op);
const char *mt_name_of(const mt_ctx_t *ctx, uint32_t name_off, uint32_t *len);

#endif /* MT_CORE_H */
