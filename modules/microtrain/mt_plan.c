/* microtrain core: load a plan and validate every field once; attach RAM and
 * decode the plan into the runtime context there.
 *
 * After mt_load succeeds, every tensor lies inside its region, every op has the
 * slots, dtypes, shapes and attributes its kernel assumes (its opdef's check),
 * and no op writes over a tensor it reads unless the format allows that pair
 * in place. mt_attach validates the structure again while it decodes it, so a
 * plan changed in between cannot get past, and from then on the kernels run on
 * the context alone and check nothing themselves.
 */
#include <string.h>
#include "mt_core.h"

static const mt_opspec_t mt_opspecs[MT_OP_MAX + 1] = MT_OPSPECS_INIT;

#define FAIL(code, op, tensor) do { ctx->err_op = (op); ctx->err_tensor = (tensor); return (code); } while (0)

static float rd_f32(const uint8_t *p) {
    return mt_f32_from_bits((int32_t)mt_rd_u32(p));
}

/* A section [off, off+bytes) must lie after the header, inside the file, aligned. */
static int section_ok(uint32_t off, uint32_t bytes, uint32_t file_bytes) {
    return off >= MT_HEADER_BYTES && off % MT_ALIGN == 0 && off <= file_bytes && bytes <= file_bytes - off;
}

static const uint8_t *tensor_record(const mt_ctx_t *ctx, uint32_t i) {
    return ctx->tensors + i * MT_TENSOR_BYTES;
}

/* The view of tensor tid (its record validated), or an absent one for MT_NO_TENSOR. */
static void tensor_view(const mt_ctx_t *ctx, uint16_t tid, mt_tensor_t *t) {
    memset(t, 0, sizeof *t);
    t->ref = MT_REF_NONE;
    if (tid == MT_NO_TENSOR) {
        return;
    }
    const uint8_t *r = tensor_record(ctx, tid);
    static const uint8_t region[5] = {MT_REGION_ARENA, MT_REGION_CONST, MT_REGION_STATE, MT_REGION_INPUT,
                                      MT_REGION_STREAM};   /* by storage */
    t->dtype = r[MT_T_DTYPE];
    t->storage = r[MT_T_STORAGE];
    t->ndim = r[MT_T_NDIM];
    t->flags = r[MT_T_FLAGS];
    t->n = 1;
    for (int d = 0; d < MT_MAX_DIMS; d++) {
        t->dim[d] = mt_rd_u32(r + MT_T_DIM0 + 4 * d);
        t->n *= t->dim[d];
    }
    t->ref = mt_rd_u32(r + MT_T_OFFSET) | region[t->storage];
    t->quant = mt_rd_u16(r + MT_T_QUANT);
}

/* The header of a plan whose first len bytes are at p: the whole file, or (ctx->read set) its head,
 * the bytes before the stream section. The CRC of the file is checked either way: over all of it, or
 * over the head combined with the stream section's recorded CRC (mt_crc32_combine); in memory, that
 * record is checked too, so a plan that loads whole also loads by its head. */
