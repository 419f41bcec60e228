"""Board profiles (boards/*.json) and the check of a plan against a board's memory.

A profile says what a plan needs to know about a board: core and FPU, SRAM and flash,
the MicroPython port and BOARD that build its firmware, the .mpy architecture, and the
heap MicroPython leaves free for microtrain (measured where the board runs here).
boards/README.md describes every field and how the RAM a Trainer takes is counted.

Standard library only: the Makefile runs this file with any python3 to turn the profiles
into make variables (`python3 host/microtrain/boards.py --make`).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FPUS = ("none", "single", "double")
STATUSES = ("tested", "built", "unverified")
REQUIRED = ("name", "title", "status", "mcu", "core", "fpu", "sram_bytes", "flash_bytes", "port", "board",
            "build", "mpy_arch", "word_bytes", "heap", "romfs", "usb", "stack_bytes", "flash_tool", "run")

# The Trainer object itself (struct with the core's context), measured with gc.mem_alloc()
# around Trainer(plan) less ram_bytes; tests/device/micropython/board_fit.py checks the whole sum on
# every device target.
TRAINER_OBJECT_BYTES = {4: 352, 8: 480}
GC_BLOCK_BYTES = {4: 16, 8: 32}


class BoardError(ValueError):
    pass


class DoesNotFit(ValueError):
    """The plan does not fit the board; the message says by how much and what would help."""


def boards_dir():
    """MICROTRAIN_BOARDS, else the repository's boards/ (a checkout, an editable install), else
    the copy a wheel carries (host/setup.py puts it in the package: `pip install ./host`)."""
    d = os.environ.get("MICROTRAIN_BOARDS") or os.path.join(ROOT, "boards")
    if not os.environ.get("MICROTRAIN_BOARDS") and not os.path.isdir(d):
        d = os.path.join(HERE, "board_profiles")
    if not os.path.isdir(d):
        raise BoardError("no board profiles at %s (set MICROTRAIN_BOARDS to the repository's boards/)" % d)
    return d


def _validate(p, path):
    missing = [k for k in REQUIRED if k not in p]
    if missing:
        raise BoardError("%s: missing field(s) %s (see boards/README.md)" % (path, ", ".join(missing)))
    if p["name"] != os.path.basename(path)[:-5]:
        raise BoardError("%s: name %r differs from the file name" % (path, p["name"]))
    if p["fpu"] not in FPUS or p["status"] not in STATUSES:
        raise BoardError("%s: fpu must be one of %s and status one of %s" % (path, FPUS, STATUSES))
    return p


def all_boards():
    """{name: profile} for every boards/*.json, in name order."""
    out = {}
    for path in sorted(glob.glob(os.path.join(boards_dir(), "*.json"))):
        with open(path) as f:
            try:
                p = json.load(f)
            except ValueError as e:
                raise BoardError("%s: not valid JSON: %s" % (path, e)) from e
        out[p.get("name")] = _validate(p, path)
    return out


def load_board(name):
    boards = all_boards()
    key = name.lower().replace("-", "_")
    if key not in boards:
        raise BoardError("unknown board %r; known boards: %s (microtrain boards lists them)"
                         % (name, ", ".join(boards)))
    return boards[key]


def free_heap(board):
    """(bytes free for microtrain, measured?) or (None, False) when nobody knows."""
    h = board["heap"]
    return h.get("free_bytes"), bool(h.get("measured"))


def _kb(n):
    return "%.1f KB" % (n / 1024) if abs(n) >= 1024 else "%d B" % n


def _round(n, word):
    b = GC_BLOCK_BYTES[word]
    return (n + b - 1) // b * b


# Where a plan's constants live on a board (boards/README.md):
#   in place  the plan in flash, read in place (ROMFS, or frozen bytes): what the firmware has ROMFS for
#   streamed  the plan a file on the board's filesystem, its head in RAM, its constants read from the file
#             a group at a time as the ops need them (a plan compiled with stream=True: its stream section)
#   in RAM    the plan read into RAM whole (Trainer(path) of a plan without a stream section, or bytes)
PLACEMENTS = ("in place", "streamed", "in RAM")
# the open file a streamed Trainer keeps, where the profile does not say (open_file_bytes): the file object
# alone, an estimate. A littlefs file also holds a cache of its own, min(block, 4 * max(readsize, progsize))
# bytes: 1,152 B in all on the stock RPI_PICO firmware (progsize 256), measured in rp2040js
# (tests/device/test_pico_stock.py)
FILE_OBJECT_BYTES = {4: 96, 8: 144}


def open_file_bytes(board):
    """The heap an open file on the board's filesystem takes: its profile's open_file_bytes, else the estimate."""
    return board.get("open_file_bytes") or FILE_OBJECT_BYTES[board["word_bytes"]]


def placement(report, board):
    """Where the plan's constants live on the board: in place where its firmware has ROMFS, else streamed
    from the plan's file if the plan has a stream section, else in RAM."""
    if board["romfs"].get("available"):
        return "in place"
    return "streamed" if report.get("streamed") else "in RAM"


def plan_in_ram(board):
    """A plan is read into RAM (open().read()) unless the board can keep it in flash on ROMFS."""
    return not board["romfs"].get("available")


def ram_needed(report, board, where=None):
    """{part: bytes} of the heap a Trainer of the plan takes on this board with its constants `where`
    (placement(), by default), as boards/README.md explains."""
    word = board["word_bytes"]
    where = placement(report, board) if where is None else where
    if where not in PLACEMENTS:
        raise ValueError("placement %r: one of %s" % (where, ", ".join(PLACEMENTS)))
    if where == "streamed":
        return {"ram_bytes": _round(report["file_ram_bytes"] - report["head_bytes"], word),
                "trainer": _round(TRAINER_OBJECT_BYTES[word], word),
                "head": _round(report["head_bytes"], word),
                "file": _round(open_file_bytes(board), word)}
    return {"ram_bytes": _round(report["ram_bytes"], word),
            "trainer": _round(TRAINER_OBJECT_BYTES[word], word),
            "plan": _round(report["plan_bytes"], word) if where == "in RAM" else 0}


def wants_stream(report, board):
    """compile --constants auto for a board: stream the constants from the plan's file unless the board keeps
    the plan in flash (ROMFS) or the plan is small beside its heap (an eighth of it at most, whole in RAM
    with room to spare, so that a fragmented heap still finds the block)."""
    free, _ = free_heap(board)
    if board["romfs"].get("available") or free is None:
        return False
    return report["plan_bytes"] > free // 8 or sum(ram_needed(report, board, "in RAM").values()) > free


def _state_bytes(report, prefix):
    return sum(t["bytes"] for t in report["tensors"] if t["storage"] == "state" and t["name"].startswith(prefix))


def _remedies(report, board, short, where):
    """What would make the plan fit: (what, bytes saved or None)."""
    out = []
    acc = _state_bytes(report, "acc(")
    if report["batch"] > 1 and acc:
        out.append(("--batch 1 (drops the gradient accumulators)", acc))
    mom = _state_bytes(report, "mom(")
    if mom:
        out.append(("--momentum 0 (drops the momentum buffers)", mom))
    if report["update"] not in ("last-layer", "bias"):
        out.append(("a sparser --update (last-layer, bias or last:K: fewer parameters and gradients)", None))
    if where == "in RAM" and report["plan_bytes"]:
        out.append(("--constants stream (the plan's constants read from its file as the ops need them, only "
                    "its head in RAM)", None))
    if where != "in place" and report["plan_bytes"]:
        saves = report["plan_bytes"] if where == "in RAM" else report["head_bytes"] + report["context_bytes"]
        if board["romfs"].get("available"):
            out.append(("the plan on ROMFS (read in place from flash)", saves))
        else:
            out.append(("constants on ROMFS (a firmware with a ROMFS partition keeps the plan in flash; %s)"
                        % board["romfs"].get("how", "not in this board's stock firmware"), saves))
    if report["const_bytes"] and where != "in place" and not report["const_int8_bytes"]:
        # int8 constants: a quarter of the plan read into RAM, or of the windows streamed ones are read into
        out.append(("--quantize int8 or --frozen-weights int8 (int8 constants: a quarter of their bytes%s)"
                    % ("" if where == "in RAM" else ", and of the windows they are read into"),
                    report["const_bytes"] * 3 // 4 if where == "in RAM" else None))
    return out


WHERE_TEXT = {"in place": "constants in place in flash (ROMFS)",
              "streamed": "constants streamed from the plan's file",
              "in RAM": "plan read into RAM"}


def _parts_text(parts):
    names = {"ram_bytes": "RAM", "trainer": "Trainer", "plan": "plan read into RAM", "head": "plan head",
             "file": "open file"}
    return " + ".join("%s %s" % (names[k], _kb(v)) for k, v in parts.items() if v)


def check(report, board):
    """Check a plan's report against a board. Returns (lines of notes) when it fits;
    raises DoesNotFit with one line (numbers and remedies) when it does not."""
    name = board["name"]
    free, measured = free_heap(board)
    where = placement(report, board)
    parts = ram_needed(report, board, where)
    need = sum(parts.values())
    notes = []
    if free is None:
        raise BoardError("board %s: its free heap is not known (boards/%s.json heap.free_bytes); "
                         "cannot check a plan against it" % (name, name))
    how = "" if measured else " (an estimate, not measured: %s)" % board["heap"]["how"]
    if need > free:
        short = need - free
        fixes = _remedies(report, board, short, where)
        fix_text = "; ".join("%s%s" % (w, " saves %s" % _kb(b) if b else "") for w, b in fixes)
        others = [n for n, b in all_boards().items()
                  if n != name and b["heap"].get("free_bytes")
                  and sum(ram_needed(report, b).values()) <= b["heap"]["free_bytes"]]
        raise DoesNotFit(
            "plan does not fit %s (%s): needs %s of heap (%s), the board has %s free%s: "
            "%s short. Would help: %s%s" % (
                name, WHERE_TEXT[where], _kb(need), _parts_text(parts), _kb(free), how,
                _kb(short), fix_text or "a board with more RAM",
                ". Fits on: " + ", ".join(others) if others else ""))
    notes.append("fits %s (%s): needs %s of heap (%s), %s free%s, %s to spare"
                 % (name, WHERE_TEXT[where], _kb(need), _parts_text(parts), _kb(free), how, _kb(free - need)))
    nat = board["heap"].get("natmod_free_bytes")
    if nat:   # the board's stock firmware with the .mpy, whose code takes heap the firmware's module does not
        notes.append("on %s's stock MicroPython with microtrain as its .mpy (the module's code in the heap): %s free, %s"
                     % (name, _kb(nat), "%s to spare" % _kb(nat - need) if need <= nat else
                        "%s short: use firmware with microtrain built in (make firmware BOARD=%s)" % (_kb(need - nat), name)))
    fs = board.get("filesystem_bytes")
    if fs is not None and fs and report["plan_bytes"] > fs:
        raise DoesNotFit("plan does not fit %s: the plan is %s and the board's filesystem holds %s; "
                         "use fewer or smaller constants" % (name, _kb(report["plan_bytes"]), _kb(fs)))
    if board["fpu"] == "none":
        notes.append("%s has no FPU: float32 runs in software (same results, much slower); %d MACs per step"
                     % (name, report["macs_per_step"]))
    if board["status"] == "unverified":
        notes.append("%s is unverified: its firmware was not built or run here (boards/README.md)" % name)
    return notes


# ---- listing ------------------------------------------------------------------------------------


def table_rows(boards=None):
    boards = boards or all_boards()
    rows = []
    for n, b in boards.items():
        free, measured = free_heap(b)
        rows.append({"name": n, "core": b["core"], "fpu": b["fpu"],
                     "sram": _kb(b["sram_bytes"]) if b["sram_bytes"] else "-",
                     "flash": _kb(b["flash_bytes"]) if b["flash_bytes"] else "-",
                     "heap_free": (_kb(free) + ("" if measured else " (est.)")) if free else "unknown",
                     "mpy_arch": b["mpy_arch"], "port": "%s %s" % (b["port"], b["board"] or b.get("variant", "")),
                     "romfs": "yes" if b["romfs"].get("available") else "no", "status": b["status"]})
    return rows


def print_boards(out=sys.stdout, as_json=False):
    boards = all_boards()
    if as_json:
        json.dump(boards, out, indent=1)
        out.write("\n")
        return
    cols = [("name", "board"), ("core", "core"), ("fpu", "FPU"), ("sram", "SRAM"), ("flash", "flash"),
            ("heap_free", "heap free"), ("mpy_arch", ".mpy arch"), ("port", "MicroPython"), ("romfs", "ROMFS"),
            ("status", "status")]
    rows = table_rows(boards)
    width = {k: max(len(h), *(len(str(r[k])) for r in rows)) for k, h in cols}
    out.write("  ".join(h.ljust(width[k]) for k, h in cols).rstrip() + "\n")
    for r in rows:
        out.write("  ".join(str(r[k]).ljust(width[k]) for k, _ in cols).rstrip() + "\n")
    out.write("\nheap free: what MicroPython leaves for microtrain after boot and `import microtrain` "
              "(est. = not measured here). microtrain compile/report --board NAME checks a plan against it.\n")


# ---- flashing -----------------------------------------------------------------------------------

FLASH_HELP = {
    "esptool": "esptool (pip install esptool)",
    "uf2": "a mounted RPI-RP2 / RP2350 drive (hold BOOTSEL while plugging in) or picotool (apt-get install picotool)",
    "dfu-util": "dfu-util (apt-get install dfu-util)",
    "st-flash": "st-flash (apt-get install stlink-tools)",
}


def _uf2_drive(label):
    for base in ("/media", "/run/media", "/mnt"):
        for d in glob.glob(os.path.join(base, "*", label)) + glob.glob(os.path.join(base, label)):
            if os.path.isfile(os.path.join(d, "INFO_UF2.TXT")):
                return d
    return None


def flash_command(board, image, port=None):
    """The command that writes IMAGE to the board, or raise BoardError saying what is missing."""
    tool = board["flash_tool"]
    if tool is None:
        raise BoardError("%s runs here without flashing (%s); nothing to flash" % (board["name"], board["run"]))
    if not os.path.isfile(image):
        raise BoardError("no firmware image %s; build it with `make firmware BOARD=%s`" % (image, board["name"]))
    if tool == "esptool":
        exe = shutil.which("esptool") or shutil.which("esptool.py")
        if not exe:
            raise BoardError("flashing %s needs %s" % (board["name"], FLASH_HELP[tool]))
        if not port:
            raise BoardError("flashing %s with esptool needs --port (e.g. /dev/ttyUSB0)" % board["name"])
        chip = board["mcu"].lower().replace("-", "")            # esp32, esp32s3, esp32c3, esp32c6
        offset = "0x1000" if chip in ("esp32", "esp32s2") else "0x0"   # where the bootloader goes
        return [exe, "--chip", chip, "--port", port, "--baud", "460800", "write_flash", offset, image]
    if tool == "uf2":
        drive = _uf2_drive("RPI-RP2" if board["mcu"] == "RP2040" else "RP2350")
        if drive:
            return ["cp", image, drive + "/"]
        exe = shutil.which("picotool")
        if exe:
            return [exe, "load", "-x", image]
        raise BoardError("flashing %s needs %s" % (board["name"], FLASH_HELP[tool]))
    if tool == "dfu-util":
        exe = shutil.which("dfu-util")
        if not exe:
            raise BoardError("flashing %s needs %s; put the board in DFU mode first" % (board["name"], FLASH_HELP[tool]))
        return [exe, "-a", "0", "-d", "0483:df11", "-D", image]
    if tool == "st-flash":
        exe = shutil.which("st-flash")
        if not exe:
            raise BoardError("flashing %s needs %s" % (board["name"], FLASH_HELP[tool]))
        return [exe, "--reset", "--format", "ihex", "write", image]
    raise BoardError("boards/%s.json: unknown flash_tool %r" % (board["name"], tool))


def firmware_image(board, build_root=None):
    return os.path.join(build_root or os.path.join(ROOT, "build"), "firmware", board["name"], board["image"])


def flash(name, port=None, image=None, dry_run=False, out=sys.stdout):
    board = load_board(name)
    cmd = flash_command(board, image or firmware_image(board), port)
    out.write("$ %s\n" % " ".join(cmd))
    if not dry_run:
        r = subprocess.run(cmd)
        if r.returncode:
            raise BoardError("%s failed (exit status %d)" % (cmd[0], r.returncode))


# ---- make variables -------------------------------------------------------------------------------

MAKE_FIELDS = ("port", "board", "variant", "board_dir", "build", "submodules", "make_args", "base_manifest", "image", "mpy_arch",
               "qemu_machine", "run", "status", "toolchain")


def make_variables(boards=None):
    """MT_<FIELD>_<name> := value for every profile, for `include` by the Makefile."""
    boards = boards or all_boards()
    lines = ["# generated from boards/*.json by host/microtrain/boards.py --make; do not edit",
             "MT_BOARDS := " + " ".join(boards)]
    for n, b in boards.items():
        for k in MAKE_FIELDS:
            v = b.get(k)
            if isinstance(v, list):
                v = " ".join(v)
            v = ("" if v is None else str(v)).replace("$", "$$")   # manifest paths hold $(PORT_DIR)
            if "#" in v or "\n" in v:
                raise BoardError("boards/%s.json: %s has a character make cannot take: %r" % (n, k, v))
            lines.append("MT_%s_%s := %s" % (k.upper(), n, v))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--make"]:
        sys.stdout.write(make_variables())
    else:
        print_boards()
