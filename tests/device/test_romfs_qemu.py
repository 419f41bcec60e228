"""A plan opened from ROMFS on the qemu MPS2_AN500 board is read in place: its constants are
not copied into MicroPython's heap.

The port has vfs.VfsRom but no ROMFS partition (no vfs.rom_ioctl), so the test makes one:
microtrain.device.emulated.QemuBoard maps the board's 16 MB PSRAM at 0x60000000 from a host
file, the host writes a ROMFS image (microtrain.romfs, plans 8-byte aligned) into the last
2 MB of that file before boot (the first megabyte is microtrain.ramdisk's), and the board
mounts `vfs.VfsRom(uctypes.bytearray_at(...))` at /rom, as a board with a partition mounts
its flash there at boot.

The plan is an int8 CNN on scikit-learn's digits whose frozen int8 constants (about 220 KB)
are more than the board's whole heap (140 KB): it cannot load unless it is read in place.
The board measures gc.mem_alloc() around `microtrain.Trainer(f)`; the increase must be the
Trainer's RAM block (arena + trainable state, info()["ram_bytes"]; the runtime context is read
from the plan) plus
the object itself, and far below the plan's const_bytes. Then it trains the last layer for
a few steps and its losses and parameters are compared with the host simulator's bit for
bit (same C core, same float32 operations: the int8 backbone is integer arithmetic and the
Cortex-M7's double FPU rounds float32 as the host does).
"""
import os
import shutil
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import microtrain
from microtrain import romfs
from microtrain.device.emulated import PSRAM_BYTES, QemuBoard

import mprun
import mptargets
from repo import need_tte

pytestmark = pytest.mark.device
from int8_models import digits, export

TARGET = mptargets.targets()["mps2_an500"]
ROM_BYTES = 2 * 1024 * 1024
ROM_OFFSET = PSRAM_BYTES - ROM_BYTES            # the last 2 MB of the PSRAM
ROM_ADDR = 0x60000000 + ROM_OFFSET
STEPS = 8
N = 4
SLACK = 512    # the Trainer object with its mt_ctx_t (304 bytes here), and the GC's 16-byte block rounding


class WideDigits(nn.Module):
    """Wide convolutions on 8x8 digits: about 220 KB of int8 weights (74 KB without c3, small
    enough that a copy would fit in the heap), a 1.3 KB float head."""

    def __init__(self, c3=True):
        super().__init__()
        self.c1 = nn.Conv2d(1, 64, 3, padding=1)
        self.c2 = nn.Conv2d(64, 128, 3, stride=2, padding=1)
        self.c3 = nn.Conv2d(128, 128, 3, padding=1) if c3 else None
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        h = F.relu(self.c2(F.relu(self.c1(x))))
        h = F.relu(self.c3(h)) if self.c3 is not None else h
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


@pytest.fixture(scope="module")
def qemu_ready():
    """Skips (a failure under CI: tests/conftest.py) before the plans are compiled."""
    why = skip_reason()
    if why:
        pytest.skip(why)


def skip_reason():
    if shutil.which("qemu-system-arm") is None:
        return "qemu-system-arm not found (Debian/Ubuntu: apt-get install qemu-system-arm)"
    if not os.path.isfile(TARGET.firmware):
        return "no firmware %s; run `make firmware-mps2_an500`" % os.path.relpath(TARGET.firmware, mptargets.ROOT)
    try:
        import serial  # noqa: F401
    except ImportError:
        return "pyboard.py needs pyserial (pip install pyserial)"
    return None


def compile_wide(path, c3):
    torch.manual_seed(0)
    x, _ = digits()
    export(WideDigits(c3).eval(), path)
    return microtrain.compile(path, update="last-layer", lr=0.05, momentum=0.9, quantize="int8",
                              calibration=x[:100], input_dtype="uint8", input_quant=(1 / 255, 0))


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("romfs")
    return {"plan.mtp": compile_wide(str(d / "wide.onnx"), True), "mid.mtp": compile_wide(str(d / "mid.onnx"), False)}