static int validate_header(mt_ctx_t *ctx, const uint8_t *p, size_t len) {
    if (len < MT_HEADER_BYTES) {
        FAIL(MT_E_TRUNCATED, -1, -1);
    }
    if (memcmp(p + MT_H_MAGIC, MT_MAGIC, 4) != 0) {
        FAIL(MT_E_MAGIC, -1, -1);
    }
    ctx->plan_version = mt_rd_u16(p + MT_H_VERSION);
    if (ctx->plan_version != MT_VERSION) {
        FAIL(MT_E_VERSION, -1, -1);
    }
    uint32_t file_bytes = mt_rd_u32(p + MT_H_FILE_BYTES);
    if (mt_rd_u16(p + MT_H_HEADER_BYTES) != MT_HEADER_BYTES || file_bytes < MT_HEADER_BYTES) {
        FAIL(MT_E_HEADER, -1, -1);
    }
    /* the stream section: at a multiple of 8 after the header, to the end of the file at most */
    ctx->stream_off = mt_rd_u32(p + MT_H_STREAM_OFF);
    ctx->stream_bytes = mt_rd_u32(p + MT_H_STREAM_BYTES);
    uint32_t stream_crc = mt_rd_u32(p + MT_H_STREAM_CRC32);
    uint32_t g_off = mt_rd_u32(p + MT_H_GROUPS_OFF);
    ctx->n_groups = mt_rd_u16(p + MT_H_N_GROUPS);
    int split = ctx->stream_off >= MT_CRC_START && ctx->stream_off <= file_bytes;
    /* in memory: the whole file; by its head: exactly the bytes before the stream section */
    uint32_t have = ctx->read == NULL || ctx->stream_off == 0 ? file_bytes : ctx->stream_off;
    if (len < have) {
        FAIL(MT_E_TRUNCATED, -1, -1);
    }
    if (len > have) {
        FAIL(MT_E_OVERSIZE, -1, -1);
    }
    ctx->plan_crc = mt_rd_u32(p + MT_H_CRC32);
    uint32_t head = split ? ctx->stream_off : file_bytes;
    uint32_t crc = mt_crc32(p + MT_CRC_START, head - MT_CRC_START);
    if (split) {
        uint32_t tail = ctx->read == NULL ? mt_crc32(p + head, file_bytes - head) : stream_crc;
        crc = mt_crc32_combine(crc, tail, file_bytes - head);
        if (crc == ctx->plan_crc && tail != stream_crc) {   /* the file is whole but its stream record is wrong */
            FAIL(MT_E_CRC, -1, -1);
        }
    }
    if (crc != ctx->plan_crc) {
        FAIL(MT_E_CRC, -1, -1);
    }
    if (ctx->stream_off == 0 ? ctx->stream_bytes != 0 || stream_crc != 0 || g_off != 0 || ctx->n_groups != 0
                             : !section_ok(ctx->stream_off, ctx->stream_bytes, file_bytes) || ctx->stream_bytes == 0
                               || ctx->n_groups == 0) {
        FAIL(MT_E_HEADER, -1, -1);
    }
    if (mt_rd_u32(p + MT_H_FLAGS) != 0 || p[MT_H_RESERVED0] != 0 || mt_rd_u16(p + MT_H_RESERVED1) != 0
        || p[MT_H_RESERVED3] != 0) {
        FAIL(MT_E_HEADER, -1, -1);
    }
    for (uint32_t i = MT_H_RESERVED2; i < MT_HEADER_BYTES; i++) {
        if (p[i] != 0) {
            FAIL(MT_E_HEADER, -1, -1);
        }
    }
    ctx->plan_bytes = file_bytes;
    ctx->n_tensors = mt_rd_u16(p + MT_H_N_TENSORS);
    ctx->n_ops = mt_rd_u16(p + MT_H_N_OPS);
    uint32_t t_off = mt_rd_u32(p + MT_H_TENSORS_OFF);
    uint32_t o_off = mt_rd_u32(p + MT_H_OPS_OFF);
    uint32_t d_off = mt_rd_u32(p + MT_H_DATA_OFF);
    uint32_t n_off = mt_rd_u32(p + MT_H_NAMES_OFF);
    uint32_t m_off = mt_rd_u32(p + MT_H_META_OFF);
    uint32_t q_off = mt_rd_u32(p + MT_H_QUANT_OFF);
    ctx->n_quant = mt_rd_u16(p + MT_H_N_QUANT);
    ctx->ops_bytes = mt_rd_u32(p + MT_H_OPS_BYTES);
    ctx->data_bytes = mt_rd_u32(p + MT_H_DATA_BYTES);
    ctx->names_bytes = mt_rd_u32(p + MT_H_NAMES_BYTES);
    if (!section_ok(t_off, ctx->n_tensors * (uint32_t)MT_TENSOR_BYTES, head)
        || !section_ok(o_off, ctx->ops_bytes, head)
        || !section_ok(d_off, ctx->data_bytes, head)
        || !section_ok(n_off, ctx->names_bytes, head)
        || !section_ok(m_off, mt_rd_u32(p + MT_H_META_BYTES), file_bytes)
        || !section_ok(q_off, ctx->n_quant * (uint32_t)MT_QUANT_BYTES, head)
        || (ctx->stream_off != 0 && !section_ok(g_off, ctx->n_groups * (uint32_t)MT_GROUP_BYTES, head))) {
        FAIL(MT_E_SECTION, -1, -1);
    }
    /* the prepared context (see ctx_check_t): 4-byte aligned within the file, or none at all */
    ctx->section_off = mt_rd_u32(p + MT_H_CONTEXT_OFF);
    ctx->section_bytes = mt_rd_u32(p + MT_H_CONTEXT_BYTES);
    if (ctx->section_bytes == 0 ? ctx->section_off != 0
                                : !section_ok(ctx->section_off, ctx->section_bytes, file_bytes)) {
        FAIL(MT_E_SECTION, -1, -1);
    }
    ctx->tensors = p + t_off;
    ctx->ops = p + o_off;
    ctx->data = p + d_off;
    ctx->names = p + n_off;
    ctx->quant = p + q_off;
    ctx->groups = p + g_off;
    ctx->stream = ctx->stream_off != 0 && ctx->read == NULL ? p + ctx->stream_off : NULL;
    if (ctx->names_bytes > 0 && ctx->names[ctx->names_bytes - 1] != 0) {
        FAIL(MT_E_NAME, -1, -1);
    }
    ctx->arena_bytes = mt_rd_u32(p + MT_H_ARENA_BYTES);
    ctx->state_bytes = mt_rd_u32(p + MT_H_STATE_BYTES);
    ctx->naive_bytes = mt_rd_u32(p + MT_H_NAIVE_BYTES);
    ctx->const_bytes = mt_rd_u32(p + MT_H_CONST_BYTES);
    ctx->macs = (uint64_t)mt_rd_u32(p + MT_H_MACS_LO) | ((uint64_t)mt_rd_u32(p + MT_H_MACS_HI) << 32);
    if (ctx->arena_bytes % MT_ALIGN != 0 || ctx->state_bytes % MT_ALIGN != 0
        || (uint64_t)ctx->arena_bytes + ctx->state_bytes > 0x7FFFFFF8u
        || (uint64_t)ctx->const_bytes > (uint64_t)ctx->data_bytes + ctx->stream_bytes) {
        FAIL(MT_E_HEADER, -1, -1);
    }
    ctx->input = mt_rd_u16(p + MT_H_INPUT_TENSOR);
    ctx->target = mt_rd_u16(p + MT_H_TARGET_TENSOR);
    ctx->output = mt_rd_u16(p + MT_H_OUTPUT_TENSOR);
    ctx->loss_kind = p[MT_H_LOSS];
    ctx->input_dtype = p[MT_H_INPUT_DTYPE];
    ctx->batch = mt_rd_u16(p + MT_H_BATCH);
    ctx->lr = rd_f32(p + MT_H_LR);
    ctx->momentum = rd_f32(p + MT_H_MOMENTUM);
    ctx->weight_decay = rd_f32(p + MT_H_WEIGHT_DECAY);
    if (ctx->loss_kind != MT_LOSS_CROSS_ENTROPY && ctx->loss_kind != MT_LOSS_MSE) {
        FAIL(MT_E_HEADER, -1, -1);
    }
    if (ctx->batch < 1 || !mt_f32_finite(ctx->lr) || !mt_f32_finite(ctx->momentum)
        || !mt_f32_finite(ctx->weight_decay) || ctx->lr < 0.0f || ctx->momentum < 0.0f
        || ctx->momentum >= 1.0f || ctx->weight_decay < 0.0f) {
        FAIL(MT_E_OPTIM, -1, -1);
    }
    return mt_groups_ok(ctx);
}

/* The values of a per-channel record's n scales (positive normal floats) and zero points (NULL for
 * none; in [lo, hi]), where they are in memory. */
static int quant_values_ok(const uint8_t *scales, const uint8_t *zps, uint32_t n, int32_t lo, int32_t hi) {
    for (uint32_t c = 0; c < n; c++) {
        if (!mt_f32_positive_normal(rd_f32(scales + 4 * c))) {
            return 0;
        }
    }
    for (uint32_t c = 0; zps != NULL && c < n; c++) {
        int32_t z = (int32_t)mt_rd_u32(zps + 4 * c);
        if (z < lo || z > hi) {
            return 0;
        }
    }
    return 1;
}

/* [off, off + n*4) inside a section of `bytes`, off a multiple of 4 */
static int array_ok(uint32_t off, uint32_t n, uint32_t bytes) {
    return off % 4 == 0 && off <= bytes && (uint64_t)n * 4u <= bytes - off;
}

/* Quantization record qi for a tensor of this dtype and shape: a positive
 * finite scale (or per-channel scales in the data or the stream section), zero points in the
 * dtype's range (0 for an int32 bias), the channel axis inside the shape. Values in a stream section
 * that is not in memory are checked when their group is read at attach (check_streamed_quant). */
static int quant_ok(const mt_ctx_t *ctx, uint32_t qi, uint8_t dtype, uint8_t ndim, const uint8_t *r) {
    if (qi >= ctx->n_quant) {
        return 0;
    }
    const uint8_t *q = ctx->quant + qi * MT_QUANT_BYTES;
    int32_t lo, hi;
    switch (dtype) {
        case MT_DTYPE_I8: lo = -128; hi = 127; break;
        case MT_DTYPE_U8: lo = 0; hi = 255; break;
        case MT_DTYPE_I32: lo = 0; hi = 0; break;   /* a bias: real = scale * q */
        default: return 0;
    }
    if (q[MT_Q_RESERVED] != 0 || q[MT_Q_RESERVED + 1] != 0) {
        return 0;
    }
    float scale = rd_f32(q + MT_Q_SCALE);
    int32_t zp = (int32_t)mt_rd_u32(q + MT_Q_ZERO_POINT);
    uint8_t axis = q[MT_Q_AXIS];
    uint32_t n = mt_rd_u32(q + MT_Q_N_CHANNELS), scales = mt_rd_u32(q + MT_Q_SCALES);
    uint32_t zps = mt_rd_u32(q + MT_Q_ZERO_POINTS);
    uint8_t where = q[MT_Q_WHERE];
    if (axis == MT_PER_TENSOR) {
        return mt_f32_positive_normal(scale) && zp >= lo && zp <= hi && n == 1 && scales == MT_NO_NAME
               && zps == MT_NO_NAME && where == MT_QUANT_IN_DATA;
    }
    if (axis >= ndim || n != mt_rd_u32(r + MT_T_DIM0 + 4u * axis) || scale != 0.0f || zp != 0) {
        return 0;
    }
    if (where != MT_QUANT_IN_DATA && where != MT_QUANT_IN_STREAM) {
        return 0;
    }
    const uint8_t *base = where == MT_QUANT_IN_DATA ? ctx->data : ctx->stream;   /* NULL: not in memory */
    uint32_t bytes = where == MT_QUANT_IN_DATA ? ctx->data_bytes : ctx->stream_bytes;
    if (!array_ok(scales, n, bytes) || (zps != MT_NO_NAME && !array_ok(zps, n, bytes))) {
        return 0;
    }
    return base == NULL || quant_values_ok(base + scales, zps != MT_NO_NAME ? base + zps : NULL, n, lo, hi);
}

