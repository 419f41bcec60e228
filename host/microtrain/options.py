"""compile()'s options: one frozen dataclass, every field checked when it is made."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

LOSSES = ("cross-entropy", "mse")
PLANNERS = ("search", "greedy", "naive")
QUANTIZE = (None, "int8")
SAVED = ("float32", "int8", "bits")
INPUT_DTYPES = {"float32": "F32", "int8": "I8", "uint8": "U8"}
FROZEN_WEIGHTS = ("float32", "int8")
TRAINED_WEIGHTS = ("float32", "int8")
FLT32_MIN_NORMAL = 2.0 ** -126   # the smallest normal float32


def _positive_float(name, v, allow_zero=True):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError("%s must be a number, got %r" % (name, v)) from None
    if not math.isfinite(f) or f < 0 or (f == 0 and not allow_zero):
        raise ValueError("%s must be a finite number %s 0, got %r" % (name, ">=" if allow_zero else ">", v))
    return f


def _set(options, name, value):
    object.__setattr__(options, name, value)     # a frozen dataclass normalising its own field


@dataclass(frozen=True, eq=False)
class CompileOptions:
    """What microtrain.compile does with a model, each field checked when the options are made
    (a ValueError or TypeError naming the field), so that the Python API, the CLI and the budget
    search get the same defaults and errors from one place.

    update: "last-layer", "bias", "last:K", "full", "none" (an inference-only plan), a JSON file
    or a list of initializer names, or a MIT sparse-update scheme (a JSON file holding one
    scheme, or a *.schemes.json file with scheme=NAME; a dict also works): weights may then train
    on some of their channels only (docs/sparse.md). loss: "cross-entropy" (softmax fused) or "mse".
    batch: samples per update (1 updates after every sample). planner:
    "search" (the default) shares arena memory between tensors whose lifetimes do not
    overlap and runs element-wise ops in place, placing them as TFLite Micro's greedy planner
    does or, where that leaves gaps, in an order found by a short search (planner.py); "greedy"
    is TFLite Micro's placement alone; "naive" gives every tensor its own memory, so all of them
    can be read after a step (for debugging).
    guard: bytes left free around every arena tensor (for memory tests).
    clip_grad: clip the gradient of each batch to this L2 norm over all trainable
    parameters before the update, as torch.nn.utils.clip_grad_norm_; a batch whose
    gradient is not finite is then rejected (info()["rejected"]), nothing updated.
    quantize: "int8" quantizes the frozen part after training (per-channel int8 weights, per-tensor
    int8 activations from the min/max over `calibration`, samples first); a QDQ model
    (QuantizeLinear/DequantizeLinear, as onnxruntime writes it) runs int8 as it is, without it.
    input_dtype: "float32", or "int8"/"uint8" for a quantized model that takes integer input (its
    quantization: the input's, or input_quant=(scale, zero_point)). int8_scope: "prefix" runs int8
    only what comes before the first trainable layer, "frozen" every frozen layer (gradients then
    pass through int8 layers in float). docs/quantization.md.
    saved: "int8" keeps the ReLU6 (Clip(0, hi)) outputs the backward reads as int8 copies, a
    quarter of the float bytes; outputs within half an int8 step of 0 or hi then pass no gradient,
    as in an int8 model; "bits" keeps the mask of every Clip (ReLU, ReLU6) output the backward
    reads only for its mask as 1 bit per element (MASK_PACK, MASK_BWD), gradients exactly those of
    "float32" (docs/sparse.md). (microtrain.compile, api.py, also takes budget and budget_probe:
    the budget search, a layer above this function.)
    int8_fuse: True streams frozen int8 convs so that their large tensors are never stored, with the
    same integers (q8_fuse.py): a conv, the depthwise conv that alone reads it and the 1x1 conv that
    alone reads that, row by row (CONV_DW_PW_Q8: a stem and its first block, an inverted-residual
    block), else a 1x1 conv into the depthwise conv that alone reads it (PWDW_Q8); "pwdw" only the
    latter; False keeps every conv an op of its own. A streamed op whose ring of rows sets the
    arena's peak keeps one channel of it, its rows made again (ring_channels.py).
    frozen_weights: "float32" (default) keeps the frozen weights of float layers (those from the
    first trainable layer on, the frozen part of a split weight) as the model has them; "int8"
    stores each frozen conv weight of a float layer as int8 with one scale per output channel
    (max |w| / 127), a quarter of its flash; the layer computes in float32 on the dequantized weight
    float32(q) * scale, so gradients are those of the model with those weights (w8.py). It needs no
    calibration and works with or without quantize="int8"; the plan's meta["w8"] lists the weights.
    Either way, a frozen conv that alone reads the int8 prefix's dequantized output reads the int8
    tensor instead, a few channels dequantized at a time, with the same bits (dq_conv.py).
    trained_weights: "int8" stores every trainable conv/Gemm weight as int8 codes with one float
    scale per output channel (max|w| / 127 of its initial values) and updates the codes with the
    float gradient, rounded to nearest (q8state.py, docs/sparse.md); biases stay float32.
    recompute: True runs forward ops again in the backward where that keeps fewer saved activations
    and lowers the arena, with the same numbers (recompute.py; at most the forward's multiply-
    accumulates again); False keeps every saved activation from the forward to its backward.
    input_in_place: True reads each sample where the caller keeps it (on a board, a file in flash
    or ROMFS read as a memoryview) instead of copying it into the arena, which then has no room for
    it: peak RAM leaves the input out. The caller's sample must not change during the step. A float32
    or int8 input (a uint8 one is flipped to int8 in a copy: give int8 pixels, pixel - 128).
    stream: True puts the frozen constants and the initial parameter values in the plan's stream
    section, in the order the ops read them (stream.py): a board that opens the plan from a file
    keeps only the rest (the head) in RAM and reads each op's constants into a window in the arena
    just before the op; the windows are planned with the arena. Read whole or in place, the plan runs
    as any other, with the same numbers. docs/plan-format.md, Streaming. stream_window: the most bytes
    of constants an op reads at once; an expansion block's ops (PWDW_W8) whose constants are more
    consume them in blocks of output channels, one window's worth at a time, with the same bits.
    None: the compiler chooses the window that needs the least RAM (stream.windowed).
    """
    update: object = "last-layer"
    scheme: str | None = None
    loss: str = "cross-entropy"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch: int = 1
    clip_grad: float | None = None
    planner: str = "search"
    guard: int = 0
    quantize: str | None = None
    calibration: object = None
    input_dtype: str = "float32"
    input_quant: tuple | None = None
    int8_scope: str = "prefix"
    int8_fuse: object = True
    saved: str = "float32"
    frozen_weights: str = "float32"
    trained_weights: str = "float32"
    recompute: bool = True
    input_in_place: bool = False
    stream: bool = False
    stream_window: int | None = None

    def __post_init__(self):
        (loss, lr, momentum, weight_decay, batch, planner, clip_grad, quantize, calibration, input_dtype, saved,
         int8_fuse, frozen_weights, trained_weights, recompute, input_in_place, stream, stream_window) = (
            getattr(self, f) for f in ("loss", "lr", "momentum", "weight_decay", "batch", "planner", "clip_grad",
                                       "quantize", "calibration", "input_dtype", "saved", "int8_fuse", "frozen_weights",
                                       "trained_weights", "recompute", "input_in_place", "stream", "stream_window"))
        if trained_weights not in TRAINED_WEIGHTS:
            raise ValueError("unknown trained_weights %r; use one of %s" % (trained_weights, ", ".join(TRAINED_WEIGHTS)))
        if recompute not in (True, False):
            raise ValueError("recompute must be True or False, got %r" % (recompute,))
        if input_in_place not in (True, False):
            raise ValueError("input_in_place must be True or False, got %r" % (input_in_place,))
        if stream not in (True, False):
            raise ValueError("stream must be True or False, got %r" % (stream,))
        if stream_window is not None and (not stream or isinstance(stream_window, bool) or not isinstance(stream_window, int)
                                          or stream_window < 256):
            raise ValueError("stream_window is the most bytes of constants an op reads into its window at once, a whole "
                             "number >= 256, with stream=True; got %r%s" % (stream_window, "" if stream else
                                                                           " without stream=True"))
        if input_in_place and input_dtype == "uint8":
            raise ValueError("input_in_place reads the caller's sample as it is, and a uint8 input is flipped to int8 "
                             "in a copy: give int8 input (input_dtype='int8', pixel - 128) or float32")
        if int8_fuse not in (True, False, "pwdw"):
            raise ValueError("int8_fuse must be True, False or \"pwdw\", got %r" % (int8_fuse,))
        if frozen_weights not in FROZEN_WEIGHTS:
            raise ValueError("unknown frozen_weights %r; use one of %s" % (frozen_weights, ", ".join(FROZEN_WEIGHTS)))
        if saved not in SAVED:
            raise ValueError("unknown saved %r; use one of %s" % (saved, ", ".join(SAVED)))
        if loss not in LOSSES:
            raise ValueError("unknown loss %r; use one of %s" % (loss, ", ".join(LOSSES)))
        if planner not in PLANNERS:
            raise ValueError("unknown planner %r; use one of %s" % (planner, ", ".join(PLANNERS)))
        if quantize not in QUANTIZE:
            raise ValueError("unknown quantize %r; use None or 'int8'" % (quantize,))
        if input_dtype not in INPUT_DTYPES:
            raise ValueError("unknown input_dtype %r; use one of %s" % (input_dtype, ", ".join(INPUT_DTYPES)))
        if quantize and calibration is None:
            raise ValueError("quantize='int8' needs calibration samples (a few hundred typical inputs, samples first: "
                             "calibration=x, or --calibration calib.npz)")
        _set(self, "lr", _positive_float("lr", lr))
        _set(self, "momentum", _positive_float("momentum", momentum))
        _set(self, "weight_decay", _positive_float("weight_decay", weight_decay))
        if clip_grad is not None:
            _set(self, "clip_grad", _positive_float("clip_grad", clip_grad, allow_zero=False))
            clip_grad = self.clip_grad
            if clip_grad < FLT32_MIN_NORMAL:   # the core refuses subnormal float32 bounds (mt_f32_positive_normal)
                raise ValueError("clip_grad must be at least %g (the smallest normal float32), got %r"
                                 % (FLT32_MIN_NORMAL, clip_grad))
        if self.momentum >= 1:
            raise ValueError("momentum must be below 1, got %r" % momentum)
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 65535:
            raise ValueError("batch must be a whole number from 1 to 65535, got %r" % (batch,))
        if calibration is not None and quantize is None:
            raise ValueError("calibration samples are for quantize='int8' (post-training quantization); give "
                             "quantize='int8' with them, or leave them out")

    @classmethod
    def of(cls, options=None, **overrides):
        """options (a CompileOptions, or None for the defaults) with overrides' fields replaced;
        an unknown name is a TypeError that lists the options."""
        unknown = sorted(set(overrides) - set(FIELDS))
        if unknown:
            raise TypeError("unknown compile option%s %s; the options are: %s"
                            % ("s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(FIELDS)))
        if options is None:
            return cls(**overrides)
        if not isinstance(options, cls):
            raise TypeError("options must be a microtrain.CompileOptions, got %s" % type(options).__name__)
        return dataclasses.replace(options, **overrides) if overrides else options

    def asdict(self):
        return {f: getattr(self, f) for f in FIELDS}


FIELDS = tuple(f.name for f in dataclasses.fields(CompileOptions))
