"""The flash layout of the RPI_PICO firmware with a ROMFS partition (firmware/rp2/RPI_PICO_ROMFS,
`make firmware-pico-romfs`), read from that board's mpconfigboard.h, the one place it is set.

    python3 firmware/pico_romfs.py --check build/firmware-pico-romfs/rpi_pico/firmware.bin

fails (exit status 1, naming the bytes) when the firmware runs into the ROMFS partition, which
MicroPython's linker script does not check. Standard library only: the Makefile runs it with
any python3.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BOARD_DIR = os.path.join(HERE, "rp2", "RPI_PICO_ROMFS")
ROOT = os.path.dirname(HERE)
BUILD = os.path.join(ROOT, "build", "firmware-pico-romfs", "rpi_pico")
FIRMWARE_UF2 = os.path.join(BUILD, "firmware.uf2")
FIRMWARE_BIN = os.path.join(BUILD, "firmware.bin")
XIP_BASE = 0x10000000
FLASH_BYTES = 2 * 1024 * 1024       # the Pico's W25Q16 (pico-sdk board "pico": PICO_FLASH_SIZE_BYTES)


def _define(text, name):
    m = re.search(r"^#define\s+%s\s+\((\d+)\s*\*\s*1024\)\s*$" % name, text, re.M)
    if not m:
        raise ValueError("%s: no `#define %s (N * 1024)`" % (os.path.join(BOARD_DIR, "mpconfigboard.h"), name))
    return int(m.group(1)) * 1024


def layout():
    """{romfs_addr, romfs_bytes, fs_addr, fs_bytes, code_bytes}: ROMFS right below the
    filesystem, which ends the flash (ports/rp2/rp2_flash.c); addresses in the XIP map."""
    with open(os.path.join(BOARD_DIR, "mpconfigboard.h")) as f:
        text = f.read()
    fs = _define(text, "MICROPY_HW_FLASH_STORAGE_BYTES")
    rom = _define(text, "MICROPY_HW_ROMFS_BYTES")
    fs_off = FLASH_BYTES - fs
    rom_off = fs_off - rom
    return {"romfs_addr": XIP_BASE + rom_off, "romfs_bytes": rom, "fs_addr": XIP_BASE + fs_off, "fs_bytes": fs,
            "code_bytes": rom_off}


def check(firmware_bin):
    """The firmware image (firmware.bin, flashed from 0x10000000) ends below the ROMFS partition."""
    size = os.path.getsize(firmware_bin)
    lay = layout()
    if size > lay["code_bytes"]:
        raise ValueError("%s is %d bytes: %d bytes into the ROMFS partition at 0x%08x; make "
                         "MICROPY_HW_ROMFS_BYTES smaller in %s" % (firmware_bin, size, size - lay["code_bytes"],
                                                                   lay["romfs_addr"], BOARD_DIR))
    return size, lay


def main(argv):
    if len(argv) != 2 or argv[0] != "--check":
        sys.exit("usage: pico_romfs.py --check FIRMWARE.bin")
    try:
        size, lay = check(argv[1])
    except (OSError, ValueError) as e:
        sys.exit("microtrain: %s" % e)
    print("microtrain: RPI_PICO with ROMFS: firmware %d of %d bytes, ROMFS %d bytes at 0x%08x, filesystem %d bytes "
          "at 0x%08x" % (size, lay["code_bytes"], lay["romfs_bytes"], lay["romfs_addr"], lay["fs_bytes"],
                         lay["fs_addr"]))


if __name__ == "__main__":
    main(sys.argv[1:])
