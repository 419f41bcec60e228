/* microtrain as a native .mpy module (MicroPython's natmod build, firmware/natmod.mk):
 * the binding itself, modules/microtrain/modmicrotrain.c, included here as
 * MicroPython's examples/natmod/framebuf includes extmod/modframebuf.c, plus what
 * a native module needs on top: the C library functions it cannot link and the
 * registration of the Trainer type at import (mpy_init). The core's mt_*.c files
 * are compiled alongside (natmod.mk's SRC).
 */
#include "modmicrotrain.c"

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
mp_map_elem_t trainer_locals_dict_table[8];
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
    trainer_locals_dict_table[5] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_set_params), MP_OBJ_FROM_PTR(&trainer_set_params_obj) };
    trainer_locals_dict_table[6] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_save_state), MP_OBJ_FROM_PTR(&trainer_save_state_obj) };
    trainer_locals_dict_table[7] = (mp_map_elem_t) { MP_OBJ_NEW_QSTR(MP_QSTR_load_state), MP_OBJ_FROM_PTR(&trainer_load_state_obj) };
    MP_OBJ_TYPE_SET_SLOT(&mt_type_trainer, locals_dict, (void *)&trainer_locals_dict, 2);

    mp_store_global(MP_QSTR_Trainer, MP_OBJ_FROM_PTR(&mt_type_trainer));
    mp_store_global(MP_QSTR_FORMAT_VERSION, MP_OBJ_NEW_SMALL_INT(MT_VERSION));

    MP_DYNRUNTIME_INIT_EXIT
}
