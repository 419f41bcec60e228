/* microtrain core: load a .mtp training plan and run it in caller-owned memory.
 *
 * Portable C99. No malloc, no mutable static data: all state lives in mt_ctx_t
 * and in the RAM buffer the caller attaches. The core knows nothing of
 * MicroPython or CPython; bindings sit on top of this header.
 *
 * Use:
 *     mt_ctx_t ctx;
 *     if (mt_load(&ctx, plan, plan_len) != MT_OK) ...   // validates every field
 *     ram = <mt_ram_bytes(&ctx) bytes, 8-byte aligned>;
 *     if (mt_attach(&ctx, ram, len) != MT_OK) ...      // copies initial parameters
 *     mt_step_label(&ctx, x, n, label, &loss);          // forward, loss, backward, update
 *     mt_predict(&ctx, x, n, out, n_out);
 * The plan bytes must stay valid while ctx is used: constants are read in place,
 * so a plan may live in flash.
 */
#ifndef MT_H
#define MT_H

#include <stddef.h>
#include <stdint.h>
#include "mt_format.h"

typedef struct {
    uint8_t n_slots;
    uint8_t n_attrs;
    uint8_t slot[MT_MAX_SLOTS];   /* MT_SLOT(role, dtype, optional) */
    uint8_t inplace[4];           /* up to two (out slot, in slot) pairs, 255 = none */
} mt_opspec_t;

/* Everything the core knows about a loaded plan and a run. */
typedef struct {
    const uint8_t *plan;
    uint32_t plan_bytes;
    const uint8_t *tensors;       /* tensor table */
    const uint8_t *ops;           /* op list */
    const uint8_t *data;          /* constants and initial parameter values */
    const uint8_t *names;
    uint32_t n_tensors, n_ops, ops_bytes, data_bytes, names_bytes;
    uint32_t n_train_ops;         /* ops past the forward phase; 0 for an inference-only plan */
    uint32_t arena_bytes, state_bytes, naive_bytes, const_bytes;
    uint64_t macs;
    uint16_t input, target, output, batch;
    uint8_t loss_kind;
    float lr, momentum, weight_decay;
    uint8_t *ram;                 /* NULL until mt_attach: state region, then arena */
    uint32_t steps;               /* samples trained since attach or reset */
    uint32_t updates;             /* parameter updates applied */
    float loss;                   /* loss of the last step */
    int32_t err_op;               /* where the last error was found, -1 if nowhere in particular */
    int32_t err_tensor;
} mt_ctx_t;

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

/* Facts about one tensor, for bindings (params(), debugging). */
typedef struct {
    const char *name;             /* "" if unnamed */
    void *data;                   /* NULL for arena tensors before mt_attach */
    uint32_t bytes, n;
    uint32_t dim[MT_MAX_DIMS];
    uint8_t ndim, dtype, storage, flags;
} mt_tensor_info_t;

/* Loading and memory */
int mt_load(mt_ctx_t *ctx, const void *plan, size_t plan_bytes);
uint32_t mt_ram_bytes(const mt_ctx_t *ctx);
int mt_attach(mt_ctx_t *ctx, void *ram, size_t ram_bytes);
int mt_reset(mt_ctx_t *ctx);

/* Training and inference. x holds mt_input_len() floats. */
int mt_step_label(mt_ctx_t *ctx, const float *x, size_t n_x, int32_t label, float *loss);
int mt_step_target(mt_ctx_t *ctx, const float *x, size_t n_x, const float *target, size_t n_target, float *loss);
int mt_predict(mt_ctx_t *ctx, const float *x, size_t n_x, float *out, size_t n_out);
uint32_t mt_input_len(const mt_ctx_t *ctx);
uint32_t mt_output_len(const mt_ctx_t *ctx);
uint32_t mt_target_len(const mt_ctx_t *ctx);   /* 1 (a label) for cross-entropy */

/* Running single ops, for tests and tracing: the step is these in order. */
int mt_set_input(mt_ctx_t *ctx, const float *x, size_t n_x);
int mt_run_op(mt_ctx_t *ctx, uint32_t index);

/* Introspection */
int mt_tensor_info(const mt_ctx_t *ctx, uint32_t index, mt_tensor_info_t *info);
int mt_op_decode(const mt_ctx_t *ctx, uint32_t index, mt_op_t *op);
const char *mt_strerror(int code);

/* Internal, shared between core files */
uint32_t mt_crc32(const uint8_t *p, size_t n);
uint32_t mt_rd_u32(const uint8_t *p);
uint16_t mt_rd_u16(const uint8_t *p);
float mt_f32_from_bits(int32_t bits);
float mt_expf(float x);
float mt_logf(float x);
int mt_op_check(const mt_ctx_t *ctx, const mt_op_t *op);
void mt_tensor_decode(const mt_ctx_t *ctx, uint16_t tid, mt_tensor_t *t);
int mt_decode_at(const mt_ctx_t *ctx, uint32_t pos, mt_op_t *op, uint32_t *next);
int mt_op_run(mt_ctx_t *ctx, const mt_op_t *op);

#endif /* MT_H */
