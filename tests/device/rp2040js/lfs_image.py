# Run by MicroPython's unix port (tests/device/rp2040js/pico.py: lfs_image()), not by CPython:
#
#     micropython lfs_image.py IMAGE BLOCKS FILE_ON_BOARD HOST_FILE [FILE_ON_BOARD HOST_FILE ...]
#
# formats IMAGE (BLOCKS blocks of 4096 bytes, already filled with 0xFF) as the littlefs filesystem
# that the RPI_PICO firmware's _boot.py mounts at / (vfs.VfsLfs2 on rp2.Flash: 4096-byte blocks,
# progsize=256, readsize and lookahead MicroPython's defaults) and writes each host file into it at
# its path on the board, making the folders on the way. MicroPython's own littlefs, the release the
# firmware has, so the image is what the board would have written itself.
import sys
import vfs

BLOCK = 4096


class FileDisk:
    """A block device on a host file, with the offsets littlefs reads and writes at."""

    def __init__(self, path, blocks):
        self.f = open(path, "r+b")
        self.blocks = blocks

    def readblocks(self, n, buf, off=0):
        self.f.seek(n * BLOCK + off)
        self.f.readinto(buf)

    def writeblocks(self, n, buf, off=0):
        self.f.seek(n * BLOCK + off)
        self.f.write(buf)

    def ioctl(self, op, arg):
        if op == 4:
            return self.blocks
        if op == 5:
            return BLOCK
        if op == 6:   # erase: what erased flash reads
            self.f.seek(arg * BLOCK)
            self.f.write(b"\xff" * BLOCK)
        return 0


def main(args):
    image, blocks, pairs = args[0], int(args[1]), args[2:]
    disk = FileDisk(image, blocks)
    vfs.VfsLfs2.mkfs(disk, progsize=256)
    fs = vfs.VfsLfs2(disk, progsize=256)
    buf = bytearray(BLOCK)
    for i in range(0, len(pairs), 2):
        path, src = pairs[i], pairs[i + 1]
        parts = path.strip("/").split("/")
        for k in range(1, len(parts)):
            try:
                fs.mkdir("/" + "/".join(parts[:k]))
            except OSError:
                pass   # there already
        n = 0
        with open(src, "rb") as s, fs.open("/" + "/".join(parts), "wb") as d:
            while True:
                got = s.readinto(buf)
                if not got:
                    break
                d.write(buf[:got] if got < BLOCK else buf)
                n += got
        print(path, n)
    fs.umount()
    disk.f.close()


main(sys.argv[1:])
