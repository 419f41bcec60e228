/* microtrain: MicroPython binding for the microtrain core (mt.h).
 *
 *     import microtrain
 *     from array import array
 *     t = microtrain.Trainer(open("model.mtp", "rb").read())
 *     t = microtrain.Trainer("model.mtp")   # or an open file: a plan with a stream section keeps only
 *                                      # its head in RAM and reads its constants from the file
 *     x = array("f", bytes(4 * t.input_len))
 *     loss = t.step(x, 3)             # cross-entropy plan: y is a class label
 *     loss = t.step(x, y)             # MSE plan: y is a float32 buffer of targets
 *     t.step(x, 3, loss_buf)          # writes loss_buf[0], returns None, no heap use
 *     t.predict(x, out)               # writes t.output_len floats into out, no heap use
 *     t.params()                      # {name: array('f')} copies of the parameters
 *     t.info()                        # memory and plan facts
 *     t.lr = 0.01                     # learning rate, read/write
 *     t.reset()                       # parameters back to the plan's initial values
 *
 * A path, or a file without the buffer protocol (a littlefs or FAT file; a ROMFS file has it and is
 * read in place): the plan's head (the bytes before its stream section, all of it for a plan
 * without one) is read into the heap in pieces of at most 512 bytes through the stream protocol,
 * the core reads each group of constants from the file into its window in the arena as the ops
 * need it (mt_stream.c), through the same protocol, allocating nothing. The file must stay open
 * and unchanged while the Trainer is used; a group that reads otherwise stops the step with
 * ValueError (its CRC is checked as it is read).
 *
 * Memory: the Trainer keeps a reference to the plan object and the core reads its
 * constants in place (like framebuf keeps its buffer); the plan's structure is
 * decoded once into the RAM block, so a caller who modifies a bytearray plan
 * afterwards changes numbers at worst, and one who resizes it gets ValueError
 * (get_ctx checks the buffer on every call). A plan that is not 4-byte aligned is
 * copied once. The RAM the core needs (mt_ram_bytes: state, arena, runtime
 * context) is allocated once, in the constructor; step() with loss_out and
 * predict() with out allocate nothing as long as x, y and out are 4-byte
 * aligned (array('f') always is; an unaligned buffer is staged through a
 * scratch area that is allocated on first use).
 *
 * Float buffers are float32 in native byte order: array('f'), or bytes/bytearray
 * (or a memoryview of them) whose length is a multiple of 4.
 *
 * Built into firmware as a user C module (micropython.mk / micropython.cmake), or
 * as a native .mpy: firmware/natmod/microtrain_natmod.c includes this file with
 * MICROPY_ENABLE_DYNRUNTIME defined by MicroPython's natmod build and adds the
 * module's registration and the C library functions a native module lacks.
 * Everything here uses only functions that py/dynruntime.h provides; the two
 * builds differ only in the sections marked MICROPY_ENABLE_DYNRUNTIME.
 */

#include <string.h>

#if MICROPY_ENABLE_DYNRUNTIME
#include "py/dynruntime.h"
#else
#include "py/runtime.h"
#include "py/binary.h"
#include "py/objarray.h"
#include "py/stream.h"
#endif

#include "mt.h"

#if !MICROPY_PY_BUILTINS_FLOAT
#error "microtrain needs a MicroPython build with float support"
#endif

#ifndef BYTEARRAY_TYPECODE
#define BYTEARRAY_TYPECODE 1
#endif

typedef struct _mt_trainer_obj_t {
    mp_obj_base_t base;
    mp_obj_t plan_obj;      /* the caller's plan object when read in place, else None */
    const void *plan_buf;   /* where its bytes were when the Trainer was made */
    size_t plan_len;
    bool plan_writable;     /* the caller can change them: check on every call */
    uint8_t *plan_copy;     /* aligned copy of the plan when the caller's was not aligned, or its head */
    mp_obj_t file;          /* the plan's file when its constants are read from it, else None */
    const mp_stream_p_t *stream;   /* its stream protocol */
    uint8_t *ram;           /* mt_ram_bytes() bytes: state region, arena, runtime context */
    float *scratch;         /* staging for unaligned buffers, allocated on first use */
    uint32_t n_in, n_out, n_target;
    mt_ctx_t ctx;
} mt_trainer_obj_t;

#if MICROPY_ENABLE_DYNRUNTIME
#define MT_MEMORY_ERROR ((const mp_obj_type_t *)mp_load_global(MP_QSTR_MemoryError))
#define mt_malloc_maybe(n) m_realloc_maybe(NULL, (n), false)
#else
#define MT_MEMORY_ERROR (&mp_type_MemoryError)
#define mt_malloc_maybe(n) m_malloc_maybe(n)
#endif

/* ---- messages -------------------------------------------------------------
 * Exception text is assembled here rather than with mp_raise_msg_varg because
 * a native .mpy has no printf-style raise; the result is the same. */

typedef struct {
    size_t len;
    char buf[160];
} mt_msg_t;

static void msg_str(mt_msg_t *m, const char *s) {
    while (*s != '\0' && m->len < sizeof(m->buf)) {
        m->buf[m->len++] = *s++;
    }
}

static void msg_bytes(mt_msg_t *m, const char *s, size_t n) {
    while (n-- > 0 && m->len < sizeof(m->buf)) {
        m->buf[m->len++] = *s++;
    }
}

static void msg_uint(mt_msg_t *m, uint32_t v) {
    char digits[10];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0 && m->len < sizeof(m->buf)) {
        m->buf[m->len++] = digits[--n];
    }
}

