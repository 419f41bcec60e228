/* microtrain core: the stream section, a plan's constants read from its file in execution order.
 *
 * A plan may keep its constants (frozen weights, their scales, the int8 layers' tables) in a
 * stream section at the end of the file, laid out by the compiler in the order the ops read them
 * and cut into groups: each group is what one op (or a pipe's two) reads, and the plan names for
 * it an arena offset, its window, planned like any tensor alive during those ops. Where the whole
 * plan is in memory (bytes in RAM, a ROMFS file in flash) the stream section is read in place and
 * the groups are never read. Where only the plan's head is (mt_load_head: a file on a board's
 * filesystem), each group is read through the caller's read function into its window just before
 * its first op, its CRC checked as read, and the stream region's base moved there: kernels reach
 * their constants through the same references either way (mt_core.h). A group read again for the
 * backward is read again: the window lives only as long as its ops. No allocation: the windows
 * are in the arena the caller attached.
 *
 * An op whose constants do not fit a window may consume them in blocks of output channels (its
 * opdef's blocks flag: PWDW_W8, PWDW_W8_BWD): the compiler cuts them into groups of one layout,
 * one after the other in the table with the op's single index and one window; the executor runs
 * the op once per group, ctx->block the block, with the stream region's base set so that the
 * op's references, made for the first block, reach the block's bytes.
 */
#include <string.h>
#include "mt_core.h"

#define FAIL(code, op, tensor) do { ctx->err_op = (op); ctx->err_tensor = (tensor); return (code); } while (0)

void mt_group(const mt_ctx_t *ctx, uint32_t k, mt_group_t *g) {
    const uint8_t *r = ctx->groups + k * MT_GROUP_BYTES;
    g->first = mt_rd_u16(r + MT_G_FIRST_OP);
    g->last = mt_rd_u16(r + MT_G_LAST_OP);
    g->window = mt_rd_u32(r + MT_G_WINDOW);
    g->lo = mt_rd_u32(r + MT_G_LO);
    g->bytes = mt_rd_u32(r + MT_G_BYTES);
    g->crc = mt_rd_u32(r + MT_G_CRC32);
}

uint32_t mt_head_bytes(const void *header, size_t n) {
    const uint8_t *p = (const uint8_t *)header;
    if (p == NULL || n < MT_HEADER_BYTES || memcmp(p + MT_H_MAGIC, MT_MAGIC, 4) != 0
        || mt_rd_u16(p + MT_H_VERSION) != MT_VERSION || mt_rd_u16(p + MT_H_HEADER_BYTES) != MT_HEADER_BYTES) {
        return 0;
    }
    uint32_t s = mt_rd_u32(p + MT_H_STREAM_OFF);
    return s != 0 ? s : mt_rd_u32(p + MT_H_FILE_BYTES);
}

/* Each record inside the stream section and (an op group) the arena; op groups in op order with
 * disjoint op ranges, except the blocks of one op: its groups in a row, one window and size; the
 * reset group, if any, last. */
int mt_groups_ok(mt_ctx_t *ctx) {
    uint32_t next = 0;
    mt_group_t prev = {0, 0, 0, 0, 0, 0};
    ctx->reset_group = ctx->n_groups;
    for (uint32_t k = 0; k < ctx->n_groups; k++) {
        mt_group_t g;
        mt_group(ctx, k, &g);
        int block = k > 0 && g.first == prev.first && g.last == prev.last && g.first == g.last
                    && g.first != MT_RESET_GROUP;
        prev = g;
        if (g.lo % MT_ALIGN != 0 || g.bytes == 0 || g.lo > ctx->stream_bytes || g.bytes > ctx->stream_bytes - g.lo) {
            FAIL(MT_E_GROUP, -1, -1);
        }
        if (g.first == MT_RESET_GROUP) {
            if (g.last != MT_RESET_GROUP || g.window != 0 || k != ctx->n_groups - 1) {
                FAIL(MT_E_GROUP, -1, -1);
            }
            ctx->reset_group = k;
            continue;
        }
        if (block) {   /* the next block of the op before: its window and size */
            mt_group_t first;
            mt_group(ctx, k - 1, &first);
            if (g.window != first.window || g.bytes != first.bytes) {
                FAIL(MT_E_GROUP, (int32_t)g.first, -1);
            }
            continue;
        }
        if (g.first < next || g.last < g.first || g.last >= ctx->n_ops || g.window % MT_ALIGN != 0
            || g.window > ctx->arena_bytes || g.bytes > ctx->arena_bytes - g.window) {
            FAIL(MT_E_GROUP, (int32_t)g.first, -1);
        }
        next = g.last + 1;
    }
    return MT_OK;
}

