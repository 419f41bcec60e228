"""The host's end of the serial protocol (protocol.py, shared with the board):
commands out, answers back, resends on silence, NAK or a bad checksum."""
from __future__ import annotations

import json
import random
import struct
import time

from . import protocol as P
from .errors import BoardError, BoardReset, LinkError

# What the board prints when it (re)starts or sits at a REPL prompt: bytes outside
# frames that mean the server is no longer there.
REPL_SIGNS = (b"MicroPython v", b"raw REPL; CTRL-B", b"\n>>> ", b"Traceback (most recent call last)")
POLL = 0.005            # seconds of one wait for bytes
BAD = ("bad",)          # next_frame: a damaged frame went by
QUIET = 0.02            # seconds without a byte in the middle of a frame: its bytes were dropped
RTO_MIN, RTO_MAX = 0.05, 2.0    # bounds of the latency part of a resend timer (seconds)


class Stats:
    """Counts of one link's traffic; `resent` is what the fault tests report."""

    def __init__(self):
        self.sent = self.resent = self.received = 0
        self.bad = self.naks = self.timeouts = 0
        self.bytes_out = self.bytes_in = 0

    def __repr__(self):
        return ("frames sent %d (resent %d), received %d; bad frames %d, NAKs %d, timeouts %d; "
                "bytes out %d, in %d" % (self.sent, self.resent, self.received, self.bad, self.naks,
                                         self.timeouts, self.bytes_out, self.bytes_in))