static void msg_typecode(mt_msg_t *m, int typecode) {
    if (typecode > ' ' && typecode < 127) {
        char s[4] = {'\'', (char)typecode, '\'', '\0'};
        msg_str(m, s);
    } else {
        msg_uint(m, (uint32_t)typecode);
    }
}

static MP_NORETURN void msg_raise(const mp_obj_type_t *type, const mt_msg_t *m) {
    mp_raise_type_arg(type, mp_obj_new_str(m->buf, m->len));
}

/* Raise ValueError("microtrain: " + mt_error_text()), the same text as the host's
 * microtrain.native: the core builds it for both. */
static MP_NORETURN void mt_raise(const mt_ctx_t *ctx, int code) {
    mt_msg_t m;
    m.len = 0;
    msg_str(&m, "microtrain: ");
    m.len += mt_error_text(ctx, code, m.buf + m.len, sizeof(m.buf) - m.len);
    msg_raise(&mp_type_ValueError, &m);
}

static inline void mt_check(const mt_ctx_t *ctx, int code) {
    if (code != MT_OK) {
        mt_raise(ctx, code);
    }
}

/* "<what> has <have> floats, the plan's <role> needs <want>" */
static MP_NORETURN void raise_len(const char *what, size_t have, const char *role, uint32_t want) {
    mt_msg_t m;
    m.len = 0;
    msg_str(&m, what);
    msg_str(&m, " has ");
    msg_uint(&m, (uint32_t)have);
    msg_str(&m, have == 1 ? " float, the plan's " : " floats, the plan's ");
    msg_str(&m, role);
    msg_str(&m, " needs ");
    msg_uint(&m, want);
    msg_raise(&mp_type_ValueError, &m);
}

/* ---- float32 buffers ------------------------------------------------------ */

/* Get a float32 buffer from obj (array('f'), or a byte buffer of 4k bytes) and
 * return its length in floats. what names the argument in error messages. */
static size_t get_f32(mp_obj_t obj, mp_buffer_info_t *bi, mp_uint_t flags, const char *what) {
    #if !MICROPY_ENABLE_DYNRUNTIME && MICROPY_PY_ARRAY
    /* array('f'), the common case on every step: its fields directly, as objarray.c's
     * own buffer function would give them (an array is always writable) */
    if (mp_obj_is_type(obj, &mp_type_array)) {
        mp_obj_array_t *a = MP_OBJ_TO_PTR(obj);
        if (a->typecode == 'f') {
            bi->buf = a->items;
            bi->len = a->len * sizeof(float);
            bi->typecode = 'f';
            return a->len;
        }
    }
    #endif
    /* a str lends its UTF-8 bytes as a buffer, but is never float32 data */
    if (mp_obj_is_str(obj) || !mp_get_buffer(obj, bi, flags)) {
        mt_msg_t m;
        m.len = 0;
        msg_str(&m, what);
        msg_str(&m, (flags & MP_BUFFER_WRITE) ?
            " must be a writable float32 buffer: array('f') or bytearray" :
            " must be a float32 buffer: array('f'), bytes or bytearray");
        msg_raise(&mp_type_TypeError, &m);
    }
    if (bi->typecode == 'f') {
        return bi->len / sizeof(float);
    }
    if (bi->typecode == 'B' || bi->typecode == BYTEARRAY_TYPECODE) {
        if (bi->len % sizeof(float) != 0) {
            mt_msg_t m;
            m.len = 0;
            msg_str(&m, what);
            msg_str(&m, " has ");
            msg_uint(&m, (uint32_t)bi->len);
            msg_str(&m, " bytes, not a whole number of float32 values");
            msg_raise(&mp_type_ValueError, &m);
        }
        return bi->len / sizeof(float);
    }
    mt_msg_t m;
    m.len = 0;
    msg_str(&m, what);
    msg_str(&m, " must hold float32: array('f'), bytes or bytearray, not an array of typecode ");
    msg_typecode(&m, bi->typecode);
    msg_raise(&mp_type_TypeError, &m);
}

static inline bool is_aligned(const void *p) {
    return ((uintptr_t)p & (sizeof(float) - 1)) == 0;
}

/* Staging area for buffers the core cannot use in place: n_in floats for x, then
 * room for the target or the output. Allocated once, on first need. */
static float *get_scratch(mt_trainer_obj_t *self) {
    if (self->scratch == NULL) {
        uint32_t n_tail = self->n_out > self->n_target ? self->n_out : self->n_target;
        self->scratch = m_new(float, self->n_in + n_tail);
    }
    return self->scratch;
}

static int file_read_at(mt_trainer_obj_t *self, uint32_t off, void *dst, uint32_t n);

/* o's stream protocol if it is a binary stream one can read (an open file), else NULL */
static const mp_stream_p_t *binary_stream(mp_obj_t o) {
    if (mp_obj_is_str(o) || !mp_obj_is_obj(o)) {
        return NULL;
    }
    const mp_stream_p_t *s = MP_OBJ_TYPE_GET_SLOT_OR_NULL(mp_obj_get_type(o), protocol);
    return s != NULL && s->read != NULL && !s->is_text ? s : NULL;
}

/* x read from an open file (the stream protocol, binary): its next sample, input_len values of the
 * plan's input dtype, straight into the arena's input tensor, where the core takes it (no heap). */
