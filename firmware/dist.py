"""`make dist`: the native module of every architecture built here, with the device package, as
mip package indexes that `mpremote mip install` (and `mip.install` on a board with a network)
reads. One index per architecture, in micropython-lib's layout:

    build/dist/mip/
      index.json                                     what is here: architecture, boards, .mpy size
      <arch>/package/6/microtrain/latest.json        the package for MicroPython's .mpy version 6
      <arch>/package/6/microtrain/<version>.json     (v1.19 and later): helpers compiled by mpy-cross
      <arch>/package/py/microtrain/latest.json       the same with the helpers as .py (--no-mpy)
      <arch>/package/py/microtrain/<version>.json
      <arch>/file/<h[:2]>/<h>                        every file once, named by its sha256's first 8 hex digits
      <arch>/package.json                            the same package by relative URLs, for
                                                     `mpremote mip install <URL>/<arch>/package.json`

so that, with the folder served over http,

    mpremote mip install --index http://HOST/mip/rv32imc microtrain

installs lib/_microtrain.mpy (the C module for that architecture) and lib/microtrain/ (the
device package) on the board: mpremote asks the board for its .mpy version
(sys.implementation._mpy & 0xFF), reads package/<that>/microtrain/latest.json and fetches each
file it lists under "hashes" from file/. A package file names no machine's path.

    python firmware/dist.py --natmod build/natmod --archs x64 rv32imc ... --mpy-cross PATH --out build/dist/mip

With --firmware BUILD (build/firmware) it also copies each real board's firmware image that was
built there (a board profile with a flash_tool: RPI_PICO's .uf2, PYBV11's .dfu, ...; --image
NAME=PATH adds a variant such as the Pico's with a ROMFS partition) into --firmware-out, and
writes --manifest: one entry per file (firmware image or .mpy) with its board(s), MicroPython
version, microtrain version, size, sha256 and how it goes on the board.

Standard library only.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "modules", "microtrain", "python", "microtrain")
NAME = "microtrain"
MPY_VERSION = 6          # the .mpy major version of MicroPython v1.19 to v1.28 (py/persistentcode.h)
SHORT_HASH = 8           # micropython-lib's index names files by this many hex digits of their sha256


def fail(msg):
    print("microtrain dist: " + msg, file=sys.stderr)
    sys.exit(2)


def version():
    with open(os.path.join(ROOT, "host", "microtrain", "version.py")) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip("\"'")
    fail("no __version__ in host/microtrain/version.py")


def boards_by_arch():
    """{mpy_arch: [board profile names]} from boards/*.json."""
    out = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "boards"))):
        if name.endswith(".json"):
            with open(os.path.join(ROOT, "boards", name)) as f:
                p = json.load(f)
            out.setdefault(p["mpy_arch"], []).append(p["name"])
    return out


def helpers(mpy_cross, compiled):
    """[(path on the board below lib/, bytes)]: the device package, as mpy-cross compiles it or as source."""
    files = []
    with tempfile.TemporaryDirectory(prefix="mt-dist-") as tmp:
        for name in sorted(os.listdir(PACKAGE)):
            if not name.endswith(".py"):
                continue
            src = os.path.join(PACKAGE, name)
            if not compiled:
                with open(src, "rb") as f:
                    files.append(("%s/%s" % (NAME, name), f.read()))
                continue
            out = os.path.join(tmp, name[:-3] + ".mpy")
            r = subprocess.run([mpy_cross, "-o", out, "-s", "%s/%s" % (NAME, name), src], capture_output=True,
                               text=True)
            if r.returncode:
                fail("mpy-cross failed on %s: %s" % (os.path.relpath(src, ROOT), r.stderr.strip()))
            with open(out, "rb") as f:
                files.append(("%s/%s.mpy" % (NAME, name[:-3]), f.read()))
    return files


def short_hash(data):
    return hashlib.sha256(data).hexdigest()[:SHORT_HASH]


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_json(path, obj):
    write(path, (json.dumps(obj, indent=1) + "\n").encode())


def arch_index(out, arch, mpy, helper_files, ver):
    """One architecture's index under out/arch; returns its package files {path: bytes} (.mpy helpers)."""
    d = os.path.join(out, arch)
    for tag, helpers_of_tag in helper_files.items():
        files = [("_microtrain.mpy", mpy)] + helpers_of_tag
        hashes = []
        for path, data in files:
            h = short_hash(data)
            write(os.path.join(d, "file", h[:2], h), data)
            hashes.append([path, h])
        pkg = {"hashes": hashes, "deps": [], "version": ver}
        for v in ("latest", ver):
            write_json(os.path.join(d, "package", tag, NAME, v + ".json"), pkg)
    # the same package by relative URLs: mip reads it from any URL (or github:, with the folder
    # published), files from beside it
    mpy_files = [("_microtrain.mpy", mpy)] + helper_files[str(MPY_VERSION)]
    urls = [[path, "file/%s/%s" % (short_hash(data)[:2], short_hash(data))] for path, data in mpy_files]
    write_json(os.path.join(d, "package.json"), {"urls": urls, "deps": [], "version": ver})
    return dict(mpy_files)


# how a firmware image goes on a board, by its profile's flash_tool
INSTALL = {
    "uf2": "hold BOOTSEL while plugging the board in, then copy the .uf2 to the drive that appears "
           "(or: microtrain flash --board {board} --image {file})",
    "dfu-util": "DFU mode (BOOT0 to 3V3, reset), then: microtrain flash --board {board} --image {file} (dfu-util)",
    "st-flash": "microtrain flash --board {board} --image {file} (st-flash, over the ST-LINK)",
    "esptool": "microtrain flash --board {board} --port PORT --image {file} (esptool)",
}


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def firmware_images(build, extra):
    """[(name, board profile, image path)]: the real boards' images built under build/NAME/, and
    the extra NAME=PATH variants (NAME: a profile's name, or profile-variant)."""
    out = []
    for name in sorted(os.listdir(os.path.join(ROOT, "boards"))):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(ROOT, "boards", name)) as f:
            p = json.load(f)
        path = os.path.join(build, p["name"], p.get("image") or "")
        if p.get("flash_tool") and p.get("image") and os.path.isfile(path):
            out.append((p["name"], p, path))
    for spec in extra:
        name, _, path = spec.partition("=")
        base = name.split("-")[0]
        try:
            with open(os.path.join(ROOT, "boards", base + ".json")) as f:
                p = json.load(f)
        except OSError:
            fail("--image %s: no board profile boards/%s.json" % (spec, base))
        if not os.path.isfile(path):
            fail("--image %s: no such file" % spec)
        out.append((name, p, path))
    return out


def write_firmware(images, out, ver, micropython):
    """Copy the images to out/NAME/ and return their manifest entries."""
    if os.path.isdir(out):
        shutil.rmtree(out)
    entries = []
    for name, p, path in images:
        with open(path, "rb") as f:
            data = f.read()
        rel = "%s/%s" % (name, os.path.basename(path))
        write(os.path.join(out, rel), data)
        entries.append({"kind": "firmware", "file": os.path.basename(out) + "/" + rel, "board": p["name"],
                        "variant": name, "title": p.get("title", p["name"]), "micropython": micropython,
                        "microtrain": ver, "bytes": len(data), "sha256": sha256(data),
                        "install": INSTALL.get(p["flash_tool"], "microtrain flash --board {board} --image {file}")
                        .format(board=p["name"], file=os.path.basename(path))})
        print("%-22s %-14s %8d B  sha256 %s" % (name, os.path.basename(path), len(data), sha256(data)[:16]))
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--natmod", required=True, help="the native modules' build folder (NATMOD/<arch>/_microtrain.mpy)")
    ap.add_argument("--archs", nargs="+", required=True)
    ap.add_argument("--mpy-cross", required=True, help="MicroPython v1.28.0's mpy-cross (compiles the helpers)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--firmware", help="the firmware build folder (BUILD/NAME/<image> per board profile)")
    ap.add_argument("--image", action="append", default=[], metavar="NAME=PATH",
                    help="a further firmware image, e.g. rpi_pico-romfs=PATH (with --firmware)")
    ap.add_argument("--firmware-out", help="where the firmware images go (with --firmware)")
    ap.add_argument("--manifest", help="the manifest to write: every file, its board, versions and sha256")
    ap.add_argument("--micropython", default="v1.28.0", help="the MicroPython version the images and .mpy are for")
    args = ap.parse_args()
    if (args.firmware is None) != (args.firmware_out is None):
        fail("--firmware and --firmware-out go together")
    if not os.path.isfile(args.mpy_cross):
        fail("no mpy-cross at %s: `make firmware-test` (or any firmware target) builds it" % args.mpy_cross)
    mpys = {}
    for arch in args.archs:
        path = os.path.join(args.natmod, arch, "_microtrain.mpy")
        if not os.path.isfile(path):
            fail("no %s: `make natmod ARCH=%s` builds it" % (path, arch))
        with open(path, "rb") as f:
            mpys[arch] = f.read()
        if mpys[arch][:2] != b"M" + bytes([MPY_VERSION]):
            fail("%s is not a version %d .mpy (MicroPython v1.19 to v1.28)" % (path, MPY_VERSION))
    ver = version()
    helper_files = {str(MPY_VERSION): helpers(args.mpy_cross, True), "py": helpers(args.mpy_cross, False)}
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    by_arch = boards_by_arch()
    listing = {}
    for arch in args.archs:
        files = arch_index(args.out, arch, mpys[arch], helper_files, ver)
        listing[arch] = {"boards": by_arch.get(arch, []), "mpy_bytes": len(mpys[arch]),
                         "package_bytes": sum(len(v) for v in files.values()),
                         "mpy_sha256": hashlib.sha256(mpys[arch]).hexdigest(), "version": ver}
        print("%-10s _microtrain.mpy %7d B, with the package %7d B  (boards: %s)" % (
            arch, len(mpys[arch]), listing[arch]["package_bytes"], ", ".join(by_arch.get(arch, [])) or "-"))
    write_json(os.path.join(args.out, "index.json"), {"package": NAME, "mpy_version": MPY_VERSION,
                                                      "architectures": listing})
    entries = []
    if args.firmware is not None:
        entries = write_firmware(firmware_images(args.firmware, args.image), args.firmware_out, ver, args.micropython)
    if args.manifest:
        base = os.path.dirname(os.path.abspath(args.manifest))
        for arch, info in listing.items():
            entries.append({"kind": "mpy", "file": os.path.relpath(os.path.join(args.out, arch, "package.json"), base),
                            "arch": arch, "boards": info["boards"], "micropython": args.micropython,
                            "microtrain": ver, "bytes": info["mpy_bytes"], "sha256": info["mpy_sha256"],
                            "install": "mpremote mip install --index <URL of %s>/%s microtrain"
                                       % (os.path.relpath(args.out, base), arch)})
        write_json(args.manifest, {"microtrain": ver, "micropython": args.micropython, "files": entries})
        print("microtrain dist: manifest of %d files in %s" % (len(entries), os.path.relpath(args.manifest, os.getcwd())))
    print("microtrain dist: %d architectures in %s; install with\n"
          "    mpremote mip install --index <URL of %s>/<arch> microtrain"
          % (len(args.archs), os.path.relpath(args.out, os.getcwd()), os.path.relpath(args.out, os.getcwd())))


if __name__ == "__main__":
    main()
