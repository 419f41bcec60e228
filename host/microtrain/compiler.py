"""microtrain.compile: ONNX model -> validated training plan."""
from __future__ import annotations

from .version import __version__
from . import format as F
from .dq_conv import add_dequantized, fuse_dequantize_conv, stream_into_projection
from .dw_stream import stream_blocks
from .recompute import replay_saved
from .ring_channels import one_channel_rings, prune
from .onnx_frontend import import_onnx
from .memory import assign_memory
from .options import INPUT_DTYPES, CompileOptions
from .stream import planned, windowed
from .plan import Plan, with_context, write_plan
from .q8state import store_int8
from .split import split_partial_weights
from .lowered import drop_unused
from .training import build_training, check_gradient_paths, macs_total
from .update import resolve_update

def optimizer_state(tensors, ops):
    """{parameter: {"momentum": tensor index or None, "accumulator": tensor index or None}}, from
    the ops that update parameters (each parameter slot followed by its momentum and accumulator
    slots, format.SINK); a list of indices where a channel-sparse weight has a momentum per
    channel run."""
    out = {}
    for o in ops:
        slots = o.spec.slots
        for i, p in enumerate(slots):
            # a parameter slot is followed by its momentum and accumulator (format.SINK)
            if p.role == "param" and o.slots[i] is not None:
                assert [q.role for q in slots[i + 1:i + 3]] == ["state", "state"], o.name
                _add_state(out, tensors[o.slots[i]].name, o.slots[i + 1], o.slots[i + 2])
    return out


def _add_state(out, name, m, acc):
    state = out.setdefault(name, {"momentum": None, "accumulator": None})
    for t, key in ((m, "momentum"), (acc, "accumulator")):
        if t is None or t == state[key] or (isinstance(state[key], list) and t in state[key]):
            continue
        # a channel-sparse weight has one momentum per channel run: their list
        state[key] = t if state[key] is None else (state[key] if isinstance(state[key], list) else [state[key]]) + [t]


def compile(model, options=None, **overrides):
    """Compile an ONNX model (path, bytes or onnx.ModelProto) into a Plan. options: a
    CompileOptions (options.py documents each field; None: the defaults); keywords replace its
    fields: compile(m, lr=0.05) and compile(m, CompileOptions(lr=0.05)) are the same plan.
    (microtrain.compile, api.py, also takes budget and budget_probe: the budget search, a layer
    above this function.)"""
    o = CompileOptions.of(options, **overrides)
    (update, loss, lr, momentum, weight_decay, batch, planner, guard, clip_grad, quantize, calibration, input_dtype,
     input_quant, int8_scope, scheme, saved, int8_fuse, frozen_weights, trained_weights, recompute, input_in_place,
     stream, stream_window) = (getattr(o, f) for f in ("update", "loss", "lr", "momentum", "weight_decay", "batch",
                                                        "planner", "guard", "clip_grad", "quantize", "calibration",
                                                        "input_dtype", "input_quant", "int8_scope", "scheme", "saved",
                                                        "int8_fuse", "frozen_weights", "trained_weights", "recompute",
                                                        "input_in_place", "stream", "stream_window"))
    graph = import_onnx(model, loss)
    out_shape = graph.values[graph.output].onnx_shape
    if loss == "cross-entropy" and len(out_shape) != 2:
        raise ValueError("loss cross-entropy needs a model output of shape (1, C) or (N, C), one score per class; "
                         "output '%s' has shape %s. Add GlobalAveragePool + Flatten (or Flatten + a Linear head) "
                         "before the output, or use --loss mse to train towards a target of that shape"
                         % (graph.output, tuple(out_shape)))
    trainable, channels = resolve_selection(graph, update, scheme)
    if loss == "mse" and graph.dropped_output_op:
        raise ValueError("mse loss with a dropped %s output" % graph.dropped_output_op)
    if quantize == "int8":
        if graph.quant:
            raise ValueError("the model is already quantized (QuantizeLinear/DequantizeLinear): compile it without "
                             "quantize='int8'")
        from .quantize import ptq
        if input_quant is not None:   # the int8 form of the input's (scale, zero point)
            input_quant = (float(input_quant[0]), int(input_quant[1]) - (128 if input_dtype == "uint8" else 0))
        ptq(graph, trainable, calibration, build_plan, input_quant, int8_scope)
    elif input_quant is not None:
        raise ValueError("input_quant is for quantize='int8'; a QDQ model states its input's quantization")
    if graph.quant:
        from .quantize import lower
        graph = lower(graph, trainable, INPUT_DTYPES[input_dtype], int8_scope, fuse=int8_fuse)
    elif input_dtype != "float32":
        raise ValueError("input_dtype %r needs an int8 model: quantize='int8' with calibration samples, or a QDQ "
                         "model" % input_dtype)
    return build_plan(graph, trainable, loss, lr=lr, momentum=momentum, weight_decay=weight_decay, batch=batch,
                      planner=planner, guard=guard, update=update, input_dtype=INPUT_DTYPES[input_dtype],
                      clip_grad=clip_grad, channels=channels, saved=saved, frozen_weights=frozen_weights,
                      trained_weights=trained_weights, recompute=recompute, input_in_place=input_in_place,
                      update_meta=update if scheme is None else "%s:%s" % (update, scheme), stream=stream,
                      stream_window=stream_window)


