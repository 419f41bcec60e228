"""The runtime context read in place from the plan (mt_plan.c's context section, plan.with_context).

The compiler appends to every plan the context the C core decodes from it at attach (op records,
then the parameter table), so that a board reads it from flash instead of decoding it into RAM.
The oracle is the same plan without that section, decoded into RAM as before:
* compiled plans carry it and use it: the Trainer's RAM is arena + state, the context's bytes less;
  20 steps with momentum (a float plan, and int8 plans from both exporters) give the losses,
  outputs and parameters of the plan without it, bit for bit;
* a section that is not what the core prepares (a damaged byte in a record, in the parameter
  table, or the last byte; a section 4 bytes short or 8 long) is not used: the plan loads with the
  context in RAM and trains as the plan without it;
* a section outside the file, misaligned, or an offset without bytes is refused at load;
* a section changed between mt_load and mt_attach is refused at attach, as a changed op list is.
"""
import struct
import zlib

import numpy as np
import pytest

import int8_models as M
import microtrain
import models
from microtrain import format as F
from microtrain.native import Core, PlanError, error_text, ffi, lib

HO = F.header_offsets()
SHAPE = (1, 3, 12, 12)


def header(data):
    return dict(zip((n for n, _ in F.HEADER_FIELDS), F.HEADER_STRUCT.unpack_from(data, 0)))


