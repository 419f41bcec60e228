/* microtrain core: the private header, shared by the core's files only.
 * Bindings use mt.h.
 *
 * How a plan runs. mt_load validates the plan; mt_attach decodes it, op by op,
 * into the runtime context at the end of the caller's RAM: one record per op
 * (what its kernel needs: tensor references, sizes, geometry with its valid
 * ranges, the implementation chosen for the dtypes and shapes), then the
 * parameter table. A step walks the records and calls each op's run function;
 * it never reads the plan's tensor table or op list again.
 *
 * Each op code has an mt_opdef_t, defined in the op's own file:
 *     check    at load: shapes and attributes fit what the kernel assumes
 *     prepare  at load (rec NULL: only its size) and at attach: fill the record
 *     run      per step: the kernel, on the record alone
 * Adding an op: a row in host/microtrain/format.py (make header), its opdef in
 * a kernel file, and its host rule. mt_ops.c collects the opdefs by name.
 */
#ifndef MT_CORE_H
#define MT_CORE_H

#include "mt.h"

#if defined(__GNUC__)
#define MT_INLINE static inline __attribute__((always_inline))
#else
#define MT_INLINE static inline
#endif

/* ---- load-time view of a plan op (built from the plan, never kept) ---- */

typedef struct {
    uint8_t n_slots;
    uint8_t n_attrs;
    uint8_t slot[MT_MAX_SLOTS];   /* MT_SLOT(role, dtype, optional) */
    uint8_t inplace[4];           /* up to two (out slot, in slot) pairs, 255 = none */
    uint8_t blocks;               /* 1: it may consume its stream constants in blocks, run once per block
                                   * with ctx->block the block (mt_stream.c) */
} mt_opspec_t;

/* A tensor of the plan as checks and prepare functions see it. n is 0 for an
 * absent optional slot. */
typedef struct {
    uint32_t n;                   /* elements */
    uint32_t dim[MT_MAX_DIMS];    /* unused dims are 1 */
    uint32_t ref;                 /* mt_ref(): where it lives, for the runtime context */
    uint8_t ndim, dtype, storage, flags;
    uint16_t quant;               /* its quantization record (mt_q8.h), MT_NO_QUANT for none */
} mt_tensor_t;

typedef struct {
    uint8_t code, phase, n_t, n_a;
    uint16_t tid[MT_MAX_SLOTS];
    mt_tensor_t t[MT_MAX_SLOTS];
    int32_t a[MT_MAX_ATTRS];
} mt_op_t;

/* ---- tensor references ----
 * A 32-bit reference is the tensor's offset in its region (a multiple of 8) with
 * the region in the low bits; ctx->base[region] is the region's address minus
 * the region number, so base + ref is the tensor's address. References are the
 * same on every platform, so the context has the same size on the host (64-bit
 * pointers) as on a board, and the report's context_bytes is the board's. The
 * input region is the caller's sample, for a plan that reads its input in place
 * (MT_STORAGE_INPUT): its base is set by mt_set_input and is 0 when none is set. The stream region
 * (MT_STORAGE_STREAM) is the plan's stream section: in place where the whole plan is in memory, else
 * the window in the arena its group was read into, its base set before each group's ops (mt_stream.c). */
enum { MT_REGION_STATE = 0, MT_REGION_ARENA = 1, MT_REGION_CONST = 2, MT_REGION_NONE = 3, MT_REGION_INPUT = 4,
       MT_REGION_STREAM = 5 };
#define MT_REF_NONE ((uint32_t)MT_REGION_NONE)   /* an absent optional tensor: resolves to NULL */

MT_INLINE void *mt_ptr(const mt_ctx_t *ctx, uint32_t ref) {
    return (void *)(ctx->base[ref & 7u] + ref);
}
#define MT_F32(ctx, ref) ((float *)mt_ptr((ctx), (ref)))

/* ---- runtime records ---- */

/* Every record starts with this; the walker sets code and bytes, prepare sets kind. */
typedef struct {
    uint8_t code;
    uint8_t kind;                 /* the implementation prepare chose (shape, layout, dtypes) */
    uint16_t bytes;               /* size of the whole record, a multiple of 4 */
} mt_rec_t;

