/* microtrain: MicroPython binding for the microtrain core (mt.h).
 *
 *     import microtrain
 *     from array import array
 *     t = microtrain.Trainer(open("model.mtp", "rb").read())
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
 * Memory: the Trainer keeps a reference to the plan object and the core reads the
 * plan in place (like framebuf keeps its buffer), so do not resize or modify a
 * bytearray plan while its Trainer is alive. A plan that is not 4-byte aligned is
 * copied once. The RAM the core needs (mt_ram_bytes) is allocated once, in the
 * constructor; step() with loss_out and predict() with out allocate nothing as long
 * as x, y and out are 4-byte aligned (array('f') always is; an unaligned buffer is
 * staged through a scratch area that is allocated on first use).
 *
 * Float buffers are float32 in native byte order: array('f'), or bytes/bytearray
 * (or a memoryview of them) whose length is a multiple of 4.
 *
 * Built into firmware as a user C module (micropython.mk / micropython.cmake), or,
 * with MICROPY_ENABLE_DYNRUNTIME defined by MicroPython's natmod build, as a
 * native .mpy: everything below uses only functions that py/dynruntime.h provides;
 * the two builds differ only in the sections marked MICROPY_ENABLE_DYNRUNTIME.
 */

#include <string.h>

#if MICROPY_ENABLE_DYNRUNTIME
#include "py/dynruntime.h"
#else
#include "py/runtime.h"
#include "py/binary.h"
#include "py/objarray.h"
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
    uint8_t *plan_copy;     /* aligned copy of the plan when the caller's was not aligned */
    uint8_t *ram;           /* mt_ram_bytes() bytes: state region, then arena */
    float *scratch;         /* staging for unaligned buffers, allocated on first use */
    uint32_t n_in, n_out, n_target;
    mt_ctx_t ctx;
} mt_trainer_obj_t;

/* ---- messages -------------------------------------------------------------
 * Exception text is assembled here rather than with mp_raise_msg_varg because
 * a native .mpy has no printf-style raise; the result is the same. */

typedef struct {
    size_t len;
    char buf[128];
} mt_msg_t;

