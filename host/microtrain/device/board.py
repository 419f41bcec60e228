"""A board running microtrain's server, seen from the host.

    with Board(port) as b:          # starts the server through the raw REPL if needed
        b.deploy(plan)
        b.start_run(run_id)
        b.train_chunk(0, x, y)
        b.params()

Files and the REPL go through mpremote's SerialTransport; everything else through
the framed protocol (link.py) on the same serial port."""
from __future__ import annotations

import ast
import contextlib
import io
import json
import struct
import time
import warnings
import zlib

import numpy as np

from . import protocol as P
from .errors import BoardError, BoardReset, DataError, FirmwareError, LinkError, NoDevice, PlanTooBig
from .link import Link
from .ports import describe_ports

# Starts the server through the raw REPL: short, since the REPL has no checksums
START = "import microtrain\nmicrotrain.serve()\n"
# Run in the raw REPL when the server did not answer: is the module there at all? The raw REPL
# has no checksums: a name damaged on a noisy line would import nothing and answer False, a wrong
# "no module" verdict. So the names come with the sum of their characters, and a board that
# receives them damaged raises instead (connect then tries again).
CHECK_NAMES = ("microtrain", "Trainer", "serve")
CHECK = """n = %r
if sum(sum(ord(c) for c in s) for s in n) != %d:
    raise ValueError('damaged on the line')
try:
    m = __import__(n[0])
    m = hasattr(m, n[1]) and hasattr(m, n[2])
except ImportError:
    m = False
print(repr(m))
""" % (CHECK_NAMES, sum(ord(c) for s in CHECK_NAMES for c in s))

# Bytes that a REPL acts on (Ctrl-A..E, CR, LF, ESC): the first frame sent to a board
# whose state is unknown avoids them, so that if a REPL reads it instead of the
# server, it is one line of junk that Ctrl-C clears.
REPL_CONTROL = frozenset(b"\x01\x02\x03\x04\x05\n\r\x1b")

# The largest head of a command that carries samples (TRAIN_HEAD, PREDICT_HEAD; Board.rows)
ROW_HEAD = 8
# The plan's input types as they cross the line (protocol.py: samples in the plan's input type)
INPUT_TYPES = {"float32": "<f4", "int8": "i1", "uint8": "u1"}

# After a deploy to ROMFS: the file plan (which the server would take first) and the
# checkpoints of whatever plan was there go
REMOVE_FILE_PLAN = """import os
for p in ('mt/plan.mtp', 'mt/ckpt.bin', 'mt/ckpt.bin.new'):
    try:
        os.remove(p)
    except OSError:
        pass
"""


def _romfs_deploy(transport, image, partition=0):
    """Write a ROMFS image to the board's partition with mpremote's own `romfs deploy`."""
    import os
    import tempfile
    from types import SimpleNamespace

    from mpremote.commands import CommandError, _do_romfs_deploy
    fd, path = tempfile.mkstemp(suffix=".romfs")
    out = io.StringIO()
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(image)
        state = SimpleNamespace(transport=transport, ensure_raw_repl=lambda: None, did_action=lambda: None)
        with contextlib.redirect_stdout(out):
            _do_romfs_deploy(state, SimpleNamespace(path=path, partition=partition, mpy=False))
    except (CommandError, SystemExit) as e:
        raise FirmwareError("writing the ROMFS partition failed: %s" % (str(e) or out.getvalue().strip()[-200:]))
    finally:
        os.unlink(path)


# Heap the server takes beside the Trainer (boards.ram_needed) while it trains: the
# checkpoint's copy of the state blob (the state plus its header) and file buffer, the
# parameter copies PARAMS makes for a pull, and its own arrays and JSON answers. Its
# frame buffer is not counted: it is allocated before the board reports mem_free.
CHECKPOINT_EXTRA = 64 + 512
SERVER_BYTES = 1024
HEAP_PARTS = {"ram_bytes": "arena and state (and context, where not read from the plan)", "trainer": "Trainer object",
              "plan": "plan read into RAM", "head": "plan head (its constants streamed from the file)",
              "file": "open plan file",
              "checkpoint": "checkpoint buffers", "pull": "parameter copies for pull", "server": "server"}