class Link:
    """Commands over a byte stream `port` (a pyserial Serial, or anything with read(n),
    write(b), a `timeout` attribute and `in_waiting`).

    byte_time: seconds per byte on the wire (1e-4 is 115200 baud, 8N1), for the
    wait before a resend, until the link has measured its own; retries: sends of one
    command before giving up."""

    def __init__(self, port, byte_time=1e-4, retries=30, stats=None):
        self.port = port
        self.byte_time = self.min_byte_time = byte_time   # seconds per byte: as measured, at least the baud rate's
        self.retries = retries
        self.stats = stats or Stats()
        self.seq = random.randrange(1 << 16)
        self.rx = bytearray()
        self.noise = bytearray()   # recent bytes that were not part of a good frame
        self.last_rx = time.monotonic()
        self.srtt, self.rttvar = 0.05, 0.05     # latency beyond the bytes' time, and its spread
        self.work = {}              # kind -> seconds the board took over it, ACK to answer

    # ---- receiving ----
    def _fill(self, deadline):
        """Read what has arrived, waiting until deadline for at least a byte. False on timeout."""
        wait = deadline - time.monotonic()
        if wait <= 0:
            return False
        old = self.port.timeout     # mpremote, sharing the port, expects its own
        # short waits: qemu's UART, on a busy host, delivers bytes several times faster
        # to a reader that wakes every few ms than to one asleep in a long read
        self.port.timeout = min(wait, POLL)
        try:
            data = self.port.read(max(1, self.port.in_waiting))
        finally:
            self.port.timeout = old
        if data:
            self.last_rx = time.monotonic()
            self.rx += data
            self.stats.bytes_in += len(data)
        return True

    def _skip(self, n):
        self.noise += self.rx[:n]
        del self.rx[:n]
        del self.noise[:-256]
        if any(sign in self.noise for sign in REPL_SIGNS):
            text = bytes(self.noise).decode("ascii", "replace")
            self.noise.clear()
            raise BoardReset("the board restarted or left the server (it printed %r)" % text[-60:])

    def next_frame(self, deadline):
        """The next intact frame (kind, flags, seq, payload), None at deadline, or BAD
        after a frame whose header checked out but whose payload did not (a damaged
        answer: worth asking again at once)."""
        partial = False         # a frame's header is in, its rest is not yet
        while True:
            i = self.rx.find(P.SYNC)
            if i < 0:
                self._skip(max(0, len(self.rx) - 1))
            else:
                self._skip(i)
                if len(self.rx) >= P.HEADER_LEN:
                    head = P.parse_header(self.rx)
                    if head is None:
                        self._skip(1)
                        continue
                    kind, flags, seq, n = head
                    end = P.HEADER_LEN + n + P.CRC_LEN
                    if len(self.rx) >= end:
                        payload = bytes(self.rx[P.HEADER_LEN:P.HEADER_LEN + n])
                        crc = int.from_bytes(self.rx[end - P.CRC_LEN:end], "little")
                        if crc == P.frame_crc(self.rx, payload):
                            del self.rx[:end]
                            self.stats.received += 1
                            return kind, flags, seq, payload
                        self.stats.bad += 1
                        self._skip(1)   # a damaged frame: look further on, after asking again
                        return BAD
                    partial = True
            quiet = max(QUIET, 32 * self.byte_time)
            if partial and time.monotonic() - self.last_rx > quiet:
                self.stats.bad += 1     # the line went quiet in the middle of a frame: bytes dropped
                self._skip(1)
                return BAD
            if not self._fill(min(deadline, time.monotonic() + quiet) if partial else deadline):
                if time.monotonic() >= deadline:
                    return None

    # ---- commands ----
    def send_time(self, nbytes):
        return nbytes * self.byte_time

    def _measured(self, nbytes, seconds):
        """An exchange of nbytes took seconds: keep byte_time near the recent rate (less the
        usual latency), so a board that reads slowly (qemu's UART, a busy USB stack) gets
        time to answer, and one slow exchange (a board still starting) counts little."""
        if nbytes >= 256:
            seen = max(0.0, seconds - self.srtt) / nbytes
            self.byte_time = max(self.min_byte_time, 0.8 * self.byte_time + 0.2 * seen)

    def _round_trip(self, nbytes, seconds):
        """A first answer came after seconds for nbytes on the wire (no resend in between,
        as TCP's Karn rule): keep a smoothed latency and its spread (Jacobson's estimator)."""
        r = max(0.0, seconds - self.send_time(nbytes))
        self.rttvar = 0.75 * self.rttvar + 0.25 * abs(r - self.srtt)
        self.srtt = 0.875 * self.srtt + 0.125 * r

    def rto(self, nbytes):
        """Seconds to wait for the first answer (ACK or reply) to nbytes on the wire before
        resending: the bytes at the measured rate, three times over (a resent long frame
        costs a whole frame's time, and an emulator on a busy host stalls), plus the
        latency seen so far and four times its spread. Short for the short frames of a
        noisy line, so that a lost one costs little."""
        return 3 * self.send_time(nbytes) + min(RTO_MAX, max(RTO_MIN, self.srtt + 4 * self.rttvar))

    def request(self, kind, payload=b"", timeout=0.0, ack=False, retries=None, expect=None):
        """Send a command, return the payload of its answer. timeout: seconds the board may
        take over the command once it has arrived (beyond the usual latency). ack: ask for
        an ACK first, so a lost command is resent after a round trip, not after the whole
        timeout; expect: how long the command usually takes (default: as long as it took
        last time), after which a lost answer is asked for again."""
        self.seq = (self.seq + 1) & 0xFFFF
        return self.exchange(kind, self.seq, payload, timeout, ack, retries, expect=expect)

    def exchange(self, kind, seq, payload, timeout=0.0, ack=False, retries=None, frame=None, expect=None):
        """Send a command until its answer arrives; see request(). frame: the exact frame
        to send every time (else each resend asks for a shorter answer: a long answer
        that keeps arriving damaged comes in shorter pieces, see FETCH).

        Resends: after a NAK or a damaged frame at once; after silence at rto() plus
        the expected time (waits double while they keep timing out). The board sends
        the answer again to a resend, it never runs a command twice, so a resend of a
        command the board is still working on only asks again for the answer; such
        silences count against retries once timeout has passed. A command expected to
        take less than a round trip asks for no ACK: its answer is the acknowledgement."""
        retries = retries or self.retries
        if expect is None:
            known = self.work.get(kind)
            expect = min(timeout, 0.5 if known is None else 1.5 * known + 0.01)
        if ack and expect < self.rto(len(payload or b"") + 2 * P.OVERHEAD):
            ack = False
        failures = attempt = 0
        first = time.monotonic()
        acked_at = None
        silent = 0                      # consecutive timeouts: each doubles the next wait
        while failures < retries:
            if attempt:
                self.stats.resent += 1
            if frame is None:
                limit_k = 0 if failures < 2 else max(1, 7 - (failures - 1))   # 4 KB, then 2 KB .. 64 B
                f = P.encode(kind, seq, payload, (P.FLAG_ACK if ack else 0) | (limit_k << P.LIMIT_SHIFT))
            else:
                f = frame
            attempt += 1
            t0 = time.monotonic()
            self.port.write(f)
            self.stats.sent += 1
            self.stats.bytes_out += len(f)
            wire = len(f) + P.OVERHEAD + 16
            backoff = 1 << min(silent, 3)
            deadline = t0 + backoff * (self.rto(wire) + (0 if ack and acked_at is None else expect))
            while True:
                got = self.next_frame(deadline)
                if got is None:
                    self.stats.timeouts += 1
                    silent += 1
                    since = first if acked_at is None else acked_at
                    if (ack and acked_at is None) or time.monotonic() - since > timeout + self.rto(wire):
                        failures += 1
                    break
                silent = 0              # the line works: what went missing was lost to noise
                if got is BAD:          # most likely the answer, damaged
                    failures += 1
                    break
                k, flags, s, body = got
                if k == P.NAK:
                    self.stats.naks += 1
                    failures += 1
                    break
                if s != seq:
                    continue            # a late answer to an earlier try
                if k == P.ACK:
                    if acked_at is None:
                        acked_at = time.monotonic()
                        if attempt == 1:
                            self._round_trip(len(f) + P.OVERHEAD, acked_at - t0)
                            self._measured(len(f) + P.OVERHEAD, acked_at - t0)
                        deadline = acked_at + expect + self.rto(wire)
                    continue
                if flags & P.FLAG_MORE:
                    body = self._fetch_rest(body)
                if k == P.ERROR:
                    err = json.loads(body.decode())
                    raise BoardError(err.get("error", "Error"), err.get("message", ""))
                if k == kind | P.REPLY:
                    now = time.monotonic()
                    if acked_at is not None:
                        if attempt == 1:
                            self.work[kind] = max(0.0, now - acked_at - self.send_time(len(body) + P.OVERHEAD))
                    else:
                        if attempt == 1:
                            self._round_trip(len(f) + len(body) + P.OVERHEAD, now - t0)
                            self._measured(len(f) + len(body) + P.OVERHEAD, now - t0)
                    return body
        raise LinkError("no intact answer to %s after %d tries (%d frames failed their checksum, "
                        "%d timeouts): check the cable and the port"
                        % (P.NAMES.get(kind, hex(kind)), retries, self.stats.bad, self.stats.timeouts))

    def _fetch_rest(self, first):
        """The rest of an answer too long for one frame: FETCH pieces, shorter after failures."""
        total = struct.unpack_from("<I", first, 0)[0]
        data = bytearray(first[4:])
        size = max(64, len(data))
        while len(data) < total:
            try:
                data += self.request(P.FETCH, struct.pack(P.FETCH_HEAD, len(data), min(size, total - len(data))),
                                     retries=None if size <= 64 else 4)
            except LinkError:
                if size <= 64:
                    raise
                size //= 2
        return bytes(data)

    def request_json(self, kind, obj=None, timeout=0.0, ack=False):
        body = b"" if obj is None else json.dumps(obj).encode()
        return json.loads(self.request(kind, body, timeout=timeout, ack=ack).decode())
