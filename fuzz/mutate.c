/* microtrain fuzzing: a structure-aware mutator for .mtp plans (libFuzzer's
 * LLVMFuzzerCustomMutator).
 *
 * Random bytes almost never get past a plan's CRC, and a plan that does pass it
 * dies at the first misplaced field. This mutator knows the layout (from the
 * generated mt_format.h, so it follows format.py) and changes one thing a
 * plan's author or a damaged file could: a header field, a tensor record's
 * field (dtype, storage, dims with or without a matching byte count, offset
 * inside, at the end of or past its region, onto another tensor), an op
 * record's code, phase, counts, tensor slots or attributes (integers and float
 * bits), swapped fields, a truncated or extended file, a moved section. Then
 * it fixes the size field and the CRC (most of the time) so the validator
 * behind the checksum is what gets tested. One call in eight hands the bytes to
 * libFuzzer's own byte mutations instead.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "mt.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

typedef struct {
    uint32_t s;
} rng_t;

static uint32_t rnd(rng_t *r) {
    uint32_t x = r->s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return r->s = x;
}

static uint32_t below(rng_t *r, uint32_t n) {
    return n ? rnd(r) % n : 0;
}

static uint32_t rd(const uint8_t *p, int w) {
    uint32_t v = 0;
    for (int i = w - 1; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static void wr(uint8_t *p, int w, uint32_t v) {
    for (int i = 0; i < w; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

/* A value worth trying in place of old: boundaries, neighbours, bit flips, float specials. */
static uint32_t interesting(rng_t *r, uint32_t old, int w) {
    static const uint32_t ints[] = {0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 64, 255, 256, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF,
        0x10000, 0x10000000, 0x10000001, 0x7FFFFFF8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF8, 0xFFFFFFFF};
    static const uint32_t floats[] = {0x7FC00000 /* NaN */, 0x7F800000 /* inf */, 0xFF800000, 0x80000000 /* -0 */,
        0x3F800000 /* 1 */, 0xBF800000, 0x3F7FFFFF /* 0.99999994 */, 0x7F7FFFFF /* FLT_MAX */, 0x00000001, 0x40C00000 /* 6 */};
    uint32_t v;
    switch (below(r, 9)) {
        case 0: v = ints[below(r, sizeof ints / sizeof ints[0])]; break;
        case 1: v = old + 1; break;
        case 2: v = old - 1; break;
        case 3: v = old + 8 * (1 + below(r, 4)); break;
        case 4: v = old - 8 * (1 + below(r, 4)); break;
        case 5: v = old ^ (1u << below(r, 8u * (uint32_t)w)); break;
        case 6: v = w == 4 ? floats[below(r, sizeof floats / sizeof floats[0])] : rnd(r); break;
        case 7: v = old * 2 + below(r, 2); break;
        default: v = rnd(r); break;
    }
    return w == 4 ? v : v & ((1u << (8 * w)) - 1u);
}

static const struct {
    uint16_t at;
    uint8_t w;
} header_fields[] = {
    {MT_H_VERSION, 2}, {MT_H_HEADER_BYTES, 2}, {MT_H_FILE_BYTES, 4}, {MT_H_FLAGS, 4}, {MT_H_N_TENSORS, 2},
    {MT_H_N_OPS, 2}, {MT_H_TENSORS_OFF, 4}, {MT_H_OPS_OFF, 4}, {MT_H_OPS_BYTES, 4}, {MT_H_DATA_OFF, 4},
    {MT_H_DATA_BYTES, 4}, {MT_H_NAMES_OFF, 4}, {MT_H_NAMES_BYTES, 4}, {MT_H_META_OFF, 4}, {MT_H_META_BYTES, 4},
    {MT_H_ARENA_BYTES, 4}, {MT_H_STATE_BYTES, 4}, {MT_H_NAIVE_BYTES, 4}, {MT_H_CONST_BYTES, 4}, {MT_H_MACS_LO, 4},
    {MT_H_INPUT_TENSOR, 2}, {MT_H_TARGET_TENSOR, 2}, {MT_H_OUTPUT_TENSOR, 2}, {MT_H_LOSS, 1}, {MT_H_RESERVED0, 1},
    {MT_H_BATCH, 2}, {MT_H_LR, 4}, {MT_H_MOMENTUM, 4}, {MT_H_WEIGHT_DECAY, 4}, {MT_H_RESERVED2, 1},
};