typedef struct {
    int (*check)(const mt_ctx_t *ctx, const mt_op_t *op);
    uint32_t (*prepare)(const mt_ctx_t *ctx, const mt_op_t *op, void *rec);
    int (*run)(mt_ctx_t *ctx, const void *rec);
} mt_opdef_t;

/* by op code; NULL for codes no op has (mt_ops.c) */
extern const mt_opdef_t *const mt_opdefs[MT_OP_MAX + 1];

/* An int8 trained weight (compile(trained_weights="int8"), mt_q8state.c): element e
 * stands for w[e] * scales[(e / inner) % nch], scales a constant float vector. */
typedef struct {
    uint32_t scales, inner, nch;  /* scales: a reference (MT_REF_NONE: a float parameter) */
} mt_q8w_t;

/* Whether t is an int8 parameter with per-channel scales and no zero points; fills q. */
int mt_q8w_of(const mt_ctx_t *ctx, const mt_tensor_t *t, mt_q8w_t *q);
/* round_half_even(v) clamped to [-127, 127]; NaN gives -127 */
int8_t mt_q8w_round(float v);

/* A trainable parameter, in the context's parameter table. */
typedef struct {
    uint32_t tensor, state_off, init_off, bytes, n, name;
    uint32_t dim[MT_MAX_DIMS];
    mt_q8w_t q8;                  /* an int8 parameter's scales (q8.scales MT_REF_NONE for float) */
    uint8_t ndim, dtype, reserved[2];
} mt_param_rec_t;

/* ---- the optimizer sink: where a parameter gradient goes (mt_optim.c) ----
 * Straight into an SGD update of the parameter (batch 1: no gradient buffer at
 * all), or into an accumulator that an SGD op applies when the batch ends. The
 * mode, fixed at prepare, picks a loop with no per-element tests. */
enum { MT_SINK_ACC, MT_SINK_SGD, MT_SINK_SGD_WD, MT_SINK_MOM, MT_SINK_MOM_WD };

typedef struct {
    uint32_t w, m, acc;           /* references; m and acc MT_REF_NONE when absent */
    uint8_t mode;
    uint8_t parts;                /* MT_SINK_M_PART, MT_SINK_ACC_PART: the buffer holds only the op's trained part */
    uint16_t q8_param;            /* an int8 w: its index in the parameter table (its scales); else MT_NO_TENSOR */
} mt_sink_rec_t;
#define MT_SINK_M_PART 1
#define MT_SINK_ACC_PART 2

/* part_n: the elements a gradient op trains (w->n unless it trains a channel range); its
 * momentum and accumulator hold either the whole parameter or only those part_n elements,
 * row by row in the parameter's order (a channel-sparse update, docs/sparse.md). */
int mt_sink_check(const mt_ctx_t *ctx, const mt_tensor_t *w, const mt_tensor_t *m, const mt_tensor_t *acc,
    int is_grad_op, uint32_t part_n);
void mt_sink_prepare(const mt_ctx_t *ctx, const mt_tensor_t *w, const mt_tensor_t *m, const mt_tensor_t *acc,
    mt_sink_rec_t *s);
/* Elements at..at+n of the parameter receive gradients g[i]; pat is where they sit in a
 * part-sized momentum/accumulator (at again when the op trains the whole parameter). */
void mt_sink_vec(const mt_ctx_t *ctx, const mt_sink_rec_t *s, uint32_t at, uint32_t pat, const float *g,
    uint32_t n);
/* An outer product: for r < rows, elements at + r*stride + [0, n) receive d[r] * v[0..n);
 * in a part-sized state they sit at pat + r*pstride + [0, n). */
void mt_sink_outer(const mt_ctx_t *ctx, const mt_sink_rec_t *s, uint32_t at, uint32_t stride, uint32_t pat,
    uint32_t pstride, const float *d, uint32_t rows, const float *v, uint32_t n);

/* ---- sliding windows (mt_window.c): convolution and pooling geometry ---- */

