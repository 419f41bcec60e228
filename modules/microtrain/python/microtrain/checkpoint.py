# Atomic checkpoints of a Trainer on the board's filesystem.
#
#     ck = Checkpoint(trainer, "mt/ckpt.bin")
#     meta = ck.restore()          # None, or the dict given to the save it restored
#     ck.save({"samples": n})      # parameters, optimizer state, counters, and meta
#
# A save writes <path>.new, reads it back and checks its CRC, then renames it over
# <path>. A reset or a power cut at any moment leaves either the previous checkpoint
# or the new one whole: restore() reads both files and takes the valid one with the
# higher generation number (a verified .new whose rename did not happen is newer).
#
# File: CK_HEAD (magic, version, generation, meta bytes, state bytes), meta as JSON,
# the Trainer's state (save_state()), then the CRC-32 of everything before it.
import json
import os
import struct

try:
    from binascii import crc32
except ImportError:
    from zlib import crc32

MAGIC = b"MTCK"
VERSION = 1
CK_HEAD = "<4sHHIII"    # magic, version, reserved, generation, meta bytes, state bytes
CK_HEAD_LEN = 20
CHUNK = 512

# Fault tests only: stop writing after this many bytes of a save and wait for a
# reset (the host resets or powers off the board while the save is half done).
PAUSE_AT = None


class Checkpoint:
    def __init__(self, trainer, path="mt/ckpt.bin"):
        self.trainer = trainer
        self.path = path
        self.new_path = path + ".new"
        self.state = bytearray(trainer.state_len)
        self.buf = bytearray(CHUNK)
        self.gen = None     # generation of the newest checkpoint on file, read on first need

    def _check(self, path):
        """(generation, meta bytes) of a valid checkpoint file, else None."""
        try:
            f = open(path, "rb")
        except OSError:
            return None
        with f:
            head = f.read(CK_HEAD_LEN)
            if len(head) != CK_HEAD_LEN:
                return None
            magic, version, _, gen, n_meta, n_state = struct.unpack(CK_HEAD, head)
            if magic != MAGIC or version != VERSION or n_state != len(self.state) or n_meta > 4096:
                return None
            meta = f.read(n_meta)
            crc, whole = self._crc_from(f, n_state, crc32(meta, crc32(head)))
            tail = f.read(4)
            if not whole or len(tail) != 4 or struct.unpack("<I", tail)[0] != crc:
                return None
            return gen, meta

    def _crc_from(self, f, n, crc):
        """Continue crc over the next n bytes of f; (crc, whether all n were there)."""
        mv = memoryview(self.buf)
        while n > 0:
            k = f.readinto(mv[:min(n, CHUNK)])
            if not k:
                return crc & 0xFFFFFFFF, False
            crc = crc32(mv[:k], crc)
            n -= k
        return crc & 0xFFFFFFFF, True

    def exists(self):
        return self._best() is not None

    def _best(self):
        best = None
        for path in (self.path, self.new_path):
            got = self._check(path)
            if got is not None and (best is None or got[0] > best[1]):
                best = (path, got[0], got[1])
        return best

    def restore(self):
        """Load the newest valid checkpoint into the trainer; return its meta dict, or
        None (trainer untouched) when there is none."""
        best = self._best()
        if best is None:
            return None
        path, gen, meta = best
        with open(path, "rb") as f:
            f.seek(CK_HEAD_LEN + len(meta))
            f.readinto(self.state)
        self.trainer.load_state(self.state)
        self.gen = gen
        return json.loads(meta)

    def meta(self):
        """The meta dict of the newest valid checkpoint, without loading it; None if none."""
        best = self._best()
        return None if best is None else json.loads(best[2])

    def save(self, meta=None):
        """Checkpoint the trainer with meta (a JSON-able dict); returns the file's size."""
        self.trainer.save_state(self.state)
        meta = json.dumps(meta or {}).encode()
        if self.gen is None:
            best = self._best()
            self.gen = 0 if best is None else best[1]
        gen = self.gen + 1
        head = struct.pack(CK_HEAD, MAGIC, VERSION, 0, gen, len(meta), len(self.state))
        crc = crc32(self.state, crc32(meta, crc32(head))) & 0xFFFFFFFF
        _makedirs(self.path)
        with open(self.new_path, "wb") as f:
            done = _write(f, head, 0)
            done = _write(f, meta, done)
            done = _write(f, self.state, done)
            _write(f, struct.pack("<I", crc), done)
        got = self._check(self.new_path)
        if got is None or got[0] != gen:
            raise OSError("checkpoint %s did not read back intact; the previous one is kept" % self.new_path)
        try:
            os.rename(self.new_path, self.path)
        except OSError:
            # FAT cannot rename over a file: remove, then rename; until the rename,
            # restore() finds the verified .new
            os.remove(self.path)
            os.rename(self.new_path, self.path)
        self.gen = gen
        return CK_HEAD_LEN + len(meta) + len(self.state) + 4


def _write(f, data, done):
    """f.write(data) as the bytes done..done+len(data) of a save; returns done + len(data).
    Pauses forever at PAUSE_AT bytes into the save (fault tests)."""
    if PAUSE_AT is not None and done + len(data) > PAUSE_AT:
        f.write(memoryview(data)[:PAUSE_AT - done])
        f.flush()
        while True:     # the test resets or powers off the board now
            pass
    f.write(data)
    return done + len(data)


def _makedirs(path):
    d = path.rpartition("/")[0]
    if d:
        try:
            os.mkdir(d)
        except OSError:
            pass
