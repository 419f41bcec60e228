"""Mutated plans for the device test (tests/device/micropython/mutated_plans.py): bit flips,
truncations, trailing bytes, swapped fields, huge dimensions, offsets past their
region, out-of-range op slots and attributes; the CRC fixed for most, so that the
validator behind it is what gets tested.

A case is (base plan index, length to keep or -1, fix_crc, [(position, xor mask)]):
the device rebuilds it from the base plan, and recomputes the CRC over bytes
[16:] itself (binascii.crc32), so the cases travel as a few bytes each (pack()).
"""
import struct
import zlib

import numpy as np

from microtrain import format as F

HO = F.header_offsets()
TO = F.tensor_offsets()
KINDS = ("bit flip", "bit flip, CRC fixed", "truncated", "trailing bytes", "swapped fields", "huge dimension",
         "offset past its region", "op slot or attribute")


def build(base, length, fix, patches, tail=b""):
    """The mutated plan bytes of a case (the device's make() does the same)."""
    b = bytearray(base if length < 0 else base[:length])
    for pos, mask in patches:
        b[pos] ^= mask
    b += tail
    if fix and len(b) >= F.HEADER_BYTES:
        b[HO["crc32"]:HO["crc32"] + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


def _diff(a, b):
    return [(i, x ^ y) for i, (x, y) in enumerate(zip(a, b)) if x != y and not HO["crc32"] <= i < HO["crc32"] + 4]


def _ops(data, h):
    pos, out = h["ops_off"], []
    for _ in range(h["n_ops"]):
        start = pos
        code, _, slots, attrs, pos = F.unpack_op(data, pos)
        out.append((start, len(slots), len(attrs)))
    return out


def cases(bases, n=1000, seed=11):
    """n cases over the base plans (a list of bytes): [(kind, base, length, fix, patches, tail)]."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        kind = KINDS[k % len(KINDS)]
        bi = int(rng.integers(len(bases)))
        data = bases[bi]
        h = dict(zip((f for f, _ in F.HEADER_FIELDS), F.HEADER_STRUCT.unpack_from(data, 0)))
        end = h["ops_off"] + h["ops_bytes"]
        b = bytearray(data)
        length, fix, tail = -1, True, b""
        rec = lambda i: h["tensors_off"] + i * F.TENSOR_BYTES   # noqa: E731
        t = int(rng.integers(h["n_tensors"]))
        if kind == "bit flip":
            b[int(rng.integers(F.CRC_START, len(b)))] ^= 1 << int(rng.integers(8))
            fix = False
        elif kind == "bit flip, CRC fixed":
            b[int(rng.integers(F.CRC_START, end))] ^= 1 << int(rng.integers(8))
        elif kind == "truncated":
            length = int(rng.integers(0, len(b)))
            fix = rng.random() < 0.5
            if fix and length >= F.HEADER_BYTES:
                struct.pack_into("<I", b, HO["file_bytes"], length)   # a consistent size field: reach the sections
        elif kind == "trailing bytes":
            tail = bytes(int(rng.integers(1, 9)) * [0])
            fix = rng.random() < 0.5
            if fix:
                struct.pack_into("<I", b, HO["file_bytes"], len(b) + len(tail))
        elif kind == "swapped fields":
            u = int(rng.integers(h["n_tensors"]))
            name = ("offset", "bytes", "dim0", "dim1", "dim2", "dim3", "dtype", "storage", "flags")[int(rng.integers(9))]
            w = 4 if name.startswith(("off", "by", "dim")) else 1
            a0, a1 = rec(t) + TO[name], rec(u) + TO[name]
            b[a0:a0 + w], b[a1:a1 + w] = data[a1:a1 + w], data[a0:a0 + w]
            if rng.random() < 0.3:   # or two header fields of one width
                f0, f1 = rng.choice(["input_tensor", "target_tensor", "output_tensor", "batch"], 2, replace=False)
                b[HO[f0]:HO[f0] + 2], b[HO[f1]:HO[f1] + 2] = data[HO[f1]:HO[f1] + 2], data[HO[f0]:HO[f0] + 2]
        elif kind == "huge dimension":
            d = int(rng.integers(4))
            dim = int(rng.choice([1 << 16, 1 << 24, 1 << 28, (1 << 32) - 1, 1 << 31, 0]))
            struct.pack_into("<I", b, rec(t) + TO["dim%d" % d], dim)
            if rng.random() < 0.5:   # with a byte count to match, so the region check decides
                dims = struct.unpack_from("<4I", b, rec(t) + TO["dim0"])
                size = F.dtype_size(b[rec(t) + TO["dtype"]]) if b[rec(t) + TO["dtype"]] in (1, 2, 3, 4) else 4
                struct.pack_into("<I", b, rec(t) + TO["bytes"], int(np.prod(dims, dtype=object) * size) & 0xFFFFFFFF)
        elif kind == "offset past its region":
            storage = data[rec(t) + TO["storage"]]
            region = {0: h["arena_bytes"], 2: h["state_bytes"]}.get(storage, h["data_bytes"])
            nbytes = struct.unpack_from("<I", data, rec(t) + TO["bytes"])[0]
            off = int(rng.choice([region - nbytes + 8, region, region + 8, 1 << 20, 0xFFFFFFF8, region - 4]))
            struct.pack_into("<I", b, rec(t) + TO["offset"], off & 0xFFFFFFFF)
            if rng.random() < 0.3:   # or the region shrunk under its tensors
                field = ("arena_bytes", "state_bytes")[int(rng.integers(2))]
                struct.pack_into("<I", b, HO[field], max(0, h[field] - 8 * int(rng.integers(1, 8))))
        else:
            ops = _ops(data, h)
            at, n_t, n_a = ops[int(rng.integers(len(ops)))]
            if rng.random() < 0.5 and n_t:
                v = int(rng.choice([F.NO_TENSOR, h["n_tensors"], int(rng.integers(h["n_tensors"]))]))
                struct.pack_into("<H", b, at + F.OP_HEAD_BYTES + 2 * int(rng.integers(n_t)), v)
            elif n_a:
                a = at + F.OP_HEAD_BYTES + ((2 * n_t + 3) & ~3) + 4 * int(rng.integers(n_a))
                v = int(rng.choice([0, -1, 1, 2, 65535, 65536, -(1 << 31), (1 << 31) - 1, 0x7FC00000]))
                struct.pack_into("<i", b, a, v)
            else:
                b[at + int(rng.integers(4))] ^= 1 << int(rng.integers(8))
        patches = _diff(data, b[:len(data)])
        if length >= 0:
            patches = [(p, m) for p, m in patches if p < length]
        out.append((kind, bi, length, fix, patches, tail))
    return out


def pack(case_list):
    """The cases as bytes: per case u8 base, u8 flags (1: fix the CRC), u16 length
    (0xFFFF: all), u8 trailing zero bytes, u8 n, then n times (u16 position, u8 xor)."""
    out = bytearray()
    for _, bi, length, fix, patches, tail in case_list:
        assert len(patches) < 256 and (length < 0 or length < 0xFFFF) and not tail.strip(b"\0")
        out += struct.pack("<BBHBB", bi, int(fix), 0xFFFF if length < 0 else length, len(tail), len(patches))
        for pos, mask in patches:
            out += struct.pack("<HB", pos, mask)
    return bytes(out)
