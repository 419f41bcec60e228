"""MCUNet-5fps with MIT's 49kb scheme trained on a Raspberry Pi Pico as a user has it: MicroPython's
stock RPI_PICO firmware (`make firmware-stock-rpi_pico`: no microtrain built in, no ROMFS) in
rp2040js, microtrain on its flash filesystem as `mpremote mip install` leaves it from `make dist`
(/lib/_microtrain.mpy for armv6m, whose code the firmware loads into the heap, and /lib/microtrain/),
and the plan, compiled as tests/device/test_pico_romfs.py compiles it but with a stream section, a
file there too (/plan.mtp, 590 KB: more than twice the Pico's heap). The filesystem is the firmware's
own littlefs, made on the host and written into the emulated flash as a UF2 (tests/device/rp2040js/
pico.py says why: rp2040js drops flash writes); the samples lie in raw flash below it, read in place.

Trainer(open("/plan.mtp", "rb")) keeps the plan's head in RAM and streams each op's constants from
the file into its window in the arena. The test checks, against the host simulator (the same C, the
plan whole in memory): the losses of 2 steps, bit for bit (the second step runs on the weights the
first one updated; a predict and the training state after them do not run yet: see AFTER); against
the plan's report: the bytes the steps read from the file, and the heap Trainer(f) took with its
open file, which must be what `microtrain report --board rpi_pico` counts, under 150 KB. The heap
left beside the .mpy and the Trainer is a few KB: the device script runs in short pieces (what one
piece compiles is freed before the next). About 7 minutes of host time (a step is 3 minutes: the
float backward is soft float on the Cortex-M0+).
"""
import json
import os
import sys
import time

import numpy as np
import pytest

import microtrain
from microtrain import boards
from microtrain.native import Core

from repo import need_tte

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rp2040js"))
import pico  # noqa: E402
sys.path.pop(0)

pytestmark = [pytest.mark.device, pytest.mark.slow, pytest.mark.long]

STEPS = 2
LABELS = [3, 7]
# what Trainer(f) may take beyond `microtrain report --board rpi_pico`'s count: the GC's rounding of
# the few blocks the constructor allocates besides those it counts (the heap's 16-byte blocks)
SLACK = 256

# The device's side, in pieces: each line a figure the test parses (pico.parse and parse below).
TRAIN = [r"""
import gc
gc.collect()
print("HEAP", gc.mem_free(), gc.mem_alloc() + gc.mem_free())
import microtrain, _microtrain
gc.collect()
print("IMPORT", microtrain.__file__, _microtrain.__file__, gc.mem_free())
""", r"""
import gc, time, uctypes
from array import array
xs = memoryview(uctypes.bytearray_at(%(x_at)d, %(x_bytes)d))
n = %(stride)d
ys = %(ys)r
loss = array("f", [0.0])
gc.collect()
free0 = gc.mem_free()
alloc0 = gc.mem_alloc()
f = open("/plan.mtp", "rb")
t = microtrain.Trainer(f)
gc.collect()
grew = gc.mem_alloc() - alloc0
free1 = gc.mem_free()
i = t.info()
print("TRAINER", free0, free1, grew, i["ram_bytes"], i["const_bytes"], i["plan_bytes"])
print("STREAMED", int(i["streamed"]), i["head_bytes"], i["stream_read_bytes"])
r0 = i["stream_read_bytes"]
i = None
"""]
# each step, and what follows, a piece of its own: the 2 KB the Trainer leaves hold a short piece's
# source and bytecode, not a long one's (what one piece compiles is freed before the next)
STEP = ("a = gc.mem_alloc(); t0 = time.ticks_us(); loss[0] = t.step(xs[%(k)d * n:%(k)d * n + n], ys[%(k)d]); "
        "us = time.ticks_diff(time.ticks_us(), t0); print('STEP', %(k)d, bytes(loss).hex(), us, gc.mem_alloc() - a)")
AFTER = ["print('PEAK', gc.mem_alloc(), gc.mem_alloc() + gc.mem_free())"]
# Not yet: a predict and the training state after the steps. Beside the .mpy's code and the Trainer the
# heap has 1.7 KB left in pieces, and the parser of the next piece needs a 640-byte block it does not
# find (MemoryError); t.save_state(f) writes the state without a buffer (tests/device/micropython/state.py)


@pytest.fixture(scope="module")
def stock_pico():
    why = pico.stock_missing()
    if why:
        pytest.skip(why)


def parse(out):
    r = {"steps": []}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        v = rest.split()
        if key == "HEAP":
            r["free_at_start"], r["heap_total"] = int(v[0]), int(v[1])
        elif key == "IMPORT":
            r["module_file"], r["natmod_file"], r["free_imported"] = v[0], v[1], int(v[2])
        elif key == "TRAINER":
            r.update(zip(("free_before", "free_after", "grew", "ram_bytes", "const_bytes", "plan_bytes"), map(int, v)))
        elif key == "STREAMED":
            r["streamed"], r["head_bytes"], r["attach_read"] = (int(x) for x in v)
        elif key == "STEP":
            r["steps"].append({"loss": bytes.fromhex(v[1]), "us": int(v[2]), "alloc": int(v[3])})
        elif key == "PEAK":
            r["peak_alloc"], r["heap_total"] = int(v[0]), int(v[1])
    if "peak_alloc" not in r:
        raise RuntimeError("the Pico's output ended early:\n" + out)
    return r