/* One tensor record, against the header's region sizes. No side effects: it runs
 * at load, again at attach, and for mt_tensor_info. */
static int tensor_ok(const mt_ctx_t *ctx, uint32_t i) {
    const uint8_t *r = tensor_record(ctx, i);
    uint8_t dtype = r[MT_T_DTYPE], storage = r[MT_T_STORAGE], ndim = r[MT_T_NDIM], flags = r[MT_T_FLAGS];
    uint32_t size;
    switch (dtype) {
        case MT_DTYPE_F32: size = MT_DTYPE_F32_SIZE; break;
        case MT_DTYPE_I32: size = MT_DTYPE_I32_SIZE; break;
        case MT_DTYPE_I8: size = MT_DTYPE_I8_SIZE; break;
        case MT_DTYPE_U8: size = MT_DTYPE_U8_SIZE; break;
        default: return MT_E_TENSOR;
    }
    if (ndim < 1 || ndim > MT_MAX_DIMS) {
        return MT_E_TENSOR;
    }
    uint64_t n = 1;
    for (int d = 0; d < MT_MAX_DIMS; d++) {
        uint32_t dim = mt_rd_u32(r + MT_T_DIM0 + 4 * d);
        if (dim < 1 || (d >= ndim && dim != 1)) {
            return MT_E_TENSOR;
        }
        n *= dim;
        if (n > 0x10000000u) {   /* 2^28 elements: keeps every index computation in int32 */
            return MT_E_TENSOR;
        }
    }
    uint32_t bytes = mt_rd_u32(r + MT_T_BYTES), off = mt_rd_u32(r + MT_T_OFFSET);
    uint32_t init = mt_rd_u32(r + MT_T_INIT), name = mt_rd_u32(r + MT_T_NAME);
    if ((uint64_t)bytes != n * size || off % MT_ALIGN != 0) {
        return MT_E_TENSOR;
    }
    uint32_t region;
    switch (storage) {
        case MT_STORAGE_ARENA: region = ctx->arena_bytes; break;
        case MT_STORAGE_STATE: region = ctx->state_bytes; break;
        case MT_STORAGE_CONST: region = ctx->data_bytes; break;
        case MT_STORAGE_STREAM: region = ctx->stream_bytes; break;   /* 0 in a plan without a stream section */
        case MT_STORAGE_INPUT:   /* the caller's sample, read in place: the input tensor or a view of it */
            if (ctx->input >= ctx->n_tensors || off != 0
                || tensor_record(ctx, ctx->input)[MT_T_STORAGE] != MT_STORAGE_INPUT) {
                return MT_E_TENSOR;
            }
            region = mt_rd_u32(tensor_record(ctx, ctx->input) + MT_T_BYTES);
            break;
        default: return MT_E_TENSOR;
    }
    if (off > region || bytes > region - off) {
        return MT_E_TENSOR;
    }
    const uint8_t known = MT_TFLAG_PARAM | MT_TFLAG_MOMENTUM | MT_TFLAG_GRAD_ACC | MT_TFLAG_INPUT
        | MT_TFLAG_TARGET | MT_TFLAG_OUTPUT;
    const uint8_t state_kinds = MT_TFLAG_PARAM | MT_TFLAG_MOMENTUM | MT_TFLAG_GRAD_ACC;
    uint8_t kind = flags & state_kinds;
    if ((flags & ~known) != 0 || (kind != 0 && kind != MT_TFLAG_PARAM && kind != MT_TFLAG_MOMENTUM
                                  && kind != MT_TFLAG_GRAD_ACC)
        || ((storage == MT_STORAGE_STATE) != (kind != 0))
        || (kind != 0 && dtype != MT_DTYPE_F32 && !(kind == MT_TFLAG_PARAM && dtype == MT_DTYPE_I8))) {
        return MT_E_TENSOR;
    }
    if (kind == MT_TFLAG_PARAM) {
        /* the initial values: in the data section, or with a reset group in the stream section (their
         * place in it: validate_tensors) */
        uint32_t from = ctx->reset_group < ctx->n_groups ? ctx->stream_bytes : ctx->data_bytes;
        if (init % MT_ALIGN != 0 || init > from || bytes > from - init) {
            return MT_E_TENSOR;
        }
    } else if (init != MT_NO_NAME) {
        return MT_E_TENSOR;
    }
    if (name != MT_NO_NAME && name >= ctx->names_bytes) {
        return MT_E_NAME;
    }
    uint16_t qi = mt_rd_u16(r + MT_T_QUANT);
    if ((qi != MT_NO_QUANT && !quant_ok(ctx, qi, dtype, ndim, r)) || mt_rd_u16(r + MT_T_RESERVED) != 0) {
        return MT_E_TENSOR;
    }
    if (kind == MT_TFLAG_PARAM && dtype == MT_DTYPE_I8) {   /* an int8 trained weight: per-channel scales, no zero points */
        /* ... in the data section: the parameter functions read them outside any op (mt_state.c) */
        const uint8_t *q = qi != MT_NO_QUANT ? ctx->quant + qi * MT_QUANT_BYTES : NULL;
        if (q == NULL || q[MT_Q_AXIS] == MT_PER_TENSOR || mt_rd_u32(q + MT_Q_ZERO_POINTS) != MT_NO_NAME
            || q[MT_Q_WHERE] != MT_QUANT_IN_DATA) {
            return MT_E_TENSOR;
        }
    }
    return MT_OK;
}

/* Every tensor record; with a reset group, the parameters' initial values fill it in table order, each
 * at the first multiple of 8 after the one before (mt_stream.c reads them so). */
static int validate_tensors(mt_ctx_t *ctx) {
    uint32_t n_params = 0, at = 0, end = 0;
    int reset = ctx->reset_group < ctx->n_groups;
    mt_group_t g = {0, 0, 0, 0, 0, 0};
    if (reset) {
        mt_group(ctx, ctx->reset_group, &g);
        at = g.lo;
    }
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        int err = tensor_ok(ctx, i);
        if (err != MT_OK) {
            FAIL(err, -1, (int32_t)i);
        }
        const uint8_t *r = tensor_record(ctx, i);
        if (r[MT_T_FLAGS] & MT_TFLAG_PARAM) {
            n_params++;
            if (reset && mt_rd_u32(r + MT_T_INIT) != at) {
                FAIL(MT_E_GROUP, -1, (int32_t)i);
            }
            end = mt_rd_u32(r + MT_T_INIT) + mt_rd_u32(r + MT_T_BYTES);   /* inside a section: no wrap */
            at = (uint32_t)(((uint64_t)end + MT_ALIGN - 1) & ~(uint64_t)(MT_ALIGN - 1));
        }
    }
    if (reset && (n_params == 0 || end != g.lo + g.bytes)) {
        FAIL(MT_E_GROUP, -1, -1);
    }
    ctx->n_params = n_params;
    return MT_OK;
}