DEVICE = r"""
import gc, uctypes, vfs, microtrain
from array import array
vfs.mount(vfs.VfsRom(uctypes.bytearray_at(%(addr)d, %(size)d)), "/rom")
for name in ("mid.mtp", "plan.mtp"):
    t = None
    f = open("/rom/" + name, "rb")
    gc.collect()
    before = gc.mem_alloc()
    t = microtrain.Trainer(f)
    gc.collect()
    after = gc.mem_alloc()
    i = t.info()
    print("MEM", name, after - before, i["ram_bytes"], i["const_bytes"], i["plan_bytes"],
          gc.mem_alloc() + gc.mem_free())
xq = %(xq)r
ys = %(ys)r
n_in = t.input_len
losses = array("f", [0.0] * %(steps)d)
for s in range(%(steps)d):
    k = s %% len(ys)
    losses[s] = t.step(memoryview(xq)[k * n_in:(k + 1) * n_in], ys[k])
print("LOSSES", bytes(losses).hex())
for name, v in sorted(t.params().items()):
    for i in range(0, len(v), 1024):   # a hex line at a time: a large weight's whole hex would not fit
        print("PARAM", name, bytes(memoryview(v)[i:i + 1024]).hex())
"""


def run_on_board(tmp_path, image, code, firmware=TARGET.firmware, offset=ROM_OFFSET, timeout=600):
    """Boot `firmware` with the ROMFS image at `offset` in the PSRAM and run code; (out, err)."""
    flash = tmp_path / "psram.img"
    with open(flash, "wb") as f:
        f.truncate(PSRAM_BYTES)
        f.seek(offset)
        f.write(image)
    with QemuBoard(firmware, flash=str(flash), workdir=str(tmp_path)) as board:
        return mprun.exec_on(board.port, code, timeout)


def device_params(lines):
    """{name: bytes} from the device's "PARAM name hex" lines, a parameter's hex over several lines."""
    out = {}
    for name, h in (line.split() for line in lines):
        out[name] = out.get(name, b"") + bytes.fromhex(h)
    return out


def test_plan_from_romfs_is_read_in_place(qemu_ready, plans, tmp_path):
    plan = plans["plan.mtp"]
    image = romfs.build({k: p.data for k, p in plans.items()})
    assert len(image) <= ROM_BYTES

    x, y = digits()
    sim = microtrain.Simulator(plan)
    xq = sim.quantize_input(x[:N])
    losses = np.array([sim.step(xq[s % N], y[s % N]) for s in range(STEPS)], np.float32)
    code = DEVICE % dict(addr=ROM_ADDR, size=ROM_BYTES, xq=xq.tobytes(), ys=[int(v) for v in y[:N]],
                         steps=STEPS)
    out, err = run_on_board(tmp_path, image, code)

    lines = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        lines.setdefault(key, []).append(rest)
    for m in lines.get("MEM", ()):
        name, grew, ram, const, plan_bytes, heap = m.split()
        grew, ram, const, plan_bytes, heap = (int(v) for v in (grew, ram, const, plan_bytes, heap))
        r = plans[name].report()
        print("ROMFS %s: %d bytes, const_bytes %d; heap %d; Trainer(f) grew the heap by %d bytes, ram_bytes %d "
              "(arena %d, state %d, context %d)" % (name, plan_bytes, const, heap, grew, ram, r["arena_bytes"],
                                                   r["param_bytes"], r["context_ram_bytes"]))
        assert (ram, const, plan_bytes) == (r["ram_bytes"], r["const_bytes"], len(plans[name].data))
        assert ram <= grew <= ram + SLACK, "%s: the heap grew by %d bytes, the Trainer's RAM is %d" % (name, grew, ram)
        assert grew < const // 4
    assert [m.split()[0] for m in lines.get("MEM", ())] == ["mid.mtp", "plan.mtp"], out + err
    assert const > heap             # plan.mtp: more than the whole heap, so only in place can it load at all
    assert not err, err

    assert lines["LOSSES"][0] == losses.tobytes().hex(), "losses differ from the host's"
    params = {name: h.hex() for name, h in device_params(lines["PARAM"]).items()}
    host = {k: np.ascontiguousarray(v, "<f4").tobytes().hex() for k, v in sim.params().items()}
    assert params == host, "parameters differ from the host's"
    assert np.mean(losses[-N:]) < np.mean(losses[:N]), losses     # the steps did something