static const void *x_from_file(mt_trainer_obj_t *self, mp_obj_t file, const mp_stream_p_t *s) {
    uint8_t *in = mt_input_buffer(&self->ctx);
    if (in == NULL) {
        mp_raise_TypeError(MP_ERROR_TEXT("x must be a buffer: this plan reads its input in place"));
    }
    uint32_t want = self->n_in * (self->ctx.input_dtype == MT_DTYPE_F32 ? 4u : 1u), have = 0;
    int err = 0;
    while (have < want) {
        mp_uint_t got = s->read(file, in + have, want - have, &err);
        if (got == MP_STREAM_ERROR || got == 0) {
            mt_msg_t m;
            m.len = 0;
            msg_str(&m, "x: the file gave ");
            msg_uint(&m, have);
            msg_str(&m, " bytes of a sample of ");
            msg_uint(&m, want);
            msg_raise(&mp_type_ValueError, &m);
        }
        have += (uint32_t)got;
    }
    return in;
}

/* x as the core takes it: for a float plan an aligned float pointer with exactly
 * n_in floats; for an int8-input plan n_in bytes (array('b'), array('B'), bytes,
 * bytearray: int8 or uint8 as the plan says), read in place at any alignment; or an
 * open file, whose next sample is read into the arena (x_from_file). */
static const void *get_x(mt_trainer_obj_t *self, mp_obj_t x_in) {
    mp_buffer_info_t bi;
    const mp_stream_p_t *stream = binary_stream(x_in);
    if (stream != NULL && !mp_get_buffer(x_in, &bi, MP_BUFFER_READ)) {
        return x_from_file(self, x_in, stream);
    }
    if (self->ctx.input_dtype != MT_DTYPE_F32) {
        if (mp_obj_is_str(x_in) || !mp_get_buffer(x_in, &bi, MP_BUFFER_READ)
            || (bi.typecode != 'b' && bi.typecode != 'B' && bi.typecode != BYTEARRAY_TYPECODE)) {
            mp_raise_TypeError(self->ctx.input_dtype == MT_DTYPE_U8
                ? MP_ERROR_TEXT("x must be a buffer of uint8 pixels: bytes, bytearray or array('B') (the plan takes uint8 input)")
                : MP_ERROR_TEXT("x must be a buffer of int8 values: array('b'), bytes or bytearray (the plan takes int8 input)"));
        }
        if (bi.len != self->n_in) {
            mt_msg_t m;
            m.len = 0;
            msg_str(&m, "x has ");
            msg_uint(&m, (uint32_t)bi.len);
            msg_str(&m, " bytes, the plan's input needs ");
            msg_uint(&m, self->n_in);
            msg_raise(&mp_type_ValueError, &m);
        }
        return bi.buf;
    }
    size_t n = get_f32(x_in, &bi, MP_BUFFER_READ, "x");
    if (n != self->n_in) {
        raise_len("x", n, "input", self->n_in);
    }
    if (is_aligned(bi.buf)) {
        return bi.buf;
    }
    float *s = get_scratch(self);
    memcpy(s, bi.buf, n * sizeof(float));
    return s;
}

/* A new array of n elements of typecode with a copy of the bytes at src (or
 * zeros if src is NULL); *items gets the array's storage. */
static mp_obj_t new_array(char typecode, size_t elem_size, const void *src, size_t n, void **items) {
    size_t nbytes = n * elem_size;
    #if MICROPY_ENABLE_DYNRUNTIME
    /* array(typecode, bytearray) copies the raw bytes in. */
    uint8_t *tmp = m_new(uint8_t, nbytes > 0 ? nbytes : 1);
    if (src != NULL) {
        memcpy(tmp, src, nbytes);
    } else {
        memset(tmp, 0, nbytes);
    }
    mp_obj_t array_mod = mp_import_name(MP_QSTR_array, mp_const_none, MP_OBJ_NEW_SMALL_INT(0));
    mp_obj_t args[2] = {
        mp_obj_new_str(&typecode, 1),
        mp_obj_new_bytearray_by_ref(nbytes, tmp),
    };
    mp_obj_t arr = mp_call_function_n_kw(mp_load_attr(array_mod, MP_QSTR_array), 2, 0, args);
    mp_buffer_info_t bi;
    mp_get_buffer_raise(arr, &bi, MP_BUFFER_WRITE);
    *items = bi.buf;
    return arr;
    #else
    /* Same as objarray.c's array_new, with the public struct from py/objarray.h. */
    mp_obj_array_t *o = mp_obj_malloc(mp_obj_array_t, &mp_type_array);
    o->typecode = typecode;
    o->free = 0;
    o->len = n;
    o->items = m_new(uint8_t, nbytes);
    if (src != NULL) {
        memcpy(o->items, src, nbytes);
    } else if (nbytes > 0) {
        memset(o->items, 0, nbytes);
    }
    *items = o->items;
    return MP_OBJ_FROM_PTR(o);
    #endif
}

static mp_obj_t new_uint(uint64_t v) {
    if (v <= 0xFFFFFFFFu) {
        return mp_obj_new_int_from_uint((mp_uint_t)(uint32_t)v);
    }
    #if !MICROPY_ENABLE_DYNRUNTIME && MICROPY_LONGINT_IMPL != MICROPY_LONGINT_IMPL_NONE
    return mp_obj_new_int_from_ull(v);
    #else
    return mp_obj_new_float_from_d((double)v);
    #endif
}

/* ---- Trainer -------------------------------------------------------------- */

/* ---- a plan read from its file (mt_read_fn) ------------------------------ */

/* n bytes at offset off of the plan's file into dst, through the stream protocol: seek, then read
 * until n bytes are in (0), or a failure, end of file included (1). Allocates nothing. */
