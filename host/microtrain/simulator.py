"""Simulator: a plan running on the host in the device's own C core (via cffi)."""
from __future__ import annotations

import sys

import numpy as np

from . import format as F
from .native import Core
from .plan import Plan


class TrainingDiverged(ValueError):
    """The loss stopped being finite: the parameters are as they were before that step."""

    def __init__(self, epoch, sample, k, lr, detail, fix="lower the learning rate (lr=%g)"):
        self.epoch, self.sample, self.k, self.lr, self.detail = epoch, sample, k, lr, detail
        super().__init__("training diverged at epoch %d, sample %d (step %d of the epoch): the loss is not finite "
                         "[%s], so that step changed nothing; %s" % (epoch, sample, k, detail, fix % lr))


class Simulator:
    def __init__(self, plan, guard=0):
        if isinstance(plan, (bytes, bytearray, memoryview)):
            plan = Plan(bytes(plan))
        if not isinstance(plan, Plan):
            raise TypeError("Simulator needs a Plan (from microtrain.compile or load_plan), not %s"
                            % type(plan).__name__)
        self.plan = plan
        self.core = Core(plan.data, guard=guard)
        self.input_shape = tuple(plan.meta["input"]["shape"][1:])
        self.output_shape = tuple(plan.meta["output"]["shape"][1:])
        self.n_in = int(np.prod(self.input_shape))
        self.input_dtype = self.core.input_dtype   # float32, or int8/uint8: the plan takes integers
        self.param_shapes = {k: tuple(v) for k, v in plan.meta.get("param_shapes", {}).items()}

    # ---- training ----
    def _sample(self, x):
        x = np.asarray(x)
        if x.dtype.kind not in "fiu":
            raise TypeError("x must be numeric, got dtype %s" % x.dtype)
        if x.size != self.n_in:
            raise ValueError("x has %d elements (shape %s); the model input takes %d (shape %s)"
                             % (x.size, x.shape, self.n_in, self.input_shape))
        return x if self.input_dtype != "float32" else x.astype(np.float32, copy=False)

    def step(self, x, y):
        """One training sample; returns the loss before the update."""
        x = self._sample(x)
        if self.plan.loss == "cross-entropy":
            y = np.asarray(y)
            if y.size != 1 or y.dtype.kind not in "iu":
                raise TypeError("cross-entropy needs an integer class label, got %r" % (y,))
            return self.core.step_label(x, int(y.reshape(())))
        return self.core.step_target(x, np.asarray(y, np.float32))

    def predict(self, x):
        """Model outputs (logits: a dropped output softmax is not applied).
        x: one sample (input shape) or a batch (N, *input shape)."""
        x = np.asarray(x) if self.input_dtype != "float32" else np.asarray(x, dtype=np.float32)
        if x.shape == self.input_shape:
            return self.core.predict(self._sample(x)).reshape(self.output_shape)
        if x.shape[1:] != self.input_shape:
            raise ValueError("x has shape %s; expected %s or (N,) + %s" % (x.shape, self.input_shape, self.input_shape))
        return np.stack([self.core.predict(s) for s in x]).reshape((len(x),) + self.output_shape)

    def quantize_input(self, x):
        """Float samples as an integer-input plan takes them: round(x / scale) + zero_point (ties to even,
        as ONNX QuantizeLinear), saturated; the plan's input quantization is in its meta."""
        inp = self.plan.meta["input"]
        if self.input_dtype == "float32":
            return np.asarray(x, np.float32)
        lo, hi = (-128, 127) if self.input_dtype == "int8" else (0, 255)
        q = np.rint(np.asarray(x, np.float32) / np.float32(inp["scale"])) + inp["zero_point"]
        return np.clip(q, lo, hi).astype(self.input_dtype)

    def reset(self):
        """Parameters back to the plan's initial values, optimizer state cleared."""
        self.core.reset()

    # ---- inspection ----
    def _read(self, param, tensor):
        """A copy of tensor `tensor` (a parameter's value or its optimizer state), in the parameter's ONNX shape."""
        return self.core.array(tensor).copy().reshape(self.param_shapes.get(param, self.plan.tensors[tensor]["shape"]))

    def params(self):
        """Trainable parameters now, by ONNX initializer name, in ONNX shapes."""
        return {t["name"]: self.core.param_values(t["name"]).reshape(self.param_shapes.get(t["name"], t["shape"]))
                for t in self.plan.tensors if t["flags"] & F.TFLAGS["PARAM"]}

    def set_params(self, params):
        """Load trainable parameters ({name: array}, as params() returns them or as
        `simulate --save-params` writes them; any subset). Every name, shape and value is
        checked before any parameter changes. Optimizer state is left as it is."""
        if not hasattr(params, "items"):
            raise TypeError("set_params needs a dict {name: array} (or an npz file's contents), not %s"
                            % type(params).__name__)
        known = {t["name"]: i for i, t in enumerate(self.plan.tensors) if t["flags"] & F.TFLAGS["PARAM"]}
        checked = []
        for name, v in params.items():
            if name not in known:
                raise ValueError("%r is not a trainable parameter of this plan; its parameters are %s"
                                 % (name, ", ".join(known)))
            t = self.plan.tensors[known[name]]
            shape = self.param_shapes.get(name, t["shape"])
            v = np.asarray(v)
            if v.dtype.kind not in "fiu" or v.shape not in (tuple(shape), tuple(t["shape"])):
                raise ValueError("parameter %r: got shape %s (%s), the plan's is %s" % (name, v.shape, v.dtype,
                                                                                       tuple(shape)))
            v = v.astype(np.float32).reshape(t["shape"])
            if not np.all(np.isfinite(v)):
                raise ValueError("parameter %r contains NaN or infinity" % name)
            checked.append((known[name], v))
        self.core.set_params({self.plan.tensors[i]["name"]: v for i, v in checked})

    def export(self, onnx_in, onnx_out=None):
        """The ONNX model the plan was compiled from, with the parameters trained here in place
        (see Plan.export); written to onnx_out if given, and returned as a ModelProto."""
        return self.plan.export(self.params(), onnx_in, onnx_out)

    def grads(self):
        """The sum of the per-sample gradients seen so far in the current batch
        (the update at the batch's end applies their mean). Only when batch > 1:
        with batch 1 each gradient is fused into its update and never stored."""
        if self.plan.header["batch"] == 1:
            raise ValueError("with batch 1 gradients are applied as they are computed and never stored; "
                             "compile with batch > 1 to read them")
        return {p: self._read(p, s["accumulator"]) for p, s in self.plan.meta["optimizer"].items()
                if s["accumulator"] is not None}

    def tensor(self, name):
        """The current contents of any plan tensor (arena tensors are shared with
        others whose lifetimes do not overlap, unless compiled with planner='naive')."""
        return self.core.array(self.plan.tensor_index(name)).copy()

    @property
    def steps(self):
        return self.core.ctx.steps

    @property
    def lr(self):
        return self.core.ctx.lr

    @lr.setter
    def lr(self, value):
        value = float(value)
        if not np.isfinite(value) or value < 0:
            raise ValueError("lr must be a finite number >= 0, got %r" % value)
        self.core.ctx.lr = value

    # ---- data sets ----
    def check_data(self, x, y, names=("x", "y")):
        """(x, y) as float32 samples of the input shape and labels (cross-entropy) or targets (mse),
        checked whole before any is used: each problem raises ValueError naming the array, the
        sample, the value and what to do."""
        xn, yn = names
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind not in "fiub" or x.ndim == 0:
            raise ValueError("%s must be an array of numbers with samples first, got %s of dtype %s"
                             % (xn, "a scalar" if x.ndim == 0 else "shape %s" % (x.shape,), x.dtype))
        if len(x) == 0:
            raise ValueError("%s has no samples (shape %s)" % (xn, x.shape))
        if x[0].size != self.n_in:
            raise ValueError("%s has shape %s: samples of %d values, but the model input takes %d (shape %s)"
                             % (xn, x.shape, x[0].size, self.n_in, self.input_shape))
        if self.input_dtype != "float32":   # integers as the board passes them
            if x.dtype.kind not in "iu":
                raise ValueError("%s must hold %s values: the plan takes %s input (Simulator.quantize_input converts "
                                 "float samples)" % (xn, self.input_dtype, self.input_dtype))
            x = x.reshape((len(x),) + self.input_shape)
        else:
            x = x.astype(np.float32).reshape((len(x),) + self.input_shape)
        bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(1))
        if bad.size:
            raise ValueError("%s[%d] contains NaN or infinity (%d sample%s in all)" % (xn, bad[0], bad.size,
                                                                                     "" if bad.size == 1 else "s"))
        if y.ndim == 0 or len(y) != len(x):
            raise ValueError("%s has %d samples but %s has %s" % (xn, len(x), yn, "a scalar" if y.ndim == 0 else
                                                                   "%d" % len(y)))
        n_out = int(np.prod(self.output_shape))
        if self.plan.loss == "cross-entropy":
            if y.ndim == 2 and y.shape[1] == n_out and n_out > 1 and np.isin(y, (0, 1)).all():
                raise ValueError("%s holds one-hot rows (shape %s); cross-entropy takes one class label per sample: "
                                 "use %s.argmax(1)" % (yn, y.shape, yn))
            if y.ndim > 1 and y[0].size != 1:
                raise ValueError("%s has shape %s; cross-entropy takes one integer class label per sample (0 to %d)"
                                 % (yn, y.shape, n_out - 1))
            y = y.reshape(len(y))
            if y.dtype.kind not in "iub":
                frac = np.flatnonzero(~np.isfinite(y) | (y != np.round(y))) if y.dtype.kind == "f" else [0]
                if len(frac) or y.dtype.kind != "f":
                    i = frac[0]
                    raise ValueError("%s[%d] = %s is not a class label; a cross-entropy plan takes integer labels "
                                     "0 to %d. To fit real-valued targets, compile with --loss mse"
                                     % (yn, i, "%g" % y[i] if y.dtype.kind == "f" else repr(y[i]), n_out - 1))
            y = y.astype(np.int64)
            out = np.flatnonzero((y < 0) | (y >= n_out))
            if out.size:
                raise ValueError("%s[%d] = %d is not a class of this model: labels go from 0 to %d (%d sample%s "
                                 "outside)" % (yn, out[0], y[out[0]], n_out - 1, out.size, "" if out.size == 1 else "s"))
            return x, y
        if y.dtype.kind not in "fiub":
            raise ValueError("%s must hold numbers (mse targets), got dtype %s" % (yn, y.dtype))
        if y[0].size != n_out:
            raise ValueError("%s has shape %s: %d target value%s per sample, but the model output has %d (shape %s); "
                             "mse targets have the output's shape" % (yn, y.shape, y[0].size,
                                                                      "" if y[0].size == 1 else "s", n_out,
                                                                      self.output_shape))
        y = y.astype(np.float32).reshape((len(y),) + self.output_shape)
        bad = np.flatnonzero(~np.isfinite(y.reshape(len(y), -1)).all(1))
        if bad.size:
            raise ValueError("%s[%d] contains NaN or infinity" % (yn, bad[0]))
        return x, y

    # ---- loops ----
    def evaluate(self, x, y):
        """Accuracy (cross-entropy) or mean squared error (mse) over a data set."""
        x, y = self.check_data(x, y)
        out = self.predict(x)
        if self.plan.loss == "cross-entropy":
            return float(np.mean(out.reshape(len(out), -1).argmax(1) == y))
        return float(np.mean((out.reshape(len(out), -1) - y.reshape(len(out), -1)) ** 2))

    def fit(self, x, y, epochs=1, shuffle=True, seed=0, progress=None, on_epoch=None):
        """Train over (x, y) for some epochs; returns the mean loss of each epoch. progress: show a
        progress bar (tqdm) on stderr; default: when stderr is a terminal. on_epoch(epoch,
        mean_loss) is called after each epoch. A step whose loss is not finite raises
        TrainingDiverged naming the epoch and the sample; the parameters stay as before it."""
        x, y = self.check_data(x, y)
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
            raise ValueError("epochs must be a whole number >= 1, got %r" % (epochs,))
        if progress is None:
            progress = sys.stderr.isatty()
        rng = np.random.default_rng(seed)
        history = []
        for e in range(epochs):
            order = rng.permutation(len(x)) if shuffle else np.arange(len(x))
            total = 0.0
            bar = _progress(len(order), "epoch %d/%d" % (e + 1, epochs)) if progress else None
            try:
                for k, i in enumerate(order):
                    try:
                        total += self.step(x[i], y[i])
                    except ValueError as err:
                        if "loss is not finite" not in str(err):
                            raise
                        raise TrainingDiverged(e + 1, int(i), k + 1, self.lr, str(err)) from None
                    if bar is not None:
                        bar.update(1)
                        if k % 50 == 0 or k == len(order) - 1:
                            bar.set_postfix(loss="%.4f" % (total / (k + 1)))
            finally:
                if bar is not None:
                    bar.close()
            history.append(total / len(x))
            if on_epoch:
                on_epoch(e + 1, history[-1])
        return history


def _progress(n, desc):
    from tqdm import tqdm
    return tqdm(total=n, desc=desc, unit="sample", leave=True, file=sys.stderr)
