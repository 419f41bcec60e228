"""A plan trained from the Raspberry Pi Pico's flash: the RPI_PICO firmware with a ROMFS
partition (`make firmware-pico-romfs`: 1280 KB at 0x10080000, firmware/rp2/RPI_PICO_ROMFS) in
rp2040js, the ROMFS image written into the emulated flash as a UF2 at the partition's address
(tests/device/rp2040js/pico.py), mounted by MicroPython at /rom at boot.

The plan: an MLP on scikit-learn's digits whose two wide hidden layers are frozen int8 (about
390 KB of constants: more than the Pico's whole free heap, so it can only load read in place,
through XIP) and whose float head trains. Trainer(f) must grow the heap by its RAM block
(arena + trainable state + context, info()["ram_bytes"]) and the Trainer object only; the
losses, parameters and outputs after a few steps must equal the host simulator's bit for bit:
the same C core, integer arithmetic in the int8 part; the float32 adds, multiplies and divides
are the RP2040 boot ROM's soft float (pico-sdk's wrappers) and expf/logf of the loss MicroPython's
lib/libm on the Pico, glibc's on the host, so the parity is what this test checks, not assumed.
"""
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import microtrain

from int8_models import digits, export
from repo import need_tte

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rp2040js"))
import pico  # noqa: E402
sys.path.pop(0)

pytestmark = [pytest.mark.device, pytest.mark.slow]

STEPS = 6
N = 3
HIDDEN = 3072
# the Trainer object with its mt_ctx_t (boards.py: 352 B), about 250 B more that Trainer(f)
# allocates (measured: 600 B in all with ram_bytes 8344, 592 B with MCUNet's 101616), and the
# GC's 16-byte block rounding
SLACK = 608