int32_t mt_group_of(const mt_ctx_t *ctx, uint32_t i, uint32_t *cursor) {
    const uint32_t n = ctx->reset_group;   /* the op groups come first */
    while (*cursor < n && mt_rd_u16(ctx->groups + *cursor * MT_GROUP_BYTES + MT_G_LAST_OP) < i) {
        (*cursor)++;
    }
    if (*cursor < n && mt_rd_u16(ctx->groups + *cursor * MT_GROUP_BYTES + MT_G_FIRST_OP) <= i) {
        return (int32_t)*cursor;
    }
    return -1;
}

uint32_t mt_group_blocks(const mt_ctx_t *ctx, int32_t k) {
    if (k < 0) {
        return 1;
    }
    mt_group_t a, b;
    mt_group(ctx, (uint32_t)k, &a);
    uint32_t n = 1;
    while ((uint32_t)k + n < ctx->reset_group && a.first == a.last) {
        mt_group(ctx, (uint32_t)k + n, &b);
        if (b.first != a.first || b.last != a.last) {
            break;
        }
        n++;
    }
    return n;
}

int mt_stream_load(mt_ctx_t *ctx, int32_t k, uint32_t b) {
    if (k < 0) {
        return MT_OK;
    }
    const int32_t j = k + (int32_t)b;
    mt_group_t g0, g;
    mt_group(ctx, (uint32_t)k, &g0);
    mt_group(ctx, (uint32_t)j, &g);
    if (ctx->read == NULL) {   /* in memory: block b's bytes where the references of block 0 point */
        ctx->base[MT_REGION_STREAM] = (uintptr_t)ctx->stream + g.lo - g0.lo - MT_REGION_STREAM;
        return MT_OK;
    }
    if (ctx->loaded == j) {
        return MT_OK;
    }
    uint8_t *w = ctx->ram + ctx->state_bytes + g.window;
    ctx->loaded = -1;
    ctx->base[MT_REGION_STREAM] = (uintptr_t)0 - MT_REGION_STREAM;
    ctx->stream_reads++;
    ctx->stream_read_bytes += g.bytes;
    if (ctx->read(ctx->read_user, ctx->stream_off + g.lo, w, g.bytes) != 0) {
        return MT_E_STREAM_READ;
    }
    if (mt_crc32(w, g.bytes) != g.crc) {
        return MT_E_STREAM_CRC;
    }
    ctx->base[MT_REGION_STREAM] = (uintptr_t)w - g0.lo - MT_REGION_STREAM;
    ctx->loaded = j;
    return MT_OK;
}

void mt_stream_done(mt_ctx_t *ctx) {
    ctx->block = 0;
    if (ctx->read == NULL) {
        ctx->base[MT_REGION_STREAM] = (uintptr_t)ctx->stream - MT_REGION_STREAM;
    }
}

/* The reset group holds the parameters' initial values back to back in table order, each at a
 * multiple of 8 (mt_plan.c checks that at load): read each straight into its place in the state
 * region, the padding between them into a stack buffer, the CRC carried over all of it. */
static int read_initial_values(mt_ctx_t *ctx) {
    mt_group_t g;
    mt_group(ctx, ctx->reset_group, &g);
    uint32_t crc = 0, pos = g.lo;
    ctx->stream_reads++;
    ctx->stream_read_bytes += g.bytes;
    for (uint32_t k = 0; k < ctx->n_params; k++) {
        const mt_param_rec_t *p = mt_param_rec(ctx, k);
        uint8_t pad[MT_ALIGN];
        uint8_t *dst = ctx->ram + p->state_off;
        uint32_t gap = p->init_off - pos;
        if ((gap != 0 && ctx->read(ctx->read_user, ctx->stream_off + pos, pad, gap) != 0)
            || ctx->read(ctx->read_user, ctx->stream_off + p->init_off, dst, p->bytes) != 0) {
            return MT_E_STREAM_READ;
        }
        crc = mt_crc32_more(mt_crc32_more(crc, pad, gap), dst, p->bytes);
        pos = p->init_off + p->bytes;
    }
    return crc == g.crc ? MT_OK : MT_E_STREAM_CRC;
}

int mt_stream_initial_values(mt_ctx_t *ctx) {
    if (ctx->reset_group < ctx->n_groups && ctx->read != NULL) {
        return read_initial_values(ctx);
    }
    const uint8_t *from = ctx->reset_group < ctx->n_groups ? ctx->stream : ctx->data;
    for (uint32_t k = 0; k < ctx->n_params; k++) {
        const mt_param_rec_t *p = mt_param_rec(ctx, k);
        memcpy(ctx->ram + p->state_off, from + p->init_off, p->bytes);
    }
    return MT_OK;
}
