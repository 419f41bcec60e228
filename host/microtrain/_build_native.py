"""cffi builder: compiles the device C core (modules/microtrain/mt_*.c) into a
CPython extension, microtrain._native, when the package is installed
(pip install -e host; `make native` reruns that after a C change). The host
never reimplements a kernel: it runs this exact C.
"""
import glob
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.normpath(os.path.join(HERE, "..", "..", "modules", "microtrain"))
# relative: setuptools refuses absolute source paths
SOURCES = sorted(os.path.relpath(p) for p in glob.glob(os.path.join(CORE, "mt_*.c")))

CDEF = """
typedef struct {
    uint32_t n_tensors, n_ops, ops_bytes, data_bytes, names_bytes, n_train_ops;
    uint32_t arena_bytes, state_bytes, naive_bytes, const_bytes;
    uint64_t macs;
    uint16_t input, target, output, batch;
    uint8_t loss_kind;
    float lr, momentum, weight_decay;
    uint8_t *ram;
    uint32_t steps, updates;
    float loss;
    int32_t err_op, err_tensor;
    ...;
} mt_ctx_t;
typedef struct {
    const char *name;
    void *data;
    uint32_t bytes, n;
    uint32_t dim[4];
    uint8_t ndim, dtype, storage, flags;
} mt_tensor_info_t;
int mt_load(mt_ctx_t *ctx, const void *plan, size_t plan_bytes);
uint32_t mt_ram_bytes(const mt_ctx_t *ctx);
int mt_attach(mt_ctx_t *ctx, void *ram, size_t ram_bytes);
int mt_reset(mt_ctx_t *ctx);
int mt_step_label(mt_ctx_t *ctx, const float *x, size_t n_x, int32_t label, float *loss);
int mt_step_target(mt_ctx_t *ctx, const float *x, size_t n_x, const float *target, size_t n_target, float *loss);
int mt_predict(mt_ctx_t *ctx, const float *x, size_t n_x, float *out, size_t n_out);
uint32_t mt_input_len(const mt_ctx_t *ctx);
uint32_t mt_output_len(const mt_ctx_t *ctx);
uint32_t mt_target_len(const mt_ctx_t *ctx);
int mt_set_input(mt_ctx_t *ctx, const float *x, size_t n_x);
int mt_run_op(mt_ctx_t *ctx, uint32_t index);
int mt_tensor_info(const mt_ctx_t *ctx, uint32_t index, mt_tensor_info_t *info);
const char *mt_strerror(int code);
uint32_t mt_crc32(const uint8_t *p, size_t n);
float mt_expf(float x);
float mt_logf(float x);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "microtrain._native",
    '#include "mt.h"',
    sources=SOURCES,
    include_dirs=[CORE],
    extra_compile_args=["-std=c99", "-O2"],
)
