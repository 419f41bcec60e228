/* microtrain core: the public API. Load a .mtp training plan and run it in
 * caller-owned memory.
 *
 * Portable C99. No malloc, no mutable static data: all state lives in mt_ctx_t
 * and in the RAM buffer the caller attaches. The core knows nothing of
 * MicroPython or CPython; the MicroPython binding and the host's cffi module
 * use this header and nothing else (the cffi declarations are generated from
 * the part between the cdef markers). mt_core.h is the core's private header.
 *
 * Use:
 *     mt_ctx_t ctx;
 *     if (mt_load(&ctx, plan, plan_len) != MT_OK) ...   // validates every field
 *     ram = <mt_ram_bytes(&ctx) bytes, 8-byte aligned>;
 *     if (mt_attach(&ctx, ram, len) != MT_OK) ...      // decodes the plan, copies initial parameters
 *     mt_step_label(&ctx, x, n, label, &loss);          // forward, loss, backward, update
 *     mt_predict(&ctx, x, n, out, n_out);
 * Errors are MT_E_* codes; mt_error_text() turns one into the message users see.
 *
 * A plan with a stream section (docs/plan-format.md, Streaming) may also run with only its head in
 * memory: mt_load_head(&ctx, head, mt_head_bytes(header), read, user) instead of mt_load, the rest
 * of the file reached through read(); the core then reads each group of constants into its window
 * in the arena just before the ops that use it, and checks its CRC as it reads it.
 *
 * What the core reads from the plan after mt_attach: the constants and the
 * initial parameter values (read in place, so a plan may live in flash; mt_reset
 * copies the initial values again) and, for messages and mt_param_info, the
 * names section, always within its bounds. The header, tensor table and op list
 * are decoded into the runtime context at the end of the RAM and never read
 * again; or, where the plan carries that context already prepared (a section the
 * host compiler writes) and it equals what this core prepares, record for record,
 * the context is read in place and takes no RAM. So the plan bytes must stay
 * where they are while ctx is used; a
 * binding that lets its caller change them must check that they did not move.
 * A plan loaded by its head (mt_load_head) keeps its head bytes so, and its file readable
 * through read() with the same contents; a group that reads otherwise stops the step there.
 */
#ifndef MT_H
#define MT_H

#include <stddef.h>
#include <stdint.h>
#include "mt_format.h"

/* cdef-begin: _build_native.py hands the text from here to cdef-end to cffi,
 * with MT_* integer constants replaced by their values. */

/* Reads n bytes at offset `offset` of the plan's file into dst (a plan loaded by its head:
 * mt_load_head); returns 0 when all n were read, anything else for a failure. */
typedef int (*mt_read_fn)(void *user, uint32_t offset, void *dst, uint32_t n);

/* Everything the core knows about a loaded plan and a run. The binding holds one;
 * its fields are the core's: read them through the functions below. */
typedef struct {
    /* the plan, set by mt_load */
    const uint8_t *plan;          /* NULL until a plan is loaded */
    const uint8_t *tensors;       /* tensor table: read by mt_load, mt_attach and mt_tensor_info */
    const uint8_t *ops;           /* op list: read by mt_load and mt_attach */
    const uint8_t *data;          /* constants and initial parameter values, read in place */
    const uint8_t *names;
    const uint8_t *quant;         /* quantization table (int8 tensors): read by mt_load and mt_attach */
    uint32_t plan_bytes, plan_crc;
    uint32_t n_tensors, n_ops, ops_bytes, data_bytes, names_bytes, n_quant;
    uint32_t arena_bytes, state_bytes, naive_bytes, const_bytes, context_bytes;
    uint32_t section_off, section_bytes;   /* the plan's context section (mt_plan.c), 0 for none */
    uint8_t context_in_plan;      /* 1: that section is this core's context, run in place (no RAM) */
    /* the stream section and its groups (mt_stream.c); with read set, only the head is in memory */
    const uint8_t *groups;        /* the group table: read at load, attach and before each group's ops */
    uint32_t stream_off, stream_bytes, n_groups;
    uint32_t reset_group;         /* index of the initial values' group, n_groups for none */
    const uint8_t *stream;        /* the stream section in memory, or NULL when it is read through read */
    mt_read_fn read;              /* NULL: the whole plan is in memory (the stream section in place) */
    void *read_user;
    int32_t loaded;               /* the group in its window now, -1 for none */
    uint32_t block;               /* the block of its constants the op runs on now (mt_core.h, blocks) */
    uint32_t stream_reads;        /* groups read since mt_load_head (wraps at 2^32) */
    uint32_t stream_read_bytes;   /* bytes of them read (wraps at 2^32) */
    uint64_t macs;
    uint16_t input, target, output, batch;
    uint16_t plan_version;        /* what the plan says, also when it is not MT_VERSION */
    uint8_t loss_kind;
    uint8_t input_dtype;          /* what the caller passes: MT_DTYPE_F32, _I8 or _U8 */
    float lr, momentum, weight_decay;
    uint32_t n_params, n_train_ops;
    /* the run, set by mt_attach */
    uint8_t *ram;                 /* NULL until mt_attach: state region, arena, runtime context */
    const uint8_t *context;       /* the runtime context: in ram after the arena, or in the plan */
    uintptr_t base[8];            /* where tensor references point (mt_core.h), by region */
    uint32_t in_ref, target_ref, out_ref, n_in, n_target, n_out;
    uint32_t phase_at[3];         /* where each phase's records start in the context (bytes) */
    uint32_t phase_op[3];         /* the index of each phase's first op */
    uint32_t params_at;           /* where the parameter table starts: the end of the op records */
    uint32_t steps;               /* samples trained since attach or reset (wraps at 2^32) */
    uint32_t updates;             /* parameter updates applied */
    uint32_t in_batch;            /* samples since the last update, < batch */
    uint32_t rejected;            /* steps refused: loss not finite, or (clip_grad) gradient norm not finite */
    float loss;                   /* loss of the last step */
    int32_t err_op;               /* where the last error was found, -1 if nowhere in particular */
    int32_t err_tensor;
} mt_ctx_t;