static void msg_str(mt_msg_t *m, const char *s) {
    while (*s != '\0' && m->len < sizeof(m->buf)) {
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

/* Raise ValueError("microtrain: <what the core said> (op N, tensor M 'name')"),
 * the same text as the host's microtrain.native. Tensor names are looked up
 * only once the plan is loaded and attached (named). */
static MP_NORETURN void mt_raise_at(const mt_ctx_t *ctx, int code, bool named) {
    mt_msg_t m;
    m.len = 0;
    msg_str(&m, "microtrain: ");
    msg_str(&m, mt_strerror(code));
    bool have_op = ctx != NULL && ctx->err_op >= 0;
    bool have_tensor = ctx != NULL && ctx->err_tensor >= 0;
    if (have_op || have_tensor) {
        msg_str(&m, " (");
        if (have_op) {
            msg_str(&m, "op ");
            msg_uint(&m, (uint32_t)ctx->err_op);
        }
        if (have_tensor) {
            msg_str(&m, have_op ? ", tensor " : "tensor ");
            msg_uint(&m, (uint32_t)ctx->err_tensor);
            mt_tensor_info_t ti;
            if (named && mt_tensor_info(ctx, (uint32_t)ctx->err_tensor, &ti) == MT_OK
                && ti.name != NULL && ti.name[0] != '\0') {
                msg_str(&m, " '");
                msg_str(&m, ti.name);
                msg_str(&m, "'");
            }
        }
        msg_str(&m, ")");
    }
    msg_raise(&mp_type_ValueError, &m);
}

/* For a loaded and attached Trainer. */
static inline void mt_check(const mt_ctx_t *ctx, int code) {
    if (code != MT_OK) {
        mt_raise_at(ctx, code, true);
    }
}

/* While loading: no tensor names yet. */
static inline void mt_check_load(const mt_ctx_t *ctx, int code) {
    if (code != MT_OK) {
        mt_raise_at(ctx, code, false);
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

/* x as an aligned float pointer with exactly n_in floats. */
static const float *get_x(mt_trainer_obj_t *self, mp_obj_t x_in) {
    mp_buffer_info_t bi;
    size_t n = get_f32(x_in, &bi, MP_BUFFER_READ, "x");
    if (n != self->n_in) {
        raise_len("x", n, "input", self->n_in);
    }
    if (is_aligned(bi.buf)) {
        return (const float *)bi.buf;
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

/* Trainer(plan): load and validate a plan, allocate and attach its RAM. */
static mp_obj_t trainer_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw, const mp_obj_t *args) {
    mp_arg_check_num(n_args, n_kw, 1, 1, false);
    mp_buffer_info_t bi;
    if (mp_obj_is_str(args[0]) || !mp_get_buffer(args[0], &bi, MP_BUFFER_READ)) {
        mp_raise_TypeError(MP_ERROR_TEXT("plan must be bytes, bytearray or memoryview (a .mtp file's contents)"));
    }

    mt_trainer_obj_t *self = mp_obj_malloc(mt_trainer_obj_t, type);
    self->plan_obj = args[0];
    self->plan_copy = NULL;
    self->ram = NULL;
    self->scratch = NULL;
    mt_ctx_t *ctx = &self->ctx;
    memset(ctx, 0, sizeof(*ctx));
    ctx->err_op = -1;
    ctx->err_tensor = -1;

    /* Read the plan in place if the core accepts its alignment, else copy it. */
    int rc = MT_E_ALIGN;
    if (is_aligned(bi.buf)) {
        rc = mt_load(ctx, bi.buf, bi.len);
    }
    if (rc == MT_E_ALIGN) {
        self->plan_copy = m_new(uint8_t, bi.len > 0 ? bi.len : 1);
        memcpy(self->plan_copy, bi.buf, bi.len);
        self->plan_obj = mp_const_none;
        ctx->err_op = -1;
        ctx->err_tensor = -1;
        rc = mt_load(ctx, self->plan_copy, bi.len);
    }
    mt_check_load(ctx, rc);

    uint32_t ram_bytes = mt_ram_bytes(ctx);
    self->ram = m_new(uint8_t, ram_bytes > 0 ? ram_bytes : 1);
    mt_check_load(ctx, mt_attach(ctx, self->ram, ram_bytes));

    self->n_in = mt_input_len(ctx);
    self->n_out = mt_output_len(ctx);
    self->n_target = mt_target_len(ctx);
    return MP_OBJ_FROM_PTR(self);
}

/* step(x, y[, loss_out]): one training sample. Returns the loss, or writes it to
 * loss_out[0] and returns None (that path allocates nothing). */
static mp_obj_t trainer_step(size_t n_args, const mp_obj_t *args) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(args[0]);
    mt_ctx_t *ctx = &self->ctx;
    mp_obj_t y_in = args[2];

    /* Check every argument before training so a bad one changes nothing. */
    mp_buffer_info_t loss_bi;
    bool have_loss_out = n_args > 3 && args[3] != mp_const_none;
    if (have_loss_out && get_f32(args[3], &loss_bi, MP_BUFFER_WRITE, "loss_out") < 1) {
        mp_raise_ValueError(MP_ERROR_TEXT("loss_out must hold at least 1 float"));
    }

    const float *x = get_x(self, args[1]);
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
    mt_ctx_t *ctx = &self->ctx;
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

    const float *x = get_x(self, args[1]);
    mt_check(ctx, mt_predict(ctx, x, self->n_in, out, self->n_out));
    if (user_out != NULL) {
        memcpy(user_out, out, self->n_out * sizeof(float));
    }
    return ret;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(trainer_predict_obj, 2, 3, trainer_predict);

/* params(): {name: array} copies of every trainable parameter. */
static mp_obj_t trainer_params(mp_obj_t self_in) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    mt_ctx_t *ctx = &self->ctx;
    mp_obj_t dict = mp_obj_new_dict(0);
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        mt_tensor_info_t ti;
        mt_check(ctx, mt_tensor_info(ctx, i, &ti));
        if (!(ti.flags & MT_TFLAG_PARAM)) {
            continue;
        }
        char typecode;
        size_t size;
        switch (ti.dtype) {
            case MT_DTYPE_F32:
                typecode = 'f';
                size = 4;
                break;
            case MT_DTYPE_I32:
                typecode = sizeof(int) == 4 ? 'i' : 'l';
                size = 4;
                break;
            case MT_DTYPE_I8:
                typecode = 'b';
                size = 1;
                break;
            default:
                typecode = 'B';
                size = 1;
                break;
        }
        mp_obj_t key;
        if (ti.name != NULL && ti.name[0] != '\0') {
            key = mp_obj_new_str(ti.name, strlen(ti.name));
        } else {
            mt_msg_t m;
            m.len = 0;
            msg_str(&m, "tensor_");
            msg_uint(&m, i);
            key = mp_obj_new_str(m.buf, m.len);
        }
        size_t n = ti.bytes / size;
        void *items;
        mp_obj_t value = new_array(typecode, size, ti.data, ti.data != NULL ? n : 0, &items);
        mp_obj_dict_store(dict, key, value);
    }
    return dict;
}
static MP_DEFINE_CONST_FUN_OBJ_1(trainer_params_obj, trainer_params);

/* info(): what the plan needs and what the run has done. */
static mp_obj_t trainer_info(mp_obj_t self_in) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    const mt_ctx_t *ctx = &self->ctx;
    mp_obj_t d = mp_obj_new_dict(14);
    /* qstrs spelled out in full: the native .mpy build finds them by name */
    #define MT_STORE(q, value) mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(q), (value))
    MT_STORE(MP_QSTR_arena_bytes, new_uint(ctx->arena_bytes));
    MT_STORE(MP_QSTR_naive_bytes, new_uint(ctx->naive_bytes));
    MT_STORE(MP_QSTR_param_bytes, new_uint(ctx->state_bytes));
    MT_STORE(MP_QSTR_const_bytes, new_uint(ctx->const_bytes));
    MT_STORE(MP_QSTR_macs_per_step, new_uint(ctx->macs));
    MT_STORE(MP_QSTR_ops, new_uint(ctx->n_ops));
    MT_STORE(MP_QSTR_tensors, new_uint(ctx->n_tensors));
    MT_STORE(MP_QSTR_ram_bytes, new_uint(mt_ram_bytes(ctx)));
    MT_STORE(MP_QSTR_plan_bytes, new_uint(ctx->plan_bytes));
    MT_STORE(MP_QSTR_batch, new_uint(ctx->batch));
    MT_STORE(MP_QSTR_lr, mp_obj_new_float_from_f(ctx->lr));
    MT_STORE(MP_QSTR_steps, new_uint(ctx->steps));
    MT_STORE(MP_QSTR_updates, new_uint(ctx->updates));
    const char *loss = ctx->loss_kind == MT_LOSS_CROSS_ENTROPY ? "cross-entropy"
        : ctx->loss_kind == MT_LOSS_MSE ? "mse" : NULL;
    MT_STORE(MP_QSTR_loss, loss != NULL ? mp_obj_new_str(loss, strlen(loss)) : mp_const_none);
    #undef MT_STORE
    return d;
}
static MP_DEFINE_CONST_FUN_OBJ_1(trainer_info_obj, trainer_info);

/* reset(): parameters back to the plan's initial values, counters to zero. */
static mp_obj_t trainer_reset(mp_obj_t self_in) {
    mt_trainer_obj_t *self = MP_OBJ_TO_PTR(self_in);
    mt_check(&self->ctx, mt_reset(&self->ctx));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_1(trainer_reset_obj, trainer_reset);

/* Attributes: lr (read/write), input_len, output_len, target_len (read-only). */
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
        } else {
            dest[1] = MP_OBJ_SENTINEL; /* continue lookup in locals_dict */
        }
    } else if (dest[1] != MP_OBJ_NULL && attr == MP_QSTR_lr) {
        /* store */
        float lr = mp_obj_get_float_to_f(dest[1]);
        if (!(lr - lr == 0.0f) || lr < 0.0f) {
            mp_raise_ValueError(MP_ERROR_TEXT("lr must be a finite number >= 0"));
        }
        self->ctx.lr = lr;
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

#else /* MICROPY_ENABLE_DYNRUNTIME: native .mpy, see examples/natmod */

/* The C library functions the binding and the core use; a native module links
 * no libc. (The core needs no libm: it has its own exp and log.) */
#if !defined(__linux__)
void *memcpy(void *dst, const void *src, size_t n) {
    return mp_fun_table.memmove_(dst, src, n);
}
void *memset(void *s, int c, size_t n) {
    return mp_fun_table.memset_(s, c, n);
}
#endif
/* gcc would turn these loops back into calls to themselves. */
#if defined(__GNUC__) && !defined(__clang__)
#define MT_NO_LIBCALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define MT_NO_LIBCALLS
#endif
MT_NO_LIBCALLS int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *p = a, *q = b;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != q[i]) {
            return p[i] < q[i] ? -1 : 1;
        }
    }
    return 0;
}
MT_NO_LIBCALLS size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n] != '\0') {
        n++;
    }
    return n;
}

