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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--natmod", required=True, help="the native modules' build folder (NATMOD/<arch>/_microtrain.mpy)")
    ap.add_argument("--archs", nargs="+", required=True)
    ap.add_argument("--mpy-cross", required=True, help="MicroPython v1.28.0's mpy-cross (compiles the helpers)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
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
    print("microtrain dist: %d architectures in %s; install with\n"
          "    mpremote mip install --index <URL of %s>/<arch> microtrain"
          % (len(args.archs), os.path.relpath(args.out, os.getcwd()), os.path.relpath(args.out, os.getcwd())))


if __name__ == "__main__":
    main()