def resolve_selection(graph, update, scheme=None):
    """(trainable parameter names, {weight: (axis, channels)} of channel-sparse weights)."""
    from .schemes import is_scheme_file, resolve_scheme
    if isinstance(update, dict) or scheme is not None or (isinstance(update, str) and update.endswith(".json")
                                                          and is_scheme_file(update)):
        return resolve_scheme(graph, update, scheme)
    return (set() if update == "none" else resolve_update(graph, update)), {}


def build_plan(graph, trainable, loss, lr=0.01, momentum=0.0, weight_decay=0.0, batch=1, planner="search", guard=0,
               update="none", input_dtype="F32", clip_grad=None, channels=None, update_meta=None, saved="float32",
               frozen_weights="float32", trained_weights="float32", recompute=True, input_in_place=False,
               stream=False, stream_window=None):
    """The Plan of an IR graph (ir.Graph): the training step for `trainable` (a set of parameter
    names), or forward only when it is empty."""
    # "naive" memory shares nothing, not even between an op's input and output, so that
    # every tensor can be read after a step (debugging, tests)
    selected = dict(channels or {})
    values = graph.values
    layers = [dict(node=n.onnx_name, op=n.op, weight=n.weight(), bias=n.bias(),
                   weight_init=graph.origins[n.weight()]["init"], w_layout=n.attrs.get("w_layout"), **n.parts)
              for n in graph.layers()]
    origins = {p: o for p, o in graph.origins.items() if p in values}
    # only the trained input channels of a weight in RAM (split.py); the rest keep ranged gradients
    trainable, channels, splits = split_partial_weights(graph, trainable, selected)
    origins.update((s["slice"], graph.origins[s["slice"]]) for s in splits.values())
    tensors, ops = build_training(graph, trainable, loss, batch, momentum, inplace=planner != "naive",
                                  clip_grad=clip_grad, channels=channels, saved=saved, input_in_place=input_in_place)
    if trained_weights == "int8":
        ops = store_int8(tensors, ops)
    w8 = []
    if frozen_weights == "int8":   # frozen float conv weights as int8 + per-channel scales (w8.py)
        from .w8 import int8_frozen_weights
        w8 = int8_frozen_weights(tensors, ops)
        if w8:
            graph.notes.append("w8: %d frozen conv weights of float layers stored int8 with per-output-channel scales "
                               "(%d B), their layers computing in float on the dequantized weights"
                               % (len(w8), sum(t.nbytes for t in tensors if t.name in set(w8))))
    if planner != "naive":
        # the inverted-residual blocks the gradient passes through a channel at a time (dw_stream.py;
        # their frozen weights int8)
        ops, streamed = stream_blocks(tensors, ops)
        if streamed:
            graph.notes.append("dw_stream: %d inverted-residual blocks run a channel at a time, forward and "
                               "backward (their depthwise convs: %s)" % (len(streamed), ", ".join(streamed)))
        # an int8 prefix's last tensor read by its float conv a few channels at a time (dq_conv.py)
        ops, dq = fuse_dequantize_conv(tensors, ops)
        if dq:
            graph.notes.append("dq_conv: %s read%s its int8 input a few channels at a time, never dequantized whole"
                               % (", ".join(dq), "s" if len(dq) == 1 else ""))
        ops, adds = add_dequantized(tensors, ops)
        if adds:
            graph.notes.append("dq_conv: %s add%s an int8 tensor never dequantized whole"
                               % (", ".join(adds), "s" if len(adds) == 1 else ""))
        ops, rows = stream_into_projection(tensors, ops)
        if rows:
            graph.notes.append("dq_conv: %s read%s the int8 expansion before it a row at a time (the depthwise "
                               "output never whole)" % (", ".join(rows), "s" if len(rows) == 1 else ""))
    if weight_decay and any(t.name == "acc(%s)" % p for t in tensors for p in channels):
        raise ValueError("weight decay with a channel-sparse update and an accumulator (batch > 1, clip_grad or a "
                         "shared weight) would decay the frozen channels too: use weight_decay=0, or batch 1")
    drop_unused(tensors, ops)
    out = next(i for i, t in enumerate(tensors) if t.flags & F.TFLAGS["OUTPUT"])
    inp = next(i for i, t in enumerate(tensors) if t.flags & F.TFLAGS["INPUT"])
    tgt = next(i for i, t in enumerate(tensors) if t.flags & F.TFLAGS["TARGET"])
    if planner != "naive":
        # rings of one channel (ring_channels.py) and replays (recompute.py) each lower the arena
        # where the other leaves it peaking: in turn, until neither does
        # (measured with the greedy placement: the search's is not monotonic in what changes)
        rings, replayed, greedy = [], [], "greedy"
        while True:
            more = one_channel_rings(tensors, ops, (inp, tgt), greedy, guard)
            again = []
            if recompute and trainable:
                ops, again = replay_saved(tensors, ops, (inp, tgt), greedy, guard)
            rings, replayed = rings + more, replayed + again
            if not more and not again:
                break
        rings = prune(tensors, ops, (inp, tgt), rings, greedy, guard)
        if rings:
            graph.notes.append("ring_channels: %s a channel at a time (a ring of one channel)"
                               % ", ".join(o.source for o in rings))
        if replayed:
            graph.notes.append("recompute: %d saved activation%s made again in the backward instead of kept (%s)"
                               % (len(replayed), "s" if len(replayed) > 1 else "", ", ".join(replayed)))
    if stream:   # the frozen constants read from the plan's file, a block too large for a window cut (stream.py)
        ops, window, cut = windowed(tensors, ops, ("INPUT", "TARGET"), stream_window, guard)
        if cut:
            graph.notes.append("stream: %d ops consume their constants in blocks of output channels, at most %d B "
                               "each" % (cut, window))
            out, inp, tgt = (next(i for i, t in enumerate(tensors) if t.flags & F.TFLAGS[f])
                             for f in ("OUTPUT", "INPUT", "TARGET"))
    arena, state, naive, peak, blobs, data_size, quants, lay = (planned if stream else assign_memory)(
        tensors, ops, (inp, tgt), planner, guard)
    if trainable:
        check_gradient_paths(tensors, ops, trainable)   # never a plan that silently does not train
    meta = {
        "microtrain": __version__,
        "update": update_meta if isinstance(update_meta, str) else update if isinstance(update, str)
        else update if isinstance(update, dict) else sorted(update),
        # weights that train on some channels only: axis (0 output, 1 input channels) and channels
        "channels": {p: {"axis": a, "channels": list(c)} for p, (a, c) in sorted(selected.items())},
        # of those, the weights whose trained channels are a parameter of their own (split.py)
        "split": splits,
        # frozen conv weights of float layers stored int8, one scale per output channel (w8.py)
        "w8": w8,
        "input": {"name": graph.input, "shape": [1] + list(values[graph.input].onnx_shape[1:]),
                  "in_place": bool(input_in_place)},
        "output": {"name": graph.output, "shape": [1] + list(values[graph.output].onnx_shape[1:])},
        "param_shapes": {t.name: list(t.onnx_shape) for t in tensors if t.flags & F.TFLAGS["PARAM"]},
        "notes": graph.notes,
        # for export and params(): where each layer parameter comes from in the ONNX model
        "model": graph.fingerprint,
        "params": {p: dict(origins[p], shape=list(values[p].onnx_shape)) for p in origins},
        "layers": layers,
        # each trainable parameter's optimizer state: tensor indices of its momentum and accumulator
        "optimizer": optimizer_state(tensors, ops),
        "planner": planner,
        "clip_grad": clip_grad,
        "saved": saved,
        "trained_weights": trained_weights,
        # tensors that share another's memory (views, ops run in place): index -> index of the owner
        "shares": {str(i): t.view_of for i, t in enumerate(tensors) if t.view_of is not None},
    }
    if input_dtype != "F32":
        q = tensors[inp].quant
        meta["input"].update(dtype={"I8": "int8", "U8": "uint8"}[input_dtype], scale=float(q.scale),
                             zero_point=int(q.zero_point) + (128 if input_dtype == "U8" else 0))
    data = write_plan(tensors, ops, arena=arena, state=state, naive=naive, blobs=blobs, data_size=data_size,
                      io=(inp, tgt, out), loss=loss, batch=batch, lr=lr, momentum=momentum,
                      weight_decay=weight_decay, macs=macs_total(ops), meta=meta, quants=quants,
                      input_dtype=input_dtype, stream=lay)
    return Plan(*with_context(data))