mp_obj_full_type_t mt_type_trainer;
mp_map_elem_t trainer_locals_dict_table[5];
static MP_DEFINE_CONST_DICT(trainer_locals_dict, trainer_locals_dict_table);

mp_obj_t mpy_init(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args) {
    MP_DYNRUNTIME_INIT_ENTRY

    mt_type_trainer.base.type = (void *)&mp_type_type;
    mt_type_trainer.flags = MP_TYPE_FLAG_NONE;
    mt_type_trainer.name = MP_QSTR_Trainer;
    MP_OBJ_TYPE_SET_SLOT(&mt_type_trainer, make_new, trainer_make_new, 0);
    MP_OBJ_TYPE_SET_SLOT(&mt_type_trainer, attr, trainer_attr, 1);
    trainer_locals_dict_table[0] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_step), MP_OBJ_FROM_PTR(&trainer_step_obj) };
    trainer_locals_dict_table[1] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_predict), MP_OBJ_FROM_PTR(&trainer_predict_obj) };
    trainer_locals_dict_table[2] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_params), MP_OBJ_FROM_PTR(&trainer_params_obj) };
    trainer_locals_dict_table[3] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_info), MP_OBJ_FROM_PTR(&trainer_info_obj) };
    trainer_locals_dict_table[4] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_reset), MP_OBJ_FROM_PTR(&trainer_reset_obj) };
    MP_OBJ_TYPE_SET_SLOT(&mt_type_trainer, locals_dict, (void *)&trainer_locals_dict, 2);

    mp_store_global(MP_QSTR_Trainer, MP_OBJ_FROM_PTR(&mt_type_trainer));
    mp_store_global(MP_QSTR_FORMAT_VERSION, MP_OBJ_NEW_SMALL_INT(MT_VERSION));

    MP_DYNRUNTIME_INIT_EXIT
}

#endif /* MICROPY_ENABLE_DYNRUNTIME */