static int file_read_at(mt_trainer_obj_t *self, uint32_t off, void *dst, uint32_t n) {
    struct mp_stream_seek_t seek;
    int err = 0;
    seek.offset = (mp_off_t)off;
    seek.whence = MP_SEEK_SET;
    if (self->stream->ioctl(self->file, MP_STREAM_SEEK, (uintptr_t)&seek, &err) == MP_STREAM_ERROR
        || seek.offset != (mp_off_t)off) {
        return 1;
    }
    uint8_t *p = (uint8_t *)dst;
    while (n > 0) {
        mp_uint_t got = self->stream->read(self->file, p, n, &err);
        if (got == MP_STREAM_ERROR || got == 0 || got > n) {
            return 1;
        }
        p += got;
        n -= (uint32_t)got;
    }
    return 0;
}

static int trainer_read(void *user, uint32_t off, void *dst, uint32_t n) {
    return file_read_at((mt_trainer_obj_t *)user, off, dst, n);
}

static MP_NORETURN void raise_file(const char *what) {
    mt_msg_t m;
    m.len = 0;
    msg_str(&m, "microtrain: ");
    msg_str(&m, what);
    msg_raise(&mp_type_ValueError, &m);
}

/* Load the plan from self->file by its head: the header first (on the stack), then the head (the
 * plan itself where it has no stream section) into one heap block, a piece at a time. */
static int load_from_file(mt_trainer_obj_t *self) {
    mt_ctx_t *ctx = &self->ctx;
    uint32_t header[(MT_HEADER_BYTES + 3) / 4];
    if (file_read_at(self, 0, header, MT_HEADER_BYTES) != 0) {
        /* shorter than a header, or not readable: let the core say which of its checks fails */
        memset(header, 0, sizeof header);
        mp_uint_t got = 0;
        int err = 0;
        struct mp_stream_seek_t seek = {0, MP_SEEK_SET};
        if (self->stream->ioctl(self->file, MP_STREAM_SEEK, (uintptr_t)&seek, &err) != MP_STREAM_ERROR) {
            got = self->stream->read(self->file, header, MT_HEADER_BYTES, &err);
        }
        if (got == MP_STREAM_ERROR) {
            raise_file("cannot read the plan's file");
        }
        return mt_load(ctx, header, got);
    }
    uint32_t head = mt_head_bytes(header, MT_HEADER_BYTES);
    if (head == 0) {   /* not a plan of this format: the core names what is wrong */
        return mt_load(ctx, header, MT_HEADER_BYTES);
    }
    self->plan_copy = mt_malloc_maybe(head);
    if (self->plan_copy == NULL) {
        mt_msg_t m;
        m.len = 0;
        msg_str(&m, "microtrain: the plan's head needs ");
        msg_uint(&m, head);
        msg_str(&m, " bytes of RAM in one block; free memory (gc.collect())");
        msg_raise(MT_MEMORY_ERROR, &m);
    }
    for (uint32_t at = 0; at < head; at += 512) {
        if (file_read_at(self, at, self->plan_copy + at, head - at < 512 ? head - at : 512) != 0) {
            raise_file("the plan's file ends before the size its header gives");
        }
    }
    return mt_load_head(ctx, self->plan_copy, head, trainer_read, self);
}

/* Trainer(plan): load and validate a plan, allocate and attach its RAM. plan: a buffer (bytes,
 * bytearray, memoryview, a ROMFS file: read in place), a path, or an open file (binary). */
static mp_obj_t trainer_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw, const mp_obj_t *args) {
    mp_arg_check_num(n_args, n_kw, 1, 1, false);
    mp_buffer_info_t bi;
    mp_obj_t file = mp_const_none;
    if (mp_obj_is_str(args[0])) {
        mp_obj_t open_args[2] = {args[0], mp_obj_new_str("rb", 2)};
        file = mp_call_function_n_kw(mp_load_global(MP_QSTR_open), 2, 0, open_args);
    } else if (!mp_get_buffer(args[0], &bi, MP_BUFFER_READ)) {
        if (binary_stream(args[0]) == NULL) {
            mp_raise_TypeError(MP_ERROR_TEXT("plan must be bytes, bytearray, memoryview, a path or a file opened 'rb' (a .mtp plan)"));
        }
        file = args[0];
    }
    /* a path to a file that has the buffer protocol (ROMFS): in place, as the file itself */
    if (file != mp_const_none && mp_get_buffer(file, &bi, MP_BUFFER_READ)) {
        file = mp_const_none;
    }

    mt_trainer_obj_t *self = mp_obj_malloc(mt_trainer_obj_t, type);
    self->plan_obj = file != mp_const_none ? file : args[0];
    self->plan_buf = file != mp_const_none ? NULL : bi.buf;
    self->plan_len = file != mp_const_none ? 0 : bi.len;
    mp_buffer_info_t wi;
    self->plan_writable = file == mp_const_none && mp_get_buffer(args[0], &wi, MP_BUFFER_WRITE);
    self->plan_copy = NULL;
    self->file = file;
    self->stream = NULL;
    self->ram = NULL;
    self->scratch = NULL;
    mt_ctx_t *ctx = &self->ctx;
    memset(ctx, 0, sizeof(*ctx));
    ctx->err_op = -1;
    ctx->err_tensor = -1;

    int rc = MT_E_ALIGN;
    if (file != mp_const_none) {
        self->stream = mp_get_stream_raise(file, MP_STREAM_OP_READ | MP_STREAM_OP_IOCTL);
        rc = load_from_file(self);
        if (rc != MT_OK) {
            mt_raise(ctx, rc);
        }
    } else if (is_aligned(bi.buf)) {   /* read the plan in place if the core accepts its alignment, else copy it */
        rc = mt_load(ctx, bi.buf, bi.len);
    }
    if (rc == MT_E_ALIGN) {
        self->plan_copy = m_new(uint8_t, bi.len > 0 ? bi.len : 1);
        memcpy(self->plan_copy, bi.buf, bi.len);
        self->plan_obj = mp_const_none;
        self->plan_writable = false;
        ctx->err_op = -1;
        ctx->err_tensor = -1;
        rc = mt_load(ctx, self->plan_copy, bi.len);
    }
    mt_check(ctx, rc);
    /* the context runs in place from the plan only where nobody can write the plan: bytes, a
     * read-only memoryview (ROMFS, flash); a bytearray's is decoded into RAM */
    if (self->plan_writable) {
        mt_check(ctx, mt_context_in_ram(ctx));
    }

    /* Everything the run needs, in one block allocated once: state, arena, and the runtime context
     * unless it is read in place from the plan. */
    uint32_t ram_bytes = mt_ram_bytes(ctx);
    self->ram = mt_malloc_maybe(ram_bytes > 0 ? ram_bytes : 1);
    if (self->ram == NULL) {
        mt_msg_t m;
        m.len = 0;
        msg_str(&m, "microtrain: the plan needs ");
        msg_uint(&m, ram_bytes);
        msg_str(&m, " bytes of RAM in one block (arena ");
        msg_uint(&m, ctx->arena_bytes);
        msg_str(&m, ", parameters and optimizer state ");
        msg_uint(&m, ctx->state_bytes);
        msg_str(&m, ", context ");
        msg_uint(&m, ram_bytes - ctx->arena_bytes - ctx->state_bytes);
        msg_str(&m, "); free memory (gc.collect()) or train fewer layers");
        msg_raise(MT_MEMORY_ERROR, &m);
    }
    mt_check(ctx, mt_attach(ctx, self->ram, ram_bytes));

    self->n_in = mt_input_len(ctx);
    self->n_out = mt_output_len(ctx);
    self->n_target = mt_target_len(ctx);
    return MP_OBJ_FROM_PTR(self);
}

