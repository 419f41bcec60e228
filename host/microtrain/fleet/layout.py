"""What of a plan crosses the link in a federated round, and how.

Only the plan's trainable parameters travel (a sparse plan's biases, channel slices and
head; a last-layer plan's last layer), each in the encoding the board's side takes
(fedround.py on the board):

    f4  float32 values, both ways
    i8  an int8 trained weight (compile(trained_weights="int8")): down, its channels' float32
        scales and one int8 code per value; up, the codes alone

Flower's records carry the real values (float32, code x scale for an int8 weight) under
the plan's parameter names in Simulator.params()' shapes, so any flwr strategy averages
real values; `requantize` puts an averaged int8 weight back on its codes with the plan's
scales (round half to even, as the C core's mt_set_param), so the global model is one the
boards hold exactly."""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

import numpy as np

from ..device import protocol as P


@dataclass
class Param:
    name: str
    enc: str                # "f4" or "i8"
    n: int                  # values
    shape: tuple            # as Simulator.params() gives it (the ONNX initializer's shape)
    channels: int = 1       # i8: scales; value i has scale[(i // inner) % channels]
    inner: int = 1
    scales: np.ndarray = None

    @property
    def down_bytes(self):
        return 4 * self.n if self.enc == "f4" else 4 * self.channels + self.n

    @property
    def up_bytes(self):
        return 4 * self.n if self.enc == "f4" else self.n

    def channel_of(self):
        return (np.arange(self.n) // self.inner) % self.channels


class Layout:
    """The trainable parameters of a plan, in plan order, and their encodings. The server sends
    it to the clients with each round (to_config), so a client needs no copy of the plan."""

    def __init__(self, plan):
        self.plan = plan
        self.crc = zlib.crc32(plan.data)
        shapes = plan.meta.get("param_shapes", {})
        self.params = []
        for name in plan.params():
            t = plan.tensors[plan.tensor_index(name)]
            n = int(np.prod(t["shape"]))
            shape = tuple(shapes.get(name, t["shape"]))
            if t["dtype"] == "I8":
                q = t["quant"]
                scales = np.asarray(q.scale, np.float32).reshape(-1)
                inner = int(np.prod(t["shape"][q.axis + 1:]))
                self.params.append(Param(name, "i8", n, shape, len(scales), inner, scales))
            else:
                self.params.append(Param(name, "f4", n, shape))
        self.by_name = {p.name: p for p in self.params}

    def to_config(self):
        """{"plan-crc", "layout" (JSON), "scales" (bytes)}: for a Flower ConfigRecord."""
        desc = [[p.name, p.enc, p.n, list(p.shape), p.channels, p.inner] for p in self.params]
        scales = b"".join(p.scales.astype("<f4").tobytes() for p in self.params if p.enc == "i8")
        return {"plan-crc": self.crc, "layout": json.dumps(desc), "scales": scales}

    @classmethod
    def from_config(cls, config):
        self = cls.__new__(cls)
        self.plan = None
        self.crc = int(config["plan-crc"])
        scales = bytes(config["scales"])
        self.params, off = [], 0
        for name, enc, n, shape, ch, inner in json.loads(config["layout"]):
            sc = None
            if enc == "i8":
                sc = np.frombuffer(scales, "<f4", ch, off).astype(np.float32)
                off += 4 * ch
            self.params.append(Param(name, enc, n, tuple(shape), ch, inner, sc))
        self.by_name = {p.name: p for p in self.params}
        return self

    # ---- sizes ----
    @property
    def down_bytes(self):
        return sum(p.down_bytes for p in self.params)

    @property
    def up_bytes(self):
        return sum(p.up_bytes for p in self.params)

    def describe(self):
        return [[p.name, p.enc, p.n, p.channels, p.inner] for p in self.params]

    # ---- values ----
    def check(self, params, who="the values"):
        """ValueError naming the first parameter that is missing, extra or of another shape."""
        names = set(params)
        want = set(self.by_name)
        if names != want:
            missing, extra = sorted(want - names), sorted(names - want)
            raise ValueError("%s do not match the plan's trainable parameters (%s%s)"
                             % (who, "missing %s" % ", ".join(missing) if missing else "",
                                ("; " if missing and extra else "") + ("not in the plan: %s" % ", ".join(extra)
                                                                       if extra else "")))
        for p in self.params:
            a = np.asarray(params[p.name])
            if a.size != p.n:
                raise ValueError("%s: %s has %d values, the plan's has %d" % (who, p.name, a.size, p.n))

    def requantize(self, params):
        """params with every int8 weight rounded to its codes (the plan's scales) and back to
        float32 code x scale; float parameters as float32."""
        out = {}
        for p in self.params:
            v = np.asarray(params[p.name], np.float32).reshape(-1)
            if p.enc == "i8":
                v = self.codes(p, v).astype(np.float32) * p.scales[p.channel_of()]
            out[p.name] = v.astype(np.float32).reshape(p.shape)
        return out

    @staticmethod
    def codes(p, values):
        s = p.scales[p.channel_of()]
        return np.clip(np.rint(np.asarray(values, np.float32).reshape(-1) / s), -127, 127).astype(np.int8)

    def encode(self, params):
        """The bytes of FED_WRITE for these values (requantized first) and their CRC."""
        parts = []
        for p in self.params:
            v = np.asarray(params[p.name], np.float32).reshape(-1)
            if p.enc == "f4":
                parts.append(v.astype("<f4").tobytes())
            else:
                parts.append(p.scales.astype("<f4").tobytes() + self.codes(p, v).tobytes())
        data = b"".join(parts)
        return data, zlib.crc32(data)

    def decode(self, name, data):
        """A parameter's values from the bytes the board sent (FED_PARAMS)."""
        p = self.by_name[name]
        if len(data) != p.up_bytes:
            raise ValueError("the board sent %d bytes for %s, expected %d" % (len(data), name, p.up_bytes))
        if p.enc == "f4":
            v = np.frombuffer(data, "<f4").astype(np.float32)
        else:
            v = np.frombuffer(data, np.int8).astype(np.float32) * p.scales[p.channel_of()]
        return v.astype(np.float32).reshape(p.shape)

    def values_crc(self, params):
        return self.encode(params)[1]


def frames(payload_bytes, max_payload=P.MAX_PAYLOAD - 4):
    """Frames needed to carry payload_bytes of values (FED_WRITE / PARAM_READ pieces)."""
    return -(-payload_bytes // max_payload) if payload_bytes else 0
