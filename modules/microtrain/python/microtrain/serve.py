# The board's side of `microtrain deploy/train/eval/pull`: a server that speaks the
# framed protocol (protocol.py) over the REPL's own serial link. The host starts it
# through the raw REPL:
#
#     import microtrain; microtrain.serve()
#
# and it runs until the host sends QUIT (or stdin closes). The plan and the
# checkpoint live in the directory "mt" on the board's filesystem (on boards with
# ROMFS, a plan deployed there, /rom/plan.mtp, is read in place from flash; a deploy to
# ROMFS removes mt/plan.mtp, which otherwise comes first). At start
# the server loads the plan and restores the checkpoint, so a board that was reset
# in the middle of training carries on from its last checkpoint.
#
# Training is counted in samples: the run's n-th sample is the same sample on the
# host and the board, every TRAIN names the index of its first sample, and the
# board trains only the ones it has not trained yet. A chunk that arrives twice, or
# overlaps what the board already has, trains nothing twice.
#
# A sample too big for one frame is staged first (STAGE, protocol.py) into one buffer,
# allocated with the plan (given up for the checkpoint's buffers if both do not fit) and
# kept: a step allocates nothing the size of a sample.
import gc
import json
import os
import struct
import sys

import micropython
import select
from array import array

from . import checkpoint
from . import protocol as P

import _microtrain as _mt

DIR = "mt"
PLAN_PATH = DIR + "/plan.mtp"
ROM_PLAN_PATH = "/rom/plan.mtp"   # `microtrain deploy --romfs`: used when mt/plan.mtp is absent
PLAN_NEW = DIR + "/plan.new"
CKPT_PATH = DIR + "/ckpt.bin"
FED_ROUND_PATH = DIR + "/round.bin"     # fedround.ROUND_PATH
QUIET_MS = 15           # no byte for this long: the line is quiet (the frame has ended)
TAIL = 16               # a frame's last bytes are read one by one (see read_exact)


def _exists(path):
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def _file_crc(path):
    """CRC-32 of a file, read 512 bytes at a time into one buffer."""
    crc = 0
    buf = bytearray(512)
    mv = memoryview(buf)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return crc & 0xFFFFFFFF
            crc = P.crc32(mv[:n], crc)


def _romfs():
    """Bytes of the board's first ROMFS partition that a deploy can write (0: none)."""
    try:
        import vfs
        if not hasattr(vfs, "rom_ioctl") or vfs.rom_ioctl(1) < 1:
            return 0
        dev = vfs.rom_ioctl(2, 0)
        return dev.ioctl(4, 0) * dev.ioctl(5, 0) if hasattr(dev, "ioctl") else len(dev)
    except Exception:       # a port whose rom_ioctl answers otherwise: treat as none
        return 0


def _argmax(a):
    best, k = a[0], 0
    for i in range(1, len(a)):
        if a[i] > best:
            best, k = a[i], i
    return k


