"""The C core, loaded in CPython through cffi: one loaded plan with its RAM."""
from __future__ import annotations

import numpy as np

try:
    from ._native import ffi, lib
except ImportError as e:   # pragma: no cover - depends on the install
    raise ImportError("microtrain's C core is not built: run `make native` (or pip install ./host) first") from e

from . import format as F


class PlanError(ValueError):
    """A plan the C core refuses."""


def error_text(ctx, code, names=None):
    msg = ffi.string(lib.mt_strerror(code)).decode()
    where = []
    if ctx is not None and ctx.err_op >= 0:
        where.append("op %d" % ctx.err_op)
    if ctx is not None and ctx.err_tensor >= 0:
        t = ctx.err_tensor
        where.append("tensor %d%s" % (t, " '%s'" % names[t] if names and t < len(names) else ""))
    return msg + (" (%s)" % ", ".join(where) if where else "")


class Core:
    """mt_load + mt_attach over a private copy of the plan bytes.

    guard: bytes of 0xA5 kept on both sides of the RAM buffer, so a test can
    prove the core never writes outside it."""

    def __init__(self, data: bytes, guard: int = 0):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("plan must be bytes, not %s" % type(data).__name__)
        data = bytes(data)
        self._plan = ffi.new("uint64_t[]", max(1, (len(data) + 7) // 8))   # 8-byte aligned copy
        ffi.memmove(self._plan, data, len(data))
        self.ctx = ffi.new("mt_ctx_t *")
        err = lib.mt_load(self.ctx, self._plan, len(data))
        if err:
            raise PlanError("invalid plan: " + error_text(self.ctx, err))
        self.ram_bytes = lib.mt_ram_bytes(self.ctx)
        self.guard = guard
        n = (self.ram_bytes + 2 * guard + 7) // 8
        self._ram = ffi.new("uint64_t[]", max(1, n))
        self.raw = np.frombuffer(ffi.buffer(self._ram), dtype=np.uint8)
        self.raw[:] = 0xA5
        err = lib.mt_attach(self.ctx, ffi.cast("uint8_t *", self._ram) + guard, self.ram_bytes)
        if err:
            raise PlanError("cannot attach RAM: " + error_text(self.ctx, err))
        self.names = [self.info(i)[0] for i in range(self.ctx.n_tensors)]

    def check(self, err):
        if err:
            raise ValueError(error_text(self.ctx, err, self.names))

    def info(self, i):
        ti = ffi.new("mt_tensor_info_t *")
        self.check(lib.mt_tensor_info(self.ctx, i, ti))
        dims = tuple(ti.dim[k] for k in range(ti.ndim))
        return ffi.string(ti.name).decode(), ti, dims

    def array(self, i):
        """A numpy view of tensor i's current memory."""
        name, ti, dims = self.info(i)
        dtype = {F.dtype_code("F32"): np.float32, F.dtype_code("I32"): np.int32,
                 F.dtype_code("I8"): np.int8, F.dtype_code("U8"): np.uint8}[ti.dtype]
        buf = ffi.buffer(ti.data, ti.bytes)
        return np.frombuffer(buf, dtype=dtype).reshape(dims)

    def ram_view(self):
        """The RAM the core may use, without the guards."""
        return self.raw[self.guard:self.guard + self.ram_bytes]

    @staticmethod
    def floats(x, n, what):
        a = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if a.size != n:
            raise ValueError("%s has %d elements; the plan needs %d" % (what, a.size, n))
        return a, ffi.cast("const float *", ffi.from_buffer(a))

    def step_label(self, x, label):
        a, p = self.floats(x, lib.mt_input_len(self.ctx), "x")
        loss = ffi.new("float *")
        self.check(lib.mt_step_label(self.ctx, p, a.size, int(label), loss))
        return float(loss[0])

    def step_target(self, x, target):
        a, p = self.floats(x, lib.mt_input_len(self.ctx), "x")
        t, q = self.floats(target, lib.mt_target_len(self.ctx), "y")
        loss = ffi.new("float *")
        self.check(lib.mt_step_target(self.ctx, p, a.size, q, t.size, loss))
        return float(loss[0])

    def predict(self, x):
        a, p = self.floats(x, lib.mt_input_len(self.ctx), "x")
        out = np.empty(lib.mt_output_len(self.ctx), np.float32)
        self.check(lib.mt_predict(self.ctx, p, a.size, ffi.cast("float *", ffi.from_buffer(out)), out.size))
        return out

    def set_input(self, x):
        a, p = self.floats(x, lib.mt_input_len(self.ctx), "x")
        self.check(lib.mt_set_input(self.ctx, p, a.size))

    def run_op(self, i):
        self.check(lib.mt_run_op(self.ctx, i))

    def reset(self):
        self.check(lib.mt_reset(self.ctx))


def crc32(data: bytes) -> int:
    return lib.mt_crc32(data, len(data))