class WideMLP(nn.Module):
    """8x8 digits -> 3072 -> 64 -> 10: 393,216 int8 weights in the two frozen layers."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        h = F.relu(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))))
        return self.head(h)


@pytest.fixture(scope="module")
def pico_ready():
    why = pico.missing()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    torch.manual_seed(0)
    x, _ = digits()
    path = export(WideMLP().eval(), str(tmp_path_factory.mktemp("pico") / "wide.onnx"))
    return microtrain.compile(path, update="last-layer", lr=0.05, momentum=0.9, quantize="int8",
                              calibration=x[:100], input_dtype="uint8", input_quant=(1 / 255, 0))


def host_run(plan):
    x, y = digits()
    sim = microtrain.Simulator(plan)
    xq = sim.quantize_input(x[:N])
    losses = [np.float32(sim.step(xq[s % N], y[s % N])).tobytes() for s in range(STEPS)]
    params = {k: np.ascontiguousarray(v, "<f4").tobytes() for k, v in sim.params().items()}
    return xq, [int(v) for v in y[:N]], losses, params, sim


def test_plan_trains_in_place_from_the_picos_flash(pico_ready, plan, tmp_path):
    r = plan.report()
    assert r["const_bytes"] > 390000
    xq, ys, losses, params, sim = host_run(plan)
    got, out = pico.train(plan.data, xq.tobytes(), ys, STEPS, str(tmp_path), stride=xq[0].nbytes)
    print("Pico (rp2040js) from ROMFS: plan %d bytes, const_bytes %d; heap free %d of %d; Trainer(f) grew the heap "
          "by %d bytes, ram_bytes %d; steps %s us of emulated time"
          % (len(plan.data), got["const_bytes"], got["free_before"], got["heap_total"], got["grew"],
             got["ram_bytes"], [s["us"] for s in got["steps"]]))
    assert (got["ram_bytes"], got["const_bytes"], got["plan_bytes"]) == (r["ram_bytes"], r["const_bytes"],
                                                                         len(plan.data))
    # only in place can it load: its constants are more than the whole free heap
    assert got["const_bytes"] > got["free_before"]
    assert got["ram_bytes"] <= got["grew"] <= got["ram_bytes"] + SLACK, out
    assert [s["loss"] for s in got["steps"]] == losses, "losses differ from the host simulator's"
    assert got["params"] == params, "parameters differ from the host simulator's"
    assert got["predict"] == np.ascontiguousarray(sim.predict(xq[0]), "<f4").tobytes()
    # a step allocates its Python objects (the bound method, the float loss): a few blocks, none of the plan's
    assert all(s["alloc"] <= 256 for s in got["steps"]), "a step allocated on the heap: %s" % got["steps"]
    first, last = (np.frombuffer(b"".join(losses[i:i + N]), np.float32).mean() for i in (0, STEPS - N))
    assert last < first, losses   # the steps did something


def test_image_at_the_wrong_address_is_not_the_partition(pico_ready, plan, tmp_path):
    """The same image 4 KB below the partition: /rom holds no filesystem, the plan does not open."""
    xq, ys, _, _, _ = host_run(plan)
    lay = pico.pico_romfs.layout()
    code = pico.TRAIN % dict(stride=xq[0].nbytes, floats=0, steps=1)
    out, err = pico.run(code, pico.image(plan.data, xq.tobytes(), ys), str(tmp_path),
                        address=lay["romfs_addr"] - 4096)
    assert "ENOENT" in err or "OSError" in err, (out, err)


def test_image_larger_than_the_partition_is_refused():
    lay = pico.pico_romfs.layout()
    too_big = r"is %d bytes, 1 more than the ROMFS partition of RPI_PICO_ROMFS" % (lay["romfs_bytes"] + 1)
    with pytest.raises(ValueError, match=too_big):
        pico.fits(lay["romfs_bytes"] + 1)


def test_firmware_ends_below_the_partition(pico_ready):
    size, lay = pico.pico_romfs.check(pico.pico_romfs.FIRMWARE_BIN)
    assert 0 < size <= lay["code_bytes"] == lay["romfs_addr"] - 0x10000000
    assert lay["romfs_addr"] + lay["romfs_bytes"] == lay["fs_addr"]
    assert lay["fs_addr"] + lay["fs_bytes"] == 0x10000000 + 2 * 1024 * 1024


@pytest.mark.long
def test_mcunet_49kb_trains_from_the_picos_flash(pico_ready, tmp_path):
    """MCUNet-5fps with MIT's 49kb scheme, compiled as benchmarks/tte.py compiles it (frozen part
    int8, uint8 input, 1-bit masks, frozen and trained conv weights int8): one training step on the
    2 MB Pico from ROMFS (MIT's engine needs an STM32F746-class board for it). The plan fits the
    partition, Trainer(f) grows the heap by its RAM block only, and the loss, the outputs after the
    step and every parameter are the host simulator's bit for bit. About 4 minutes of host time."""
    images = pico.mcunet_samples(33)
    plan = pico.mcunet_49kb(need_tte(), images[:32])
    r = plan.report()
    sim = microtrain.Simulator(plan)
    xq = sim.quantize_input(images[32:])
    loss = np.float32(sim.step(xq[0], 3)).tobytes()
    params = {k: np.ascontiguousarray(v, "<f4").tobytes() for k, v in sim.params().items()}
    got, out = pico.train(plan.data, xq.tobytes(), [3], 1, str(tmp_path), stride=xq[0].nbytes, timeout=1800)
    print("MCUNet-5fps 49kb on the Pico (rp2040js) from ROMFS: plan %d bytes; heap free %d of %d; Trainer(f) grew the "
          "heap by %d bytes, ram_bytes %d; peak heap in use %d; %d us of emulated time for the step"
          % (len(plan.data), got["free_before"], got["heap_total"], got["grew"], got["ram_bytes"], got["peak_alloc"],
             got["steps"][0]["us"]))
    assert got["ram_bytes"] == r["ram_bytes"] and got["const_bytes"] > got["free_before"]
    assert got["ram_bytes"] <= got["grew"] <= got["ram_bytes"] + SLACK, out
    assert got["steps"][0]["loss"] == loss, "the loss differs from the host simulator's"
    assert got["predict"] == np.ascontiguousarray(sim.predict(xq[0]), "<f4").tobytes()
    assert got["params"] == params, "parameters differ from the host simulator's"