/* The core reads the plan's constants, initial values and names in place, and its op records
 * where the plan carries them and cannot be written (else they were decoded into RAM when the
 * Trainer was made). A caller may have
 * resized or replaced a writable plan buffer since: then its bytes are not where
 * they were, and using them would read freed memory. Every call that reaches the
 * plan checks first. */
static mt_ctx_t *get_ctx(mt_trainer_obj_t *self) {
    if (self->plan_writable) {   /* (a plan read from its file: its head is the Trainer's own copy) */
        mp_buffer_info_t bi;
        if (!mp_get_buffer(self->plan_obj, &bi, MP_BUFFER_READ) || bi.buf != self->plan_buf
            || bi.len != self->plan_len) {
            /* one literal: CircuitPython's message extraction does not join adjacent ones */
            mp_raise_ValueError(MP_ERROR_TEXT("microtrain: the plan buffer was resized or moved after Trainer() read it; keep it unchanged while the Trainer is used, or make a new Trainer"));
        }
    }
    return &self->ctx;
}

/* step(x, y[, loss_out]): one training sample. Returns the loss, or writes it to
 * loss_out[0] and returns None (that path allocates nothing). */
static mp_obj_t trainer_step(size_t n_args, const mp_obj_t *args) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(args[0]);
    mt_ctx_t *ctx = get_ctx(self);
    mp_obj_t y_in = args[2];

    /* Check every argument before training so a bad one changes nothing. */
    mp_buffer_info_t loss_bi;
    bool have_loss_out = n_args > 3 && args[3] != mp_const_none;
    if (have_loss_out && get_f32(args[3], &loss_bi, MP_BUFFER_WRITE, "loss_out") < 1) {
        mp_raise_ValueError(MP_ERROR_TEXT("loss_out must hold at least 1 float"));
    }

    const void *x = get_x(self, args[1]);
    float loss = 0.0f;
    int rc;
    if (ctx->loss_kind == MT_LOSS_CROSS_ENTROPY) {
        if (!mp_obj_is_int(y_in)) {
            mp_raise_TypeError(MP_ERROR_TEXT("y must be an int class label (the plan's loss is cross-entropy)"));
        }
        mp_int_t label = mp_obj_get_int(y_in);
        if ((mp_uint_t)label > 0x7FFFFFFFu) {
            label = -1; /* negative or beyond int32: the core reports it as out of range */
        }
        rc = mt_step_label(ctx, x, self->n_in, (int32_t)label, &loss);
    } else {
        mp_buffer_info_t y_bi;
        float y_scalar;
        const float *y;
        size_t n_y;
        if (self->n_target == 1 && !mp_get_buffer(y_in, &y_bi, MP_BUFFER_READ)) {
            /* one target: a plain number is fine */
            y_scalar = mp_obj_get_float_to_f(y_in);
            y = &y_scalar;
            n_y = 1;
        } else {
            n_y = get_f32(y_in, &y_bi, MP_BUFFER_READ, "y");
            if (n_y != self->n_target) {
                raise_len("y", n_y, "target", self->n_target);
            }
            if (is_aligned(y_bi.buf)) {
                y = (const float *)y_bi.buf;
            } else {
                float *s = get_scratch(self) + self->n_in;
                memcpy(s, y_bi.buf, n_y * sizeof(float));
                y = s;
            }
        }
        rc = mt_step_target(ctx, x, self->n_in, y, n_y, &loss);
    }
    mt_check(ctx, rc);

    if (have_loss_out) {
        memcpy(loss_bi.buf, &loss, sizeof(float));
        return mp_const_none;
    }
    return mp_obj_new_float_from_f(loss);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(trainer_step_obj, 3, 4, trainer_step);

