# Native-module targets only (inserted by tests/test_micropython.py before the prelude): load
# the test data's _microtrain.mpy (NATMOD_MPY) and the device package (NATMOD_PACKAGE) from a
# filesystem in RAM, as MicroPython's run-natmodtests.py does, and make `import microtrain`
# use them. The .mpy is imported as _mtnative, so it cannot be confused with a _microtrain
# built into the firmware, and is then registered as _microtrain for the package.
import sys, io, vfs, binascii

_MT_FILES = {"/_mtnative.mpy": binascii.a2b_base64(NATMOD_MPY)}
for _k, _v in NATMOD_PACKAGE.items():
    _MT_FILES["/" + _k] = _v
_MT_DIRS = set("/" + _k.rsplit("/", 1)[0] for _k in NATMOD_PACKAGE)


class _MTFile(io.IOBase):
    def __init__(self, data):
        self.data, self.off = data, 0

    def ioctl(self, request, arg):
        return 0 if request == 4 else -1   # MP_STREAM_CLOSE

    def readinto(self, buf):
        n = min(len(buf), len(self.data) - self.off)
        buf[:n] = memoryview(self.data)[self.off:self.off + n]
        self.off += n
        return n


class _MTFS:
    def mount(self, readonly, mkfs):
        pass

    def chdir(self, path):
        pass

    def stat(self, path):
        if path in _MT_DIRS:
            return (0x4000, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        if path in _MT_FILES:
            return (0x8000, 0, 0, 0, 0, 0, len(_MT_FILES[path]), 0, 0, 0)
        raise OSError(2)

    def open(self, path, mode):
        if path not in _MT_FILES:
            raise OSError(2)
        return _MTFile(_MT_FILES[path])


vfs.mount(_MTFS(), "/__mt")
sys.path.insert(0, "/__mt")
import _mtnative
sys.modules["_microtrain"] = _mtnative
import microtrain
if microtrain.Trainer is not _mtnative.Trainer:
    raise SystemExit("the native module did not load")
NATMOD_MPY = None
_MT_FILES.clear()   # frees the .mpy image; later imports find nothing here