def with_header(data, **fields):
    """data with header fields replaced (file_bytes: the file cut or padded to it), the CRC fixed."""
    h = header(data)
    h.update(fields)
    b = bytearray(data[:h["file_bytes"]]) + bytes(max(0, h["file_bytes"] - len(data)))
    b[:F.HEADER_BYTES] = F.HEADER_STRUCT.pack(*h.values())
    b[HO["crc32"]:HO["crc32"] + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


def without_section(data):
    h = header(data)
    return with_header(data, file_bytes=h["context_off"], context_off=0, context_bytes=0)


def damaged(data, at):
    """data with byte `at` of its context section flipped."""
    b = bytearray(data)
    b[header(data)["context_off"] + at] ^= 0x01
    return with_header(bytes(b))


def int8_plan(tmp_path, exporter):
    src = M.export(M.Block(cin=3, width=8, expand=24), str(tmp_path / ("block-%s.onnx" % exporter)), exporter,
                   shape=SHAPE)
    layers = microtrain.compile(src, update="last-layer").meta["layers"]
    rng = np.random.default_rng(1)
    return microtrain.compile(src, quantize="int8", input_dtype="uint8", input_quant=(1 / 255, 0), lr=0.05,
                              momentum=0.9, calibration=rng.uniform(0, 1, (16,) + SHAPE[1:]).astype(np.float32),
                              update=[layers[-2]["bias"], layers[-2]["weight"], layers[-1]["weight"],
                                      layers[-1]["bias"]])


def float_plan():
    return microtrain.compile(models.cnn(), update="full", lr=0.05, momentum=0.9, batch=2)


def run(core, steps=20, seed=3):
    """(losses, outputs, parameters) after `steps` labelled steps on random inputs."""
    rng = np.random.default_rng(seed)
    n, dtype = lib.mt_input_len(core.ctx), {"float32": np.float32, "uint8": np.uint8}[core.input_dtype]
    xs = [rng.integers(0, 256, n).astype(dtype) if dtype == np.uint8 else rng.normal(size=n).astype(dtype)
          for _ in range(steps)]
    losses = [core.step_label(x, k % 4) for k, x in enumerate(xs)]
    return losses, core.predict(xs[0]), [core.param_values(n) for n in core.param_names]


def assert_same_run(a, b):
    ra, rb = run(a), run(b)
    assert np.array_equal(np.float32(ra[0]), np.float32(rb[0]))
    assert ra[1].tobytes() == rb[1].tobytes()
    assert all(p.tobytes() == q.tobytes() for p, q in zip(ra[2], rb[2]))


@pytest.fixture(scope="module", params=["float", "int8-ts", "int8-dynamo"])
def plan(request, tmp_path_factory):
    if request.param == "float":
        return float_plan()
    return int8_plan(tmp_path_factory.mktemp("ctx"), request.param.split("-")[1])


def test_the_context_is_read_in_place_and_trains_as_decoded(plan):
    r = plan.report()
    assert r["context_in_plan"] and r["context_ram_bytes"] == 0 and r["context_bytes"] > 0
    assert r["ram_bytes"] == r["peak_ram_bytes"] == r["arena_bytes"] + r["param_bytes"]
    h = header(plan.data)
    assert h["context_bytes"] == r["context_bytes"] and h["context_off"] + h["context_bytes"] == len(plan.data)
    inplace, decoded = Core(plan.data), Core(without_section(plan.data))
    assert inplace.info()["context_in_plan"] and not decoded.info()["context_in_plan"]
    assert inplace.ram_bytes == decoded.ram_bytes - r["context_bytes"]
    assert inplace.context_image() == decoded.context_image() == plan.data[h["context_off"]:]
    # the run reads the plan's bytes, not a copy in the RAM it was given
    assert int(ffi.cast("uintptr_t", inplace._plan)) + h["context_off"] == int(ffi.cast("uintptr_t", inplace.ctx.context))
    losses = run(inplace)[0]
    assert_same_run(Core(plan.data), decoded)
    assert len(set(np.float32(losses).tolist())) > 1   # it trained


@pytest.mark.parametrize("where", ["first record", "parameter table", "last byte"])
def test_a_section_that_is_not_the_cores_context_is_decoded_into_ram(plan, where):
    h = header(plan.data)
    at = {"first record": 4, "parameter table": h["context_bytes"] - 40, "last byte": h["context_bytes"] - 1}[where]
    bad = damaged(plan.data, at)
    core = Core(bad)
    assert not core.info()["context_in_plan"]
    assert core.ram_bytes == Core(plan.data).ram_bytes + h["context_bytes"]
    assert core.context_image() == plan.data[h["context_off"]:]   # decoded, not taken from the section
    assert_same_run(core, Core(without_section(plan.data)))


@pytest.mark.parametrize("change", [-4, 8])
def test_a_section_shorter_or_longer_than_the_context_is_decoded_into_ram(plan, change):
    """4 bytes short; or the context and 8 zero bytes after it."""
    h = header(plan.data)
    other = with_header(plan.data, context_bytes=h["context_bytes"] + change, file_bytes=len(plan.data) + change)
    assert not Core(other).info()["context_in_plan"]
    assert_same_run(Core(other), Core(without_section(plan.data)))


BAD_SECTIONS = {   # header fields from the good plan's (h) and the plan without its section (bare)
    "misaligned": lambda h, bare: dict(context_off=h["context_off"] + 4),
    "inside the header": lambda h, bare: dict(context_off=0),
    "past the file": lambda h, bare: dict(context_bytes=10 ** 6),
    "bytes without an offset": lambda h, bare: dict(context_off=0, context_bytes=8),
    "an offset without bytes": lambda h, bare: dict(context_off=bare["file_bytes"] - 8, context_bytes=0),
}


@pytest.mark.parametrize("what", sorted(BAD_SECTIONS))
def test_a_section_outside_the_file_or_misaligned_is_refused(what):
    data = float_plan().data
    bare = without_section(data)
    base = bare if what == "an offset without bytes" else data
    with pytest.raises(PlanError, match="section"):
        Core(with_header(base, **BAD_SECTIONS[what](header(data), header(bare))))


def test_the_binding_for_a_writable_buffer_decodes_the_context_into_ram(plan):
    """mt_context_in_ram (modmicrotrain.c calls it for a bytearray): the records run are the
    validated copy in RAM; only between mt_load and mt_attach."""
    core = Core(plan.data, context_in_ram=True)
    assert not core.info()["context_in_plan"] and core.ram_bytes == Core(plan.data).ram_bytes + plan.context_bytes
    assert int(ffi.cast("uintptr_t", core.ctx.context)) == int(ffi.cast("uintptr_t", core._ram)) + plan.ram_bytes
    assert_same_run(core, Core(without_section(plan.data)))
    assert "no plan loaded or no RAM attached" in error_text(core.ctx, lib.mt_context_in_ram(core.ctx))


def test_a_section_changed_between_load_and_attach_is_refused():
    data = float_plan().data
    h = header(data)
    buf = ffi.new("uint64_t[]", (len(data) + 7) // 8)
    ffi.memmove(buf, data, len(data))
    ctx = ffi.new("mt_ctx_t *")
    assert lib.mt_load(ctx, buf, len(data)) == 0 and ctx.context_in_plan
    n = lib.mt_ram_bytes(ctx)
    ffi.cast("uint8_t *", buf)[h["context_off"] + 4] ^= 1
    ram = ffi.new("uint64_t[]", (n + 7) // 8)
    err = lib.mt_attach(ctx, ram, n)
    assert "changed" in error_text(ctx, err)


def test_deploy_warns_when_the_board_decodes_the_context_into_ram(plan):
    """What a board whose core prepares other records reports (a damaged section stands in for
    them: the same C, decoding into RAM) makes Board.deploy warn, naming the RAM it costs; a board
    that reads the plan's section makes it say nothing."""
    from microtrain.device.board import _warn_context
    h = header(plan.data)
    fallback = Core(damaged(plan.data, 4)).info()
    with pytest.warns(RuntimeWarning, match=r"runtime context into RAM \(%d bytes more" % h["context_bytes"]):
        _warn_context(plan, {"trainer": fallback})
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_context(plan, {"trainer": Core(plan.data).info()})
        _warn_context(plan, {"trainer": None})