/* predict(x[, out]): forward pass only. Writes output_len floats into out and
 * returns None (allocates nothing); without out, returns a new array('f'). */
static mp_obj_t trainer_predict(size_t n_args, const mp_obj_t *args) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(args[0]);
    mt_ctx_t *ctx = get_ctx(self);
    mp_obj_t ret = mp_const_none;
    float *out;
    void *user_out = NULL;

    if (n_args > 2 && args[2] != mp_const_none) {
        mp_buffer_info_t bi;
        size_t n = get_f32(args[2], &bi, MP_BUFFER_WRITE, "out");
        if (n < self->n_out) {
            raise_len("out", n, "output", self->n_out);
        }
        if (is_aligned(bi.buf)) {
            out = (float *)bi.buf;
        } else {
            user_out = bi.buf;
            out = get_scratch(self) + self->n_in;
        }
    } else {
        void *items;
        ret = new_array('f', sizeof(float), NULL, self->n_out, &items);
        out = (float *)items;
    }

    const void *x = get_x(self, args[1]);
    mt_check(ctx, mt_predict(ctx, x, self->n_in, out, self->n_out));
    if (user_out != NULL) {
        memcpy(user_out, out, self->n_out * sizeof(float));
    }
    return ret;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(trainer_predict_obj, 2, 3, trainer_predict);

/* The name of parameter k as a str ("param_<k>" when the plan has none). */
static mp_obj_t param_name(const mt_tensor_info_t *ti, uint32_t k) {
    if (ti->name_len > 0) {
        return mp_obj_new_str(ti->name, ti->name_len);
    }
    mt_msg_t m;
    m.len = 0;
    msg_str(&m, "param_");
    msg_uint(&m, k);
    return mp_obj_new_str(m.buf, m.len);
}

/* params(): {name: array('f')} copies of every trainable parameter (an int8 trained
 * weight as its float values, code * scale). */
static mp_obj_t trainer_params(mp_obj_t self_in) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    mt_ctx_t *ctx = get_ctx(self);
    uint32_t n = mt_param_count(ctx);
    mp_obj_t dict = mp_obj_new_dict(n);
    for (uint32_t k = 0; k < n; k++) {
        mt_tensor_info_t ti;
        mt_check(ctx, mt_param_info(ctx, k, &ti));
        void *items;
        mp_obj_t value = new_array('f', sizeof(float), NULL, ti.n, &items);
        mt_check(ctx, mt_get_param(ctx, k, (float *)items, ti.n));
        mp_obj_dict_store(dict, param_name(&ti, k), value);
    }
    return dict;
}
static MP_DEFINE_CONST_FUN_OBJ_1(trainer_params_obj, trainer_params);

/* set_params({name: float32 buffer}): overwrite some or all trainable
 * parameters. Every name, length and value is checked before any is written. */