/* Persistent tensors must not share memory: each is a distinct parameter or buffer. */
static int validate_state_disjoint(mt_ctx_t *ctx) {
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        const uint8_t *a = tensor_record(ctx, i);
        if (a[MT_T_STORAGE] != MT_STORAGE_STATE) {
            continue;
        }
        uint32_t a0 = mt_rd_u32(a + MT_T_OFFSET), a1 = a0 + mt_rd_u32(a + MT_T_BYTES);
        for (uint32_t j = i + 1; j < ctx->n_tensors; j++) {
            const uint8_t *b = tensor_record(ctx, j);
            if (b[MT_T_STORAGE] != MT_STORAGE_STATE) {
                continue;
            }
            uint32_t b0 = mt_rd_u32(b + MT_T_OFFSET), b1 = b0 + mt_rd_u32(b + MT_T_BYTES);
            if (a0 < b1 && b0 < a1) {
                FAIL(MT_E_ALIAS, -1, (int32_t)j);
            }
        }
    }
    return MT_OK;
}

/* The tensors named in the header: an F32 or int8 arena input, the target, the output. */
static int validate_io(mt_ctx_t *ctx) {
    if (ctx->input >= ctx->n_tensors || ctx->output >= ctx->n_tensors || ctx->target >= ctx->n_tensors) {
        FAIL(MT_E_HEADER, -1, -1);
    }
    mt_tensor_t x, y, t;
    tensor_view(ctx, ctx->input, &x);
    tensor_view(ctx, ctx->output, &y);
    tensor_view(ctx, ctx->target, &t);
    /* a float input is passed as float; an int8 one as int8, or as uint8 that the core flips to int8
     * (in a copy: an input read in place, from the caller's memory, is float or int8) */
    int input_fits = x.dtype == MT_DTYPE_F32 ? ctx->input_dtype == MT_DTYPE_F32
        : x.dtype == MT_DTYPE_I8 && (ctx->input_dtype == MT_DTYPE_I8
                                     || (ctx->input_dtype == MT_DTYPE_U8 && x.storage == MT_STORAGE_ARENA));
    if ((x.storage != MT_STORAGE_ARENA && x.storage != MT_STORAGE_INPUT) || !input_fits
        || !(x.flags & MT_TFLAG_INPUT)) {
        FAIL(MT_E_TENSOR, -1, ctx->input);
    }
    if (y.storage != MT_STORAGE_ARENA || y.dtype != MT_DTYPE_F32 || !(y.flags & MT_TFLAG_OUTPUT)) {
        FAIL(MT_E_TENSOR, -1, ctx->output);
    }
    int label = ctx->loss_kind == MT_LOSS_CROSS_ENTROPY;
    if (t.storage != MT_STORAGE_ARENA || !(t.flags & MT_TFLAG_TARGET)
        || t.dtype != (label ? MT_DTYPE_I32 : MT_DTYPE_F32) || t.n != (label ? 1u : y.n)) {
        FAIL(MT_E_TENSOR, -1, ctx->target);
    }
    ctx->in_ref = x.ref;
    ctx->n_in = x.n;
    ctx->out_ref = y.ref;
    ctx->n_out = y.n;
    ctx->target_ref = t.ref;
    ctx->n_target = t.n;
    return MT_OK;
}

/* The op record at byte position pos of the op list, with its tensors' views. */
static int decode_op(mt_ctx_t *ctx, uint32_t index, uint32_t pos, mt_op_t *op, uint32_t *next) {
    if (pos > ctx->ops_bytes || ctx->ops_bytes - pos < MT_OP_HEAD_BYTES) {
        FAIL(MT_E_OP, (int32_t)index, -1);
    }
    const uint8_t *p = ctx->ops + pos;
    op->code = p[0];
    op->phase = p[1];
    op->n_t = p[2];
    op->n_a = p[3];
    if (op->n_t > MT_MAX_SLOTS || op->n_a > MT_MAX_ATTRS) {
        FAIL(MT_E_OP, (int32_t)index, -1);
    }
    uint32_t t_bytes = (2u * op->n_t + 3u) & ~3u;
    uint32_t rec = MT_OP_HEAD_BYTES + t_bytes + 4u * op->n_a;
    if (ctx->ops_bytes - pos < rec) {
        FAIL(MT_E_OP, (int32_t)index, -1);
    }
    for (int i = 0; i < op->n_t; i++) {
        op->tid[i] = mt_rd_u16(p + MT_OP_HEAD_BYTES + 2 * i);
        if (op->tid[i] != MT_NO_TENSOR && op->tid[i] >= ctx->n_tensors) {
            FAIL(MT_E_OP, (int32_t)index, op->tid[i]);
        }
        tensor_view(ctx, op->tid[i], &op->t[i]);
    }
    for (int i = 0; i < op->n_a; i++) {
        op->a[i] = (int32_t)mt_rd_u32(p + MT_OP_HEAD_BYTES + t_bytes + 4 * i);
    }
    *next = pos + rec;
    return MT_OK;
}

static int inplace_allowed(const mt_opspec_t *spec, int out, int in) {
    return (spec->inplace[0] == out && spec->inplace[1] == in) || (spec->inplace[2] == out && spec->inplace[3] == in);
}

