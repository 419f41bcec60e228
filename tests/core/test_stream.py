"""A plan's constants streamed from its file (compile(stream=True), stream.py, mt_stream.c).

* Bit-identical: a plan with a stream section, run whole in memory and by its head (mt_load_head,
  each group read from the file into its window just before its ops), gives the losses,
  predictions and parameters of the same model compiled without one, bit for bit, over steps with
  momentum; also with a window small enough that an expansion block's ops (PWDW_W8 and its
  backward) consume their constants in blocks of output channels.
* By its head only the head is in memory and every training step reads its groups again.
* Faults: a group whose bytes changed in the file, or that the file no longer holds (truncated or a
  read error), fails the step with the core's message and updates nothing; a group record outside
  the arena is refused at load.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import microtrain
from microtrain import format as F
from microtrain.native import Core, PlanError, PlanFile

import models
from oracle_models import export
from test_dw_stream import INT8, SCHEMES, MBBlock

STEPS = 3
LR = 0.05


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    cnn = d / "cnn.onnx"
    cnn.write_bytes(models.cnn(seed=3).SerializeToString())
    block = export(MBBlock(1, 3).eval(), torch.zeros(1, 3, 8, 8), "ts13", str(d / "mb.onnx"))
    return {"cnn": str(cnn), "mb": block}


CASES = {   # name: (model, compile options)
    "cnn float32": ("cnn", dict(update="full", momentum=0.9, lr=LR)),
    "cnn last-layer": ("cnn", dict(update="last-layer", momentum=0.9, lr=LR)),
    "mb int8 split": ("mb", dict(INT8, update=SCHEMES["split"], momentum=0.9, lr=LR)),
    "mb int8 biases": ("mb", dict(INT8, update=SCHEMES["biases"], momentum=0.9, lr=LR)),
}


def data(shape, n=STEPS):
    rng = np.random.default_rng(5)
    return rng.normal(size=(n,) + shape).astype(np.float32), rng.integers(0, 4, n)


def run(core, plan, xs, ys):
    """Bytes of everything the steps compute: predictions, losses, then each parameter."""
    out = [core.predict(xs[0]).tobytes()]
    for x, y in zip(xs, ys):
        out.append(np.float32(core.step_label(x, int(y))).tobytes())
        out.append(core.predict(x).tobytes())
    return out + [core.param(n).tobytes() for n in core.param_names]


def input_shape(plan):
    return tuple(plan.meta["input"]["shape"][1:])


@pytest.mark.parametrize("window", [None, 256])
@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_plan_computes_what_the_resident_plan_computes(paths, case, window):
    model, kw = CASES[case]
    resident = microtrain.compile(paths[model], **kw)
    streamed = microtrain.compile(paths[model], stream=True, stream_window=window, **kw)
    h = streamed.header
    assert h["stream_off"] and h["n_groups"] and resident.header["stream_off"] == 0
    xs, ys = data(input_shape(resident))
    want = run(Core(resident.data), resident, xs, ys)
    assert run(Core(streamed.data), streamed, xs, ys) == want   # whole in memory: in place
    core = Core(streamed.data, stream=True)
    assert run(core, streamed, xs, ys) == want                  # by its head: read from the file
    info = core.info()
    r = streamed.report()
    assert info["streamed"] and info["head_bytes"] == h["stream_off"] < len(streamed.data)
    # reset reads the initial values' group; every step reads the groups of its ops
    # (a plan that trains everything has no frozen constants: only the initial values are streamed)
    assert (r["reads_per_step"] > 0) == (kw["update"] != "full")
    assert info["stream_reads"] >= STEPS * r["reads_per_step"] + 1
    assert info["stream_read_bytes"] >= STEPS * r["read_per_step"] + r["param_bytes"] // 2
    if window is not None and model == "mb":   # the expansion block's ops read their constants in blocks
        assert any("blocks of output channels" in n for n in r["notes"]), r["notes"]
        assert r["window_bytes"] <= window


class Changed(PlanFile):
    """The plan's file as it is when the Trainer opens it, then `change` applied to its bytes."""

    def __init__(self, data):
        super().__init__(data)
        self.later = None

    def read_at(self, offset, n):
        d = self.data if self.later is None else self.later
        self.reads += 1
        return d[offset:offset + n]


def op_group(plan, which):
    """The file offset and size of the first or the last group a training step reads (the last: of a
    backward op where the plan has one, after ops that compute gradients)."""
    g = [g for g in plan.groups if g["first_op"] != F.RESET_GROUP][0 if which == "first" else -1]
    return plan.header["stream_off"] + g["lo"], g["bytes"]


