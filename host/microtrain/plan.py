"""The .mtp plan file: write it, read it back, report on it.

Every plan, whether just compiled or read from disk, goes through the C core's
validator before Python looks inside, so Python never trusts bytes the device
would refuse.
"""
from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np

from . import format as F
from . import planner
from .memory import lifetimes, op_slots
from .ir import NP_DTYPES
from .native import Core, PlanError

OP_NAMES = {op.code: op.name for op in F.OPS}
PHASE_NAMES = {v: k for k, v in F.PHASES.items()}
STORAGE_NAMES = {v: k for k, v in F.STORAGES.items()}
DTYPE_NAMES = {code: name for name, (code, _) in F.DTYPES.items()}
LOSS_NAMES = {F.LOSSES["CROSS_ENTROPY"]: "cross-entropy", F.LOSSES["MSE"]: "mse"}


def _align(n, a=F.ALIGN):
    return (n + a - 1) // a * a


def write_plan(tensors, ops, *, arena, state, naive, blobs, data_size, io, loss, batch, lr, momentum,
               weight_decay, macs, meta, quants=(), input_dtype="F32", stream=None):
    """Serialize to bytes (format.py layout). stream: a stream.Layout (the stream section, its
    groups with their windows) or None."""
    names = bytearray()
    name_off = []
    for t in tensors:
        name_off.append(len(names))
        names += t.name.encode() + b"\0"
    trec = bytearray()
    const_bytes = 0
    for i, t in enumerate(tensors):
        dims = list(t.shape) + [1] * (F.MAX_DIMS - len(t.shape))
        flags = t.flags
        is_param = bool(flags & F.TFLAGS["PARAM"])
        if t.storage in ("CONST", "STREAM"):
            offset = t.data_offset if t.view_of is None else tensors[t.view_of].data_offset
            const_bytes += t.nbytes * len(getattr(t, "blocks", None) or [0]) if t.view_of is None else 0
        else:
            offset = t.offset
        init = t.data_offset if is_param else F.NO_NAME
        trec += F.pack_tensor(dtype=F.dtype_code(t.dtype), storage=F.STORAGES[t.storage], ndim=len(t.shape),
                              flags=flags, offset=offset, bytes=t.nbytes, dim0=dims[0], dim1=dims[1], dim2=dims[2],
                              dim3=dims[3], name=name_off[i], init=init,
                              quant=getattr(t, "quant_index", F.NO_QUANT), reserved=0)
    orec = bytearray()
    for op in ops:
        orec += F.pack_op(op.spec.code, F.PHASES[op.phase], op.slots, op.attrs)
    meta_b = json.dumps(meta, separators=(",", ":")).encode()
    qrec = b"".join(F.pack_quant(**q) for q in quants)
    section = b""
    grec = b""
    if stream is not None:
        from .stream import section as stream_section
        section = stream_section(stream)
        grec = b"".join(F.pack_group(first_op=g.first, last_op=g.last, window=g.window, lo=g.lo, bytes=g.bytes,
                                     crc32=zlib.crc32(section[g.lo:g.lo + g.bytes])) for g in stream.groups)
    # the head (what a board streaming the plan keeps in memory), then the stream section, then meta
    sections = {}
    pos = F.HEADER_BYTES
    for key, blob in (("tensors", trec), ("ops", orec), ("quant", qrec), ("names", names), ("groups", grec)):
        pos = _align(pos)
        sections[key] = (pos, blob)
        pos += len(blob)
    data_off = _align(pos)
    pos = data_off + data_size
    stream_off = _align(pos) if section else 0
    pos = stream_off + len(section) if section else pos
    meta_off = _align(pos)
    total = meta_off + len(meta_b)
    out = bytearray(total)
    for off, blob in sections.values():
        out[off:off + len(blob)] = blob
    for off, blob in blobs:
        out[data_off + off:data_off + off + len(blob)] = blob
    out[stream_off:stream_off + len(section)] = section
    out[meta_off:meta_off + len(meta_b)] = meta_b
    fields = dict(
        magic=F.MAGIC, version=F.VERSION, header_bytes=F.HEADER_BYTES, file_bytes=total, crc32=0, flags=0,
        n_tensors=len(tensors), n_ops=len(ops),
        tensors_off=sections["tensors"][0], ops_off=sections["ops"][0], ops_bytes=len(orec),
        data_off=data_off, data_bytes=data_size, names_off=sections["names"][0], names_bytes=len(names),
        meta_off=meta_off, meta_bytes=len(meta_b),
        arena_bytes=arena, state_bytes=state, naive_bytes=naive, const_bytes=const_bytes,
        macs_lo=macs & 0xFFFFFFFF, macs_hi=macs >> 32,
        input_tensor=io[0], target_tensor=io[1], output_tensor=io[2],
        loss=F.LOSSES["CROSS_ENTROPY" if loss == "cross-entropy" else "MSE"], reserved0=0, batch=batch,
        reserved1=0, lr=lr, momentum=momentum, weight_decay=weight_decay, quant_off=sections["quant"][0],
        n_quant=len(quants), input_dtype=F.dtype_code(input_dtype), reserved3=0, context_off=0, context_bytes=0,
        stream_off=stream_off, stream_bytes=len(section), stream_crc32=0,
        groups_off=sections["groups"][0] if grec else 0, n_groups=len(grec) // F.GROUP_BYTES, reserved2=0)
    if len(tensors) > 0xFFFE or len(ops) > 0xFFFF:
        raise ValueError("model too large for plan format %d: %d tensors, %d ops" % (F.VERSION, len(tensors), len(ops)))
    return _seal(out, fields)


def _seal(out, fields):
    """out (bytearray) with its header packed from fields and its CRCs: the stream section's and what
    follows it (a board that streams the plan checks its head against the file's CRC with it), then
    the file's over everything after the CRC field."""
    if fields["stream_off"]:
        fields = dict(fields, stream_crc32=zlib.crc32(bytes(out[fields["stream_off"]:])))
    out[:F.HEADER_BYTES] = F.HEADER_STRUCT.pack(*[fields[n] for n, _ in F.HEADER_FIELDS])
    crc = F.header_offsets()["crc32"]
    out[crc:crc + 4] = struct.pack("<I", zlib.crc32(bytes(out[F.CRC_START:])))
    return bytes(out)


def with_context(data):
    """(plan bytes, the core's info() of them): data with its runtime context section
    (format.py's context_off and context_bytes): the context the C core decodes from this plan at
    attach, prepared here by the same C, so that a board runs it in place from the plan (flash)
    instead of decoding it into RAM. mt_load compares it with what the board's core prepares and
    uses it only where every byte agrees. data as it was if the core would not use it (a record
    over the core's compare buffer)."""
    core = Core(data)
    image = core.context_image()
    off = _align(len(data))
    out = bytearray(data) + bytes(off - len(data)) + image
    h = dict(zip((n for n, _ in F.HEADER_FIELDS), F.HEADER_STRUCT.unpack_from(out, 0)))
    h.update(file_bytes=len(out), context_off=off, context_bytes=len(image), crc32=0)
    sealed = _seal(out, h)
    info = Core(sealed).info()
    return (sealed, info) if info["context_in_plan"] else (data, core.info())


class Plan:
    """A validated plan. Build with microtrain.compile() or load_plan()."""

    def __init__(self, data: bytes, _info=None):
        _check_kind(data)
        # the C validator decides; raises PlanError (ValueError). _info: Core(data).info(), from
        # a caller that has just made it (with_context), not made again
        info = _info or Core(data).info()
        self.context_bytes = info["context_bytes"]       # the decoded plan: in RAM, or read in place
        self.context_in_plan = info["context_in_plan"]   # from the plan's context section (no RAM)
        self.ram_bytes = info["ram_bytes"]
        self.data = bytes(data)
        h = F.HEADER_STRUCT.unpack_from(self.data, 0)
        self.header = {name: v for (name, _), v in zip(F.HEADER_FIELDS, h)}
        self.tensors = []
        hd = self.header
        for i in range(hd["n_tensors"]):
            r = F.unpack_tensor(self.data, hd["tensors_off"] + i * F.TENSOR_BYTES)
            end = self.data.index(b"\0", hd["names_off"] + r["name"])
            self.tensors.append(dict(
                name=self.data[hd["names_off"] + r["name"]:end].decode(), dtype=DTYPE_NAMES[r["dtype"]],
                storage=STORAGE_NAMES[r["storage"]], flags=r["flags"],
                shape=tuple([r["dim0"], r["dim1"], r["dim2"], r["dim3"]][:r["ndim"]]),
                offset=r["offset"], bytes=r["bytes"], init=r["init"], quant=self._quant(r["quant"])))
        self.ops = []
        pos = hd["ops_off"]
        for _ in range(hd["n_ops"]):
            code, phase, slots, attrs, pos = F.unpack_op(self.data, pos)
            self.ops.append(dict(op=OP_NAMES[code], phase=PHASE_NAMES[phase], slots=slots, attrs=attrs))
        m0 = hd["meta_off"]
        self.meta = json.loads(self.data[m0:m0 + hd["meta_bytes"]] or b"{}")
        self.groups = [F.unpack_group(self.data, hd["groups_off"] + k * F.GROUP_BYTES) for k in range(hd["n_groups"])]

    # ---- public ----
    def save(self, path):
        tmp = "%s.tmp" % path
        with open(tmp, "wb") as f:   # write then rename: a crash never leaves half a plan
            f.write(self.data)
        os.replace(tmp, path)

    @property
    def loss(self):
        return LOSS_NAMES[self.header["loss"]]

    def tensor_index(self, name):
        for i, t in enumerate(self.tensors):
            if t["name"] == name:
                return i
        raise KeyError("no tensor named %r in the plan" % name)

    def memory_owners(self):
        """For each tensor, the tensor whose memory it uses (itself unless it is a view
        or the output of an op run in place)."""
        shares = {int(k): v for k, v in self.meta.get("shares", {}).items()}

        def owner(i):
            while i in shares:
                i = shares[i]
            return i
        return [owner(i) for i in range(len(self.tensors))]

    def constant(self, name):
        """The value of a constant tensor (a frozen parameter), from the plan's data or stream section (of a
        constant in blocks, block 0's)."""
        t = self.tensors[self.tensor_index(name)]
        if t["storage"] not in ("CONST", "STREAM"):
            raise ValueError("%r is not a constant of the plan" % name)
        dt = np.dtype(NP_DTYPES[t["dtype"]])
        at = self.header["data_off" if t["storage"] == "CONST" else "stream_off"] + t["offset"]
        return np.frombuffer(self.data, dt, t["bytes"] // dt.itemsize, at).reshape(t["shape"]).copy()

    def stream_figures(self):
        """What streaming the plan from its file costs: {head_bytes, the bytes a board keeps in RAM of
        the plan; stream_bytes; groups; window_bytes, the largest group an op reads; read_per_step and
        reads_per_step, the bytes and groups a training step reads (forward and training ops; the
        batch-end ops' as well, once a batch), and read_per_predict}."""
        hd = self.header
        ops = [g for g in self.groups if g["first_op"] != F.RESET_GROUP]
        train = next((k for k, o in enumerate(self.ops) if o["phase"] != "FORWARD"), len(self.ops))
        end = next((k for k, o in enumerate(self.ops) if o["phase"] == "BATCH_END"), len(self.ops))
        step = [g for g in ops if g["first_op"] < end]
        return {"head_bytes": hd["stream_off"] or len(self.data), "stream_bytes": hd["stream_bytes"],
                "groups": len(self.groups), "window_bytes": max((g["bytes"] for g in ops), default=0),
                "read_per_step": sum(g["bytes"] for g in step), "reads_per_step": len(step),
                "read_per_batch_end": sum(g["bytes"] for g in ops if g["first_op"] >= end),
                "read_per_predict": sum(g["bytes"] for g in ops if g["first_op"] < train)}

    def weight(self, name):
        """A frozen weight as the kernels compute with it: a float32 constant as it is, an int8 one of
        a float layer (compile(frozen_weights="int8"), w8.py) dequantized, float32(q) * scale[o]."""
        i = self.tensor_index(name)
        if name not in self.meta.get("w8", []):
            return self.constant(name)
        from .w8 import dequantize
        return dequantize(self.constant(name), self.tensors[i]["quant"])

    def _quant(self, index):
        """The ir.Quant of quantization record `index`, or None."""
        from .ir import Quant
        if index == F.NO_QUANT:
            return None
        q = F.unpack_quant(self.data, self.header["quant_off"] + index * F.QUANT_BYTES)
        if q["axis"] == F.PER_TENSOR:
            return Quant(q["scale"], q["zero_point"])
        d0, n = self.header["data_off" if q["where"] == F.QUANT_IN_DATA else "stream_off"], q["n_channels"]
        scales = np.frombuffer(self.data, "<f4", n, d0 + q["scales"])
        zps = np.zeros(n, np.int32) if q["zero_points"] == F.NO_NAME else \
            np.frombuffer(self.data, "<i4", n, d0 + q["zero_points"])
        return Quant(scales.copy(), zps.copy(), q["axis"])

    def export(self, params, onnx_in, onnx_out=None):
        """Write the ONNX model the plan was compiled from (onnx_in: path, bytes or ModelProto) with
        `params` ({name: array}, as Simulator.params() returns) in place to onnx_out; returns the
        ModelProto. BatchNormalization-folded layers are written as the folded Conv/Gemm."""
        from .export import export_trained
        return export_trained(self, params, onnx_in, onnx_out)

    def params(self):
        """Names of the trainable parameters, in plan order."""
        return [t["name"] for t in self.tensors if t["flags"] & F.TFLAGS["PARAM"]]

    def onnx_params(self, params):
        """params ({name: array}, as Simulator.params() or a board returns them) in the ONNX model's
        names and shapes: a weight that trains on some input channels is a parameter of its own
        for those channels (`W@trained`, docs/sparse.md), put back here into the whole weight."""
        from .split import merge
        return merge(self, params)

    def report(self):
        hd = self.header
        inputs = [hd["input_tensor"], hd["target_tensor"]]
        first, last = lifetimes(len(self.tensors), op_slots(self.ops, lambda o: o["op"], lambda o: o["slots"]), inputs)
        owner = self.memory_owners()
        # a lower bound: the largest set of distinct arena buffers live at one op
        spans = {}
        for i, t in enumerate(self.tensors):
            if t["storage"] == "ARENA" and first[i] >= 0:
                f, l = spans.get(owner[i], (first[i], last[i]))
                spans[owner[i]] = (min(f, first[i]), max(l, last[i]))
        windows = {(g["first_op"], g["last_op"]): g["bytes"] for g in self.groups if g["first_op"] != F.RESET_GROUP}
        peak = planner.peak_live_bytes([planner.Buffer(self.tensors[o]["bytes"], f, l) for o, (f, l) in spans.items()]
                                       + [planner.Buffer(b, f, l) for (f, l), b in windows.items()], F.ALIGN)
        phases = {}
        for o in self.ops:
            phases[o["phase"].lower()] = phases.get(o["phase"].lower(), 0) + 1
        macs = hd["macs_lo"] | (hd["macs_hi"] << 32)
        return {
            "plan_bytes": len(self.data),
            "arena_bytes": hd["arena_bytes"],
            "naive_bytes": hd["naive_bytes"],
            "peak_live_bytes": peak,
            "param_bytes": hd["state_bytes"],
            "context_bytes": self.context_bytes,
            # the context read in place from the plan's section (flash on a board), not from RAM
            "context_in_plan": self.context_in_plan,
            "context_ram_bytes": 0 if self.context_in_plan else self.context_bytes,
            "ram_bytes": self.ram_bytes,
            # RAM the board gives a Trainer: arena + trainable state + context_ram_bytes
            "peak_ram_bytes": self.ram_bytes,
            # flash a plan takes when read in place (ROMFS, frozen bytes): all of it, constants included
            "flash_bytes": len(self.data),
            "const_bytes": hd["const_bytes"],
            "const_int8_bytes": sum(t["bytes"] for t in self.tensors if t["storage"] == "CONST" and t["dtype"] == "I8"),
            "input_dtype": {v: k for k, v in (("float32", "F32"), ("int8", "I8"), ("uint8", "U8"))}
                           [DTYPE_NAMES[hd["input_dtype"]]],
            "input_bytes": self.tensors[hd["input_tensor"]]["bytes"],
            # the input read in place, where the caller keeps it (compile(input_in_place=True)): not in
            # the arena, so not in peak_ram_bytes
            "input_in_place": self.tensors[hd["input_tensor"]]["storage"] == "INPUT",
            # the stream section (compile(stream=True)): a board that opens the plan's file keeps its head in
            # RAM and reads the rest a group at a time; file_ram_bytes is what Trainer(path) then takes
            # without the Trainer object: arena (its windows in it), state, the context decoded into RAM
            # (the context section is not in the head), and the head; for a plan without a stream section,
            # ram_bytes and the whole plan
            "streamed": bool(hd["stream_off"]),
            **self.stream_figures(),
            "file_ram_bytes": hd["arena_bytes"] + hd["state_bytes"] + self.context_bytes + hd["stream_off"]
            if hd["stream_off"] else self.ram_bytes + len(self.data),
            "macs_per_step": macs,
            "ops": hd["n_ops"],
            "ops_by_phase": phases,
            "loss": self.loss,
            "batch": hd["batch"],
            "lr": hd["lr"],
            "momentum": hd["momentum"],
            "weight_decay": hd["weight_decay"],
            "update": self.meta.get("update"),
            "trainable": self.params(),
            "notes": self.meta.get("notes", []),
            "tensors": [dict(name=t["name"], storage=t["storage"].lower(), dtype=t["dtype"].lower(),
                             shape=list(t["shape"]), bytes=t["bytes"], offset=t["offset"],
                             first=first[i], last=last[i],
                             memory_of=self.tensors[owner[i]]["name"] if owner[i] != i else None)
                          for i, t in enumerate(self.tensors)],
        }


def _check_kind(data, where="the plan"):
    """What the C validator cannot say helpfully: an ONNX model given as a plan, or a plan of
    another format version."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 6:
        return
    data = bytes(data[:F.HEADER_BYTES]) if data[:4] == F.MAGIC else bytes(data)
    if data[:4] == F.MAGIC:
        version = struct.unpack_from("<H", data, F.header_offsets()["version"])[0]
        if version != F.VERSION:
            raise PlanError("%s has plan format version %d, this runtime reads %d: recompile the model with this "
                            "microtrain (microtrain compile MODEL.onnx -o PLAN.mtp)" % (where, version, F.VERSION))
        return
    try:
        import onnx
        model = onnx.load_from_string(data)
        is_onnx = model.ir_version > 0 and len(model.graph.node) > 0
    except Exception:   # not a protobuf at all
        is_onnx = False
    if is_onnx:
        raise PlanError("%s is an ONNX model, not a training plan: compile it first "
                        "(microtrain compile MODEL.onnx -o PLAN.mtp)" % where)


def load_plan(path):
    """Read and validate a plan file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError("cannot read plan %s: %s" % (path, e.strerror)) from e
    _check_kind(data, str(path))
    return Plan(data)
