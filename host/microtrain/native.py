"""The C core, loaded in CPython through cffi: one loaded plan with its RAM."""
from __future__ import annotations

import numpy as np

try:
    from ._native import ffi, lib
except ImportError as e:   # pragma: no cover - depends on the install
    raise ImportError("microtrain's C core is not built: run `make native` (or pip install ./host) first") from e

from . import format as F

LOSS_NAMES = {F.LOSSES["CROSS_ENTROPY"]: "cross-entropy", F.LOSSES["MSE"]: "mse"}
DTYPES = {F.dtype_code("F32"): np.float32, F.dtype_code("I32"): np.int32,
          F.dtype_code("I8"): np.int8, F.dtype_code("U8"): np.uint8}


class PlanError(ValueError):
    """A plan the C core refuses."""


def error_text(ctx, code):
    """The core's message for code, with where it happened (mt_error_text, as on the device)."""
    buf = ffi.new("char[]", 256)
    n = lib.mt_error_text(ctx if ctx is not None else ffi.NULL, code, buf, len(buf))
    return ffi.string(buf, n).decode()


class PlanFile:
    """The plan's file as the core reads it when it streams the plan (mt_load_head): bytes read
    at an offset, counted. A test may replace read_at to make the file change or fail."""

    def __init__(self, data):
        self.data = bytes(data)
        self.reads = 0

    def read_at(self, offset, n):
        self.reads += 1
        return self.data[offset:offset + n]


@ffi.def_extern()
def mt_host_read(user, offset, dst, n):
    """mt_read_fn: 0 when all n bytes were read (a short read or an exception fails the core's read)."""
    try:
        b = ffi.from_handle(user).read_at(offset, n)
    except Exception:   # the core reports MT_E_STREAM_READ
        return 1
    if b is None or len(b) != n:
        return 1
    ffi.memmove(dst, b, n)
    return 0