class Server:
    def __init__(self, rx, tx):
        self.rx = rx
        self.tx = tx
        self.poll = select.poll()
        self.poll.register(rx, select.POLLIN)
        self.buf = bytearray(P.HEADER_LEN + P.MAX_PAYLOAD + P.CRC_LEN)
        self.buf[0:2] = P.SYNC          # never overwritten: reads start at buf[2]
        mv = memoryview(self.buf)
        self.head_rest = mv[2:P.HEADER_LEN]
        self.body = mv[P.HEADER_LEN:]
        self.one = bytearray(1)
        self.last = None                # (seq, kind, answer kind, payload): the answer to send again
        self.long = b""                 # the last answer too long for one frame, for FETCH
        self.running = True
        self.t = None
        self.plan_error = None
        self.plan_crc = None
        self.plan_len = 0
        self.ck = None
        self.run = None                 # the host's id of the training run the state belongs to
        self.samples = 0                # samples of that run trained into the state
        self.params = None              # parameter copies for PARAM_READ, until the next step
        self.upload = None              # plan upload in progress: [file, bytes written, size, crc]
        self.stage = None               # a federated round's values on their way (fedround.py)
        self.staged = None              # the staging buffer: one sample's input, padded, then its label or target
        self.load_plan()

    # ---- plan and state ----
    def load_plan(self):
        # the Trainer, the plan and the checkpoint's state copy each want one block:
        # free what is not needed before they are allocated
        self.t = self.ck = self.params = self.last = self.staged = self.staged_x = self.staged_mv = None
        self.staged_tag, self.staged_len = None, 0
        self.long = b""
        self.run, self.samples = None, 0
        self.plan_error = self.ck_error = None
        gc.collect()
        self.plan_path = path = PLAN_PATH if _exists(PLAN_PATH) or not _exists(ROM_PLAN_PATH) else ROM_PLAN_PATH
        try:
            self.plan_crc = _file_crc(path)
        except OSError:
            return                              # no plan deployed yet
        try:
            self.plan_len = os.stat(path)[6]
            # by its path: in place from ROMFS; else the plan's head read into RAM in pieces and its
            # constants read from the file as the ops need them (a plan with a stream section), or
            # the whole plan read in pieces into one block
            self.t = _mt.Trainer(path)
        except Exception as e:  # reported to the host by HELLO
            self.plan_error = "%s: %s" % (type(e).__name__, e)
            return
        info = self.t.info()
        self.ce = info["loss"] == "cross-entropy"
        self.input_dtype = info["input_dtype"]
        self.nx = self.t.input_len * (4 if self.input_dtype == "float32" else 1)   # bytes of one input
        self.ny = 4 if self.ce else 4 * self.t.target_len                          # of its label or target
        info = None
        if self.staging_bytes():    # beside the Trainer's block while the heap is in one piece
            try:
                self.staging()
            except MemoryError:     # HELLO tells the host; STAGE tries again
                pass
        self.out = array("f", bytes(4 * self.t.output_len))
        self.loss_out = array("f", [0])
        gc.collect()
        try:
            self.ck = checkpoint.Checkpoint(self.t, CKPT_PATH)
        except MemoryError:
            if self.staged is None:
                raise
            self.staged = self.staged_mv = self.staged_x = None     # the plan before its samples' buffer
            gc.collect()
            self.ck = checkpoint.Checkpoint(self.t, CKPT_PATH)
        try:
            meta = self.ck.restore()
        except Exception as e:  # a checkpoint the trainer refuses: start from the plan
            self.t.reset()
            self.ck_error = "%s: %s" % (type(e).__name__, e)
            meta = None
        if meta is not None and meta.get("plan_crc") == self.plan_crc:
            self.run, self.samples = meta["run"], meta["samples"]
        self.fed = None
        if _exists(FED_ROUND_PATH):              # a federated round (fedround.py) to carry on
            from . import fedround
            fedround.restore(self)

    def staging_bytes(self):
        """Bytes of the staging buffer this plan's samples need; 0 when a TRAIN frame carries one."""
        n = P.x_bytes(1, self.nx) + self.ny
        return n if struct.calcsize(P.TRAIN_HEAD) + n > P.MAX_PAYLOAD else 0

    def staging(self):
        """The staging buffer, allocated on first need; a MemoryError that says what did not fit."""
        if self.staged is None:
            n = P.x_bytes(1, self.nx) + self.ny
            gc.collect()
            try:
                self.staged = bytearray(n)
            except MemoryError:
                raise MemoryError("a sample takes %d bytes on the board (its input and label or target) and the "
                                  "board's heap, %d bytes free beside the plan, has no block that large: the "
                                  "sample does not fit the board's RAM" % (n, gc.mem_free()))
            self.staged_mv = memoryview(self.staged)
            self.staged_x = self.staged_mv[:self.nx]
        return self.staged

    def trainer(self):
        if self.t is None:
            raise ValueError(self.plan_error or "no plan on the board: run `microtrain deploy` first")
        return self.t

    def checkpoints(self):
        self.trainer()
        return self.ck

    def checkpoint_meta(self):
        return {"run": self.run, "samples": self.samples, "plan_crc": self.plan_crc}

    def facts(self):
        gc.collect()
        d = {"protocol": P.VERSION, "format_version": _mt.FORMAT_VERSION,
             "platform": sys.platform, "mem_free": gc.mem_free(), "mem_alloc": gc.mem_alloc(),
             "word_bytes": 8 if sys.maxsize > 1 << 32 else 4, "romfs": _romfs(),
             "max_payload": P.MAX_PAYLOAD, "plan": None, "plan_error": self.plan_error,
             "run": self.run, "samples": self.samples, "checkpoint_error": self.ck_error}
        t = self.t
        if t is not None:
            d["plan"] = {"bytes": self.plan_len, "crc": self.plan_crc, "rom": self.plan_path == ROM_PLAN_PATH,
                         "input_len": t.input_len, "output_len": t.output_len,
                         "target_len": t.target_len, "ce": self.ce, "input_dtype": self.input_dtype,
                         "staging": len(self.staged) if self.staged is not None else 0,
                         "staging_needed": self.staging_bytes()}
        return d

    # ---- frames ----
    def read_frame(self):
        """(kind, flags, seq, payload memoryview) of the next good frame, or None after a bad one."""
        rx, one = self.rx, self.one
        prev = 0
        while True:                     # find the sync bytes
            if not rx.readinto(one, 1):
                raise EOFError
            if prev == 0xA5 and one[0] == 0x5A:
                break
            prev = one[0]
        if not self.read_exact(self.head_rest, P.HEADER_LEN - 2):
            return self.reject(False)
        head = P.parse_header(self.buf)
        if head is None:
            return self.reject()
        kind, flags, seq, n = head
        if not self.read_exact(self.body, n + P.CRC_LEN):
            return self.reject(False)
        payload = self.body[:n]
        if struct.unpack_from("<I", self.buf, P.HEADER_LEN + n)[0] != P.frame_crc(self.buf, payload):
            return self.reject()
        return kind, flags, seq, payload

    def read_exact(self, mv, n):
        """Read n bytes into mv; False if the line goes quiet first (bytes were dropped).
        All but the last TAIL bytes in one blocking read (a frame short of at most TAIL
        bytes still has them); the last ones byte by byte, each waited for QUIET_MS, so
        a frame that lost bytes is answered with NAK at once, not when the host resends."""
        rx, one, poll = self.rx, self.one, self.poll
        i = n - TAIL if n > TAIL else 0
        if i:
            rx.readinto(mv, i)
        while i < n:
            if not poll.poll(QUIET_MS):
                return False
            rx.readinto(one, 1)
            mv[i] = one[0]
            i += 1
        return True

    def reject(self, drain=True):
        """A frame failed: wait for the line to go quiet (drain: it is not yet), then ask
        for a resend."""
        while drain and self.poll.poll(QUIET_MS):
            self.rx.readinto(self.one, 1)
        self.tx.write(P.encode(P.NAK, 0))
        return None

    def serve(self):
        while self.running:
            frame = self.read_frame()
            if frame is None:
                continue
            kind, flags, seq, payload = frame
            if kind == P.HELLO:
                self.last = None        # a new session: its seqs start afresh
            elif self.last is not None and self.last[0] == seq and self.last[1] == kind:
                self.answer(seq, self.last[2], self.last[3], flags)    # it was lost: again
                continue
            if flags & P.FLAG_ACK:
                self.tx.write(P.encode(P.ACK, seq))
            handler = HANDLERS.get(kind)
            try:
                if handler is None:
                    raise ValueError("unknown command 0x%02x" % kind)
                rkind, body = kind | P.REPLY, handler(self, payload)
            except Exception as e:
                rkind = P.ERROR
                body = json.dumps({"error": type(e).__name__, "message": str(e)}).encode()
            self.last = (seq, kind, rkind, body)
            self.answer(seq, rkind, body, flags)

    def answer(self, seq, rkind, body, flags):
        """Send an answer, cut to the length the command allows; the host FETCHes the rest."""
        limit = P.reply_limit(flags)
        if len(body) > limit:
            self.long = body
            self.tx.write(P.encode(rkind, seq, struct.pack("<I", len(body)) + body[:limit - 4], P.FLAG_MORE))
        else:
            self.tx.write(P.encode(rkind, seq, body))

    # ---- commands: each takes the payload and returns the reply's payload ----
    def hello(self, p):
        self.staged_tag, self.staged_len = None, 0      # a new session: its tags start afresh
        return json.dumps(self.facts()).encode()

    def info(self, p):
        d = self.facts()
        if self.t is not None:
            d["trainer"] = self.t.info()
            d["checkpoint"] = self.ck.meta()
        return json.dumps(d).encode()

    def plan_begin(self, p):
        req = json.loads(bytes(p))
        if self.upload is not None:
            self.upload[0].close()
        # free the old plan's RAM before the new one arrives
        self.upload = None
        self.t = self.ck = self.params = None
        gc.collect()
        if not req["bytes"]:            # only free the RAM (a deploy to ROMFS follows)
            return b"{}"
        try:
            os.mkdir(DIR)
        except OSError:
            pass
        self.upload = [open(PLAN_NEW, "wb"), 0, req["bytes"], req["crc"]]
        return b"{}"

    def plan_data(self, p):
        if self.upload is None:
            raise ValueError("PLAN_DATA without PLAN_BEGIN")
        off = struct.unpack_from(P.PLAN_DATA_HEAD, p, 0)[0]
        up = self.upload
        data = p[4:]
        if off == up[1]:                # the next piece; an earlier one was a resend
            if off + len(data) > up[2]:
                raise ValueError("plan data past the announced %d bytes" % up[2])
            up[0].write(data)
            up[1] += len(data)
        elif off > up[1]:
            raise ValueError("plan data at %d, expected %d" % (off, up[1]))
        return struct.pack("<I", up[1])

    def plan_end(self, p):
        up = self.upload
        if up is None:
            raise ValueError("PLAN_END without PLAN_BEGIN")
        up[0].close()
        self.upload = None
        crc = _file_crc(PLAN_NEW)
        size = os.stat(PLAN_NEW)[6]
        if size != up[2] or crc != up[3]:
            os.remove(PLAN_NEW)
            raise ValueError("plan arrived with %d bytes, CRC %08x; expected %d bytes, CRC %08x"
                             % (size, crc & 0xFFFFFFFF, up[2], up[3]))
        for path in (PLAN_PATH, CKPT_PATH, CKPT_PATH + ".new"):
            try:
                os.remove(path)         # the old plan's checkpoint belongs to the old plan
            except OSError:
                pass
        os.rename(PLAN_NEW, PLAN_PATH)
        self.load_plan()
        return self.info(p)

    def plan_read(self, p):
        self.trainer()
        off, n = struct.unpack_from(P.PLAN_READ_HEAD, p, 0)
        with open(self.plan_path, "rb") as f:
            f.seek(off)
            return f.read(n)

    def start_run(self, p):
        req = json.loads(bytes(p))
        t = self.trainer()
        run = req["run"]
        if req.get("resume"):
            if self.run != run:
                meta = self.checkpoints().meta()
                if meta is None or meta.get("run") != run or meta.get("plan_crc") != self.plan_crc:
                    raise ValueError("no checkpoint of this run on the board to resume from")
                self.restore(p)
        else:
            t.reset()
            self.run, self.samples, self.params = run, 0, None
            self.ck.save(self.checkpoint_meta())    # a reset from now on comes back to here
        return json.dumps({"run": self.run, "samples": self.samples}).encode()

    def rows(self, p, head, what, ny):
        """The samples of a TRAIN, EVALUATE or PREDICT payload whose head is `head` bytes
        (count and flags at head - 4): (count, flags, inputs, offset of the labels or
        targets in the payload or the staging buffer, that payload or buffer). inputs is
        the staged input itself or the frame's inputs, sample i at i * nx."""
        count, flags = struct.unpack_from("<HH", p, head - 4)
        if flags & P.STAGED:
            if len(p) != head + 4 or count != 1:
                raise ValueError("%s of a staged sample with %d bytes for %d samples, expected %d for 1"
                                 % (what, len(p), count, head + 4))
            tag = struct.unpack_from(P.STAGED_HEAD, p, head)[0]
            whole = P.x_bytes(1, self.nx) + ny
            if self.staged is None or tag != self.staged_tag or self.staged_len < whole:
                raise ValueError("%s of staged sample %d, but the board has %d of its %d bytes"
                                 % (what, tag, self.staged_len if tag == self.staged_tag else 0, whole))
            return count, flags, self.staged_x, P.x_bytes(1, self.nx), self.staged_mv
        ys = head + P.x_bytes(count, self.nx)
        if len(p) != ys + count * ny:
            raise ValueError("%s with %d bytes for %d samples, expected %d" % (what, len(p), count, ys + count * ny))
        return count, flags, p[head:head + count * self.nx], ys, p

    @staticmethod
    def x_at(xs, i, nx, flags):
        return xs if flags & P.STAGED else xs[i * nx:(i + 1) * nx]

    def stage(self, p):
        """STAGE: a piece of one sample's input (and its label or target) into the staging
        buffer. A new tag starts a new sample at offset 0; a piece the board already has
        (a resend) is skipped. Answers the bytes of the sample staged."""
        self.trainer()
        tag, off = struct.unpack_from(P.STAGE_HEAD, p, 0)
        data = p[8:]
        staged = self.staging()
        if tag != self.staged_tag:
            if off:
                raise ValueError("STAGE of a new sample at byte %d, expected 0" % off)
            self.staged_tag, self.staged_len = tag, 0
        n = self.staged_len
        if off == n:
            if n + len(data) > len(staged):
                raise ValueError("STAGE past the sample's %d bytes" % len(staged))
            staged[n:n + len(data)] = data
            self.staged_len = n + len(data)
        elif off > n:
            raise ValueError("STAGE at byte %d, expected %d" % (off, n))
        return struct.pack("<I", self.staged_len)

    def train(self, p):
        t = self.trainer()
        start = struct.unpack_from(P.TRAIN_HEAD, p, 0)[0]
        count, flags, xs, ys, yb = self.rows(p, 8, "TRAIN", self.ny)
        skip = self.samples - start
        if flags & P.TRAIN_DRY or skip < 0 or skip >= count:
            # link benchmark; or samples the board has already trained (a resend), or
            # ones past where it is (it lost state): train nothing, say where it is
            return struct.pack(P.TRAIN_REPLY, self.samples, 0, 0, 0.0, gc.mem_free())
        if self.run is None:
            raise ValueError("no training run: send RUN first")
        nx, ny, ce = self.nx, self.ny, self.ce
        labels = struct.unpack_from("<%di" % count, yb, ys) if ce else None
        return self.train_samples(t, ((self.x_at(xs, i, nx, flags), labels[i] if ce else yb[ys + i * ny:ys + (i + 1) * ny])
                                      for i in range(skip, count)), count - skip, flags & P.TRAIN_ACCURACY)

    def train_samples(self, t, samples, count, accuracy):
        """Train the `count` (x, y) pairs of `samples` one at a time, each predicted first if
        accuracy is asked for (a cross-entropy plan), counted in self.samples; TRAIN's reply.
        TRAIN's samples come in its frame, a federated round's from the board's store."""
        accuracy = accuracy and self.ce
        out, lo = self.out, self.loss_out
        self.params = None
        total, correct = 0.0, 0
        for x, y in samples:
            if accuracy:
                t.predict(x, out)
                if _argmax(out) == y:
                    correct += 1
            t.step(x, y, lo)
            total += lo[0]
            self.samples += 1
        return struct.pack(P.TRAIN_REPLY, self.samples, count, correct, total, gc.mem_free())

    def predict(self, p):
        t = self.trainer()
        count, flags, xs, _, _ = self.rows(p, 4, "PREDICT", 0)
        nx, no = self.nx, 4 * t.output_len
        res = bytearray(count * no)
        mv = memoryview(res)
        for i in range(count):
            t.predict(self.x_at(xs, i, nx, flags), mv[i * no:(i + 1) * no])
        return res

    def evaluate(self, p):
        t = self.trainer()
        count, flags, xs, ys, yb = self.rows(p, 4, "EVALUATE", self.ny)
        nx, ny, n_out = self.nx, self.ny, t.output_len
        out = self.out
        correct, sse = 0, 0.0
        for i in range(count):
            t.predict(self.x_at(xs, i, nx, flags), out)
            if self.ce:
                if _argmax(out) == struct.unpack_from("<i", yb, ys + 4 * i)[0]:
                    correct += 1
            else:
                y = struct.unpack_from("<%df" % n_out, yb, ys + i * ny)
                for k in range(n_out):
                    sse += (out[k] - y[k]) ** 2
        return struct.pack(P.EVAL_REPLY, count, correct, sse)

    def save(self, p):
        self.checkpoints()
        if len(p):
            req = json.loads(bytes(p))
            if "pause_at" in req:       # fault tests: stop half way through this save
                checkpoint.PAUSE_AT = req["pause_at"]
        n = self.ck.save(self.checkpoint_meta())
        return json.dumps({"samples": self.samples, "bytes": n}).encode()

    def restore(self, p):
        self.checkpoints()
        meta = self.ck.restore()
        if meta is None or meta.get("plan_crc") != self.plan_crc:
            raise ValueError("no checkpoint of this plan on the board")
        self.run, self.samples, self.params = meta["run"], meta["samples"], None
        return json.dumps({"run": self.run, "samples": self.samples}).encode()

    def list_params(self, p):
        t = self.trainer()
        self.params = [(k, bytes(v)) for k, v in sorted(t.params().items())]
        return json.dumps([[k, len(v)] for k, v in self.params]).encode()

    def param_read(self, p):
        if self.params is None:
            raise ValueError("PARAM_READ without PARAMS (or training since)")
        k, off, n = struct.unpack_from(P.PARAM_READ_HEAD, p, 0)
        return self.params[k][1][off:off + n]

    def fetch(self, p):
        off, n = struct.unpack_from(P.FETCH_HEAD, p, 0)
        return self.long[off:off + n]

    def quit(self, p):
        if self.upload is not None:     # a file left open would outlive the server in littlefs
            self.upload[0].close()
            self.upload = None
        self.running = False
        return b"{}"


