# Labelled samples kept on the board's own filesystem, and the order a local run takes
# them in. One definition, run unchanged by the board (MicroPython: the sensor loop
# appends, the server trains from the file in `microtrain fleet` rounds) and by the
# host (CPython: microtrain.fleet writes shards for emulated boards and replays the
# same order in the simulator, the oracle of what a board trains).
#
#     from microtrain.samples import Store
#     s = Store("mt/samples.bin")
#     s.create(input_len=64)              # once: float32 inputs, integer labels
#     s.append(x, label)                  # the sensor loop, one sample at a time
#
# File: HEAD (magic, version, input dtype, label kind, input_len, target_len), then
# records of input_len inputs (float32, int8 or uint8) and the label (int32) or the
# target (target_len float32), little-endian. The count is the file's size over the
# record's, so an append is one write at the end, and one cut short by a reset or a
# power cut is ignored (the count floors) until the next append overwrites it.
import struct

MAGIC = b"MTSM"
VERSION = 1
HEAD = "<4sHBBII"       # magic, version, input dtype, label kind, input_len, target_len
HEAD_LEN = 16
PATH = "mt/samples.bin"

F32, I8, U8 = 0, 1, 2   # input dtypes
DTYPE_BYTES = {F32: 4, I8: 1, U8: 1}
DTYPE_NAMES = {F32: "float32", I8: "int8", U8: "uint8"}
LABEL, TARGET = 0, 1    # label kinds: an int32 class label (cross-entropy), float32 targets (mse)


class Store:
    def __init__(self, path=PATH):
        self.path = path
        self.head = None

    def create(self, input_len, dtype=F32, kind=LABEL, target_len=1):
        """Start an empty store (an existing one is replaced)."""
        with open(self.path, "wb") as f:
            f.write(struct.pack(HEAD, MAGIC, VERSION, dtype, kind, input_len, target_len))
        self.head = None

    def read_head(self):
        """(input dtype, label kind, input_len, target_len); OSError if there is no store,
        ValueError if the file is not one."""
        if self.head is None:
            with open(self.path, "rb") as f:
                b = f.read(HEAD_LEN)
            if len(b) != HEAD_LEN:
                raise ValueError("%s is not a sample store (%d bytes)" % (self.path, len(b)))
            magic, version, dtype, kind, n_in, n_t = struct.unpack(HEAD, b)
            if magic != MAGIC or version != VERSION or dtype not in DTYPE_BYTES or kind not in (LABEL, TARGET):
                raise ValueError("%s is not a version %d sample store" % (self.path, VERSION))
            self.head = (dtype, kind, n_in, n_t)
        return self.head

    def x_bytes(self):
        dtype, _, n_in, _ = self.read_head()
        return DTYPE_BYTES[dtype] * n_in

    def record_bytes(self):
        _, kind, _, n_t = self.read_head()
        return self.x_bytes() + (4 if kind == LABEL else 4 * n_t)

    def count(self):
        import os
        return (os.stat(self.path)[6] - HEAD_LEN) // self.record_bytes()

    def append(self, x, y):
        """Add one sample: x a buffer of input_len values of the store's dtype (array('f')
        for float32), y an int label or a buffer of target_len float32."""
        _, kind, _, _ = self.read_head()
        xb = bytes(x)
        if len(xb) != self.x_bytes():
            raise ValueError("x has %d bytes, the store's samples %d" % (len(xb), self.x_bytes()))
        yb = struct.pack("<i", y) if kind == LABEL else bytes(y)
        if len(xb) + len(yb) != self.record_bytes():
            raise ValueError("y has %d bytes, the store's labels %d" % (len(yb), self.record_bytes() - len(xb)))
        n = self.count()
        with open(self.path, "r+b") as f:
            f.seek(HEAD_LEN + n * len(xb + yb))     # over a record a reset cut short, if any
            f.write(xb + yb)
        return n + 1


def header(input_len, dtype=F32, kind=LABEL, target_len=1):
    """The bytes a store starts with (the host writes whole stores)."""
    return struct.pack(HEAD, MAGIC, VERSION, dtype, kind, input_len, target_len)


class Order:
    """Sample k of a local run -> the store's record: epoch k // n takes the n records in
    a shuffle of its own (Fisher-Yates driven by xorshift32 from seed and epoch). The board
    and the host compute the same orders, so the host's simulator replays the board's run."""

    def __init__(self, n, seed):
        self.n = n
        self.seed = seed
        self.epoch = -1
        self.perm = None

    def record(self, k):
        epoch, pos = divmod(k, self.n)
        if epoch != self.epoch:
            self.perm = permutation(self.n, self.seed, epoch)
            self.epoch = epoch
        return self.perm[pos]


def permutation(n, seed, epoch):
    """A permutation of range(n), the same on every Python (a list of ints)."""
    s = (seed * 0x9E3779B1 + (epoch + 1) * 0x85EBCA6B) & 0xFFFFFFFF or 0x6D2B79F5
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        j = s % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p