/* Facts about one tensor or parameter. The name is not NUL-terminated:
 * use name_len bytes. */
typedef struct {
    const char *name;             /* "" if unnamed */
    uint32_t name_len;
    void *data;                   /* NULL for arena and state tensors before mt_attach */
    uint32_t bytes, n;
    uint32_t dim[MT_MAX_DIMS];    /* unused dims are 1 */
    uint8_t ndim, dtype, storage, flags;
} mt_tensor_info_t;

/* What a plan needs and what the run has done (mt_info). */
typedef struct {
    uint32_t plan_bytes;
    uint32_t arena_bytes;         /* planned transient region */
    uint32_t state_bytes;         /* parameters and optimizer state */
    uint32_t context_bytes;       /* the decoded plan: ops, geometry, parameter table */
    uint32_t ram_bytes;           /* what mt_attach needs: the three, or with the context in the plan two */
    uint32_t naive_bytes, const_bytes;
    uint64_t macs;                /* multiply-accumulates of one training step */
    uint32_t n_tensors, n_ops, n_params, n_train_ops;
    uint32_t state_size;          /* bytes of an mt_save_state blob */
    uint32_t steps, updates, in_batch, rejected;
    float loss, lr, momentum, weight_decay;
    uint16_t batch, format_version;
    uint8_t loss_kind;
    uint8_t input_dtype;          /* MT_DTYPE_F32, _I8 or _U8: what x holds */
    uint8_t context_in_plan;      /* 1: the context runs in place from the plan (its section), not RAM */
    uint8_t streamed;             /* 1: the plan's head is in memory, its groups read from its file */
    uint32_t head_bytes;          /* what a streamed plan keeps in memory: bytes before the stream section */
    uint32_t stream_bytes;        /* the stream section; 0 for a plan without one */
    uint32_t n_groups;
    uint32_t stream_reads, stream_read_bytes;   /* groups read, and their bytes, since mt_load_head */
} mt_info_t;

/* Loading and memory */
int mt_load(mt_ctx_t *ctx, const void *plan, size_t plan_bytes);
uint32_t mt_ram_bytes(const mt_ctx_t *ctx);
int mt_attach(mt_ctx_t *ctx, void *ram, size_t ram_bytes);
int mt_reset(mt_ctx_t *ctx);
/* After mt_load, before mt_attach: decode the context into RAM even where the plan carries it, for
 * a plan in memory its owner can still write (the records run are then the ones validated);
 * mt_ram_bytes grows by the context's bytes. MT_E_DETACHED with no plan, or RAM attached already. */
int mt_context_in_ram(mt_ctx_t *ctx);

/* A plan by its head: the bytes before its stream section (all of it for a plan without one), the
 * rest read through read(user, ...) as the ops need it. mt_head_bytes tells how many bytes that is
 * from the first MT_HEADER_BYTES of the file (0 where they are not a plan's header of this format).
 * The head is validated as mt_load validates a plan, its CRC with the stream section's recorded one;
 * the checks that need a group's bytes run at mt_attach, which reads every group once. */