/* What every op must satisfy (format.py's slot table); its own check runs after (walk_ops). */
static int validate_op(mt_ctx_t *ctx, uint32_t index, const mt_op_t *op) {
    int32_t oi = (int32_t)index;
    if (op->code < 1 || op->code > MT_OP_MAX || mt_opspecs[op->code].n_slots == 0 || mt_opdefs[op->code] == NULL) {
        FAIL(MT_E_OPCODE, oi, -1);
    }
    const mt_opspec_t *spec = &mt_opspecs[op->code];
    if (op->n_t != spec->n_slots || op->n_a != spec->n_attrs || op->phase > MT_PHASE_BATCH_END) {
        FAIL(MT_E_OP, oi, -1);
    }
    for (int s = 0; s < op->n_t; s++) {
        uint8_t slot = spec->slot[s];
        uint16_t tid = op->tid[s];
        if (tid == MT_NO_TENSOR) {
            if (!MT_SLOT_OPTIONAL(slot)) {
                FAIL(MT_E_OP, oi, -1);
            }
            continue;
        }
        const mt_tensor_t *t = &op->t[s];
        /* a parameter slot also takes an int8 trained weight (its sink checks the scales) */
        if (t->dtype != MT_SLOT_DTYPE(slot)
            && !(MT_SLOT_ROLE(slot) == MT_ROLE_PARAM && t->dtype == MT_DTYPE_I8 && (t->flags & MT_TFLAG_PARAM))) {
            FAIL(MT_E_OP, oi, tid);
        }
        switch (MT_SLOT_ROLE(slot)) {
            case MT_ROLE_OUT:
                if (t->storage != MT_STORAGE_ARENA) {
                    FAIL(MT_E_OP, oi, tid);
                }
                break;
            case MT_ROLE_PARAM:
                if (!(t->flags & MT_TFLAG_PARAM)) {
                    FAIL(MT_E_OP, oi, tid);
                }
                break;
            case MT_ROLE_STATE:
                if (!(t->flags & (MT_TFLAG_MOMENTUM | MT_TFLAG_GRAD_ACC))) {
                    FAIL(MT_E_OP, oi, tid);
                }
                break;
            default:
                break;
        }
        /* forward ops compute values; only training ops may touch persistent state */
        if (MT_SLOT_ROLE(slot) != MT_ROLE_IN && op->phase == MT_PHASE_FORWARD && t->storage != MT_STORAGE_ARENA) {
            FAIL(MT_E_PHASE, oi, tid);
        }
    }
    /* anything an op writes must not overlap anything else it touches, except allowed in-place pairs:
     * the output exactly over the input, or over its first bytes (CONV2D_PW_INPLACE: O <= C planes) */
    for (int w = 0; w < op->n_t; w++) {
        if (MT_SLOT_ROLE(spec->slot[w]) == MT_ROLE_IN || op->tid[w] == MT_NO_TENSOR) {
            continue;
        }
        const uint8_t *rw = tensor_record(ctx, op->tid[w]);
        uint32_t bw = mt_rd_u32(rw + MT_T_OFFSET), ew = bw + mt_rd_u32(rw + MT_T_BYTES);
        for (int o = 0; o < op->n_t; o++) {
            if (o == w || op->tid[o] == MT_NO_TENSOR) {
                continue;
            }
            const uint8_t *ro = tensor_record(ctx, op->tid[o]);
            uint32_t bo = mt_rd_u32(ro + MT_T_OFFSET), eo = bo + mt_rd_u32(ro + MT_T_BYTES);
            if (ro[MT_T_STORAGE] != rw[MT_T_STORAGE] || eo <= bw || ew <= bo) {
                continue;
            }
            if (bo == bw && eo == ew && (inplace_allowed(spec, w, o) || inplace_allowed(spec, o, w))) {
                continue;
            }
            if (bo == bw && ew < eo && inplace_allowed(spec, w, o)) {   /* an output over its input's head */
                continue;
            }
            FAIL(MT_E_ALIAS, oi, op->tid[o]);
        }
    }
    return MT_OK;
}

/* ---- ops and the stream section ---- */

/* The stream bytes op reads, widened into [*lo, *hi): its STREAM tensors and the per-channel scales
 * and zero points its tensors keep in the stream section (a kernel reads those through mt_quant_of). */
static void stream_extent(const mt_ctx_t *ctx, const mt_op_t *op, uint32_t *lo, uint32_t *hi) {
    for (int s = 0; s < op->n_t; s++) {
        if (op->tid[s] == MT_NO_TENSOR) {
            continue;
        }
        const mt_tensor_t *t = &op->t[s];
        uint32_t a[3][2];
        int n = 0;
        if (t->storage == MT_STORAGE_STREAM) {
            a[n][0] = t->ref & ~7u;
            a[n++][1] = (t->ref & ~7u) + mt_rd_u32(tensor_record(ctx, op->tid[s]) + MT_T_BYTES);
        }
        const uint8_t *q = t->quant != MT_NO_QUANT ? ctx->quant + (uint32_t)t->quant * MT_QUANT_BYTES : NULL;
        if (q != NULL && q[MT_Q_AXIS] != MT_PER_TENSOR && q[MT_Q_WHERE] == MT_QUANT_IN_STREAM) {
            uint32_t nc = mt_rd_u32(q + MT_Q_N_CHANNELS), zps = mt_rd_u32(q + MT_Q_ZERO_POINTS);
            a[n][0] = mt_rd_u32(q + MT_Q_SCALES);
            a[n][1] = a[n][0] + 4u * nc;
            n++;
            if (zps != MT_NO_NAME) {
                a[n][0] = zps;
                a[n++][1] = zps + 4u * nc;
            }
        }
        for (int k = 0; k < n; k++) {   /* each inside the section (tensor_ok, quant_ok): no wrap */
            *lo = a[k][0] < *lo ? a[k][0] : *lo;
            *hi = a[k][1] > *hi ? a[k][1] : *hi;
        }
    }
}

/* [b, e) of the arena overlaps tensor tid's memory */
static int arena_overlaps(const mt_ctx_t *ctx, uint16_t tid, uint32_t b, uint32_t e) {
    const uint8_t *r = tensor_record(ctx, tid);
    uint32_t bo = mt_rd_u32(r + MT_T_OFFSET), eo = bo + mt_rd_u32(r + MT_T_BYTES);
    return r[MT_T_STORAGE] == MT_STORAGE_ARENA && bo < e && b < eo;
}

/* Op i and the stream section: what it reads of it (with a pipe reader's, its writer's too: extent)
 * lies in the group covering it (*g, -1 for none), whose window overlaps none of the arena tensors
 * the op or the writer it runs touch. */
static int stream_ok(mt_ctx_t *ctx, uint32_t i, const mt_op_t *op, const uint32_t *extent, const uint16_t *writer,
                     int32_t g) {
    if (g < 0) {
        if (extent[0] < extent[1]) {
            FAIL(MT_E_GROUP, (int32_t)i, -1);
        }
        return MT_OK;
    }
    mt_group_t gr;
    mt_group(ctx, (uint32_t)g, &gr);
    if (extent[0] < extent[1] && (extent[0] < gr.lo || extent[1] > gr.lo + gr.bytes)) {
        FAIL(MT_E_GROUP, (int32_t)i, -1);
    }
    uint32_t b = gr.window, e = gr.window + gr.bytes;
    for (int s = 0; s < op->n_t; s++) {
        if (op->tid[s] != MT_NO_TENSOR && arena_overlaps(ctx, op->tid[s], b, e)) {
            FAIL(MT_E_ALIAS, (int32_t)i, op->tid[s]);
        }
    }
    for (int k = 0; k < 4 && op->code == MT_OP_CONV_DW_PW_Q8_FROM_PIPE; k++) {
        if (arena_overlaps(ctx, writer[k], b, e)) {
            FAIL(MT_E_ALIAS, (int32_t)i, writer[k]);
        }
    }
    return MT_OK;
}

static void quant_range(uint8_t dtype, int32_t *lo, int32_t *hi) {
    *lo = dtype == MT_DTYPE_I8 ? -128 : 0;
    *hi = dtype == MT_DTYPE_I8 ? 127 : dtype == MT_DTYPE_U8 ? 255 : 0;
}

/* A plan by its head, at attach: the values of the stream-held scales and zero points of op's tensors,
 * now in the group's window (quant_ok checked their place at load). */
static int streamed_quant_ok(const mt_ctx_t *ctx, const mt_op_t *op) {
    for (int s = 0; s < op->n_t; s++) {
        const mt_tensor_t *t = &op->t[s];
        const uint8_t *q = op->tid[s] != MT_NO_TENSOR && t->quant != MT_NO_QUANT
            ? ctx->quant + (uint32_t)t->quant * MT_QUANT_BYTES : NULL;
        if (q == NULL || q[MT_Q_AXIS] == MT_PER_TENSOR || q[MT_Q_WHERE] != MT_QUANT_IN_STREAM) {
            continue;
        }
        int32_t lo, hi;
        quant_range(t->dtype, &lo, &hi);
        uint32_t zps = mt_rd_u32(q + MT_Q_ZERO_POINTS);
        const uint8_t *at = (const uint8_t *)mt_ptr(ctx, mt_rd_u32(q + MT_Q_SCALES) | MT_REGION_STREAM);
        const uint8_t *zat = zps != MT_NO_NAME ? (const uint8_t *)mt_ptr(ctx, zps | MT_REGION_STREAM) : NULL;
        if (!quant_values_ok(at, zat, mt_rd_u32(q + MT_Q_N_CHANNELS), lo, hi)) {
            return MT_E_TENSOR;
        }
    }
    return MT_OK;
}