static mp_obj_t trainer_set_params(mp_obj_t self_in, mp_obj_t values) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    mt_ctx_t *ctx = get_ctx(self);
    /* the keys as a list: list(values) works for any mapping, in both builds */
    mp_obj_t keys = mp_call_function_n_kw(mp_load_global(MP_QSTR_list), 1, 0, &values);
    size_t n_keys = mp_obj_get_int(mp_obj_len(keys));
    for (int pass = 0; pass < 2; pass++) {   /* 0: check everything, 1: write */
        for (size_t i = 0; i < n_keys; i++) {
            mp_obj_t key = mp_obj_subscr(keys, MP_OBJ_NEW_SMALL_INT(i), MP_OBJ_SENTINEL);
            if (!mp_obj_is_str(key)) {
                mp_raise_TypeError(MP_ERROR_TEXT("set_params takes {parameter name (str): float32 buffer}"));
            }
            size_t key_len;
            const char *key_s = mp_obj_str_get_data(key, &key_len);
            uint32_t k, n_params = mt_param_count(ctx);
            mt_tensor_info_t ti;
            for (k = 0; k < n_params; k++) {
                mt_check(ctx, mt_param_info(ctx, k, &ti));
                if (ti.name_len == key_len && memcmp(ti.name, key_s, key_len) == 0) {
                    break;
                }
            }
            mt_msg_t m;
            m.len = 0;
            if (k == n_params) {
                msg_str(&m, "microtrain: no trainable parameter named '");
                msg_bytes(&m, key_s, key_len);
                msg_str(&m, "' (params() lists them)");
                msg_raise(&mp_type_ValueError, &m);
            }
            mp_buffer_info_t bi;
            msg_bytes(&m, key_s, key_len);
            m.buf[m.len < sizeof(m.buf) ? m.len : sizeof(m.buf) - 1] = '\0';
            size_t n = get_f32(mp_obj_subscr(values, key, MP_OBJ_SENTINEL), &bi, MP_BUFFER_READ, m.buf);
            if (n != ti.n) {
                raise_len(m.buf, n, "parameter", ti.n);
            }
            mt_check(ctx, pass == 0 ? mt_check_param(ctx, k, (const float *)bi.buf, n)
                                    : mt_set_param(ctx, k, (const float *)bi.buf, n));
        }
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(trainer_set_params_obj, trainer_set_params);

/* n bytes from p written to an open binary file through the stream protocol, a short write carried on;
 * a write error raises OSError, a file that takes nothing more ValueError. Allocates nothing. */
static void write_all(mp_obj_t file, const mp_stream_p_t *s, const uint8_t *p, size_t n) {
    while (n > 0) {
        int err = 0;
        mp_uint_t put = s->write(file, p, n, &err);
        if (put == MP_STREAM_ERROR) {
            mp_raise_OSError(err);
        }
        if (put == 0 || put > n) {
            raise_file("save_state(f): the file took no more bytes");
        }
        p += put;
        n -= put;
    }
}

/* save_state([buf or f]): the training state as bytes, or written into buf (at least
 * state_len bytes), or to an open binary file f (state_len bytes from where it stands: the
 * header, the state where it lies in RAM, its CRC); with buf or f, returns None and allocates
 * nothing. */
static mp_obj_t trainer_save_state(size_t n_args, const mp_obj_t *args) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(args[0]);
    mt_ctx_t *ctx = get_ctx(self);
    uint32_t n = mt_state_size(ctx);
    if (n_args > 1 && args[1] != mp_const_none) {
        mp_buffer_info_t bi;
        const mp_stream_p_t *s = mp_obj_is_str(args[1]) || !mp_obj_is_obj(args[1]) ? NULL
            : MP_OBJ_TYPE_GET_SLOT_OR_NULL(mp_obj_get_type(args[1]), protocol);
        if (s != NULL && s->write != NULL && !s->is_text && !mp_get_buffer(args[1], &bi, MP_BUFFER_WRITE)) {
            uint8_t head[MT_STATE_HEADER_BYTES], tail[4];
            const uint8_t *state;
            uint32_t crc;
            mt_check(ctx, mt_state_parts(ctx, head, &state, &crc));
            for (int b = 0; b < 4; b++) {
                tail[b] = (uint8_t)(crc >> (8 * b));
            }
            write_all(args[1], s, head, sizeof head);
            write_all(args[1], s, state, n - sizeof head - sizeof tail);
            write_all(args[1], s, tail, sizeof tail);
            return mp_const_none;
        }
        if (mp_obj_is_str(args[1]) || !mp_get_buffer(args[1], &bi, MP_BUFFER_WRITE)) {
            mp_raise_TypeError(MP_ERROR_TEXT("save_state(buf): buf must be a writable buffer such as a bytearray, or an open binary file"));
        }
        if (bi.len < n) {
            mt_msg_t m;
            m.len = 0;
            msg_str(&m, "buf has ");
            msg_uint(&m, (uint32_t)bi.len);
            msg_str(&m, " bytes, the state needs ");
            msg_uint(&m, n);
            msg_str(&m, " (state_len)");
            msg_raise(&mp_type_ValueError, &m);
        }
        mt_check(ctx, mt_save_state(ctx, bi.buf, n));
        return mp_const_none;
    }
    #if MICROPY_ENABLE_DYNRUNTIME
    uint8_t *tmp = m_new(uint8_t, n);
    mt_check(ctx, mt_save_state(ctx, tmp, n));
    mp_obj_t b = mp_obj_new_bytes(tmp, n);
    m_free(tmp);
    return b;
    #else
    vstr_t vstr;
    vstr_init_len(&vstr, n);
    mt_check(ctx, mt_save_state(ctx, vstr.buf, n));
    return mp_obj_new_bytes_from_vstr(&vstr);
    #endif
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(trainer_save_state_obj, 1, 2, trainer_save_state);

/* load_state(buf): resume from save_state()'s bytes. A blob of another plan, a
 * truncated or a corrupted one raises ValueError and changes nothing. */
static mp_obj_t trainer_load_state(mp_obj_t self_in, mp_obj_t blob) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    mt_ctx_t *ctx = get_ctx(self);
    mp_buffer_info_t bi;
    if (mp_obj_is_str(blob) || !mp_get_buffer(blob, &bi, MP_BUFFER_READ)) {
        mp_raise_TypeError(MP_ERROR_TEXT("load_state(buf): buf must be bytes, bytearray or memoryview"));
    }
    mt_check(ctx, mt_load_state(ctx, bi.buf, bi.len));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(trainer_load_state_obj, trainer_load_state);

/* info(): what the plan needs and what the run has done. */
static mp_obj_t trainer_info(mp_obj_t self_in) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    mt_info_t in;
    mt_check(&self->ctx, mt_info(&self->ctx, &in));
    mp_obj_t d = mp_obj_new_dict(25);
    /* qstrs spelled out in full: the native .mpy build finds them by name */
    #define MT_STORE(q, value) mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(q), (value))
    MT_STORE(MP_QSTR_arena_bytes, new_uint(in.arena_bytes));
    MT_STORE(MP_QSTR_naive_bytes, new_uint(in.naive_bytes));
    MT_STORE(MP_QSTR_param_bytes, new_uint(in.state_bytes));
    MT_STORE(MP_QSTR_context_bytes, new_uint(in.context_bytes));
    MT_STORE(MP_QSTR_context_in_plan, mp_obj_new_bool(in.context_in_plan));
    MT_STORE(MP_QSTR_const_bytes, new_uint(in.const_bytes));
    MT_STORE(MP_QSTR_macs_per_step, new_uint(in.macs));
    MT_STORE(MP_QSTR_ops, new_uint(in.n_ops));
    MT_STORE(MP_QSTR_tensors, new_uint(in.n_tensors));
    MT_STORE(MP_QSTR_ram_bytes, new_uint(in.ram_bytes));
    MT_STORE(MP_QSTR_plan_bytes, new_uint(in.plan_bytes));
    MT_STORE(MP_QSTR_batch, new_uint(in.batch));
    MT_STORE(MP_QSTR_lr, mp_obj_new_float_from_f(in.lr));
    MT_STORE(MP_QSTR_steps, new_uint(in.steps));
    MT_STORE(MP_QSTR_updates, new_uint(in.updates));
    MT_STORE(MP_QSTR_rejected, new_uint(in.rejected));
    MT_STORE(MP_QSTR_format_version, new_uint(in.format_version));
    MT_STORE(MP_QSTR_streamed, mp_obj_new_bool(in.streamed));
    MT_STORE(MP_QSTR_head_bytes, new_uint(in.head_bytes));
    MT_STORE(MP_QSTR_groups, new_uint(in.n_groups));
    MT_STORE(MP_QSTR_stream_bytes, new_uint(in.stream_bytes));
    MT_STORE(MP_QSTR_stream_reads, new_uint(in.stream_reads));
    MT_STORE(MP_QSTR_stream_read_bytes, new_uint(in.stream_read_bytes));
    const char *input = in.input_dtype == MT_DTYPE_I8 ? "int8" : in.input_dtype == MT_DTYPE_U8 ? "uint8" : "float32";
    MT_STORE(MP_QSTR_input_dtype, mp_obj_new_str(input, strlen(input)));
    const char *loss = in.loss_kind == MT_LOSS_CROSS_ENTROPY ? "cross-entropy"
        : in.loss_kind == MT_LOSS_MSE ? "mse" : NULL;
    MT_STORE(MP_QSTR_loss, loss != NULL ? mp_obj_new_str(loss, strlen(loss)) : mp_const_none);
    #undef MT_STORE
    return d;
}
static MP_DEFINE_CONST_FUN_OBJ_1(trainer_info_obj, trainer_info);