# ---- MIT's MCUNet-5fps with its 49kb sparse scheme, constants on ROMFS (issue 10) ----------------
# The int8 plan is 1.8 MB, far past any heap; its RAM (arena + trainable state; the context stays
# in the plan) is
# more than the 140 KB of the standard qemu build, so it runs on the same board's firmware built
# with a 1 MB heap (`make firmware-natmod-tests`, build/firmware-natmod-tests/mps2_an500).
BIG_HEAP_FIRMWARE = os.path.join(mptargets.NATMOD_FIRMWARE, "mps2_an500", "firmware.elf")
MCUNET_ROM_BYTES = 4 * 1024 * 1024
MCUNET_ROM_OFFSET = PSRAM_BYTES - MCUNET_ROM_BYTES
MCUNET_STEPS = 2

MCUNET_DEVICE = r"""
import gc, uctypes, vfs, microtrain
from array import array
vfs.mount(vfs.VfsRom(uctypes.bytearray_at(%(addr)d, %(size)d)), "/rom")
f = open("/rom/mcunet.mtp", "rb")
gc.collect()
before = gc.mem_alloc()
t = microtrain.Trainer(f)
gc.collect()
i = t.info()
print("MEM", gc.mem_alloc() - before, i["ram_bytes"], i["const_bytes"], gc.mem_alloc() + gc.mem_free())
xq = %(xq)s
ys = %(ys)r
n_in = t.input_len
losses = array("f", [0.0] * %(steps)d)
for s in range(%(steps)d):
    losses[s] = t.step(memoryview(xq)[s * n_in:(s + 1) * n_in], ys[s])
print("LOSSES", bytes(losses).hex())
gc.collect()
print("SAMPLES", uctypes.addressof(xq), gc.mem_alloc() - before)
for name, v in sorted(t.params().items()):
    for i in range(0, len(v), 1024):   # a hex line at a time: a large weight's whole hex would not fit
        print("PARAM", name, bytes(memoryview(v)[i:i + 1024]).hex())
"""


# 148kb as benchmarks/tte.py compiles it: its weights int8 (the float trained weights' copies that
# params() returns would not fit the heap beside it), its blocks run a channel at a time
MCUNET_WEIGHTS = {"49kb": {}, "148kb": dict(frozen_weights="int8", trained_weights="int8")}