/* The op's own check, on each block of its constants in turn: where they are only in the file, at
 * attach, each once read into the window; at load that waits (walk_ops). Several blocks only for an
 * op that consumes blocks. */
static int check_op(mt_ctx_t *ctx, uint32_t i, const mt_op_t *op, int32_t g) {
    const uint32_t blocks = mt_group_blocks(ctx, g);
    if (blocks > 1 && !mt_opspecs[op->code].blocks) {
        FAIL(MT_E_GROUP, (int32_t)i, -1);
    }
    if (ctx->read != NULL && g >= 0 && ctx->ram == NULL) {
        return MT_OK;
    }
    int err = MT_OK;
    for (uint32_t b = 0; b < blocks && err == MT_OK; b++) {
        err = mt_stream_load(ctx, g, b);
        if (err == MT_OK) {
            err = mt_opdefs[op->code]->check(ctx, op);
        }
        if (err == MT_OK && g >= 0) {
            err = streamed_quant_ok(ctx, op);
        }
    }
    if (blocks > 1) {
        mt_stream_done(ctx);
        ctx->loaded = -1;
    }
    if (err != MT_OK) {
        FAIL(err, (int32_t)i, -1);
    }
    return MT_OK;
}

static int is_loss(uint8_t code) {
    return code == MT_OP_SOFTMAX_CE || code == MT_OP_MSE;
}

/* the ops that run when a batch ends; gradient clipping before any update */
static int is_batch_end(uint8_t code) {
    return code == MT_OP_SGD || code == MT_OP_GRAD_NORM2 || code == MT_OP_GRAD_CLIP;
}

/* The pipe writer's tensors in the arena (x, ring, row, the pipe): its reader runs it, so what
 * the reader writes must lie outside them all. */
static const uint8_t PIPE_SLOTS[4] = {MT_CONV_DW_PW_Q8_TO_PIPE_X, MT_CONV_DW_PW_Q8_TO_PIPE_RING,
    MT_CONV_DW_PW_Q8_TO_PIPE_ROW, MT_CONV_DW_PW_Q8_TO_PIPE_Y};

static int pipe_clear(const mt_ctx_t *ctx, const uint16_t *writer, const mt_op_t *reader) {
    for (int w = 0; w < reader->n_t; w++) {
        if (MT_SLOT_ROLE(mt_opspecs[reader->code].slot[w]) == MT_ROLE_IN || reader->tid[w] == MT_NO_TENSOR) {
            continue;
        }
        const uint8_t *rw = tensor_record(ctx, reader->tid[w]);
        uint32_t bw = mt_rd_u32(rw + MT_T_OFFSET), ew = bw + mt_rd_u32(rw + MT_T_BYTES);
        for (int k = 0; k < 4; k++) {
            const uint8_t *ro = tensor_record(ctx, writer[k]);
            uint32_t bo = mt_rd_u32(ro + MT_T_OFFSET), eo = bo + mt_rd_u32(ro + MT_T_BYTES);
            if (ro[MT_T_STORAGE] == rw[MT_T_STORAGE] && bo < ew && bw < eo) {
                return 0;
            }
        }
    }
    return 1;
}

/* The plan's context section: the runtime context as mt_attach writes it (op records, then the
 * parameter table), prepared by the host compiler running this same C (plan.py), so that a board
 * can read it in place (from flash) instead of decoding it into RAM. It is used only where each
 * record and table entry equals the one this core prepares, compared one at a time in a stack
 * buffer; anything else (another core version, a record over the buffer, a damaged byte) and the
 * context is decoded into RAM as without the section. Records are plain integers, floats and
 * region-relative references (mt_core.h), the same bytes on every platform. The buffer holds the
 * largest record there is (232 B, CONV_DW_PW_Q8's) with room: it is on the stack of mt_load. */
#define MT_CHECK_BYTES 256
typedef struct {
    const uint8_t *section;
    uint32_t bytes;
    int same;                     /* 1 while everything compared so far matched */
    union {
        mt_rec_t rec;
        mt_param_rec_t param;
        uint32_t u[MT_CHECK_BYTES / 4];
    } buf;
} ctx_check_t;
typedef char check_holds_a_param_entry[sizeof(mt_param_rec_t) <= MT_CHECK_BYTES ? 1 : -1];

static void check_record(const mt_ctx_t *ctx, const mt_op_t *op, uint32_t at, uint32_t size, ctx_check_t *chk) {
    if (!chk->same || size > sizeof chk->buf || at > chk->bytes || size > chk->bytes - at) {
        chk->same = 0;
        return;
    }
    memset(&chk->buf, 0, size);
    mt_opdefs[op->code]->prepare(ctx, op, &chk->buf);
    chk->buf.rec.code = op->code;
    chk->buf.rec.bytes = (uint16_t)size;
    chk->same = memcmp(&chk->buf, chk->section + at, size) == 0;
}

/* Validate the op list and size (dest NULL) or write (dest) each op's record, and compare each
 * with the context section (chk, unless NULL). At attach, budget is what mt_load measured: a plan
 * that changed since cannot make the records outgrow it. */