/* reset(): parameters back to the plan's initial values, counters to zero. */
static mp_obj_t trainer_reset(mp_obj_t self_in) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    mt_ctx_t *ctx = get_ctx(self);
    mt_check(ctx, mt_reset(ctx));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_1(trainer_reset_obj, trainer_reset);

/* Attributes: lr (read/write), input_len, output_len, target_len, state_len (read-only). */
static void trainer_attr(mp_obj_t self_in, qstr attr, mp_obj_t *dest) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    if (dest[0] == MP_OBJ_NULL) {
        /* load */
        if (attr == MP_QSTR_lr) {
            dest[0] = mp_obj_new_float_from_f(self->ctx.lr);
        } else if (attr == MP_QSTR_input_len) {
            dest[0] = mp_obj_new_int_from_uint(self->n_in);
        } else if (attr == MP_QSTR_output_len) {
            dest[0] = mp_obj_new_int_from_uint(self->n_out);
        } else if (attr == MP_QSTR_target_len) {
            dest[0] = mp_obj_new_int_from_uint(self->n_target);
        } else if (attr == MP_QSTR_state_len) {
            dest[0] = mp_obj_new_int_from_uint(mt_state_size(&self->ctx));
        } else {
            dest[1] = MP_OBJ_SENTINEL; /* continue lookup in locals_dict */
        }
    } else if (dest[1] != MP_OBJ_NULL && attr == MP_QSTR_lr) {
        /* store */
        mt_check(&self->ctx, mt_set_lr(&self->ctx, mp_obj_get_float_to_f(dest[1])));
        dest[0] = MP_OBJ_NULL; /* success */
    }
}

#if !MICROPY_ENABLE_DYNRUNTIME

static const mp_rom_map_elem_t trainer_locals_dict_table[] = {
    { MP_ROM_QSTR(MP_QSTR_step), MP_ROM_PTR(&trainer_step_obj) },
    { MP_ROM_QSTR(MP_QSTR_predict), MP_ROM_PTR(&trainer_predict_obj) },
    { MP_ROM_QSTR(MP_QSTR_params), MP_ROM_PTR(&trainer_params_obj) },
    { MP_ROM_QSTR(MP_QSTR_info), MP_ROM_PTR(&trainer_info_obj) },
    { MP_ROM_QSTR(MP_QSTR_reset), MP_ROM_PTR(&trainer_reset_obj) },
    { MP_ROM_QSTR(MP_QSTR_set_params), MP_ROM_PTR(&trainer_set_params_obj) },
    { MP_ROM_QSTR(MP_QSTR_save_state), MP_ROM_PTR(&trainer_save_state_obj) },
    { MP_ROM_QSTR(MP_QSTR_load_state), MP_ROM_PTR(&trainer_load_state_obj) },
};
static MP_DEFINE_CONST_DICT(trainer_locals_dict, trainer_locals_dict_table);

static MP_DEFINE_CONST_OBJ_TYPE(
    mt_type_trainer,
    MP_QSTR_Trainer,
    MP_TYPE_FLAG_NONE,
    make_new, trainer_make_new,
    attr, trainer_attr,
    locals_dict, &trainer_locals_dict
    );

static const mp_rom_map_elem_t microtrain_module_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR__microtrain) },
    { MP_ROM_QSTR(MP_QSTR_Trainer), MP_ROM_PTR(&mt_type_trainer) },
    { MP_ROM_QSTR(MP_QSTR_FORMAT_VERSION), MP_ROM_INT(MT_VERSION) },
};
static MP_DEFINE_CONST_DICT(microtrain_module_globals, microtrain_module_globals_table);

const mp_obj_module_t microtrain_user_cmodule = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&microtrain_module_globals,
};

/* `_microtrain`: the device package `microtrain` (python/microtrain/) re-exports it. */
MP_REGISTER_MODULE(MP_QSTR__microtrain, microtrain_user_cmodule);

#endif /* !MICROPY_ENABLE_DYNRUNTIME: the native .mpy's registration is in firmware/natmod/microtrain_natmod.c */

