# A filesystem in a fixed region of RAM, for boards with no flash filesystem (the
# qemu MPS2_AN500 and VIRT_RV32 boards): a block device over memory outside MicroPython's
# heap and .bss (the MPS2 board's PSRAM, where the firmware lives in SSRAM1 at 0; the
# virt machine's RAM 16 MB in, above the firmware's image, heap and stack), mounted as
# littlefs.
# The memory keeps its contents across a reset of the board (qemu's system_reset
# reloads the firmware image, not this region), and qemu can map it from a file that
# outlives the emulator (a power cut: see microtrain.device.emulated), so files
# survive as they would in flash; littlefs keeps the file system consistent when a
# reset or power cut interrupts a write.
#
#     from microtrain import ramdisk
#     ramdisk.mount()              # formats the region the first time
import sys

import uctypes
import vfs

# where the disk is, by qemu machine (sys.implementation._machine starts with its name; the
# host's microtrain.device.emulated.QEMU_MACHINES maps these from a file): qemu mps2-an500's
# 16 MB of PSRAM at 0x60000000, the RISC-V virt machine's RAM at 0x81000000
ADDR = 0x81000000 if getattr(sys.implementation, "_machine", "").startswith("virt") else 0x60000000
SIZE = 1024 * 1024
BLOCK = 1024


class RamBlockDev:
    def __init__(self, addr=ADDR, size=SIZE, block=BLOCK):
        self.mem = uctypes.bytearray_at(addr, size)
        self.block = block
        self.count = size // block

    def readblocks(self, n, buf, off=0):
        i = n * self.block + off
        buf[:] = self.mem[i:i + len(buf)]

    def writeblocks(self, n, buf, off=None):
        i = n * self.block + (off or 0)
        self.mem[i:i + len(buf)] = buf

    def ioctl(self, op, arg):
        if op == 4:  # block count
            return self.count
        if op == 5:  # block size
            return self.block
        if op == 6:  # erase: littlefs needs none in RAM
            return 0
        return None


def mount(path="/", addr=ADDR, size=SIZE):
    """Mount the RAM region at path, formatting it if it holds no file system yet.
    Returns the path; mounting twice is harmless."""
    try:
        vfs.umount(path)
    except OSError:
        pass
    dev = RamBlockDev(addr, size)
    try:
        fs = vfs.VfsLfs2(dev)
    except OSError:
        vfs.VfsLfs2.mkfs(dev)
        fs = vfs.VfsLfs2(dev)
    vfs.mount(fs, path)
    return path