@pytest.mark.parametrize("which", ["first", "last"])
@pytest.mark.parametrize("fault", ["changed byte", "truncated", "read error"])
@pytest.mark.parametrize("case", ["cnn last-layer", "mb int8 split"])
def test_a_group_that_reads_otherwise_fails_the_step_and_updates_nothing(paths, case, fault, which):
    model, kw = CASES[case]
    plan = microtrain.compile(paths[model], stream=True, **kw)
    xs, ys = data(input_shape(plan))
    f = Changed(plan.data)
    core = Core(plan.data, stream=f)
    core.step_label(xs[0], int(ys[0]))
    before = [core.param(n).tobytes() for n in core.param_names], core.steps
    at, n = op_group(plan, which)
    if which == "last" and case == "mb int8 split":   # a backward op's: the expansion block's trains before it
        assert plan.ops[[g for g in plan.groups if g["first_op"] != F.RESET_GROUP][-1]["first_op"]]["phase"] == "TRAIN"
    if fault == "changed byte":
        later = bytearray(plan.data)
        later[at + n // 2] ^= 0x10
        f.later = bytes(later)
        message = "do not match their CRC"
    elif fault == "truncated":
        f.later = plan.data[:at + n - 1]
        message = "reading the plan's constants from its file failed"
    else:
        def fail(offset, n):
            raise OSError(5, "EIO")
        f.read_at = fail
        message = "reading the plan's constants from its file failed"
    with pytest.raises(ValueError, match=message):
        core.step_label(xs[1], int(ys[1]))
    assert ([core.param(n).tobytes() for n in core.param_names], core.steps) == before
    if fault != "read error":   # the file as it was: the next step runs as if nothing had happened
        f.later = None
        core.step_label(xs[1], int(ys[1]))
        assert core.steps == before[1] + 1


def reseal(data, patch):
    """data with patch(bytearray, header) applied and the plan's CRCs made right again."""
    b = bytearray(data)
    h = F.HEADER_STRUCT.unpack_from(b, 0)
    hd = dict(zip((n for n, _ in F.HEADER_FIELDS), h))
    patch(b, hd)
    so = hd["stream_off"]
    hd["stream_crc32"] = zlib.crc32(bytes(b[so:])) if so else 0
    b[:F.HEADER_BYTES] = F.HEADER_STRUCT.pack(*[hd[n] for n, _ in F.HEADER_FIELDS])
    crc = F.header_offsets()["crc32"]
    b[crc:crc + 4] = zlib.crc32(bytes(b[F.CRC_START:])).to_bytes(4, "little")
    return bytes(b)


@pytest.mark.parametrize("field, value", [("window", "arena"), ("lo", "section"), ("first_op", "ops"),
                                          ("crc32", "wrong")])
def test_bad_group_records_are_refused(paths, field, value):
    model, kw = CASES["cnn last-layer"]
    plan = microtrain.compile(paths[model], stream=True, **kw)
    k = next(k for k, g in enumerate(plan.groups) if g["first_op"] != F.RESET_GROUP)

    def patch(b, hd):
        at = hd["groups_off"] + k * F.GROUP_BYTES
        g = F.unpack_group(b, at)
        g[field] = {"arena": hd["arena_bytes"], "section": hd["stream_bytes"], "ops": hd["n_ops"],
                    "wrong": g["crc32"] ^ 1}[value]
        b[at:at + F.GROUP_BYTES] = F.pack_group(**g)

    bad = reseal(plan.data, patch)
    assert reseal(plan.data, lambda b, hd: None) == plan.data   # reseal itself changes nothing
    if field == "crc32":   # the file's word on a group's bytes: checked as it is read, first at attach
        Core(bad)   # in memory the group is never read: the file's CRC covers it
        with pytest.raises(PlanError, match="cannot attach RAM: .*do not match their CRC"):
            Core(bad, stream=True)
        return
    for stream in (None, True):
        with pytest.raises(PlanError, match="invalid stream group record"):
            Core(bad, stream=stream)


def test_mcunet_49kb_streamed_fits_the_pico_and_trains_alike():
    """MCUNet-5fps with MIT's 49kb scheme (int8 frozen part): whole in RAM it needs over 670 KB of the
    Pico's heap (the plan itself is 575 KB); streamed, under 150 KB, and by its head it computes
    the resident plan's losses and parameters bit for bit over 3 steps."""
    from microtrain import boards
    from tte_parity import tte
    path, opts = tte("mcunet-5fps", "49kb")
    opts["momentum"] = 0.0   # as benchmarks/pico_romfs.py runs it on the Pico (issue 28's figures)
    resident = microtrain.compile(path, **opts)
    streamed = microtrain.compile(path, stream=True, **opts)
    pico = boards.load_board("rpi_pico")
    r = streamed.report()
    assert boards.placement(r, pico) == "streamed" and boards.placement(resident.report(), pico) == "in RAM"
    need = sum(boards.ram_needed(r, pico).values())
    assert need < 150 * 1024 < 670 * 1024 < sum(boards.ram_needed(resident.report(), pico).values())
    assert boards.check(r, pico)   # fits, with its notes
    xs = np.random.default_rng(5).integers(0, 256, (STEPS, 1, 3, 128, 128)).astype(np.uint8)
    ys = [3, 7, 1]

    def steps(core):
        return [np.float32(core.step_label(x, y)).tobytes() for x, y in zip(xs, ys)] + \
            [core.param(n).tobytes() for n in core.param_names]

    core = Core(streamed.data, stream=True)
    assert steps(core) == steps(Core(resident.data))
    assert core.info()["stream_read_bytes"] >= STEPS * r["read_per_step"]
