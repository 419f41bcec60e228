# The board's side of a federated round (`microtrain fleet`, docs/fleet.md): the server
# (serve.py) imports this on the first such command. Per round the host sends the global
# values of the plan's trainable parameters (FED_BEGIN, FED_WRITE, FED_APPLY), the board
# trains on the samples in its own store (samples.py) in the order samples.Order gives
# (LOCAL_TRAIN, counted in samples as TRAIN is: a resent chunk trains nothing twice), and
# the host reads the trained values back (FED_PARAMS, PARAM_READ). No sample crosses the
# link.
#
# A round is a run (serve.py's run/samples), checkpointed when it starts with the global
# values in place, so a board reset in the middle restores the round and its count and
# carries on where it was. What the round needs after a reset beyond the trainer's state
# (its seed, sample count, parameter encodings and int8 scales) is in mt/round.bin.
#
# Encodings, per parameter (in FED_BEGIN's `params` list: [name, enc, values, channels, inner]):
#   "f4"  the values as float32, both ways
#   "i8"  an int8 trained weight (compile(trained_weights="int8")): to the board its channels'
#         float32 scales, then one int8 code per value; value i is code * scale[(i // inner) %
#         channels], which the trainer stores as that code again (mt_set_param rounds value /
#         scale). Back to the host the codes alone (round(value / scale)).
import gc
import json
import os
import struct
from array import array

from . import protocol as P
from . import samples as S
from .serve import _argmax

ROUND_PATH = "mt/round.bin"


def _write_round(meta, scales):
    body = json.dumps(meta).encode()
    new = ROUND_PATH + ".new"
    with open(new, "wb") as f:
        f.write(struct.pack("<I", len(body)))
        f.write(body)
        f.write(scales)
    try:
        os.rename(new, ROUND_PATH)
    except OSError:         # FAT: remove, then rename
        os.remove(ROUND_PATH)
        os.rename(new, ROUND_PATH)


def restore(s):
    """At server start, after the checkpoint: the round the restored run belongs to."""
    s.fed = None
    try:
        with open(ROUND_PATH, "rb") as f:
            n = struct.unpack("<I", f.read(4))[0]
            meta = json.loads(f.read(n))
            scales = f.read()
    except (OSError, ValueError):
        return
    if s.run is not None and meta.get("run") == s.run and meta.get("plan_crc") == s.plan_crc:
        meta["scales"] = scales
        s.fed = meta


def _store(s):
    st = S.Store(S.PATH)
    t = s.trainer()
    try:
        dtype, kind, n_in, n_t = st.read_head()
    except OSError:
        raise ValueError("no samples on the board (%s): record some with microtrain.samples.Store, "
                         "or put a labelled set there with `microtrain fleet provision`" % S.PATH)
    want = "float32" if t.info()["input_dtype"] == "float32" else t.info()["input_dtype"]
    if n_in != t.input_len or S.DTYPE_NAMES[dtype] != want or (kind == S.LABEL) != s.ce \
            or (kind == S.TARGET and n_t != t.target_len):
        raise ValueError("the samples in %s (%d %s inputs, %s) do not fit the plan (%d %s inputs, %s)"
                         % (S.PATH, n_in, S.DTYPE_NAMES[dtype], "labels" if kind == S.LABEL else "%d targets" % n_t,
                            t.input_len, want, "labels" if s.ce else "%d targets" % t.target_len))
    return st


def begin(s, p):
    req = json.loads(bytes(p))
    s.trainer()
    st = _store(s)
    stored = st.count()
    total = req["steps"] or req["epochs"] * stored
    fed = getattr(s, "fed", None)
    if req["train"] and fed is not None and s.run == req["run"] and fed.get("crc") == req["crc"]:
        # this round is under way (a resend, or the board was reset and restored it)
        return json.dumps({"run": s.run, "samples": s.samples, "have": True, "stored": stored,
                           "total": fed["samples"]}).encode()
    req["samples"] = total
    s.stage = None
    s.params = None
    gc.collect()
    size = 0
    for name, enc, n, ch, inner in req["params"]:
        size += 4 * n if enc == "f4" else 4 * ch + n
    s.stage = bytearray(size)
    s.stage_req = req
    s.stage_got = 0
    return json.dumps({"run": s.run, "samples": s.samples, "have": False, "stored": stored,
                       "total": total}).encode()


def write(s, p):
    if getattr(s, "stage", None) is None:
        raise ValueError("FED_WRITE without FED_BEGIN")
    off = struct.unpack_from(P.FED_WRITE_HEAD, p, 0)[0]
    data = p[4:]
    if off == s.stage_got:
        if off + len(data) > len(s.stage):
            raise ValueError("round values past the announced %d bytes" % len(s.stage))
        s.stage[off:off + len(data)] = data
        s.stage_got += len(data)
    elif off > s.stage_got:
        raise ValueError("round values at %d, expected %d" % (off, s.stage_got))
    return struct.pack("<I", s.stage_got)