static int walk_ops(mt_ctx_t *ctx, uint8_t *dest, uint32_t budget, uint32_t *total, ctx_check_t *chk) {
    uint32_t pos = 0, at = 0, n_loss = 0, n_train = 0, n_sgd = 0;
    uint16_t pipe = MT_NO_TENSOR;   /* the pipe the op before wrote (CONV_DW_PW_Q8_TO_PIPE) */
    uint16_t writer[4] = {0, 0, 0, 0};   /* that op's arena tensors (PIPE_SLOTS) */
    int32_t pipe_h = 0;
    uint8_t phase = MT_PHASE_FORWARD;
    uint32_t cursor = 0, prev[2] = {0, 0};   /* the group table's cursor; the op before's stream extent */
    ctx->phase_at[0] = 0;
    ctx->phase_op[0] = 0;
    for (uint32_t i = 0; i < ctx->n_ops; i++) {
        mt_op_t op;
        uint32_t next;
        int err = decode_op(ctx, i, pos, &op, &next);
        if (err == MT_OK) {
            err = validate_op(ctx, i, &op);
        }
        if (err != MT_OK) {
            return err;
        }
        /* a pipe is read by the op right after its writer, which runs the writer (mt_cdp_q8.c):
         * a CONV_DW_PW_Q8_TO_PIPE is followed by a CONV_DW_PW_Q8_FROM_PIPE reading its y as a
         * tensor of as many rows, and that op follows nothing else */
        if ((op.code == MT_OP_CONV_DW_PW_Q8_FROM_PIPE) != (pipe != MT_NO_TENSOR)
            || (pipe != MT_NO_TENSOR && (op.tid[MT_CONV_DW_PW_Q8_FROM_PIPE_X] != pipe
                || op.a[MT_CONV_DW_PW_Q8_FROM_PIPE_A_IN_H] != pipe_h))) {
            FAIL(MT_E_OP, (int32_t)i, -1);
        }
        if (pipe != MT_NO_TENSOR && !pipe_clear(ctx, writer, &op)) {
            FAIL(MT_E_ALIAS, (int32_t)i, -1);
        }
        uint32_t ext[2] = {UINT32_MAX, 0};
        stream_extent(ctx, &op, &ext[0], &ext[1]);
        const uint32_t own[2] = {ext[0], ext[1]};
        if (op.code == MT_OP_CONV_DW_PW_Q8_FROM_PIPE) {   /* it runs its writer, on the writer's constants */
            ext[0] = prev[0] < ext[0] ? prev[0] : ext[0];
            ext[1] = prev[1] > ext[1] ? prev[1] : ext[1];
        }
        prev[0] = own[0];
        prev[1] = own[1];
        int32_t g = mt_group_of(ctx, i, &cursor);
        err = stream_ok(ctx, i, &op, ext, writer, g);
        if (err == MT_OK) {
            err = check_op(ctx, i, &op, g);
        }
        if (err != MT_OK) {
            return err;
        }
        for (int k = 0; k < 4 && op.code == MT_OP_CONV_DW_PW_Q8_TO_PIPE; k++) {
            writer[k] = op.tid[PIPE_SLOTS[k]];
        }
        pipe = op.code == MT_OP_CONV_DW_PW_Q8_TO_PIPE ? op.tid[MT_CONV_DW_PW_Q8_TO_PIPE_Y] : MT_NO_TENSOR;
        pipe_h = op.code == MT_OP_CONV_DW_PW_Q8_TO_PIPE ? op.a[MT_CONV_DW_PW_Q8_TO_PIPE_A_OUT_H] : 0;
        /* phases never go back, and the loss is the first training op, so a step
         * that fails at the loss has changed no parameter */
        if (op.phase < phase || (op.phase == MT_PHASE_TRAIN && phase == MT_PHASE_FORWARD && !is_loss(op.code))
            || (is_loss(op.code) && (op.phase != MT_PHASE_TRAIN || phase != MT_PHASE_FORWARD))
            || (is_batch_end(op.code) != (op.phase == MT_PHASE_BATCH_END))
            || (op.code != MT_OP_SGD && n_sgd > 0)) {
            FAIL(MT_E_PHASE, (int32_t)i, -1);
        }
        n_sgd += op.code == MT_OP_SGD;
        if (is_loss(op.code)) {
            n_loss++;
            if ((op.code == MT_OP_SOFTMAX_CE) != (ctx->loss_kind == MT_LOSS_CROSS_ENTROPY)
                || op.tid[0] != ctx->output || op.tid[1] != ctx->target) {
                FAIL(MT_E_OP, (int32_t)i, -1);
            }
        }
        for (uint8_t q = phase + 1; q <= op.phase; q++) {
            ctx->phase_at[q] = at;
            ctx->phase_op[q] = i;
        }
        phase = op.phase;
        n_train += op.phase != MT_PHASE_FORWARD;
        const mt_opdef_t *def = mt_opdefs[op.code];
        uint32_t size = (def->prepare(ctx, &op, NULL) + 3u) & ~3u;
        if (dest != NULL) {
            if (size > budget - at) {
                FAIL(MT_E_CHANGED, (int32_t)i, -1);
            }
            mt_rec_t *rec = (mt_rec_t *)(dest + at);
            memset(rec, 0, size);
            def->prepare(ctx, &op, rec);
            rec->code = op.code;
            rec->bytes = (uint16_t)size;
        }
        if (chk != NULL) {
            check_record(ctx, &op, at, size, chk);
        }
        at += size;
        pos = next;
    }
    if (pos != ctx->ops_bytes || n_loss > 1 || pipe != MT_NO_TENSOR) {
        FAIL(MT_E_OP, -1, -1);
    }
    for (uint8_t q = phase + 1; q <= MT_PHASE_BATCH_END; q++) {
        ctx->phase_at[q] = at;
        ctx->phase_op[q] = ctx->n_ops;
    }
    ctx->n_train_ops = n_train;
    *total = at;
    return MT_OK;
}

/* Everything but the header, at load and again at attach. */
static int validate_structure(mt_ctx_t *ctx, uint8_t *dest, uint32_t budget, uint32_t *op_bytes,
                              ctx_check_t *chk) {
    int err = validate_tensors(ctx);
    if (err == MT_OK) {
        err = validate_state_disjoint(ctx);
    }
    if (err == MT_OK) {
        err = validate_io(ctx);
    }
    if (err == MT_OK) {
        err = walk_ops(ctx, dest, budget, op_bytes, chk);
    }
    return err;
}

static void param_entry(const mt_ctx_t *ctx, uint32_t i, mt_param_rec_t *p);

/* After the records: the section holds the whole context, its parameter table included. */
static int section_is_context(const mt_ctx_t *ctx, ctx_check_t *chk) {
    if (!chk->same || chk->bytes != ctx->context_bytes) {
        return 0;
    }
    const uint8_t *table = chk->section + ctx->params_at;
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        if (tensor_record(ctx, i)[MT_T_FLAGS] & MT_TFLAG_PARAM) {
            param_entry(ctx, i, &chk->buf.param);
            if (memcmp(&chk->buf.param, table, sizeof chk->buf.param) != 0) {
                return 0;
            }
            table += sizeof chk->buf.param;
        }
    }
    return 1;
}

/* The whole plan in memory (read NULL), or its head with the rest read through read. */
static int load(mt_ctx_t *ctx, const void *plan, size_t plan_bytes, mt_read_fn read, void *user) {
    memset(ctx, 0, sizeof *ctx);
    mt_clear_error(ctx);
    ctx->read = read;
    ctx->read_user = user;
    ctx->loaded = -1;
    if (plan == NULL || ((uintptr_t)plan & 3u) != 0) {
        FAIL(MT_E_ALIGN, -1, -1);
    }
    uint32_t op_bytes = 0;
    ctx_check_t chk;
    int err = validate_header(ctx, (const uint8_t *)plan, plan_bytes);
    ctx->base[MT_REGION_CONST] = (uintptr_t)ctx->data - MT_REGION_CONST;
    ctx->base[MT_REGION_NONE] = (uintptr_t)0 - MT_REGION_NONE;
    ctx->base[MT_REGION_STREAM] = (uintptr_t)ctx->stream - MT_REGION_STREAM;   /* by its head: set per group */
    /* a plan by its head never runs its context in place: the section is not in the head */
    chk.section = ctx->read == NULL || ctx->stream_off == 0 ? (const uint8_t *)plan + ctx->section_off : NULL;
    chk.bytes = ctx->section_bytes;
    chk.same = chk.bytes != 0 && chk.section != NULL;
    if (err == MT_OK) {
        err = validate_structure(ctx, NULL, 0, &op_bytes, &chk);
    }
    if (err == MT_OK) {
        ctx->params_at = op_bytes;
        ctx->context_bytes = op_bytes + ctx->n_params * (uint32_t)sizeof(mt_param_rec_t);
        ctx->context_in_plan = (uint8_t)section_is_context(ctx, &chk);
        if ((uint64_t)ctx->state_bytes + ctx->arena_bytes + ctx->context_bytes > 0x7FFFFFF8u) {
            ctx->err_op = -1;
            err = MT_E_HEADER;
        }
    }
    if (err != MT_OK) {
        ctx->plan = NULL;   /* a half-loaded context must not be usable */
        ctx->n_ops = 0;
        return err;
    }
    ctx->plan = (const uint8_t *)plan;
    return MT_OK;
}

