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
        self.load_plan()

    # ---- plan and state ----
    def load_plan(self):
        # the Trainer, the plan and the checkpoint's state copy each want one block:
        # free what is not needed before they are allocated
        self.t = self.ck = self.params = self.last = None
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
        self.ce = self.t.info()["loss"] == "cross-entropy"
        self.out = array("f", bytes(4 * self.t.output_len))
        self.loss_out = array("f", [0])
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
                         "target_len": t.target_len, "ce": self.ce}
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

    def train(self, p):
        t = self.trainer()
        start, count, flags = struct.unpack_from(P.TRAIN_HEAD, p, 0)
        nx = 4 * t.input_len
        ny = 4 if self.ce else 4 * t.target_len
        if len(p) != 8 + count * (nx + ny):
            raise ValueError("TRAIN with %d bytes for %d samples, expected %d"
                             % (len(p), count, 8 + count * (nx + ny)))
        skip = self.samples - start
        if flags & P.TRAIN_DRY or skip < 0 or skip >= count:
            # link benchmark; or samples the board has already trained (a resend), or
            # ones past where it is (it lost state): train nothing, say where it is
            return struct.pack(P.TRAIN_REPLY, self.samples, 0, 0, 0.0, gc.mem_free())
        if self.run is None:
            raise ValueError("no training run: send RUN first")
        xs = p[8:8 + count * nx]
        ys = p[8 + count * nx:]
        labels = struct.unpack_from("<%di" % count, ys, 0) if self.ce else None
        return self.train_samples(t, ((xs[i * nx:(i + 1) * nx], labels[i] if self.ce else ys[i * ny:(i + 1) * ny])
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
        count = struct.unpack_from(P.PREDICT_HEAD, p, 0)[0]
        nx, no = 4 * t.input_len, 4 * t.output_len
        if len(p) != 4 + count * nx:
            raise ValueError("PREDICT with %d bytes for %d samples, expected %d" % (len(p), count, 4 + count * nx))
        res = bytearray(count * no)
        mv = memoryview(res)
        for i in range(count):
            t.predict(p[4 + i * nx:4 + (i + 1) * nx], mv[i * no:(i + 1) * no])
        return res

    def evaluate(self, p):
        t = self.trainer()
        count = struct.unpack_from(P.PREDICT_HEAD, p, 0)[0]
        nx, n_out = 4 * t.input_len, t.output_len
        ny = 4 if self.ce else 4 * t.target_len
        if len(p) != 4 + count * (nx + ny):
            raise ValueError("EVALUATE with %d bytes for %d samples, expected %d"
                             % (len(p), count, 4 + count * (nx + ny)))
        ys = 4 + count * nx
        out = self.out
        correct, sse = 0, 0.0
        for i in range(count):
            t.predict(p[4 + i * nx:4 + (i + 1) * nx], out)
            if self.ce:
                if _argmax(out) == struct.unpack_from("<i", p, ys + 4 * i)[0]:
                    correct += 1
            else:
                y = struct.unpack_from("<%df" % n_out, p, ys + i * ny)
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
    P.PARAM_READ: Server.param_read, P.QUIT: Server.quit, P.FETCH: Server.fetch,
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
