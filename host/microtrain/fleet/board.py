"""A federated round on one board, from the host the board is plugged into.

    with FleetBoard(port) as fb:
        fb.check_plan(layout)                  # PlanMismatch unless the board runs this plan
        out = fb.train_round(layout, global_values, run=..., seed=..., samples=...)
        out.params, out.stored, out.loss, out.accuracy, out.link_bytes

The board holds its samples (samples.py, `mt/samples.bin` on its filesystem); a round
sends the global values of the plan's trainable parameters (layout.py), trains the
board's own samples in samples.Order's order (counted in samples, as `microtrain
train` is), and reads the trained values back. A reset or a lost link in the middle
of the round is recovered from as `train` does: the board restores the round's last
checkpoint and its sample count, and the host carries on from there, so the values
returned are exactly those of `replay` on the host. Nothing but values, commands and
counts crosses the link."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import struct
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..device import protocol as P
from ..device.board import Board
from ..device.errors import DataError, DeviceError, LinkError, NoDevice
from . import samples as S


# sends of one command before the link counts as lost (then: reconnect, resume from the checkpoint);
# fewer than `microtrain train`'s 30, so that a board that went silent is found out in seconds
LINK_RETRIES = 12


class PlanMismatch(DeviceError):
    """The board runs another plan than the fleet's: it is refused, never averaged."""

    def __init__(self, board_crc, message):
        super().__init__(message)
        self.board_crc = board_crc


class RoundTimeout(DeviceError):
    """The round's time ran out before the board finished."""


def round_run(plan_crc, fleet_id, server_round, values_crc, seed):
    """The board's run id of a round: its plan, fleet, round, global values and seed."""
    crc = zlib.crc32(np.asarray([plan_crc, values_crc, server_round, seed], "<u8").tobytes())
    return zlib.crc32(str(fleet_id).encode(), crc)


def round_seed(seed, server_round):
    return (int(seed) * 1000003 + int(server_round)) & 0xFFFFFFFF


@dataclass
class RoundResult:
    params: dict
    stored: int                 # samples in the board's store (FedAvg's weight)
    trained: int                # samples trained in the round (all of them, over its epochs)
    loss: float                 # mean training loss of the round's samples
    accuracy: float | None      # running accuracy (each sample predicted before it is trained on)
    seconds: float
    link_bytes: dict = field(default_factory=dict)   # {"out": host to board, "in": board to host}
    recoveries: int = 0
    resumed_at: list = field(default_factory=list)   # the board's count each time it carried on a round