int mt_load(mt_ctx_t *ctx, const void *plan, size_t plan_bytes) {
    return load(ctx, plan, plan_bytes, NULL, NULL);
}

int mt_load_head(mt_ctx_t *ctx, const void *head, size_t head_bytes, mt_read_fn read, void *user) {
    if (read == NULL) {
        memset(ctx, 0, sizeof *ctx);
        mt_clear_error(ctx);
        return MT_E_DETACHED;
    }
    return load(ctx, head, head_bytes, read, user);
}

int mt_context_in_ram(mt_ctx_t *ctx) {
    mt_clear_error(ctx);
    if (ctx->plan == NULL || ctx->ram != NULL) {
        return MT_E_DETACHED;
    }
    ctx->context_in_plan = 0;
    return MT_OK;
}

uint32_t mt_ram_bytes(const mt_ctx_t *ctx) {
    return ctx->plan != NULL
        ? ctx->state_bytes + ctx->arena_bytes + (ctx->context_in_plan ? 0u : ctx->context_bytes) : 0;
}

/* The parameter table's entry for parameter tensor i. */
static void param_entry(const mt_ctx_t *ctx, uint32_t i, mt_param_rec_t *p) {
    const uint8_t *r = tensor_record(ctx, i);
    mt_tensor_t t;
    tensor_view(ctx, (uint16_t)i, &t);
    memset(p, 0, sizeof *p);
    p->tensor = i;
    p->state_off = mt_rd_u32(r + MT_T_OFFSET);
    p->init_off = mt_rd_u32(r + MT_T_INIT);
    p->bytes = mt_rd_u32(r + MT_T_BYTES);
    p->n = t.n;
    p->name = mt_rd_u32(r + MT_T_NAME);
    memcpy(p->dim, t.dim, sizeof p->dim);
    p->ndim = t.ndim;
    p->dtype = t.dtype;
    if (!mt_q8w_of(ctx, &t, &p->q8)) {
        p->q8.scales = MT_REF_NONE;
    }
}

/* The parameter table, after the op records of a context in RAM. */
static void write_params(mt_ctx_t *ctx, uint8_t *context) {
    mt_param_rec_t *p = (mt_param_rec_t *)(context + ctx->params_at);
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        if (tensor_record(ctx, i)[MT_T_FLAGS] & MT_TFLAG_PARAM) {
            param_entry(ctx, i, p++);
        }
    }
}

int mt_attach(mt_ctx_t *ctx, void *ram, size_t ram_bytes) {
    mt_clear_error(ctx);
    if (ctx->plan == NULL) {
        return MT_E_DETACHED;
    }
    if (ram == NULL || ((uintptr_t)ram & 3u) != 0) {
        return MT_E_ALIGN;
    }
    if (ram_bytes < mt_ram_bytes(ctx)) {
        return MT_E_RAM;
    }
    uint32_t n_params = ctx->n_params, op_bytes = 0;
    ctx->ram = (uint8_t *)ram;
    ctx->base[MT_REGION_STATE] = (uintptr_t)ctx->ram - MT_REGION_STATE;
    ctx->base[MT_REGION_ARENA] = (uintptr_t)(ctx->ram + ctx->state_bytes) - MT_REGION_ARENA;
    uint8_t *context = ctx->ram + ctx->state_bytes + ctx->arena_bytes;
    ctx_check_t chk;
    chk.section = ctx->plan + ctx->section_off;
    chk.bytes = ctx->section_bytes;
    chk.same = 1;
    /* a context in the plan is compared again, as one in RAM is decoded again: the plan may have
     * changed since mt_load */
    int err = ctx->context_in_plan ? validate_structure(ctx, NULL, 0, &op_bytes, &chk)
                                   : validate_structure(ctx, context, ctx->params_at, &op_bytes, NULL);
    if (err == MT_OK && (op_bytes != ctx->params_at || ctx->n_params != n_params
                         || (ctx->context_in_plan && !section_is_context(ctx, &chk)))) {
        err = MT_E_CHANGED;
    }
    if (err != MT_OK) {
        ctx->ram = NULL;
        return err;
    }
    if (ctx->context_in_plan) {
        ctx->context = chk.section;
    } else {
        write_params(ctx, context);
        ctx->context = context;
    }
    ctx->loaded = -1;   /* the arena is the steps' from now on */
    err = mt_reset(ctx);
    if (err != MT_OK) {
        ctx->ram = NULL;
    }
    return err;
}

uint16_t mt_param_of(const mt_ctx_t *ctx, uint32_t ref) {
    uint16_t k = 0;
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        if (tensor_record(ctx, i)[MT_T_FLAGS] & MT_TFLAG_PARAM) {
            mt_tensor_t t;
            tensor_view(ctx, (uint16_t)i, &t);
            if (t.ref == ref) {
                return k;
            }
            k++;
        }
    }
    return MT_NO_TENSOR;
}

const mt_param_rec_t *mt_param_rec(const mt_ctx_t *ctx, uint32_t k) {
    return (const mt_param_rec_t *)(mt_context(ctx) + ctx->params_at) + k;
}

/* Parameters back to the plan's initial values, optimizer state to zero. */
int mt_reset(mt_ctx_t *ctx) {
    mt_clear_error(ctx);
    if (ctx->plan == NULL || ctx->ram == NULL) {
        return MT_E_DETACHED;
    }
    memset(ctx->ram, 0, ctx->state_bytes);
    int err = mt_stream_initial_values(ctx);
    if (err != MT_OK) {
        return err;
    }
    ctx->steps = 0;
    ctx->updates = 0;
    ctx->in_batch = 0;
    ctx->rejected = 0;
    ctx->loss = 0.0f;
    return MT_OK;
}

/* Introspection reads the tensor table, so it checks the record again first. */
int mt_tensor_info(const mt_ctx_t *ctx, uint32_t index, mt_tensor_info_t *info) {
    if (ctx->plan == NULL) {
        return MT_E_DETACHED;
    }
    if (index >= ctx->n_tensors) {
        return MT_E_INDEX;
    }
    int err = tensor_ok(ctx, index);
    if (err != MT_OK) {
        return err;
    }
    mt_tensor_t t;
    tensor_view(ctx, (uint16_t)index, &t);
    const uint8_t *r = tensor_record(ctx, index);
    info->name = mt_name_of(ctx, mt_rd_u32(r + MT_T_NAME), &info->name_len);
    info->data = t.storage == MT_STORAGE_INPUT ? (ctx->base[MT_REGION_INPUT] != 0 ? mt_ptr(ctx, t.ref) : NULL)
        : t.storage == MT_STORAGE_STREAM ? (ctx->stream != NULL ? mt_ptr(ctx, t.ref) : NULL)   /* else in the file */
        : t.storage == MT_STORAGE_CONST || ctx->ram != NULL ? mt_ptr(ctx, t.ref) : NULL;
    info->bytes = mt_rd_u32(r + MT_T_BYTES);
    info->n = t.n;
    memcpy(info->dim, t.dim, sizeof info->dim);
    info->ndim = t.ndim;
    info->dtype = t.dtype;
    info->storage = t.storage;
    info->flags = t.flags;
    return MT_OK;
}
