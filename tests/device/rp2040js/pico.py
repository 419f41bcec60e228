"""Train a plan from ROMFS on the RPI_PICO firmware with a ROMFS partition (`make
firmware-pico-romfs`, firmware/pico_romfs.py; `board` names another of firmware/rp2/, such as
RP2040_4MB_ROMFS) in rp2040js: used by tests/device/test_pico_romfs.py and benchmarks/pico_romfs.py.

The host builds one ROMFS image (microtrain.romfs: the plan, the inputs, the labels, each
8-byte aligned), turns it into a UF2 at the partition's address (romfs.to_uf2) and boots the
firmware in rp2040js with it (run.mjs FIRMWARE.uf2 BOOTROM.ts ROMFS.uf2); MicroPython mounts the
partition at /rom at boot. The device script (TRAIN) opens the plan and the inputs from /rom,
so neither is copied into the heap, measures the heap around Trainer(f), and times each step
with time.ticks_us(): the RP2040 timer, which rp2040js drives from its simulated clock (8 ns
per executed cycle, 125 MHz), so the times are emulated time, not host time.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
for _p in (os.path.join(ROOT, "tests", "support"), os.path.join(ROOT, "firmware")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import mprun        # noqa: E402
import mptargets    # noqa: E402
import pico_romfs   # noqa: E402  firmware/pico_romfs.py: the partition's place and size
from microtrain import romfs   # noqa: E402

BOARD = pico_romfs.BOARD

# The device's side. Lines: HEAP free total (at start); TRAINER free-before free-after grew
# ram_bytes const_bytes plan_bytes; STEP k loss(hex float32) microseconds heap-allocated-by-the-step;
# PEAK the heap in use after the steps, before any collection; PREDICT the outputs for the first
# input after the steps (hex float32); PARAM name hex, or NOPARAMS param_bytes free when the heap
# left beside the Trainer cannot hold t.params()'s copies (MCUNet 49kb: 71.5 KB, 29 KB free).
TRAIN = r"""
import gc, time, microtrain
from array import array
gc.collect()
print("HEAP", gc.mem_free(), gc.mem_alloc() + gc.mem_free())
f = open("/rom/plan.mtp", "rb")
xs = memoryview(open("/rom/x.bin", "rb"))
ys = open("/rom/y.bin", "rb").read()
gc.collect()
free0 = gc.mem_free()
alloc0 = gc.mem_alloc()
t = microtrain.Trainer(f)
gc.collect()
i = t.info()
print("TRAINER", free0, gc.mem_free(), gc.mem_alloc() - alloc0, i["ram_bytes"], i["const_bytes"], i["plan_bytes"])
stride = %(stride)d
floats = %(floats)d
loss = array("f", [0.0])
for s in range(%(steps)d):
    k = s %% len(ys)
    x = xs[k * stride:(k + 1) * stride]
    if floats:
        x = array("f", bytes(x))
    a = gc.mem_alloc()
    t0 = time.ticks_us()
    loss[0] = t.step(x, ys[k])
    us = time.ticks_diff(time.ticks_us(), t0)
    print("STEP", s, bytes(loss).hex(), us, gc.mem_alloc() - a)
print("PEAK", gc.mem_alloc(), gc.mem_alloc() + gc.mem_free())
print("PREDICT", bytes(t.predict(xs[0:stride] if not floats else array("f", bytes(xs[0:stride])))).hex())
gc.collect()
try:
    params = t.params()
except MemoryError:
    params = None
    print("NOPARAMS", i["param_bytes"], gc.mem_free())
from binascii import hexlify
for name in sorted(params or {}):
    v = memoryview(params.pop(name))   # printed 256 values at a time: no copy of a large parameter
    print("PARAM", name, end=" ")
    for k in range(0, len(v), 256):
        print(hexlify(v[k:k + 256]).decode(), end="")
    print()
    v = None
    gc.collect()
"""


def missing(board=BOARD):
    """Why the Pico cannot run here, or None."""
    firmware = pico_romfs.firmware(board)
    if not os.path.isfile(firmware):
        return "no firmware %s; run `make firmware-pico-romfs%s`" % (
            os.path.relpath(firmware, ROOT), "" if board == BOARD else " PICO_ROMFS_BOARD=" + board)
    target = mptargets.targets()["rpi_pico"]
    target.firmware = firmware
    return target.missing()


def image(plan_data, x_bytes, labels):
    """The ROMFS image: plan.mtp, x.bin (the inputs, back to back, as the plan takes them), y.bin."""
    return romfs.build({"plan.mtp": bytes(plan_data), "x.bin": bytes(x_bytes), "y.bin": bytes(labels)})


def fits(image_bytes, board=BOARD):
    """Raises ValueError naming the bytes when the image is larger than the partition."""
    lay = pico_romfs.layout(board)
    if image_bytes > lay["romfs_bytes"]:
        raise ValueError("the ROMFS image is %d bytes, %d more than the ROMFS partition of %s (%d bytes at 0x%08x, "
                         "firmware/rp2/%s)" % (image_bytes, image_bytes - lay["romfs_bytes"], board,
                                               lay["romfs_bytes"], lay["romfs_addr"], board))
    return lay


def run(code, rom_image, workdir, board=BOARD, address=None, timeout=900):
    """Boot the board's firmware in rp2040js with rom_image at `address` (default: the ROMFS
    partition) and run code in the raw REPL; returns (stdout, stderr) of the code as text."""
    lay = fits(len(rom_image), board)
    firmware = pico_romfs.firmware(board)
    uf2 = os.path.join(workdir, "romfs.uf2")
    with open(uf2, "wb") as f:
        f.write(romfs.to_uf2(rom_image, lay["romfs_addr"] if address is None else address))
    board = mprun.pico_board(firmware, images=[uf2])
    try:
        return mprun.exec_on(board.start(), code, timeout)
    finally:
        board.close()


def train(plan_data, x_bytes, labels, steps, workdir, stride, floats=False, **kw):
    """Train `steps` steps from ROMFS; returns the parsed lines (see TRAIN) and the raw output."""
    code = TRAIN % dict(stride=stride, floats=int(floats), steps=steps)
    out, err = run(code, image(plan_data, x_bytes, labels), workdir, **kw)
    if err:
        raise RuntimeError("the Pico raised:\n%s\n%s" % (out, err))
    return parse(out), out


def parse(out):
    r = {"steps": [], "params": {}}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        v = rest.split()
        if key == "HEAP":
            r["free_at_start"], r["heap_total"] = int(v[0]), int(v[1])
        elif key == "TRAINER":
            r.update(zip(("free_before", "free_after", "grew", "ram_bytes", "const_bytes", "plan_bytes"), map(int, v)))
        elif key == "STEP":
            r["steps"].append({"loss": bytes.fromhex(v[1]), "us": int(v[2]), "alloc": int(v[3])})
        elif key == "PEAK":
            r["peak_alloc"], r["heap_total"] = int(v[0]), int(v[1])
        elif key == "PARAM":
            r["params"][v[0]] = bytes.fromhex(v[1])
        elif key == "PREDICT":
            r["predict"] = bytes.fromhex(v[0])
        elif key == "NOPARAMS":
            r["params"], r["params_short"] = None, (int(v[0]), int(v[1]))
    if "predict" not in r:
        raise RuntimeError("the Pico's output ended early:\n" + out)
    return r