class Core:
    """mt_load + mt_attach over a private copy of the plan bytes.

    guard: bytes of 0xA5 kept on both sides of the RAM buffer, so a test can
    prove the core never writes outside it. context_in_ram: decode the runtime context into RAM
    even where the plan carries it (mt_context_in_ram), as the board's binding does for a plan in
    a writable buffer. stream: load the plan by its head (mt_load_head), as a board does a plan
    file it streams: only the bytes before the stream section are copied, the groups are read
    through stream (True: a PlanFile of data; or any object with read_at(offset, n)) as the
    ops need them."""

    def __init__(self, data: bytes, guard: int = 0, context_in_ram: bool = False, stream=None):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("plan must be bytes, not %s" % type(data).__name__)
        data = bytes(data)
        self.ctx = ffi.new("mt_ctx_t *")
        if stream:
            self.file = PlanFile(data) if stream is True else stream
            self._handle = ffi.new_handle(self.file)
            head = lib.mt_head_bytes(data, len(data)) or len(data)
            data = data[:head]
        self._plan = ffi.new("uint64_t[]", max(1, (len(data) + 7) // 8))   # 8-byte aligned copy
        ffi.memmove(self._plan, data, len(data))
        if stream:
            err = lib.mt_load_head(self.ctx, self._plan, len(data), lib.mt_host_read, self._handle)
        else:
            err = lib.mt_load(self.ctx, self._plan, len(data))
        if err:
            raise PlanError("invalid plan: " + error_text(self.ctx, err))
        if context_in_ram:
            self.check(lib.mt_context_in_ram(self.ctx))
        self.ram_bytes = lib.mt_ram_bytes(self.ctx)
        self.guard = guard
        n = (self.ram_bytes + 2 * guard + 7) // 8
        self._ram = ffi.new("uint64_t[]", max(1, n))
        self.raw = np.frombuffer(ffi.buffer(self._ram), dtype=np.uint8)
        self.raw[:] = 0xA5
        err = lib.mt_attach(self.ctx, ffi.cast("uint8_t *", self._ram) + guard, self.ram_bytes)
        if err:
            raise PlanError("cannot attach RAM: " + error_text(self.ctx, err))
        self.names = [self.tensor_info(i)[0] for i in range(self.ctx.n_tensors)]
        self.input_dtype = {F.dtype_code("F32"): "float32", F.dtype_code("I8"): "int8",
                            F.dtype_code("U8"): "uint8"}[lib.mt_input_dtype(self.ctx)]
        self.param_names = [self.param_info(k)[0] for k in range(lib.mt_param_count(self.ctx))]

    def check(self, err):
        if err:
            raise ValueError(error_text(self.ctx, err))

    @staticmethod
    def _described(ti):
        dims = tuple(ti.dim[k] for k in range(ti.ndim))
        return ffi.string(ti.name, ti.name_len).decode(errors="replace"), ti, dims

    def tensor_info(self, i):
        """(name, mt_tensor_info_t, shape) of tensor i."""
        ti = ffi.new("mt_tensor_info_t *")
        self.check(lib.mt_tensor_info(self.ctx, i, ti))
        return self._described(ti)

    def param_info(self, k):
        """(name, mt_tensor_info_t, shape) of trainable parameter k (plan order)."""
        ti = ffi.new("mt_tensor_info_t *")
        self.check(lib.mt_param_info(self.ctx, k, ti))
        return self._described(ti)

    @staticmethod
    def _view(ti, dims):
        return np.frombuffer(ffi.buffer(ti.data, ti.bytes), dtype=DTYPES[ti.dtype]).reshape(dims)

    def array(self, i):
        """A numpy view of tensor i's current memory."""
        name, ti, dims = self.tensor_info(i)
        if ti.data == ffi.NULL:
            raise ValueError("tensor %d %r has no memory now: the plan reads its input in place and none is set "
                             "(set_input)" % (i, name))
        return self._view(ti, dims)

    def ram_view(self):
        """The RAM the core may use, without the guards."""
        return self.raw[self.guard:self.guard + self.ram_bytes]

    @staticmethod
    def floats(x, n, what):
        a = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if a.size != n:
            raise ValueError("%s has %d elements; the plan needs %d" % (what, a.size, n))
        return a, ffi.cast("const float *", ffi.from_buffer(a))

    def sample(self, x):
        """x as the plan's input takes it: float32, or int8/uint8 values for an integer-input plan
        (integers of any dtype within range; a float array is refused, not rounded)."""
        n = lib.mt_input_len(self.ctx)
        if self.input_dtype == "float32":
            a, p = self.floats(x, n, "x")
            return a, ffi.cast("const float *", p)
        a = np.asarray(x)
        lo, hi = (-128, 127) if self.input_dtype == "int8" else (0, 255)
        if a.dtype.kind not in "iu":
            raise TypeError("x must hold %s values (the plan takes integer input), got dtype %s"
                            % (self.input_dtype, a.dtype))
        if a.size != n:
            raise ValueError("x has %d elements; the plan needs %d" % (a.size, n))
        if a.size and (a.min() < lo or a.max() > hi):
            raise ValueError("x holds values outside the %s range %d..%d" % (self.input_dtype, lo, hi))
        a = np.ascontiguousarray(a, dtype=self.input_dtype).reshape(-1)
        return a, ffi.cast("const void *", ffi.from_buffer(a))

    # ---- training ----
    def step_label(self, x, label):
        a, p = self.sample(x)
        loss = ffi.new("float *")
        self.check(lib.mt_step_label(self.ctx, p, a.size, int(label), loss))
        return float(loss[0])

    def step_target(self, x, target):
        a, p = self.sample(x)
        t, q = self.floats(target, lib.mt_target_len(self.ctx), "y")
        loss = ffi.new("float *")
        self.check(lib.mt_step_target(self.ctx, p, a.size, q, t.size, loss))
        return float(loss[0])

    def predict(self, x):
        a, p = self.sample(x)
        out = np.empty(lib.mt_output_len(self.ctx), np.float32)
        self.check(lib.mt_predict(self.ctx, p, a.size, ffi.cast("float *", ffi.from_buffer(out)), out.size))
        return out

    def set_input(self, x):
        a, p = self.sample(x)
        self.check(lib.mt_set_input(self.ctx, p, a.size))
        self._input = a   # a plan reading its input in place reads this array until the next set_input

    def run_op(self, i):
        self.check(lib.mt_run_op(self.ctx, i))

    def reset(self):
        self.check(lib.mt_reset(self.ctx))

    # ---- settings and facts ----
    @property
    def lr(self):
        return self.ctx.lr

    @lr.setter
    def lr(self, value):
        self.set_lr(value)

    def set_lr(self, value):
        self.check(lib.mt_set_lr(self.ctx, float(value)))

    @property
    def steps(self):
        return self.ctx.steps

    def info(self):
        """The device's Trainer.info(): byte counts (the runtime context included), counters, settings."""
        i = ffi.new("mt_info_t *")
        self.check(lib.mt_info(self.ctx, i))
        return dict(
            arena_bytes=i.arena_bytes, naive_bytes=i.naive_bytes, param_bytes=i.state_bytes,
            context_bytes=i.context_bytes, const_bytes=i.const_bytes, macs_per_step=i.macs, ops=i.n_ops,
            tensors=i.n_tensors, ram_bytes=i.ram_bytes, plan_bytes=i.plan_bytes, batch=i.batch, lr=i.lr,
            steps=i.steps, updates=i.updates, rejected=i.rejected, format_version=i.format_version,
            input_dtype=self.input_dtype, context_in_plan=bool(i.context_in_plan),
            loss=LOSS_NAMES.get(i.loss_kind), streamed=bool(i.streamed), head_bytes=i.head_bytes,
            stream_bytes=i.stream_bytes, groups=i.n_groups, stream_reads=i.stream_reads,
            stream_read_bytes=i.stream_read_bytes)

    def context_image(self):
        """The runtime context as attached (op records, then the parameter table): what a plan's
        context section holds (plan.with_context)."""
        return bytes(ffi.buffer(self.ctx.context, self.ctx.context_bytes))

    # ---- parameters ----
    def param_index(self, name):
        try:
            return self.param_names.index(name)
        except ValueError:
            raise KeyError("no trainable parameter named %r; the plan's are %s"
                           % (name, ", ".join(self.param_names))) from None

    def param(self, name):
        """A numpy view of a trainable parameter's current values (flat shape as in the plan)."""
        _, ti, dims = self.param_info(self.param_index(name))
        return self._view(ti, dims)

    def param_values(self, name):
        """A float32 copy of a trainable parameter's values (an int8 trained weight dequantized,
        code * its channel's scale: mt_get_param), flat shape as in the plan."""
        k = self.param_index(name)
        _, ti, dims = self.param_info(k)
        out = np.empty(ti.n, np.float32)
        self.check(lib.mt_get_param(self.ctx, k, ffi.cast("float *", ffi.from_buffer(out)), ti.n))
        return out.reshape(dims)

    def set_param(self, name, values):
        """Overwrite one trainable parameter (by name or index) with values of the same size."""
        self.set_params({name: values})

    def set_params(self, values):
        """{name or index: values}: every name, size and value is checked before any is written."""
        checked = []
        for name, v in values.items():
            k = name if isinstance(name, int) else self.param_index(name)
            pname, ti, dims = self.param_info(k)
            a = np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
            if a.size != ti.n:
                raise ValueError("%s has %d values; the parameter has %d (shape %s)" % (pname, a.size, ti.n, dims))
            p = ffi.cast("const float *", ffi.from_buffer(a))
            self.check(lib.mt_check_param(self.ctx, k, p, a.size))
            checked.append((k, a, p))
        for k, a, p in checked:
            self.check(lib.mt_set_param(self.ctx, k, p, a.size))

    # ---- checkpoints ----
    @property
    def state_len(self):
        return lib.mt_state_size(self.ctx)

    def save_state(self):
        """The training state (parameters, optimizer buffers, counters, lr) as a CRC-checked blob."""
        buf = ffi.new("uint8_t[]", self.state_len)
        self.check(lib.mt_save_state(self.ctx, buf, len(buf)))
        return bytes(ffi.buffer(buf))

    def load_state(self, blob):
        """Resume from save_state()'s blob; a blob of another plan, or a damaged one, changes nothing."""
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError("state must be bytes, not %s" % type(blob).__name__)
        blob = bytes(blob)
        self.check(lib.mt_load_state(self.ctx, blob, len(blob)))


def crc32(data: bytes) -> int:
    return lib.mt_crc32(data, len(data))