def apply(s, p):
    req = getattr(s, "stage_req", None)
    if s.stage is None or req is None:
        raise ValueError("FED_APPLY without FED_BEGIN")
    stage = s.stage
    if s.stage_got != len(stage) or P.crc32(stage) & 0xFFFFFFFF != req["crc"]:
        raise ValueError("the round's values arrived with %d of %d bytes, CRC %08x; expected CRC %08x"
                         % (s.stage_got, len(stage), P.crc32(stage) & 0xFFFFFFFF, req["crc"]))
    t = s.trainer()
    train = req["train"]
    if train:
        t.reset()               # the optimizer's state and counters start afresh each round
    mv = memoryview(stage)
    off = 0
    scales = bytearray()
    for name, enc, n, ch, inner in req["params"]:
        if enc == "f4":
            t.set_params({name: mv[off:off + 4 * n]})
            off += 4 * n
        else:
            sc = array("f", bytes(mv[off:off + 4 * ch]))    # bytes: MicroPython copies those raw
            scales += mv[off:off + 4 * ch]
            codes = mv[off + 4 * ch:off + 4 * ch + n]
            v = array("f", bytes(4 * n))
            for i in range(n):
                c = codes[i]
                v[i] = (c - 256 if c > 127 else c) * sc[(i // inner) % ch]
            t.set_params({name: v})
            v = None
            off += 4 * ch + n
    s.stage = s.stage_req = None
    gc.collect()
    if not train:               # evaluation of these values: no run, nothing checkpointed
        s.run, s.samples, s.fed = None, 0, None
        return json.dumps({"run": None, "samples": 0}).encode()
    meta = {"run": req["run"], "plan_crc": s.plan_crc, "seed": req["seed"], "samples": req["samples"],
            "params": req["params"], "crc": req["crc"]}
    _write_round(meta, scales)
    meta["scales"] = bytes(scales)
    s.fed = meta
    s.run, s.samples = req["run"], 0
    s.ck.save(s.checkpoint_meta())          # a reset from now on comes back to the round's start
    return json.dumps({"run": s.run, "samples": 0}).encode()


def local_train(s, p):
    t = s.trainer()
    start, count, flags = struct.unpack_from(P.TRAIN_HEAD, p, 0)
    fed = getattr(s, "fed", None)
    if fed is None or s.run != fed["run"]:
        raise ValueError("no federated round on the board: send FED_BEGIN and FED_APPLY first")
    count = max(0, min(count, fed["samples"] - start))
    skip = s.samples - start
    if skip < 0 or skip >= count:
        return struct.pack(P.TRAIN_REPLY, s.samples, 0, 0, 0.0, gc.mem_free())
    st = _store(s)
    n = st.count()
    order = getattr(s, "order", None)
    if order is None or order.n != n or order.seed != fed["seed"]:
        order = s.order = S.Order(n, fed["seed"])
    rec = st.record_bytes()
    nx = st.x_bytes()
    buf = bytearray(rec)
    mv = memoryview(buf)
    x = mv[:nx]
    ytarget = mv[nx:]

    def records(f):         # the round's samples in its order, read one at a time into buf
        for k in range(start + skip, start + count):
            f.seek(S.HEAD_LEN + order.record(k) * rec)
            f.readinto(buf)
            yield x, (struct.unpack_from("<i", buf, nx)[0] if s.ce else ytarget)

    with open(S.PATH, "rb") as f:
        return s.train_samples(t, records(f), count - skip, flags & P.TRAIN_ACCURACY)


def local_eval(s, p):
    t = s.trainer()
    start, count = struct.unpack_from(P.LOCAL_EVAL_HEAD, p, 0)
    st = _store(s)
    count = max(0, min(count, st.count() - start))
    rec, nx = st.record_bytes(), st.x_bytes()
    buf = bytearray(rec)
    mv = memoryview(buf)
    out = s.out
    correct, sse = 0, 0.0
    with open(S.PATH, "rb") as f:
        f.seek(S.HEAD_LEN + start * rec)
        for _ in range(count):
            f.readinto(buf)
            t.predict(mv[:nx], out)
            if s.ce:
                if _argmax(out) == struct.unpack_from("<i", buf, nx)[0]:
                    correct += 1
            else:
                y = struct.unpack_from("<%df" % t.output_len, buf, nx)
                for k in range(t.output_len):
                    sse += (out[k] - y[k]) ** 2
    return struct.pack(P.EVAL_REPLY, count, correct, sse)


def params(s, p):
    """The trained values in the round's encodings, kept for PARAM_READ (serve.py's)."""
    t = s.trainer()
    fed = getattr(s, "fed", None)
    if fed is None or s.run != fed["run"]:
        raise ValueError("no federated round on the board to read")
    s.params = None
    gc.collect()
    values = t.params()
    out = []
    soff = 0
    sc_all = fed["scales"]
    for name, enc, n, ch, inner in fed["params"]:
        v = values.pop(name)
        if enc == "f4":
            out.append((name, bytes(v)))
        else:
            sc = array("f", bytes(sc_all[soff:soff + 4 * ch]))
            soff += 4 * ch
            codes = bytearray(n)            # the host has the scales: the codes alone go back
            for i in range(n):
                codes[i] = round(v[i] / sc[(i // inner) % ch]) & 0xFF
            out.append((name, bytes(codes)))
        v = None
    values = None
    gc.collect()
    s.params = out
    return json.dumps([[k, len(b)] for k, b in out]).encode()