uint32_t mt_head_bytes(const void *header, size_t n);
int mt_load_head(mt_ctx_t *ctx, const void *head, size_t head_bytes, mt_read_fn read, void *user);

/* Training and inference. x holds mt_input_len() elements of mt_input_dtype():
 * float32 (any alignment), or int8 / uint8 for a plan compiled for integer input
 * (a uint8 input is stored as int8 with its zero point moved by -128). A plan that
 * reads its input in place (storage INPUT) copies nothing: the ops read x during
 * the call, a float x must be 4-byte aligned (MT_E_ALIGN), and x must not change. */
int mt_step_label(mt_ctx_t *ctx, const void *x, size_t n_x, int32_t label, float *loss);
int mt_step_target(mt_ctx_t *ctx, const void *x, size_t n_x, const float *target, size_t n_target, float *loss);
int mt_predict(mt_ctx_t *ctx, const void *x, size_t n_x, float *out, size_t n_out);
uint32_t mt_input_len(const mt_ctx_t *ctx);
/* Where a sample goes in RAM (the arena's input tensor, mt_input_len() elements of the input's dtype),
 * so that a caller may read one straight there and pass this pointer as x; NULL before attach and for
 * a plan that reads its input in place. */
void *mt_input_buffer(const mt_ctx_t *ctx);
uint8_t mt_input_dtype(const mt_ctx_t *ctx);   /* MT_DTYPE_F32, _I8 or _U8; 0 before a plan is loaded */
uint32_t mt_output_len(const mt_ctx_t *ctx);
uint32_t mt_target_len(const mt_ctx_t *ctx);   /* 1 (a label) for cross-entropy */

/* Settings and facts */
int mt_set_lr(mt_ctx_t *ctx, float lr);
int mt_info(const mt_ctx_t *ctx, mt_info_t *info);

/* Errors: mt_error_text writes "message (op N, tensor M 'name')" into buf (always
 * NUL-terminated when n > 0) and returns its length. */
size_t mt_error_text(const mt_ctx_t *ctx, int code, char *buf, size_t n);
const char *mt_strerror(int code);

/* Trainable parameters, k in [0, mt_param_count) in plan order. mt_set_param
 * takes n float32 values (any alignment) and refuses non-finite ones;
 * mt_check_param makes the same checks without writing, so that a caller can
 * check several before it sets any. mt_get_param writes the n float32 values
 * (any alignment). An int8 trained weight (mt_param_info's dtype I8) reads as
 * code * its channel's scale and is set to round_half_even(value / scale); a
 * value 127.5 scales or more from 0 is refused (PARAM_RANGE). */
uint32_t mt_param_count(const mt_ctx_t *ctx);
int mt_param_info(const mt_ctx_t *ctx, uint32_t k, mt_tensor_info_t *info);
int mt_check_param(mt_ctx_t *ctx, uint32_t k, const float *data, size_t n);
int mt_set_param(mt_ctx_t *ctx, uint32_t k, const float *data, size_t n);
int mt_get_param(const mt_ctx_t *ctx, uint32_t k, float *out, size_t n);

/* Checkpoints: the counters, lr and the whole state region in one CRC-checked
 * blob of mt_state_size() bytes. mt_load_state checks everything before it
 * changes anything; training then continues bit for bit. */
uint32_t mt_state_size(const mt_ctx_t *ctx);
int mt_save_state(const mt_ctx_t *ctx, void *buf, size_t n);
/* The same blob in three parts, for a caller that writes it out without a buffer of its size (a file):
 * head gets its first MT_STATE_HEADER_BYTES (40), *state points at the next state_size - 44, where
 * they lie in RAM, and *crc is its last 4 bytes (little-endian) */
int mt_state_parts(const mt_ctx_t *ctx, uint8_t *head, const uint8_t **state, uint32_t *crc);
int mt_load_state(mt_ctx_t *ctx, const void *buf, size_t n);

/* Running single ops, for tests and tracing: a step is the ops in order. */
int mt_set_input(mt_ctx_t *ctx, const void *x, size_t n_x);
int mt_run_op(mt_ctx_t *ctx, uint32_t index);
int mt_tensor_info(const mt_ctx_t *ctx, uint32_t index, mt_tensor_info_t *info);

/* Utilities: CRC-32 (as zlib.crc32), and the core's own exp and log */
uint32_t mt_crc32(const uint8_t *p, size_t n);
float mt_expf(float x);
float mt_logf(float x);

/* cdef-end */

#endif /* MT_H */