def test_mcunet_49kb_streams_from_the_stock_picos_filesystem(stock_pico, tmp_path):
    tte = need_tte()
    images = pico.mcunet_samples(32 + STEPS)
    plan = pico.mcunet_49kb(tte, images[:32], stream=True)
    r = plan.report()
    board = boards.load_board("rpi_pico")
    assert r["streamed"] and boards.placement(r, board) == "streamed"
    need = boards.ram_needed(r, board)
    in_ram = sum(boards.ram_needed(pico.mcunet_49kb(tte, images[:32]).report(), board).values())

    sim = microtrain.Simulator(plan)
    xq = sim.quantize_input(images[32:])
    losses = [np.float32(sim.step(x, y)).tobytes() for x, y in zip(xq, LABELS)]

    files = {"/lib/" + k: v for k, v in pico.package_files("armv6m").items()}
    files["/plan.mtp"] = plan.data
    code = [c % dict(x_at=pico.raw_address(xq.nbytes), x_bytes=xq.nbytes, stride=xq[0].nbytes, ys=bytes(LABELS))
            for c in TRAIN] + [STEP % dict(k=k) for k in range(STEPS)] + AFTER
    t0 = time.monotonic()
    out, err = pico.run_stock(code, files, str(tmp_path), raw=xq.tobytes(), timeout=2400)
    host_s = time.monotonic() - t0
    if err:
        raise AssertionError("the Pico raised:\n%s\n%s" % (out, err))
    with open(os.path.join(str(tmp_path), "pico.out"), "w") as f:   # for a look when an assertion fails
        f.write(out + err)
    got = parse(out)
    host = Core(plan.data, stream=True)
    read0 = host.info()["stream_read_bytes"]
    for x, y in zip(xq, LABELS):
        host.step_label(x, y)
    got["read"] = host.info()["stream_read_bytes"] - read0
    print("MCUNet-5fps 49kb streamed on the stock Pico (rp2040js, armv6m .mpy from /lib): plan %d bytes, head %d; "
          "heap %d, %d free after boot, %d after import microtrain; Trainer(f) with its open file took %d bytes "
          "(report --board rpi_pico: %d = %s); peak heap in use %d; read %d bytes in %d steps (host core); steps %s us of emulated "
          "time; %.0f s of host time"
          % (len(plan.data), got["head_bytes"], got["heap_total"], got["free_at_start"], got["free_imported"],
             got["grew"], sum(need.values()), need, got["peak_alloc"], got["read"], STEPS,
             [s["us"] for s in got["steps"]], host_s))

    # the figures of docs/performance.md (bench/pico_stream.json)
    print("pico_stream.json: " + json.dumps({
        "model": "MCUNet-5fps 128x128 int8", "update": "sparse 49kb (MIT)", "micropython": "v1.28.0",
        "heap_total": got["heap_total"], "heap_free_boot": got["free_at_start"], "heap_free_imported": got["free_imported"],
        "trainer_heap": got["grew"], "report_heap": sum(need.values()), "in_ram_heap": in_ram,
        "read_per_step": got["read"] // STEPS, "step_us": [s["us"] for s in got["steps"]], "host_s": round(host_s)}))
    # microtrain is the .mpy and the package on the filesystem, not built into the firmware
    assert (got["module_file"], got["natmod_file"]) == ("/lib/microtrain/__init__.mpy", "/lib/_microtrain.mpy")
    # streamed: the plan's head in RAM, the plan itself more than the heap that was free for it
    assert got["streamed"] == 1 and got["head_bytes"] == r["head_bytes"] < got["plan_bytes"] == len(plan.data)
    assert got["plan_bytes"] > got["free_before"] and in_ram > got["heap_total"]
    # the heap Trainer(f) took, open file included, is what the report counts for the board, and under 150 KB
    assert sum(need.values()) - SLACK <= got["grew"] <= sum(need.values()) + SLACK, (got["grew"], need)
    assert got["grew"] < 150 * 1024
    # the free heap the board profile gives for its stock firmware with the .mpy (report --board's note)
    assert abs(got["free_imported"] - board["heap"]["natmod_free_bytes"]) <= 2048, \
        "boards/rpi_pico.json: heap.natmod_free_bytes is %d, measured %d" % (board["heap"]["natmod_free_bytes"],
                                                                          got["free_imported"])
    # the bytes a step reads, by the host core streaming the same plan (the board has no heap left for
    # info()'s dict after the steps)
    assert got["read"] == STEPS * r["read_per_step"] and got["attach_read"] == read0
    assert all(s["alloc"] <= 256 for s in got["steps"]), "a step allocated on the heap: %s" % got["steps"]
    assert [s["loss"] for s in got["steps"]] == losses, "losses differ from the host simulator's"
