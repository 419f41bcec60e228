"""The plan format has one definition (host/microtrain/format.py); these prove
the C header and the C core agree with it."""
import os
import subprocess
import sys
import zlib

import numpy as np

from microtrain import format as F
from microtrain.native import crc32, lib

from repo import ROOT


def test_committed_header_is_generated_from_format_py():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "host", "microtrain", "format.py")],
                         capture_output=True, text=True, check=True).stdout
    with open(os.path.join(ROOT, "modules", "microtrain", "mt_format.h")) as f:
        assert f.read() == out, "mt_format.h is stale: run `make header`"


def test_struct_sizes_are_aligned():
    assert F.HEADER_BYTES % F.ALIGN == 0
    assert F.TENSOR_BYTES % 4 == 0


def test_c_crc32_matches_zlib():
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 64, 1000):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32(data) == zlib.crc32(data)


def test_c_error_strings_match_format_py():
    from microtrain.native import ffi
    for code, (_, msg) in enumerate(F.ERRORS, start=1):
        assert ffi.string(lib.mt_strerror(code)).decode() == msg
    assert ffi.string(lib.mt_strerror(len(F.ERRORS) + 1)).decode() == "unknown error"


def test_opcodes_unique_and_slot_limits():
    codes = [op.code for op in F.OPS]
    assert len(codes) == len(set(codes))
    for op in F.OPS:
        assert len(op.slots) <= F.MAX_SLOTS and len(op.attrs) <= F.MAX_ATTRS
        for out, inp in op.inplace:
            assert op.slots[op.slot_index(out)].role == "out" and op.slots[op.slot_index(inp)].role == "in"


def test_plan_format_doc_tables_are_current():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "host", "microtrain", "format.py"), "--markdown"],
                         capture_output=True, text=True, check=True).stdout
    with open(os.path.join(ROOT, "docs", "plan-format.md")) as f:
        doc = f.read()
    start = doc.index("<!-- generated: python host/microtrain/format.py --markdown -->\n")
    end = doc.index("<!-- end generated -->")
    assert doc[doc.index("\n", start) + 1:end] == out, "docs/plan-format.md tables are stale: run `make header`"


def test_attribute_groups_lead_the_attributes_of_every_op_that_has_them():
    """The C core names a group's attributes once (MT_CONV_A_STRIDE_H for all three convolution ops)."""
    for op in F.OPS:
        for group in F.ATTR_GROUPS.values():
            if set(group) <= set(op.attrs):
                assert tuple(op.attrs[:len(group)]) == group, op.name


def test_record_packing_round_trips():
    rec = F.pack_op(3, 1, [5, None, 7], [1, -2, 3])
    assert len(rec) % 4 == 0
    assert F.unpack_op(b"xx" + rec, 2) == (3, 1, [5, None, 7], [1, -2, 3], 2 + len(rec))
    fields = {name: i + 1 for i, (name, _) in enumerate(F.TENSOR_FIELDS)}
    assert F.unpack_tensor(F.pack_tensor(**fields), 0) == fields