/* Output extent of a window sliding over in elements with pads pad0, pad1;
 * ceil selects ceil_mode rounding; -1 if none fits. */
int64_t mt_out_extent(int64_t in, int64_t pad0, int64_t pad1, int64_t k, int64_t dil, int64_t stride, int ceil);
/* [*lo, *hi): the i in [0, count) with 0 <= base + i*step < extent (step >= 1).
 * The valid taps of one window (step = dilation), or the outputs whose tap
 * stays inside the input (step = stride): every window walk uses this. */
MT_INLINE void mt_window_range(int32_t base, int32_t step, int32_t count, int32_t extent, int32_t *lo, int32_t *hi) {
    int32_t a = base >= 0 ? 0 : (-base + step - 1) / step;
    int32_t b = base <= extent - 1 ? (extent - 1 - base) / step + 1 : 0;
    b = b < count ? b : count;
    *lo = a < b ? a : b;
    *hi = b;
}

/* ---- convolution and pooling geometry (mt_conv.c, mt_pool.c), shared with the int8 kernels ---- */

typedef struct {
    uint32_t C, H, W, O, OH, OW, G, Cg, Og;   /* up to 2^28 elements (a 1-D input may be long) */
    uint16_t KH, KW, sh, sw, dh, dw, pt, pl;  /* <= MT_LIMIT */
} mt_conv_geom_t;

/* x (1,C,H,W) * w (O, C/g, KH, KW) -> y (1,O,OH,OW) with the MT_CONV_A_* attributes a */
int mt_conv_check_shapes(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y);
void mt_conv_prepare_geom(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *w, const mt_tensor_t *y,
    mt_conv_geom_t *g);
/* The W8 kernels' loops (mt_conv.c), for ops that stream channels through them (mt_pwdw_w8.c).
 * w8_weight_ok: w int8, one scale per output channel (*scales: their reference), filters that fit */
int mt_conv_w8_weight_ok(const mt_ctx_t *ctx, const mt_tensor_t *w, uint32_t *scales);
/* y = b + conv(x, W') or acc + conv(x, W'), W' = float32(w) * scales[o], as CONV2D_W8 */
void mt_conv_forward_w8(const mt_conv_geom_t *g, const float *x, const int8_t *w, const float *scales,
    const float *b, const float *acc, float *y);
/* input channels [c_lo, c_hi) of a groups-1 conv only (x: those channels), on the int8 w with its
 * scales or on the float wf: from c_lo = 0, y = b + their terms, else their terms summed on; the
 * channel ranges in turn give the whole conv's sums bit for bit (CONV2D_DQ's loop) */
void mt_conv_forward_range(const mt_conv_geom_t *g, const float *x, const int8_t *w, const float *wf,
    const float *scales, const float *b, float *y, uint32_t c_lo, uint32_t c_hi);
/* the same on a float weight, as CONV2D (CONV2D_ACC with acc) */
void mt_conv_forward_f32(const mt_conv_geom_t *g, const float *x, const float *w, const float *b, const float *acc,
    float *y);
/* one channel of a depthwise input gradient: dx = conv_bwd_input(dy, float32(w) * scale), g the
 * one-channel geometry, as CONV2D_BWD_INPUT_W8 */
void mt_conv_bwd_input_plane_w8(const mt_conv_geom_t *g, const float *dy, const int8_t *w, float scale, float *dx);
/* g[c] = sum_p d[p] x[c][p], c < n, as CONV2D_BWD_WEIGHT's 1x1 gradients */
void mt_conv_pw_grads(const float *d, const float *x, uint32_t n, uint32_t P, float *g);

typedef struct {
    uint32_t C, H, W, OH, OW;     /* up to 2^28 elements (a 1-D input may be long) */
    uint16_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, include_pad, reserved;   /* attributes <= MT_LIMIT */
} mt_pool_geom_t;

/* The part of pooling window (oy, ox) inside the input: taps [ky0, ky1) x [kx0, kx1),
 * tap (ky, kx) at input (by + ky*dh, bx + kx*dw). */
typedef struct {
    int32_t ky0, ky1, kx0, kx1, by, bx;
} mt_window_t;