static const struct {
    uint8_t at, w;
} tensor_fields[] = {
    {MT_T_DTYPE, 1}, {MT_T_STORAGE, 1}, {MT_T_NDIM, 1}, {MT_T_FLAGS, 1}, {MT_T_OFFSET, 4}, {MT_T_BYTES, 4},
    {MT_T_DIM0, 4}, {MT_T_DIM1, 4}, {MT_T_DIM2, 4}, {MT_T_DIM3, 4}, {MT_T_NAME, 4}, {MT_T_INIT, 4},
    {MT_T_QUANT, 2}, {MT_T_RESERVED, 2},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The plan as far as it can be walked: where the tensor table and op records are. */
typedef struct {
    uint8_t *p;
    size_t size;
    uint32_t n_tensors, t_off, n_ops;
    uint32_t op_at[256];          /* byte position in p of the first ops (at most 256) */
    uint32_t n_op_at;
} view_t;

static void walk(view_t *v, uint8_t *p, size_t size) {
    v->p = p;
    v->size = size;
    v->n_tensors = rd(p + MT_H_N_TENSORS, 2);
    v->t_off = rd(p + MT_H_TENSORS_OFF, 4);
    if (v->t_off > size || (size - v->t_off) / MT_TENSOR_BYTES < v->n_tensors) {
        v->n_tensors = v->t_off <= size ? (uint32_t)((size - v->t_off) / MT_TENSOR_BYTES) : 0;
    }
    v->n_ops = rd(p + MT_H_N_OPS, 2);
    uint64_t pos = rd(p + MT_H_OPS_OFF, 4), end = pos + rd(p + MT_H_OPS_BYTES, 4);
    if (end > size) {
        end = size;
    }
    v->n_op_at = 0;
    while (v->n_op_at < v->n_ops && v->n_op_at < COUNT(v->op_at) && pos + MT_OP_HEAD_BYTES <= end) {
        v->op_at[v->n_op_at++] = (uint32_t)pos;
        pos += MT_OP_HEAD_BYTES + ((2u * p[pos + 2] + 3u) & ~3u) + 4u * p[pos + 3];
    }
}

static uint8_t *tensor_at(const view_t *v, uint32_t i) {
    return v->p + v->t_off + i * MT_TENSOR_BYTES;
}

static uint32_t dtype_size(uint8_t dtype) {
    return dtype == MT_DTYPE_I8 || dtype == MT_DTYPE_U8 ? 1 : 4;
}

/* a tensor's size in its region, from the header */
static uint32_t region_of(const view_t *v, const uint8_t *t) {
    switch (t[MT_T_STORAGE]) {
        case MT_STORAGE_ARENA: return rd(v->p + MT_H_ARENA_BYTES, 4);
        case MT_STORAGE_STATE: return rd(v->p + MT_H_STATE_BYTES, 4);
        default: return rd(v->p + MT_H_DATA_BYTES, 4);
    }
}

static void mutate_tensor(rng_t *r, view_t *v) {
    if (v->n_tensors == 0) {
        return;
    }
    uint8_t *t = tensor_at(v, below(r, v->n_tensors));
    switch (below(r, 5)) {
        case 0: {   /* any field */
            int f = (int)below(r, COUNT(tensor_fields));
            wr(t + tensor_fields[f].at, tensor_fields[f].w,
               interesting(r, rd(t + tensor_fields[f].at, tensor_fields[f].w), tensor_fields[f].w));
            break;
        }
        case 1: {   /* a dim, huge or small, with a byte count to match (the shape checks decide) */
            int d = (int)below(r, MT_MAX_DIMS);
            uint32_t dim = below(r, 4) == 0 ? interesting(r, rd(t + MT_T_DIM0 + 4 * d, 4), 4) : 1 + below(r, 64);
            wr(t + MT_T_DIM0 + 4 * d, 4, dim);
            if (d >= t[MT_T_NDIM] && below(r, 2)) {
                t[MT_T_NDIM] = (uint8_t)(d + 1);
            }
            uint64_t n = 1;
            for (int k = 0; k < MT_MAX_DIMS; k++) {
                n *= rd(t + MT_T_DIM0 + 4 * k, 4);
            }
            wr(t + MT_T_BYTES, 4, (uint32_t)(n * dtype_size(t[MT_T_DTYPE])));
            break;
        }
        case 2: {   /* the offset: anywhere aligned, at the very end, just past the end */
            uint32_t region = region_of(v, t), bytes = rd(t + MT_T_BYTES, 4), off;
            switch (below(r, 4)) {
                case 0: off = (below(r, region / 8 + 2)) * 8; break;
                case 1: off = region >= bytes ? (region - bytes) & ~7u : 0; break;
                case 2: off = (region - bytes + 8) & ~7u; break;
                default: off = rd(tensor_at(v, below(r, v->n_tensors)) + MT_T_OFFSET, 4); break;   /* alias */
            }
            wr(t + MT_T_OFFSET, 4, off);
            break;
        }
        case 3: {   /* swap one field between two tensors */
            uint8_t *u = tensor_at(v, below(r, v->n_tensors));
            int f = (int)below(r, COUNT(tensor_fields));
            uint32_t a = rd(t + tensor_fields[f].at, tensor_fields[f].w);
            wr(t + tensor_fields[f].at, tensor_fields[f].w, rd(u + tensor_fields[f].at, tensor_fields[f].w));
            wr(u + tensor_fields[f].at, tensor_fields[f].w, a);
            break;
        }
        default: {   /* swap two dims */
            int a = (int)below(r, MT_MAX_DIMS), b = (int)below(r, MT_MAX_DIMS);
            uint32_t x = rd(t + MT_T_DIM0 + 4 * a, 4);
            wr(t + MT_T_DIM0 + 4 * a, 4, rd(t + MT_T_DIM0 + 4 * b, 4));
            wr(t + MT_T_DIM0 + 4 * b, 4, x);
            break;
        }
    }
}

static void mutate_op(rng_t *r, view_t *v) {
    if (v->n_op_at == 0) {
        return;
    }
    uint32_t at = v->op_at[below(r, v->n_op_at)];
    uint8_t *op = v->p + at;
    uint32_t n_t = op[2], n_a = op[3];
    uint8_t *slots = op + MT_OP_HEAD_BYTES, *attrs = slots + ((2u * n_t + 3u) & ~3u);
    int fits_attrs = (size_t)(attrs - v->p) + 4u * n_a <= v->size;
    if ((size_t)(slots - v->p) + 2u * n_t > v->size) {
        n_t = 0;   /* the record runs past the file: leave its slots alone */
    }
    switch (below(r, 6)) {
        case 0: {   /* head: code, phase, slot or attribute count */
            int f = (int)below(r, 4);
            op[f] = f == 0 && below(r, 2) ? (uint8_t)(1 + below(r, MT_OP_MAX + 1)) : (uint8_t)interesting(r, op[f], 1);
            break;
        }
        case 1:     /* a slot: another tensor, absent, or out of range */
            if (n_t > 0) {
                uint8_t *s = slots + 2 * below(r, n_t);
                uint32_t k = below(r, 4);
                wr(s, 2, k == 0 ? MT_NO_TENSOR : k == 1 ? interesting(r, rd(s, 2), 2) : below(r, v->n_tensors + 1));
            }
            break;
        case 2:     /* two slots swapped */
            if (n_t > 1) {
                uint8_t *a = slots + 2 * below(r, n_t), *b = slots + 2 * below(r, n_t);
                uint32_t x = rd(a, 2);
                wr(a, 2, rd(b, 2));
                wr(b, 2, x);
            }
            break;
        default:    /* an attribute: integer boundaries, neighbours, float bits */
            if (n_a > 0 && fits_attrs) {
                uint8_t *a = attrs + 4 * below(r, n_a);
                wr(a, 4, below(r, 3) == 0 ? (uint32_t)(int32_t)(below(r, 9) - 2) : interesting(r, rd(a, 4), 4));
            }
            break;
    }
}

static void fix_crc(uint8_t *p, size_t size) {
    uint32_t file_bytes = rd(p + MT_H_FILE_BYTES, 4);
    if (file_bytes >= MT_CRC_START && file_bytes <= size) {
        wr(p + MT_H_CRC32, 4, mt_crc32(p + MT_CRC_START, file_bytes - MT_CRC_START));
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    rng_t r = {seed * 2654435761u + 1u};
    int plan = size >= MT_HEADER_BYTES && memcmp(data, MT_MAGIC, 4) == 0;
    if (!plan || below(&r, 8) == 0) {
        size = LLVMFuzzerMutate(data, size, max_size);
    } else {
        for (uint32_t k = 1 + below(&r, 2); k > 0; k--) {
            view_t v;
            walk(&v, data, size);
            switch (below(&r, 10)) {
                case 0: case 1: {
                    int f = (int)below(&r, COUNT(header_fields));
                    wr(data + header_fields[f].at, header_fields[f].w,
                       interesting(&r, rd(data + header_fields[f].at, header_fields[f].w), header_fields[f].w));
                    break;
                }
                case 2: case 3: case 4: mutate_tensor(&r, &v); break;
                case 5: case 6: case 7: mutate_op(&r, &v); break;
                case 8: {   /* truncate, or extend with zeros or copies */
                    size_t n = below(&r, 2) ? below(&r, (uint32_t)size) : size + below(&r, 64);
                    n = n < MT_HEADER_BYTES ? MT_HEADER_BYTES : n > max_size ? max_size : n;
                    if (n > size) {
                        memset(data + size, below(&r, 2) ? 0 : 0xA5, n - size);
                    }
                    size = n;
                    if (below(&r, 4) != 0) {
                        wr(data + MT_H_FILE_BYTES, 4, (uint32_t)size);
                    }
                    break;
                }
                default: {  /* move or resize a section by a few aligned steps */
                    static const uint16_t sec[] = {MT_H_TENSORS_OFF, MT_H_OPS_OFF, MT_H_OPS_BYTES, MT_H_DATA_OFF,
                        MT_H_DATA_BYTES, MT_H_NAMES_OFF, MT_H_NAMES_BYTES, MT_H_ARENA_BYTES, MT_H_STATE_BYTES};
                    uint16_t at = sec[below(&r, COUNT(sec))];
                    int32_t d = 8 * ((int32_t)below(&r, 9) - 4);
                    wr(data + at, 4, rd(data + at, 4) + (uint32_t)d);
                    break;
                }
            }
        }
    }
    if (size >= MT_HEADER_BYTES && below(&r, 10) != 0) {
        fix_crc(data, size);
    }
    return size;
}
