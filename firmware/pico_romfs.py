"""The flash layout of the RPI_PICO firmware with a ROMFS partition (firmware/rp2/RPI_PICO_ROMFS,
`make firmware-pico-romfs`; or another board there, such as RP2040_4MB_ROMFS, built with
PICO_ROMFS_BOARD=NAME), read from the board's mpconfigboard.h, the one place it is set.

    python3 firmware/pico_romfs.py [--board NAME] --check FIRMWARE.bin

fails (exit status 1, naming the bytes) when the firmware runs into the ROMFS partition, which
MicroPython's linker script does not check. Standard library only: the Makefile runs it with
any python3.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BOARD = "RPI_PICO_ROMFS"
XIP_BASE = 0x10000000


def board_dir(board=BOARD):
    return os.path.join(HERE, "rp2", board)


def firmware(board=BOARD, name="firmware.uf2"):
    """What `make firmware-pico-romfs PICO_ROMFS_BOARD=board` builds."""
    return os.path.join(ROOT, "build", "firmware-pico-romfs", board, "rpi_pico", name)


FIRMWARE_UF2 = firmware()
FIRMWARE_BIN = firmware(name="firmware.bin")


def _define(text, name, board):
    m = re.search(r"^#define\s+%s\s+\((\d+)\s*\*\s*1024\)" % name, text, re.M)
    if not m:
        raise ValueError("%s: no `#define %s (N * 1024)`" % (os.path.join(board_dir(board), "mpconfigboard.h"), name))
    return int(m.group(1)) * 1024


def layout(board=BOARD):
    """{romfs_addr, romfs_bytes, fs_addr, fs_bytes, code_bytes, flash_bytes}: ROMFS right below the
    filesystem, which ends the flash (ports/rp2/rp2_flash.c); addresses in the XIP map."""
    path = os.path.join(board_dir(board), "mpconfigboard.h")
    if not os.path.isfile(path):
        boards = sorted(os.listdir(os.path.join(HERE, "rp2")))
        raise ValueError("no board %s (the boards: %s)" % (path, ", ".join(boards)))
    with open(path) as f:
        text = f.read()
    flash = _define(text, "MICROTRAIN_FLASH_BYTES", board)
    fs = _define(text, "MICROPY_HW_FLASH_STORAGE_BYTES", board)
    rom = _define(text, "MICROPY_HW_ROMFS_BYTES", board)
    fs_off = flash - fs
    rom_off = fs_off - rom
    return {"romfs_addr": XIP_BASE + rom_off, "romfs_bytes": rom, "fs_addr": XIP_BASE + fs_off, "fs_bytes": fs,
            "code_bytes": rom_off, "flash_bytes": flash, "board": board}


def check(firmware_bin, board=BOARD):
    """The firmware image (firmware.bin, flashed from 0x10000000) ends below the ROMFS partition."""
    size = os.path.getsize(firmware_bin)
    lay = layout(board)
    if size > lay["code_bytes"]:
        raise ValueError("%s is %d bytes: %d bytes into the ROMFS partition at 0x%08x; make "
                         "MICROPY_HW_ROMFS_BYTES smaller in %s" % (firmware_bin, size, size - lay["code_bytes"],
                                                                   lay["romfs_addr"], board_dir(board)))
    return size, lay


def main(argv):
    board = BOARD
    if len(argv) == 4 and argv[0] == "--board":
        board, argv = argv[1], argv[2:]
    if len(argv) != 2 or argv[0] != "--check":
        sys.exit("usage: pico_romfs.py [--board NAME] --check FIRMWARE.bin")
    try:
        size, lay = check(argv[1], board)
    except (OSError, ValueError) as e:
        sys.exit("microtrain: %s" % e)
    print("microtrain: " + board + ": firmware %d of %d bytes, ROMFS %d bytes at 0x%08x, filesystem %d bytes "
          "at 0x%08x" % (size, lay["code_bytes"], lay["romfs_bytes"], lay["romfs_addr"], lay["fs_bytes"],
                         lay["fs_addr"]))


if __name__ == "__main__":
    main(sys.argv[1:])