/* x (1,C,H,W) -> y (1,C,OH,OW) with the MT_POOL_A_* attributes a */
int mt_pool_check_shapes(const int32_t *a, const mt_tensor_t *x, const mt_tensor_t *y);
void mt_pool_prepare_geom(const mt_op_t *op, const mt_tensor_t *x, const mt_tensor_t *y, mt_pool_geom_t *g);
void mt_pool_window(const mt_pool_geom_t *g, int32_t oy, int32_t ox, mt_window_t *w);
/* the divisor of an average over window w (count_include_pad as PyTorch) */
int32_t mt_pool_window_count(const mt_pool_geom_t *g, const mt_window_t *w);

/* ---- small helpers ---- */

/* Every entry point starts here: an error names where it happened, never where an earlier one did. */
MT_INLINE void mt_clear_error(mt_ctx_t *ctx) {
    ctx->err_op = -1;
    ctx->err_tensor = -1;
}

/* (1, C, H, W) activation */
MT_INLINE int mt_is_nchw(const mt_tensor_t *t) {
    return t->ndim == 4 && t->dim[0] == 1;
}

MT_INLINE int mt_in_range(int32_t v, int32_t lo, int32_t hi) {
    return v >= lo && v <= hi;
}

/* [begin, begin + count) inside [0, total), count >= 1 */
MT_INLINE int mt_range_ok(int32_t begin, int32_t count, uint32_t total) {
    return begin >= 0 && count >= 1 && (int64_t)begin + count <= (int64_t)total;
}

#define MT_LIMIT 65535            /* largest window attribute (kernel, stride, pad, dilation) */

/* ---- the stream section (mt_stream.c) ---- */

typedef struct {
    uint32_t first, last;         /* ops first..last read it; MT_RESET_GROUP: the initial values */
    uint32_t window, lo, bytes, crc;
} mt_group_t;

void mt_group(const mt_ctx_t *ctx, uint32_t k, mt_group_t *g);
/* Every group record in range and in order (at load). */
int mt_groups_ok(mt_ctx_t *ctx);
/* The op group covering op i (the first of an op's blocks), or -1; *cursor (start at 0) walks the
 * table as i grows. */
int32_t mt_group_of(const mt_ctx_t *ctx, uint32_t i, uint32_t *cursor);
/* How many blocks group k starts: the groups from k on of the same single op (1 for any other). */
uint32_t mt_group_blocks(const mt_ctx_t *ctx, int32_t k);
/* Block b of the op whose blocks start at group k in its window, the stream region's base set for
 * the op's references (made for block 0): read and its CRC checked if not there already (a plan by
 * its head), or the base moved to it in place (a plan in memory). */
int mt_stream_load(mt_ctx_t *ctx, int32_t k, uint32_t b);
/* The stream region back in place (a plan in memory) after an op's blocks. */
void mt_stream_done(mt_ctx_t *ctx);
/* Every parameter's initial values copied into the state region (mt_reset), from the data section,
 * the stream section in memory, or the reset group read through the file. */
int mt_stream_initial_values(mt_ctx_t *ctx);

uint32_t mt_crc32_more(uint32_t crc, const uint8_t *p, size_t n);
uint32_t mt_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint32_t len_b);
uint32_t mt_rd_u32(const uint8_t *p);
uint16_t mt_rd_u16(const uint8_t *p);
void mt_wr_u32(uint8_t *p, uint32_t v);
float mt_f32_from_bits(int32_t bits);
int mt_f32_finite(float f);
int mt_f32_positive_normal(float f);
int mt_all_finite(const float *p, uint32_t n);
const char *mt_name_of(const mt_ctx_t *ctx, uint32_t name_off, uint32_t *len);
const mt_param_rec_t *mt_param_rec(const mt_ctx_t *ctx, uint32_t k);
/* The index in the parameter table of the parameter at reference ref, MT_NO_TENSOR if none. */
uint16_t mt_param_of(const mt_ctx_t *ctx, uint32_t ref);

MT_INLINE const uint8_t *mt_context(const mt_ctx_t *ctx) {
    return ctx->context;
}

#endif /* MT_CORE_H */