@contextlib.contextmanager
def board_lock(port, wait=None):
    """One process at a time on a board: a Flower engine may hand two rounds of one node to
    two workers (a late round and the next), which must not share the serial line."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", os.path.realpath(port))
    path = os.path.join(tempfile.gettempdir(), "microtrain-fleet-%s.lock" % name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    raise RoundTimeout("the board on %s is still busy with an earlier round after %.0f s"
                                       % (port, wait))
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


class FleetBoard:
    """A device.Board with the federated round's commands. The server stays running when
    the host lets go of the port (close), so the next round only says HELLO."""

    def __init__(self, port, baud=115200, board=None):
        self.board = board or Board(port, baud=baud, retries=LINK_RETRIES)
        self.port = port

    def __enter__(self):
        return self

    def connect(self, deadline=None):
        """Reach the board's server (starting it through the REPL if need be); a silent board is
        tried again until deadline (time.monotonic()), one whose port is gone fails at once."""
        def late():
            if deadline is not None and time.monotonic() > deadline:
                raise RoundTimeout("the board on %s did not answer before the round's time ran out; it is left "
                                   "out of this round" % self.port)
        self._reconnect(deadline, late, first=True)
        return self.board.facts

    def __exit__(self, *exc):
        try:
            self.board.close(quit=False)
        except OSError:         # a port whose board went away fails even its close: what failed first counts
            pass

    @property
    def stats(self):
        return self.board.stats

    def plan_crc(self):
        facts = self.board.facts or self.board.connect()
        if facts["plan"] is None:
            raise DataError("no plan on the board on %s%s: deploy the fleet's plan with `microtrain deploy PLAN.mtp`"
                            % (self.port, " (%s)" % facts["plan_error"] if facts.get("plan_error") else ""))
        return facts["plan"]["crc"]

    def check_plan(self, plan_crc):
        got = self.plan_crc()
        if got != plan_crc:
            raise PlanMismatch(got, "the board on %s runs plan %08x, the fleet trains plan %08x: it is left out of the "
                               "round; deploy the fleet's plan to it with `microtrain deploy PLAN.mtp --port %s`"
                               % (self.port, got, plan_crc, self.port))

    # ---- the round's values ----
    def _begin(self, layout, data, crc, run, seed, epochs, steps, train):
        """FED_BEGIN (the board answers how many samples it holds and the round's total), then the
        values, unless the board has this round under way already."""
        req = {"run": run, "seed": seed, "epochs": epochs, "steps": steps, "train": train,
               "params": layout.describe(), "crc": crc}
        got = self.board.link.request_json(P.FED_BEGIN, req, timeout=10, ack=True)
        if train and not got["stored"]:
            raise DataError("the board on %s holds no samples in %s: record some there (microtrain.samples.Store) "
                            "or put a set there with `microtrain fleet provision`" % (self.port, S.PATH))
        if got["have"]:
            return got
        off = 0
        while off < len(data):
            reply, _ = self.board._sized(P.FED_WRITE, lambda size: (struct.pack(P.FED_WRITE_HEAD, off)
                                                                    + data[off:off + max(1, size - 4)], 0))
            off = struct.unpack("<I", reply)[0]
        got.update(self.board.link.request_json(P.FED_APPLY, timeout=60, ack=True))
        return got

    def read_values(self, layout):
        """The board's trained values, decoded: {name: float32 array in Simulator.params() shape}."""
        listing = self.board.link.request_json(P.FED_PARAMS, timeout=30, ack=True)
        out = {}
        for k, (name, nbytes) in enumerate(listing):
            data = bytearray()
            while len(data) < nbytes:
                left = nbytes - len(data)
                data += self.board._sized(P.PARAM_READ, lambda size: (struct.pack(P.PARAM_READ_HEAD, k, len(data),
                                                                                  min(size, left)), 0))[0]
            out[name] = layout.decode(name, bytes(data))
        return out

    def train_round(self, layout, values, run, seed, epochs=1, steps=0, checkpoint_every=0, deadline=None,
                    max_recoveries=10, accuracy=True, log=None):
        """Train one round from the global `values`; returns a RoundResult. epochs: passes over the
        board's samples; steps > 0: that many samples instead. deadline: time.monotonic() by which
        the round must be done (RoundTimeout after). A reset or lost link is recovered from."""
        log = log or (lambda line: None)
        layout.check(values, "the global values")
        data, crc = layout.encode(values)
        link0 = (self.stats.bytes_out, self.stats.bytes_in)
        t0 = time.monotonic()
        expired = threading.Event()
        progress = {"at": 0, "of": "?"}     # for the timeout's message

        def late():
            if expired.is_set() or (deadline is not None and time.monotonic() > deadline):
                raise RoundTimeout("the round's time ran out with the board on %s at sample %d of %s; it is left "
                                   "out of this round (its state stays checkpointed on the board)"
                                   % (self.port, progress["at"], progress["of"]))

        def expire():
            # a board that stopped answering holds the host in a read: the port closed under it ends that
            expired.set()
            try:
                self.board.transport.serial.close()
            except Exception:
                pass
        watchdog = threading.Timer(max(0.0, deadline - t0), expire) if deadline is not None else None
        if watchdog:
            watchdog.daemon = True
            watchdog.start()
        try:
            return self._train_round(layout, data, crc, run, seed, epochs, steps, checkpoint_every, max_recoveries,
                                     accuracy, log, late, expired, progress, t0, link0, deadline)
        finally:
            if watchdog:
                watchdog.cancel()

    def _train_round(self, layout, data, crc, run, seed, epochs, steps, checkpoint_every, max_recoveries, accuracy,
                     log, late, expired, progress, t0, link0, deadline):
        recoveries = 0
        resumed = []
        samples = None
        got = None
        chunks = {}
        while True:
            try:
                late()
                if got is None:
                    got = self._begin(layout, data, crc, run, seed, epochs, steps, True)
                    samples = progress["of"] = got["total"]
                    if got["have"]:
                        resumed.append(got["samples"])
                        log("%s: the round was under way on the board, at sample %d" % (self.port, got["samples"]))
                done = got["samples"]
                chunks = {k: c for k, c in chunks.items() if k + c[0] <= done}
                saved = done
                while done < samples:
                    late()
                    stop = samples
                    if checkpoint_every:
                        stop = min(stop, (done // checkpoint_every + 1) * checkpoint_every)
                    n = max(1, min(stop - done, int(1.0 / max(self.board.sample_time, 1e-4)), 0xFFFF))
                    reply, _ = self.board._sized(
                        P.LOCAL_TRAIN, lambda size: (struct.pack(P.TRAIN_HEAD, done, n,
                                                                 P.TRAIN_ACCURACY if accuracy else 0), n),
                        timeout=lambda n: 2.0 + 5 * self.board.sample_time * n, ack=True,
                        expect=lambda n: 1.5 * self.board.sample_time * n + 0.02)
                    at, trained, correct, loss_sum, _ = struct.unpack(P.TRAIN_REPLY, reply)
                    if trained and P.LOCAL_TRAIN in self.board.link.work:
                        self.board.sample_time = max(1e-5, self.board.link.work[P.LOCAL_TRAIN] / trained)
                    if trained:
                        chunks[at - trained] = (trained, loss_sum, correct)
                    done = progress["at"] = at
                    got["samples"] = done
                    if checkpoint_every and done % checkpoint_every == 0 and done < samples and done != saved:
                        self.board.save()
                        saved = done
                self.board.save()           # the round's end: a reset now keeps the trained values
                params = self.read_values(layout)
                break
            except (LinkError, OSError, TypeError, AttributeError) as e:
                # TypeError, AttributeError: pyserial's read on a port the watchdog closed
                if expired.is_set():
                    late()
                if not isinstance(e, (LinkError, OSError)):
                    raise
                recoveries += 1
                if recoveries > max_recoveries:
                    raise
                log("%s: link lost (%s); reconnecting, the board resumes from its last checkpoint" % (self.port, e))
                self._reconnect(deadline, late)
                if got is not None:
                    got = self._begin(layout, data, crc, run, seed, epochs, steps, True)
                    if got["have"]:
                        resumed.append(got["samples"])
        n = sum(c[0] for c in chunks.values())
        return RoundResult(
            params=params, stored=got["stored"], trained=samples,
            loss=sum(c[1] for c in chunks.values()) / n if n else float("nan"),
            accuracy=(sum(c[2] for c in chunks.values()) / n if n else float("nan")) if accuracy else None,
            seconds=time.monotonic() - t0,
            link_bytes={"out": self.stats.bytes_out - link0[0], "in": self.stats.bytes_in - link0[1]},
            recoveries=recoveries, resumed_at=resumed)

    def _reconnect(self, deadline, late, first=False):
        """Reach the board's server again. A board whose port is gone (unplugged, powered off) fails
        at once with NoDevice; one whose port is there but silent (resetting, stalled, hung) is tried
        again until the round's deadline (without one: once)."""
        while True:
            late()
            wait = 20.0 if deadline is None else max(1.0, min(20.0, deadline - time.monotonic()))
            try:
                if first:
                    self.board.connect()
                else:
                    self.board.reconnect(wait=wait)
                late()
                return
            except (DeviceError, OSError, ValueError) as e:    # ValueError: a damaged line's JSON
                if isinstance(e, RoundTimeout):
                    raise
                late()
                if not os.path.exists(self.port):
                    raise NoDevice("the board on %s went away (its port is gone: unplugged or powered off); it is "
                                   "left out of this round" % self.port) from e
                if deadline is None:
                    raise
                first = False
                time.sleep(0.5)

    def evaluate(self, layout, values):
        """(samples, accuracy or mse) of `values` on the board's own samples (the trained state of
        the last round stays in its checkpoint)."""
        data, crc = layout.encode(values)
        got = self._begin(layout, data, crc, 0, 0, 0, 0, False)
        stored = got["stored"]
        correct, sse, i = 0, 0.0, 0
        while i < stored:
            reply = self.board.link.request(P.LOCAL_EVAL, struct.pack(P.LOCAL_EVAL_HEAD, i, min(0xFFFF, stored - i)),
                                            timeout=5 + stored * max(self.board.sample_time, 0.001), ack=True)
            count, c, s = struct.unpack(P.EVAL_REPLY, reply)
            correct, sse, i = correct + c, sse + s, i + count
            if not count:
                break
        ce = self.board.facts["plan"]["ce"]
        if not stored:
            return 0, float("nan")
        return stored, correct / stored if ce else sse / (stored * self.board.facts["plan"]["output_len"])


# ---- the samples on a board ----
def store_bytes(plan, x, y):
    """A sample store (samples.py) of x, y for the plan's input: what a board's sensor loop
    would have recorded."""
    n_in = int(np.prod(plan.meta["input"]["shape"][1:]))
    x = np.asarray(x)
    if x.reshape(len(x), -1).shape[1] != n_in:
        raise DataError("each sample has %d values; the plan's input has %d" % (x.reshape(len(x), -1).shape[1], n_in))
    from ..simulator import Simulator
    dtype = Simulator(plan).input_dtype
    if dtype == "float32":
        xb, code = np.ascontiguousarray(x, "<f4").reshape(len(x), -1), S.F32
    else:
        xb = np.ascontiguousarray(x).reshape(len(x), -1)
        if xb.dtype.kind == "f":
            xb = Simulator(plan).quantize_input(xb)
        xb, code = xb.astype(np.int8 if dtype == "int8" else np.uint8), S.I8 if dtype == "int8" else S.U8
    if plan.loss == "cross-entropy":
        yb = np.ascontiguousarray(y, "<i4").reshape(len(y), 1).view(np.uint8)
        head = S.header(n_in, code, S.LABEL, 1)
    else:
        yb = np.ascontiguousarray(y, "<f4").reshape(len(y), -1)
        head = S.header(n_in, code, S.TARGET, yb.shape[1])
        yb = yb.view(np.uint8)
    rows = np.concatenate([xb.view(np.uint8), yb], axis=1)
    return head + rows.tobytes()


def provision(board, plan, x, y, path=S.PATH):
    """Put a labelled set on the board's filesystem as its sample store (through the raw REPL,
    as mpremote copies a file). For boards whose samples did not come from a sensor loop: the
    emulated fleet, a set collected elsewhere. This is the one time samples cross the link."""
    data = store_bytes(plan, x, y)
    facts = board.facts or board.connect()
    board.close(quit=True, keep_port=True)
    board._enter_raw_repl()
    t = board.transport
    d = path.rpartition("/")[0]
    if d and not t.fs_exists(d):
        t.fs_mkdir(d)
    t.fs_writefile(path + ".new", data, chunk_size=512)
    board._exec("import os\ntry:\n    os.remove(%r)\nexcept OSError:\n    pass\nos.rename(%r, %r)\n"
                % (path, path + ".new", path))
    t.exit_raw_repl()
    board.link.rx.clear()
    board.connect()
    return len(data), facts


# ---- the oracle ----
def replay(plan, values, x, y, seed, samples, sim=None):
    """What a board with samples x, y ends a round with: the host simulator from `values`, the
    optimizer cleared, trained on the round's samples in samples.Order's order."""
    from ..simulator import Simulator
    sim = sim or Simulator(plan)
    sim.reset()
    sim.set_params(values)
    order = S.Order(len(x), seed)
    for k in range(samples):
        i = order.record(k)
        sim.step(x[i], y[i])
    return sim.params()


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default