@pytest.mark.slow
@pytest.mark.parametrize("scheme,in_place", [("49kb", False), ("148kb", False), ("148kb", True)])
def test_mcunet_sparse_plan_trains_from_romfs(qemu_ready, tmp_path, scheme, in_place):
    """MCUNet-5fps, frozen part int8, MIT's 49kb scheme (channel-sparse 1x1 convs, 20 biases, the
    head), 1-bit ReLU6 masks: two training steps on qemu MPS2_AN500 with the plan opened from a
    VfsRom, with the host simulator's losses and parameters within 1e-5. The 148kb scheme the
    same with int8 weights (PWDW_W8), saved block outputs made again in the backward (recompute.py);
    and again reading its int8 samples in place from a ROMFS file (input_in_place=True): the
    samples' address is in the ROM, and the heap holds the Trainer's block, not the input."""
    sys.path.insert(0, os.path.join(mptargets.ROOT, "benchmarks"))
    try:
        from calibration import samples
    finally:
        sys.path.pop(0)
    tte = need_tte()
    if not os.path.isfile(BIG_HEAP_FIRMWARE):
        pytest.skip("no firmware %s; run `make firmware-natmod-tests`" % BIG_HEAP_FIRMWARE)
    images = samples(32 + MCUNET_STEPS, 128)
    plan = microtrain.compile(os.path.join(tte, "mcunet-5fps.onnx"), update=os.path.join(tte, "mcunet-5fps.schemes.json"),
                              scheme=scheme, lr=0.01, saved="bits", quantize="int8", calibration=images[:32],
                              input_dtype="int8" if in_place else "uint8", input_quant=(1 / 127.5, 0 if in_place else 128),
                              input_in_place=in_place, **MCUNET_WEIGHTS[scheme])
    assert plan.meta["split"], "the scheme's 1x1 convs train on some input channels"
    assert any(n.startswith("recompute: ") for n in plan.meta["notes"]) == (scheme == "148kb")
    sim = microtrain.Simulator(plan)
    xq = sim.quantize_input(images[32:])
    ys = [3, 7][:MCUNET_STEPS]
    losses = np.array([sim.step(xq[s], ys[s]) for s in range(MCUNET_STEPS)], np.float32)
    files = {"mcunet.mtp": plan.data}
    if in_place:   # the samples a file in the ROM, read where they are
        files["samples.bin"] = xq[:MCUNET_STEPS].tobytes()
    image = romfs.build(files)
    assert len(image) <= MCUNET_ROM_BYTES
    xs = 'memoryview(open("/rom/samples.bin", "rb"))' if in_place else repr(xq.tobytes())
    code = MCUNET_DEVICE % dict(addr=0x60000000 + MCUNET_ROM_OFFSET, size=MCUNET_ROM_BYTES, xq=xs,
                                ys=ys, steps=MCUNET_STEPS)
    out, err = run_on_board(tmp_path, image, code, BIG_HEAP_FIRMWARE, MCUNET_ROM_OFFSET, timeout=900)
    assert not err, err
    lines = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        lines.setdefault(key, []).append(rest)
    grew, ram, const, heap = (int(v) for v in lines["MEM"][0].split())
    r = plan.report()
    print("MCUNet-5fps %s from ROMFS on MPS2_AN500 (heap %d): plan %d bytes, const_bytes %d; Trainer(f) grew the "
          "heap by %d bytes, ram_bytes %d (arena %d, state %d, context %d)"
          % (scheme, heap, len(plan.data), const, grew, ram, r["arena_bytes"], r["param_bytes"],
             r["context_ram_bytes"]))
    assert (ram, const) == (r["ram_bytes"], r["const_bytes"])
    # the Trainer's RAM block, the object and the open file's buffers: nothing of the 1.7 MB of constants
    assert ram <= grew <= ram + 2 * SLACK
    address, after = (int(v) for v in lines["SAMPLES"][0].split())
    if in_place:
        # the samples where the ROM is; after the steps the heap holds the Trainer, the open files
        # and the losses, not a copy of the 48 KB input
        assert 0x60000000 + MCUNET_ROM_OFFSET <= address < 0x60000000 + MCUNET_ROM_OFFSET + len(image)
        assert r["input_in_place"] and after <= ram + 4 * SLACK < ram + r["input_bytes"]
        print("samples read in place at 0x%x (the ROM); the heap after the steps: %d bytes more than before the "
              "Trainer, ram_bytes %d (the %d-byte input not in it)" % (address, after, ram, r["input_bytes"]))
    got = np.frombuffer(bytes.fromhex(lines["LOSSES"][0]), np.float32)
    assert np.allclose(got, losses, rtol=1e-5, atol=0), (got, losses)
    params = {name: np.frombuffer(h, np.float32) for name, h in device_params(lines["PARAM"]).items()}
    host = sim.params()
    assert set(params) == set(host)
    for k, v in host.items():
        v = v.reshape(-1)
        assert np.abs(params[k] - v).max() <= 1e-5 * max(1.0, np.abs(v).max()), k
    print("bit-identical to the host simulator: %s" % (got.tobytes() == losses.tobytes() and all(
        params[k].tobytes() == np.ascontiguousarray(v, "<f4").tobytes() for k, v in host.items())))