def _file_placement(plan):
    """Where a plan deployed as a file keeps its constants: streamed from the file when it has a stream
    section (the server opens it by its path: Trainer(path)), else the whole plan read into RAM."""
    return "streamed" if plan.header["stream_off"] else "in RAM"


def _warn_context(plan, info):
    """info, after a RuntimeWarning if the board's context is in RAM where the host's is not."""
    why = context_warning(plan, info.get("trainer") or {})
    if why:
        warnings.warn(why, RuntimeWarning, stacklevel=3)
    return info


def context_warning(plan, trainer):
    """Why the board spends more RAM than plan.report() says, or None: the plan's runtime context
    section, which this machine's core reads in place, was not what the board's core prepares (a
    firmware built from other microtrain sources, or by a compiler that computes a record
    differently), so the board decoded the context into RAM. trainer: the board's Trainer.info()."""
    if plan.context_in_plan and not trainer.get("context_in_plan", True):
        return ("the board decoded the plan's runtime context into RAM (%d bytes more than `microtrain report` "
                "counts): its microtrain core prepares records that differ from this machine's, so it did not use "
                "the plan's context section; flash a firmware built from this microtrain to read it from the plan"
                % trainer["context_bytes"])
    return None


class Sizer:
    """How many bytes to put in one frame: halves when a frame had to be resent (a noisy
    link loses fewer bytes in short frames), grows back after clean exchanges."""

    def __init__(self, limit, floor=48):
        self.limit = limit
        self.floor = floor
        self.size = limit

    def update(self, resent):
        if resent:
            self.size = max(self.floor, self.size // 2)
        else:
            self.size = min(self.limit, self.size + max(self.size // 4, 16))


class Board:
    def __init__(self, port, baud=115200, retries=30, stats=None):
        self.port = port
        self.baud = baud
        self.transport = self._open()
        self.link = Link(self.transport.serial, byte_time=10.0 / baud, retries=retries, stats=stats)
        self.facts = None
        self._plan = None
        self.sizer = Sizer(P.MAX_PAYLOAD)
        self.sample_time = 0.05         # seconds per trained sample, learned from the answers
        self.stage_tag = 0              # the tag of the last sample staged (STAGE)

    # ---- session ----
    def __enter__(self):
        self.connect()
        return self

    def __exit__(self, *exc):
        self.close(quit=exc[0] is None)

    def _open(self, wait=0.0):
        from mpremote.transport import TransportError
        from mpremote.transport_serial import SerialTransport
        deadline = time.monotonic() + wait
        while True:
            try:
                # a timeout, so that mpremote's reads from a pty cannot block for ever
                return SerialTransport(self.port, baudrate=self.baud, timeout=5)
            except TransportError as e:
                if time.monotonic() >= deadline:
                    raise NoDevice("no device at %s (%s)" % (self.port, describe_ports())) from e
                time.sleep(0.5)

    def reconnect(self, wait=20.0):
        """After a reset or a lost link: open the port again (a USB board that was reset
        comes back as a new device) and reach the server again."""
        try:
            self.transport.close()
        except Exception:
            pass
        self.transport = self._open(wait)
        self.link.port = self.transport.serial
        return self.connect()

    @property
    def stats(self):
        return self.link.stats

    def _probe(self):
        """A HELLO frame free of REPL control bytes, and its seq."""
        base = self.link.seq + 1
        for k in range(1 << 16):
            seq = (base + k) & 0xFFFF
            frame = P.encode(P.HELLO, seq, json.dumps({"version": P.VERSION, "nonce": k}).encode())
            if not REPL_CONTROL.intersection(frame):
                self.link.seq = seq
                return frame, seq
        raise AssertionError("no REPL-safe HELLO frame")    # pragma: no cover

    def _hello(self, tries, wait):
        frame, seq = self._probe()
        try:
            return json.loads(self.link.exchange(P.HELLO, seq, None, timeout=wait, retries=tries, frame=frame))
        except LinkError:       # no server (BoardReset: a REPL answered instead)
            return None

    def connect(self):
        """Reach the board's server, starting it through the raw REPL if it is not running.
        Returns the board's facts (HELLO)."""
        from mpremote.transport import TransportError
        self.link.rx.clear()
        self.transport.serial.reset_input_buffer()
        facts = self._hello(tries=2, wait=0.4)
        err = None
        for attempt in range(5):    # the REPL has no checksums: on a noisy line, try again
            if facts is not None:
                break
            try:
                self._enter_raw_repl()
                self.transport.exec_raw_no_follow(START)
                self.link.rx.clear()
            except (TransportError, LinkError) as e:
                err = e
                continue
            facts = self._hello(tries=6, wait=1.0)
            if facts is None:
                try:                # why not? FirmwareError when the module is missing
                    self._check_module()
                except (TransportError, LinkError, SyntaxError, ValueError) as e:
                    err = e
        if facts is None:
            raise LinkError("the board on %s does not answer microtrain's server (%s)"
                            % (self.port, str(err).strip()[-200:] if err else "no answer after starting it"))
        if facts["protocol"] != P.VERSION:
            raise FirmwareError("the board speaks microtrain protocol %d, this host %d: install the same "
                                "microtrain version on both" % (facts["protocol"], P.VERSION))
        self.facts = facts
        return facts

    def _exec(self, code):
        from mpremote.transport import TransportError
        try:
            return self.transport.exec(code)
        except TransportError as e:
            raise LinkError("the board's REPL failed running microtrain's set-up on %s: %s"
                            % (self.port, str(e).strip()[-200:])) from e

    def _enter_raw_repl(self):
        from mpremote.transport import TransportError
        t = self.transport
        for attempt in range(3):
            # Ctrl-C ends whatever ran (or clears the junk our probe left on the REPL's
            # line); then let the board settle: the unix port drops input that arrives
            # while it switches its terminal mode
            t.serial.write(b"\r\x03")
            time.sleep(0.2)
            t.serial.reset_input_buffer()
            try:
                with contextlib.redirect_stdout(io.StringIO()):     # mpremote prints what it read on failure
                    t.enter_raw_repl(soft_reset=False, timeout_overall=3 + 3 * attempt)
                break
            except TransportError as e:
                if attempt == 2:
                    raise NoDevice("no MicroPython REPL answers on %s (%s)" % (self.port, describe_ports())) from e

    def _check_module(self):
        """FirmwareError if the board's firmware has no microtrain module."""
        self._enter_raw_repl()
        if not ast.literal_eval(self._exec(CHECK).decode().strip()):
            raise FirmwareError("the firmware on %s has no microtrain module: flash firmware built with it "
                                "(firmware/README.md) or copy _microtrain.mpy and the microtrain package "
                                "with mpremote" % self.port)

    def close(self, quit=True, keep_port=False):
        """Stop the server (back to the friendly REPL) and close the port (keep_port: not)."""
        try:
            if quit:
                self.link.request(P.QUIT, retries=4)
                # the raw REPL ends the run with \x04 (output) \x04 (errors) and its prompt
                deadline = time.monotonic() + 2
                while b"\x04\x04>" not in self.link.rx and self.link._fill(deadline):
                    pass
                self.transport.exit_raw_repl()
        except Exception:           # the board is gone: nothing to tidy up
            pass
        finally:
            if not keep_port:
                self.transport.close()

    # ---- commands ----
    def info(self):
        return self.link.request_json(P.INFO)

    def plan(self):
        """The board's plan (a microtrain Plan), read back from it once and kept."""
        from ..plan import Plan
        facts = self.facts or self.connect()
        if facts["plan"] is None:
            raise DataError("no plan on the board on %s%s: run `microtrain deploy PLAN.mtp` first"
                            % (self.port, " (%s)" % facts["plan_error"] if facts.get("plan_error") else ""))
        if self._plan is None or zlib.crc32(self._plan.data) != facts["plan"]["crc"]:
            data = bytearray()
            while len(data) < facts["plan"]["bytes"]:
                left = facts["plan"]["bytes"] - len(data)
                data += self._sized(P.PLAN_READ, lambda size: (struct.pack(P.PLAN_READ_HEAD, len(data),
                                                                           min(size, left)), 0))[0]
            if zlib.crc32(data) != facts["plan"]["crc"]:
                raise LinkError("the plan read back from the board does not match its CRC")
            self._plan = Plan(bytes(data))
        return self._plan

    def _sized(self, kind, build, timeout=0.0, ack=False, expect=None):
        """A command whose frame may be cut to any size (every such command is idempotent):
        build(size) gives (payload, n) for a frame of about size bytes. A frame that has
        to be resent makes the next ones smaller, and one that keeps failing is cut
        smaller at once (a noisy line loses fewer bytes in short frames).
        Returns (answer, n)."""
        while True:
            payload, n = build(self.sizer.size)
            before = self.link.stats.resent
            at_floor = self.sizer.size <= self.sizer.floor
            try:
                reply = self.link.request(kind, payload, timeout=timeout(n) if callable(timeout) else timeout,
                                          ack=ack, retries=None if at_floor else 4,
                                          expect=expect(n) if callable(expect) else expect)
            except BoardReset:
                raise
            except LinkError:
                if at_floor:
                    raise
                self.sizer.update(True)
                continue
            self.sizer.update(self.link.stats.resent != before)
            return reply, n

    def deploy(self, plan, progress=None, romfs=None):
        """Put a plan on the board, after checking that the board reads its format and has
        the RAM; returns the board's info afterwards. romfs: True puts it on the board's
        ROMFS partition (read in place from flash, not copied into the heap), False in a
        file in mt/, None chooses: ROMFS where the board has a partition and the plan is
        int8 or would not fit the heap as a file."""
        facts = self.facts or self.connect()
        data = plan.data
        if facts["format_version"] != plan.header["version"]:
            raise FirmwareError("the firmware on %s reads plan format %d, this plan is format %d: %s"
                                % (self.port, facts["format_version"], plan.header["version"],
                                   "recompile the model with the microtrain that built the firmware"
                                   if facts["format_version"] < plan.header["version"] else
                                   "update the board's firmware"))
        if romfs is None:
            r = plan.report()
            fits_as_file = sum(self.heap_needed(plan, _file_placement(plan)).values()) <= facts["mem_free"]
            romfs = bool(facts.get("romfs")) and (r["const_int8_bytes"] > 0 or not fits_as_file)
        if romfs:
            return self._deploy_romfs(plan)
        self.link.request_json(P.PLAN_BEGIN, {"bytes": len(data), "crc": zlib.crc32(data)})
        free = self.link.request_json(P.HELLO, {"version": P.VERSION})["mem_free"]
        self.check_heap(plan, free, _file_placement(plan))
        off = 0
        while off < len(data):
            reply, _ = self._sized(P.PLAN_DATA, lambda size: (struct.pack(P.PLAN_DATA_HEAD, off)
                                                              + data[off:off + max(1, size - 4)], 0))
            off = struct.unpack("<I", reply)[0]
            if progress:
                progress(off, len(data))
        info = self.link.request_json(P.PLAN_END, timeout=30, ack=True)
        if info.get("plan_error"):
            raise FirmwareError("the board could not load the plan: %s" % info["plan_error"])
        self.facts = self.link.request_json(P.HELLO, {"version": P.VERSION})
        self._plan = plan
        return _warn_context(plan, info)

    def _deploy_romfs(self, plan):
        """The plan as /rom/plan.mtp: an image (microtrain.romfs, the plan 8-byte aligned)
        written by mpremote's `romfs deploy` through the raw REPL; mt/plan.mtp and its
        checkpoints removed so that the server takes the ROM plan; the server started
        again and the plan it loaded checked against ours by its CRC."""
        from ..romfs import build
        facts = self.facts
        if not facts.get("romfs"):
            raise FirmwareError("the firmware on %s has no ROMFS partition (vfs.rom_ioctl): deploy the plan as a "
                                "file (without --romfs), or flash a firmware with one" % self.port)
        image = build({"plan.mtp": plan.data})
        if len(image) > facts["romfs"]:
            raise PlanTooBig("the plan's ROMFS image is %d bytes and the board's ROMFS partition %d: %d bytes short"
                             % (len(image), facts["romfs"], len(image) - facts["romfs"]))
        self.link.request_json(P.PLAN_BEGIN, {"bytes": 0, "crc": 0})     # frees the old plan's RAM
        self.check_heap(plan, self.link.request_json(P.HELLO, {"version": P.VERSION})["mem_free"], "in place")
        self.close(quit=True, keep_port=True)
        self._enter_raw_repl()
        _romfs_deploy(self.transport, image)
        self._exec(REMOVE_FILE_PLAN)
        self.transport.exit_raw_repl()
        self.link.rx.clear()
        facts = self.connect()
        want = zlib.crc32(plan.data)
        if not facts["plan"] or not facts["plan"]["rom"] or facts["plan"]["crc"] != want:
            raise FirmwareError("the board did not load the plan from ROMFS (%s)"
                                % (facts.get("plan_error") or "it has plan %r" % (facts["plan"],)))
        self._plan = plan
        return _warn_context(plan, self.info())

    def heap_needed(self, plan, where="in RAM"):
        """{part: bytes} of the board's heap that training this plan through the server
        takes: the Trainer as boards.ram_needed counts it for a board of this word size
        with the plan's constants `where` (boards.PLACEMENTS: GC blocks, the Trainer object,
        the plan itself when it is read into RAM, its head and open file when its constants
        are streamed), plus the server's own (see CHECKPOINT_EXTRA)."""
        from ..boards import _state_bytes, ram_needed
        r = plan.report()
        parts = ram_needed(r, self._profile(), where)
        parts["checkpoint"] = r["param_bytes"] + CHECKPOINT_EXTRA
        parts["pull"] = r["param_bytes"] - _state_bytes(r, "mom(") - _state_bytes(r, "acc(")
        parts["server"] = SERVER_BYTES
        return parts

    def _profile(self):
        """What boards.py needs to know of this board, from what it says of itself."""
        facts = self.facts or {}
        return {"name": facts.get("platform", "board"), "word_bytes": facts.get("word_bytes", 4),
                "romfs": {"available": bool(facts.get("romfs"))}}

    def check_heap(self, plan, free, where="in RAM"):
        """PlanTooBig (by how much, and what would help) if the plan does not fit the free heap."""
        from ..boards import _remedies
        parts = self.heap_needed(plan, where)
        need = sum(parts.values())
        if need > free:
            fixes = _remedies(plan.report(), self._profile(), need - free, where)
            raise PlanTooBig("the plan needs %d bytes of RAM on the board (%s) and the board has %d free: "
                             "%d bytes short; would help: %s"
                             % (need, ", ".join("%s %d" % (HEAP_PARTS.get(k, k), n) for k, n in parts.items() if n),
                                free, need - free,
                                "; ".join(w for w, _ in fixes) or "a board with more RAM"))
        return parts

    # -- data --
    def check_data(self, x, y=None, over_link=True):
        """x (and y) as the board takes them: rows of input_len values of the plan's input type
        (float32, or int8/uint8 for a plan that takes integer input), int32 labels or float32 rows
        of target_len. DataError when they do not fit the plan, or (over_link: they are to cross
        the link) when they are not of its input type or a sample too big for one frame does not
        fit the board's RAM. Not over_link (a fleet's sample store, which quantizes floats itself),
        x keeps its type."""
        p = self.plan()
        shape = tuple(p.meta["input"]["shape"][1:])
        n_in = int(np.prod(shape))
        dtype = p.meta["input"].get("dtype", "float32")
        x = np.asarray(x)
        if x.ndim == 0 or x.dtype.kind not in "fiu":
            raise DataError("x must be numeric samples, got %s of %s" % (x.dtype, x.shape))
        if x[0].size != n_in:
            raise DataError("each sample in x has shape %s (%d values); the plan's input is %s (%d values)"
                            % (x.shape[1:], x[0].size, shape, n_in))
        if dtype != "float32" and over_link:
            info = np.iinfo(dtype)
            if x.dtype.kind not in "iu":
                raise DataError("x holds %s values but the plan takes %s input: give %s values "
                                "(Simulator.quantize_input converts float samples)" % (x.dtype, dtype, dtype))
            if x.size and (x.min() < info.min or x.max() > info.max):
                raise DataError("x holds values from %d to %d but the plan takes %s input (%d to %d)"
                                % (x.min(), x.max(), dtype, info.min, info.max))
        x = np.ascontiguousarray(x, dtype=INPUT_TYPES[dtype] if over_link or dtype == "float32" else None)
        x = x.reshape(len(x), n_in)
        if y is None:
            y_out = None
        else:
            y = np.asarray(y)
            if len(y) != len(x):
                raise DataError("x has %d samples but y has %d" % (len(x), len(y)))
            if p.loss == "cross-entropy":
                n_cls = int(np.prod(p.meta["output"]["shape"][1:]))
                if y.dtype.kind not in "iu" or y.size != len(y):
                    raise DataError("y must hold one integer class label per sample for a cross-entropy plan, "
                                    "got %s of shape %s" % (y.dtype, y.shape))
                if len(y) and (y.min() < 0 or y.max() >= n_cls):
                    raise DataError("labels in y run from %d to %d; the plan has %d classes (0 to %d)"
                                    % (y.min(), y.max(), n_cls, n_cls - 1))
                y_out = np.ascontiguousarray(y, dtype="<i4").reshape(len(y), 1)
            else:
                n_t = self.facts["plan"]["target_len"]
                if y[0].size != n_t:
                    raise DataError("each target in y has %d values; the plan's output has %d" % (y[0].size, n_t))
                y_out = np.ascontiguousarray(y, dtype="<f4").reshape(len(y), n_t)
        if over_link:
            self._check_staging(x, y_out, shape, dtype)
        return x, y_out

    def staged(self, x, y=None, head=ROW_HEAD):
        """Whether a sample of x (and y) is too big for one frame with a command's head: it is
        staged first (STAGE), then trained, evaluated or predicted by its tag."""
        return head + P.x_bytes(1, x.shape[1] * x.itemsize) + (0 if y is None else y.shape[1] * 4) > P.MAX_PAYLOAD

    def _check_staging(self, x, y, shape, dtype):
        """DataError, before anything is sent, when samples that must be staged do not fit the
        board's RAM: the board allocates its staging buffer with the plan, and says whether it
        could (HELLO, at connect and after deploy)."""
        if not self.staged(x, y, ROW_HEAD if y is not None else 4):
            return
        facts = self.facts
        need, have = facts["plan"]["staging_needed"], facts["plan"]["staging"]
        if have < need:
            raise DataError("a sample takes %d bytes on the board (input %s %s and its label or target) and the "
                            "board's heap, %d bytes free beside the plan, has no block that large: the sample does "
                            "not fit the board's RAM; use smaller inputs or a board with more RAM"
                            % (need, "x".join(map(str, shape)), dtype, facts["mem_free"]))

    @staticmethod
    def rows(size, x, y=None, head=ROW_HEAD):
        """How many samples fit in a frame of size bytes (at least one)."""
        per = x.shape[1] * x.itemsize + (0 if y is None else y.shape[1] * 4)
        pad = 3 if x.itemsize % 4 else 0
        return max(1, min(0xFFFF, len(x), (size - head - pad) // per))

    @staticmethod
    def _row_bytes(x, y, n):
        """The first n samples as a command carries them: inputs padded to 4 bytes, then labels or targets."""
        xb = x[:n].tobytes()
        return xb + bytes(P.x_bytes(n, x.shape[1] * x.itemsize) - len(xb)) + (b"" if y is None else y[:n].tobytes())

    def stage(self, x, y=None):
        """Stage one sample (x a row, y its label or target row, or None) on the board in
        pieces the size of the sizer's frames; returns its tag."""
        self.stage_tag = (self.stage_tag + 1) & 0xFFFFFFFF
        tag, data, off = self.stage_tag, self._row_bytes(x.reshape(1, -1), None if y is None else y.reshape(1, -1), 1), 0
        head = struct.calcsize(P.STAGE_HEAD)
        while off < len(data):
            reply, _ = self._sized(P.STAGE, lambda size: (struct.pack(P.STAGE_HEAD, tag, off)
                                                          + data[off:off + max(1, size - head)], 0))
            got = struct.unpack("<I", reply)[0]
            if got <= off:      # a board that takes nothing would be asked for ever
                raise BoardError("STAGE", "the board staged %d bytes of a sample after a piece at byte %d" % (got, off))
            off = got
        return tag

    # -- training --
    def start_run(self, run, resume=False):
        """Begin run `run` (fresh: the plan's initial parameters) or resume it (the board's
        live state or its checkpoint). Returns the samples of the run the board has."""
        return self.link.request_json(P.RUN, {"run": run, "resume": bool(resume)}, timeout=30, ack=True)["samples"]

    def train_chunk(self, start, x, y, accuracy=True, dry=False):
        """Train on samples start, start+1, ... of the run: the first rows of x, y, as many as
        fit in a frame. Returns (samples the board has trained in the run, trained now,
        correct, loss sum, heap free); the board's count says where to go on from."""
        flags = (P.TRAIN_ACCURACY if accuracy else 0) | (P.TRAIN_DRY if dry else 0)
        if self.staged(x, y):
            tag = self.stage(x[0], y[0])
            flags |= P.STAGED

        def build(size):
            if flags & P.STAGED:
                return struct.pack(P.TRAIN_HEAD, start, 1, flags) + struct.pack(P.STAGED_HEAD, tag), 1
            n = self.rows(size, x, y)
            return struct.pack(P.TRAIN_HEAD, start, n, flags) + self._row_bytes(x, y, n), n
        before = self.link.stats.resent
        reply, n = self._sized(P.TRAIN, build, timeout=lambda n: 2.0 + 5 * self.sample_time * n, ack=True,
                               expect=lambda n: 1.5 * self.sample_time * n + 0.02)
        r = struct.unpack(P.TRAIN_REPLY, reply)
        if r[1] and self.link.stats.resent == before and P.TRAIN in self.link.work:
            # the board's time from ACK to answer, measured on a clean exchange
            self.sample_time = max(1e-5, self.link.work[P.TRAIN] / r[1])
        return r

    def save(self, pause_at=None):
        """Checkpoint now. pause_at (fault tests): the board stops that many bytes into the
        save and waits to be reset."""
        req = {} if pause_at is None else {"pause_at": pause_at}
        return self.link.request_json(P.SAVE, req, timeout=60, ack=True)

    def restore(self):
        return self.link.request_json(P.RESTORE, timeout=30, ack=True)

    # -- inference --
    def evaluate(self, x, y):
        """Accuracy (cross-entropy) or mean squared error (mse), as Simulator.evaluate."""
        x, y = self.check_data(x, y)
        staged = self.staged(x, y, head=4)
        correct, sse, i = 0, 0.0, 0
        while i < len(x):
            def build(size):
                if staged:
                    return struct.pack(P.PREDICT_HEAD, 1, P.STAGED) + struct.pack(P.STAGED_HEAD, tag), 1
                n = self.rows(size, x[i:], y[i:], head=4)
                return struct.pack(P.PREDICT_HEAD, n, 0) + self._row_bytes(x[i:], y[i:], n), n
            tag = self.stage(x[i], y[i]) if staged else None
            reply, _ = self._sized(P.EVALUATE, build, timeout=lambda n: 5 + n, ack=True)
            count, c, s = struct.unpack(P.EVAL_REPLY, reply)
            correct, sse, i = correct + c, sse + s, i + count
        if self.facts["plan"]["ce"]:
            return correct / len(x)
        return sse / (len(x) * self.facts["plan"]["output_len"])

    def predict(self, x):
        """Outputs for a batch x (N, ...) as float32 (N, output_len)."""
        x, _ = self.check_data(x)
        staged = self.staged(x, head=4)
        no = self.facts["plan"]["output_len"]
        out, i = [], 0
        while i < len(x):
            def build(size):
                if staged:
                    return struct.pack(P.PREDICT_HEAD, 1, P.STAGED) + struct.pack(P.STAGED_HEAD, tag), 1
                n = max(1, min(self.rows(size, x[i:], head=4), size // (4 * no)))
                return struct.pack(P.PREDICT_HEAD, n, 0) + self._row_bytes(x[i:], None, n), n
            tag = self.stage(x[i]) if staged else None
            reply, n = self._sized(P.PREDICT, build, timeout=lambda n: 5 + n, ack=True)
            out.append(np.frombuffer(reply, "<f4").reshape(-1, no))
            i += n
        return np.concatenate(out) if out else np.zeros((0, no), np.float32)

    def params(self):
        """The trainable parameters now, by ONNX initializer name, in ONNX shapes."""
        shapes = self.plan().meta.get("param_shapes", {})
        out = {}
        for k, (name, nbytes) in enumerate(self.link.request_json(P.PARAMS, timeout=10, ack=True)):
            data = bytearray()
            while len(data) < nbytes:
                left = nbytes - len(data)
                data += self._sized(P.PARAM_READ, lambda size: (struct.pack(P.PARAM_READ_HEAD, k, len(data),
                                                                            min(size, left)), 0))[0]
            a = np.frombuffer(bytes(data), "<f4").astype(np.float32)
            out[name] = a.reshape(shapes[name]) if name in shapes else a
        return out


__all__ = ["Board", "BoardReset", "Sizer"]
