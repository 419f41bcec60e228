"""Plans of a single int8 op, written directly with the compiler's plan writer, so that the
kernels can be driven with any quantization parameters, multipliers and shifts (also the
extremes no calibration would produce)."""
import numpy as np

from microtrain import format as F
from microtrain.ir import Quant
from microtrain.memory import assign_memory
from microtrain.plan import Plan, write_plan
from microtrain.lowered import TOp, TTensor


def act(name, shape, scale, zp, flags=0):
    return TTensor(name, tuple(shape), dtype="I8", flags=flags, quant=Quant(scale, zp))


def const(name, data, dtype, quant=None):
    return TTensor(name, tuple(data.shape), dtype=dtype, storage="CONST", data=np.asarray(data), quant=quant)


def single_op_plan(op, x, inputs, y, attrs, input_dtype="I8"):
    """Tensors: x (the int8 plan input, an I8 TTensor), the other slots `inputs` (TTensor or None,
    in slot order after x), y (int8 output). A DEQUANTIZE after the op makes the float output."""
    tensors = [x] + [t for t in inputs if t is not None] + [y]
    x.flags |= F.TFLAGS["INPUT"]
    out = TTensor("out", y.shape, flags=F.TFLAGS["OUTPUT"])
    target = TTensor("target", (1,), dtype="I32", flags=F.TFLAGS["TARGET"])
    tensors += [out, target]
    index = {id(t): i for i, t in enumerate(tensors)}
    slots = [0] + [index[id(t)] if t is not None else None for t in inputs] + [index[id(y)]]
    ops = [TOp(op, "FORWARD", slots, list(attrs)),
           TOp("DEQUANTIZE", "FORWARD", [index[id(y)], index[id(out)]], [])]
    io = (0, len(tensors) - 1, len(tensors) - 2)
    arena, state, naive, peak, blobs, size, quants, _ = assign_memory(tensors, ops, io[:2], "naive")
    data = write_plan(tensors, ops, arena=arena, state=state, naive=naive, blobs=blobs, data_size=size, io=io,
                      loss="cross-entropy", batch=1, lr=0.0, momentum=0.0, weight_decay=0.0, macs=0,
                      meta={"input": {"shape": list(x.shape)}, "output": {"shape": list(y.shape)}},
                      quants=quants, input_dtype=input_dtype)
    return Plan(data)
