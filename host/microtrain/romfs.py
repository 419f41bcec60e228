"""ROMFS images (MicroPython's read-only filesystem in flash) that hold plans where the core
can read them in place.

The core reads a plan's constants through 4-byte (float, int32) pointers, so a plan must
start at an aligned address; mpremote's own `romfs build` packs files byte after byte, and
a Trainer given a misaligned plan copies it into the heap. This writer lays out the same
ROMFS format (MicroPython's extmod/vfs_rom.c: records of varint kind and length) with every
file's data starting at a multiple of 8 bytes from the image start, which the partition
keeps aligned:

    image = header (8 bytes) | for each file: padding record, data record | file records

Each file record names its data with a DATA_POINTER record. Deploy the image with
`mpremote romfs deploy image.romfs`; on the board, `open("/rom/plan.mtp", "rb")` is a
buffer in flash and `microtrain.Trainer(f)` reads it where it is (firmware/README.md).
"""
from __future__ import annotations

import os

HEADER = b"\xd2\xcd\x31"      # the FILESYSTEM record kind, as a varint
PADDING, DATA_VERBATIM, DATA_POINTER, FILE = 1, 2, 3, 5
ALIGN = 8
LEN_BYTES = 5                 # lengths as fixed 5-byte varints (leading 0x80s add nothing)


def _uint(value, width=None):
    """MicroPython's varint: 7 bits a byte, most significant first; padded to width with 0x80."""
    out = [value & 0x7F]
    value >>= 7
    while value:
        out.insert(0, 0x80 | (value & 0x7F))
        value >>= 7
    if width is not None:
        if len(out) > width:
            raise ValueError("value too large for a %d-byte length" % width)
        out = [0x80] * (width - len(out)) + out
    return bytes(out)


def _record(kind, payload, width=None):
    return _uint(kind) + _uint(len(payload), width) + payload


def build(files):
    """A ROMFS image of {name: bytes} (names without '/'), each file's data 8-byte aligned."""
    body = bytearray()
    pointers = []
    start = len(HEADER) + LEN_BYTES            # the filesystem's payload: offsets count from here
    assert start % ALIGN == 0
    for name, data in files.items():
        if "/" in name or not name or not name.isascii():
            raise ValueError("ROMFS file names here are plain ASCII names without '/': %r" % name)
        head = 1 + LEN_BYTES                   # kind + length of the data record
        pad = (-(start + len(body) + 2 + head)) % ALIGN   # a padding record is 2 bytes at least
        body += _record(PADDING, b"\0" * pad)
        body += _uint(DATA_VERBATIM) + _uint(len(data), LEN_BYTES)
        offset = len(body)
        assert (start + offset) % ALIGN == 0
        body += data
        pointers.append((name, len(data), offset))
    for name, size, offset in pointers:
        payload = _uint(len(name)) + name.encode("ascii") + _record(DATA_POINTER, _uint(size) + _uint(offset))
        body += _record(FILE, payload)
    return HEADER + _uint(len(body), LEN_BYTES) + bytes(body)


def build_from_paths(paths):
    """An image of the given files (a directory: its files), under their base names."""
    files = {}
    for p in paths:
        entries = [os.path.join(p, n) for n in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
        for e in entries:
            if os.path.isfile(e):
                with open(e, "rb") as f:
                    files[os.path.basename(e)] = f.read()
    if not files:
        raise ValueError("no files to put in the ROMFS image")
    return build(files)


RP2040_FAMILY = 0xE48BFF56      # UF2 family ID the RP2040 boot ROM accepts
UF2_PAYLOAD = 256               # the RP2040 boot ROM takes 256-byte, 256-aligned payloads only


def to_uf2(data, address, family=RP2040_FAMILY):
    """`data` as a UF2 file that writes it to flash at `address` (a board's ROMFS partition,
    e.g. 0x10080000 for firmware/rp2/RPI_PICO_ROMFS): copied onto a Pico's BOOTSEL drive, or
    loaded by tests/device/rp2040js/run.mjs after the firmware. The tail is padded with 0xFF, as
    erased flash reads."""
    if address % UF2_PAYLOAD:
        raise ValueError("UF2 address 0x%x is not a multiple of %d" % (address, UF2_PAYLOAD))
    data = bytes(data) + b"\xff" * (-len(data) % UF2_PAYLOAD)
    n = len(data) // UF2_PAYLOAD
    out = bytearray()
    for i in range(n):
        head = [0x0A324655, 0x9E5D5157, 0x00002000, address + i * UF2_PAYLOAD, UF2_PAYLOAD, i, n, family]
        block = b"".join(v.to_bytes(4, "little") for v in head) + data[i * UF2_PAYLOAD:(i + 1) * UF2_PAYLOAD]
        out += block + b"\0" * (508 - len(block)) + (0x0AB16F30).to_bytes(4, "little")
    return bytes(out)