HANDLERS = {
    P.HELLO: Server.hello, P.INFO: Server.info, P.PLAN_BEGIN: Server.plan_begin,
    P.PLAN_DATA: Server.plan_data, P.PLAN_END: Server.plan_end, P.PLAN_READ: Server.plan_read,
    P.RUN: Server.start_run,
    P.TRAIN: Server.train, P.PREDICT: Server.predict, P.EVALUATE: Server.evaluate,
    P.SAVE: Server.save, P.RESTORE: Server.restore, P.PARAMS: Server.list_params,
    P.PARAM_READ: Server.param_read, P.QUIT: Server.quit, P.FETCH: Server.fetch, P.STAGE: Server.stage,
}


def _fed(name):
    """A federated round's command (fedround.py), imported on first use."""
    def handler(server, p):
        from . import fedround
        return getattr(fedround, name)(server, p)
    return handler


HANDLERS.update({P.FED_BEGIN: _fed("begin"), P.FED_WRITE: _fed("write"), P.FED_APPLY: _fed("apply"),
                 P.LOCAL_TRAIN: _fed("local_train"), P.LOCAL_EVAL: _fed("local_eval"),
                 P.FED_PARAMS: _fed("params")})


def _need_filesystem():
    """The qemu board has no flash filesystem: the plan and checkpoints go on the RAM
    disk in its PSRAM (microtrain.ramdisk), which survives a reset as flash would."""
    if sys.platform != "qemu":
        return
    import vfs
    if not [m for m in vfs.mount() if m[1] != "/rom"]:     # ROMFS is read-only
        from . import ramdisk
        ramdisk.mount()


def serve(rx=None, tx=None):
    """Serve the host over the REPL's stdin/stdout until it sends QUIT."""
    rx = rx or sys.stdin.buffer
    tx = tx or sys.stdout.buffer
    _need_filesystem()
    micropython.kbd_intr(-1)        # 0x03 in the data is data, not Ctrl-C
    gc.collect()
    try:
        Server(rx, tx).serve()
    except EOFError:
        pass
    finally:
        micropython.kbd_intr(3)
