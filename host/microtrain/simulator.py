"""Simulator: a plan running on the host in the device's own C core (via cffi)."""
from __future__ import annotations

import sys
import time

import numpy as np

from . import format as F
from .native import Core
from .plan import Plan


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
        self.param_shapes = {k: tuple(v) for k, v in plan.meta.get("param_shapes", {}).items()}

    # ---- training ----
    def _sample(self, x):
        x = np.asarray(x)
        if x.dtype.kind not in "fiu":
            raise TypeError("x must be numeric, got dtype %s" % x.dtype)
        if x.size != self.n_in:
            raise ValueError("x has %d elements (shape %s); the model input takes %d (shape %s)"
                             % (x.size, x.shape, self.n_in, self.input_shape))
        return x.astype(np.float32, copy=False)

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
        x = np.asarray(x, dtype=np.float32)
        if x.shape == self.input_shape:
            return self.core.predict(self._sample(x)).reshape(self.output_shape)
        if x.shape[1:] != self.input_shape:
            raise ValueError("x has shape %s; expected %s or (N,) + %s" % (x.shape, self.input_shape, self.input_shape))
        return np.stack([self.core.predict(s) for s in x]).reshape((len(x),) + self.output_shape)

    def reset(self):
        """Parameters back to the plan's initial values, optimizer state cleared."""
        self.core.reset()

    # ---- inspection ----
    def _state(self, flag):
        out = {}
        for i, t in enumerate(self.plan.tensors):
            if t["flags"] & F.TFLAGS[flag]:
                name = t["name"]
                if flag != "PARAM":
                    name = name[name.index("(") + 1:-1]
                out[name] = self.core.array(i).copy().reshape(self.param_shapes.get(name, t["shape"]))
        return out

    def params(self):
        """Trainable parameters now, by ONNX initializer name, in ONNX shapes."""
        return self._state("PARAM")

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
            if v.dtype.kind not in "fiu" or v.size != int(np.prod(t["shape"])):
                raise ValueError("parameter %r: got shape %s (%s), the plan's is %s" % (name, v.shape, v.dtype,
                                                                                       tuple(shape)))
            v = v.astype(np.float32).reshape(t["shape"])
            if not np.all(np.isfinite(v)):
                raise ValueError("parameter %r contains NaN or infinity" % name)
            checked.append((known[name], v))
        for i, v in checked:   # the tensor's own memory in the core's RAM
            self.core.array(i)[...] = v

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
        return self._state("GRAD_ACC")

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

    # ---- loops ----
    def evaluate(self, x, y):
        """Accuracy (cross-entropy) or mean squared error (mse) over a data set."""
        out = self.predict(np.asarray(x, np.float32))
        if self.plan.loss == "cross-entropy":
            return float(np.mean(out.reshape(len(out), -1).argmax(1) == np.asarray(y).reshape(-1)))
        return float(np.mean((out.reshape(len(out), -1) - np.asarray(y, np.float32).reshape(len(out), -1)) ** 2))

    def fit(self, x, y, epochs=1, shuffle=True, seed=0, progress=None, on_epoch=None):
        """Train over (x, y) for some epochs; returns the mean loss of each epoch.
        progress: a file to draw a progress bar on (default: stderr if it is a
        terminal). on_epoch(epoch, mean_loss) is called after each epoch."""
        x = np.asarray(x, np.float32)
        y = np.asarray(y)
        if len(x) != len(y):
            raise ValueError("x has %d samples but y has %d" % (len(x), len(y)))
        if len(x) == 0:
            raise ValueError("no samples to train on")
        if progress is None and sys.stderr.isatty():
            progress = sys.stderr
        rng = np.random.default_rng(seed)
        history = []
        for e in range(epochs):
            order = rng.permutation(len(x)) if shuffle else np.arange(len(x))
            total, t0 = 0.0, time.monotonic()
            for k, i in enumerate(order):
                total += self.step(x[i], y[i])
                if progress and (k % 50 == 0 or k == len(order) - 1):
                    _bar(progress, e + 1, epochs, k + 1, len(order), total / (k + 1), time.monotonic() - t0)
            history.append(total / len(x))
            if progress:
                progress.write("\n")
            if on_epoch:
                on_epoch(e + 1, history[-1])
        return history


def _bar(f, epoch, epochs, done, n, loss, elapsed):
    width = 30
    filled = int(width * done / n)
    f.write("\repoch %d/%d [%s%s] %d/%d loss %.4f %.1fs" % (epoch, epochs, "#" * filled, "." * (width - filled),
                                                          done, n, loss, elapsed))
    f.flush()
