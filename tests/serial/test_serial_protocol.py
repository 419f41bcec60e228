"""The serial protocol without a board: frames, checksums, the host's resends, and the
first frame sent to a board in an unknown state. The CRC oracle is zlib.crc32."""
import json
import struct
import time
import zlib

import pytest

from microtrain.device import protocol as P
from microtrain.device.board import CHECK, REPL_CONTROL, Board, Sizer
from microtrain.device.errors import BoardError, BoardReset, LinkError
from microtrain.device.link import Link


def test_frame_layout_and_crcs():
    f = P.encode(P.TRAIN, 0x1234, b"abc", P.FLAG_ACK)
    assert f[:2] == b"\xa5\x5a"
    assert struct.unpack("<BBHH", f[2:8]) == (P.TRAIN, P.FLAG_ACK, 0x1234, 3)
    assert struct.unpack("<I", f[8:12])[0] == zlib.crc32(f[2:8])
    assert f[12:15] == b"abc"
    assert struct.unpack("<I", f[15:])[0] == zlib.crc32(f[2:8] + b"abc")
    assert P.parse_header(f) == (P.TRAIN, P.FLAG_ACK, 0x1234, 3)


def test_every_single_bit_flip_is_caught():
    f = P.encode(P.PLAN_DATA, 7, bytes(range(40)))
    for i in range(len(f)):
        for bit in range(8):
            bad = bytearray(f)
            bad[i] ^= 1 << bit
            head = P.parse_header(bad)
            ok = head is not None and head[3] == 40 and \
                struct.unpack_from("<I", bad, P.HEADER_LEN + 40)[0] == P.frame_crc(bad, bad[P.HEADER_LEN:P.HEADER_LEN + 40])
            assert not ok, (i, bit)


def test_payload_limit():
    with pytest.raises(ValueError, match="exceeds the frame limit"):
        P.encode(P.TRAIN, 1, bytes(P.MAX_PAYLOAD + 1))


class FakePort:
    """A port whose board answers each written frame with what respond(kind, seq, payload, n) returns."""

    def __init__(self, respond):
        self.respond = respond
        self.inbox = bytearray()
        self.timeout = None
        self.writes = 0

    @property
    def in_waiting(self):
        return len(self.inbox)

    def write(self, data):
        self.writes += 1
        head = P.parse_header(data)
        self.inbox += self.respond(head[0], head[2], data[P.HEADER_LEN:-4], self.writes)

    def read(self, n):
        out = bytes(self.inbox[:n])
        del self.inbox[:n]
        return out


def test_resend_after_a_damaged_answer_and_a_nak():
    def respond(kind, seq, payload, n):
        good = P.encode(kind | P.REPLY, seq, b"ok")
        if n == 1:
            bad = bytearray(good)
            bad[-6] ^= 0x40
            return b"junk" + bytes(bad)         # damaged: fails its CRC
        if n == 2:
            return P.encode(P.NAK, 0)
        return P.encode(kind | P.REPLY, (seq - 1) & 0xFFFF, b"stale") + good
    link = Link(FakePort(respond))
    assert link.request(P.INFO, timeout=0.2) == b"ok"
    assert link.stats.resent == 2 and link.stats.bad == 1 and link.stats.naks == 1


def test_damaged_or_cut_answers_are_asked_for_again_at_once():
    """An answer that fails its CRC, or stops short (bytes dropped, the line then quiet),
    makes the host resend at once: no resend waits for the timer."""
    def respond(kind, seq, payload, n):
        good = P.encode(kind | P.REPLY, seq, b"answer")
        if n == 1:
            bad = bytearray(good)
            bad[P.HEADER_LEN + 2] ^= 0x10
            return bytes(bad)
        if n == 2:
            return good[:-3]                    # three bytes dropped at the end
        return good
    link = Link(FakePort(respond))
    assert link.request(P.INFO, timeout=5) == b"answer"
    assert link.stats.resent == 2 and link.stats.bad == 2 and link.stats.timeouts == 0


def test_a_lost_answer_after_an_ack_is_asked_for_after_the_expected_time():
    """The board ACKed a long command, then its answer was lost: the host asks again once
    the usual time has passed (expect), not after the command's limit (timeout); the
    board sends its remembered answer again."""
    def respond(kind, seq, payload, n):
        if n == 1:
            return P.encode(P.ACK, seq)         # the answer that followed was lost
        return P.encode(kind | P.REPLY, seq, b"saved")
    link = Link(FakePort(respond))
    t0 = time.monotonic()
    assert link.request(P.SAVE, timeout=60, ack=True, expect=0.2) == b"saved"
    assert time.monotonic() - t0 < 30               # far below the 60 s limit
    assert link.stats.resent == 1 and link.stats.timeouts == 1


def test_module_check_raises_on_a_damaged_name(capsys):
    """connect's module check (run in the raw REPL, which has no checksums): a module name damaged
    on the line must not read as "no microtrain module" (False) but raise, so connect tries again."""
    exec(CHECK, {})   # intact: on the host, microtrain has no Trainer, so False
    assert capsys.readouterr().out.strip() == "False"
    for good, bad in (("'microtrain'", "'micrntrain'"), ("'microtrain'", "'microtrai'"), ("'serve'", "'sarve'")):
        assert good in CHECK
        with pytest.raises(ValueError, match="damaged on the line"):
            exec(CHECK.replace(good, bad, 1), {})


def test_gives_up_after_its_retries():
    link = Link(FakePort(lambda *a: b""), retries=3)
    with pytest.raises(LinkError, match=r"no intact answer to INFO after 3 tries \(0 frames failed their checksum, "
                                        r"3 timeouts\)"):
        link.request(P.INFO, timeout=0.01)


def test_board_error_and_reset_are_reported():
    link = Link(FakePort(lambda k, s, p, n: P.encode(P.ERROR, s, json.dumps(
        {"error": "ValueError", "message": "no plan"}).encode())))
    with pytest.raises(BoardError, match="the board refused: ValueError: no plan"):
        link.request(P.INFO)
    link = Link(FakePort(lambda *a: b"\r\nMicroPython v1.28.0 on 2026; qemu\r\n>>> "))
    with pytest.raises(BoardReset, match="restarted"):
        link.request(P.INFO, timeout=1)


def test_first_frame_is_harmless_to_a_repl():
    """The HELLO sent to a board in an unknown state holds no byte a REPL acts on."""
    b = Board.__new__(Board)
    b.link = Link(FakePort(lambda *a: b""))
    for start in range(0, 1 << 16, 997):
        b.link.seq = start
        frame, seq = b._probe()
        assert not REPL_CONTROL.intersection(frame)
        assert P.parse_header(frame)[:3] == (P.HELLO, 0, seq)


def test_sizer_shrinks_on_resends_and_grows_back():
    s = Sizer(4096, floor=48)
    for _ in range(10):
        s.update(True)
    assert s.size == 48
    for _ in range(200):
        s.update(False)
    assert s.size == 4096


def test_a_board_of_another_protocol_version_is_refused():
    """A board whose server speaks protocol 1 (samples as float32 only, no STAGE) and this host
    (2): connect stops with the FirmwareError naming both, before any other command."""
    from types import SimpleNamespace
    from microtrain.device.errors import FirmwareError
    seen = []

    def respond(kind, seq, payload, n):
        seen.append(kind)
        return P.encode(P.HELLO | P.REPLY, seq, json.dumps({"protocol": 1}).encode())
    b = Board.__new__(Board)
    b.port = "/dev/fake"
    b.link = Link(FakePort(respond))
    b.transport = SimpleNamespace(serial=SimpleNamespace(reset_input_buffer=lambda: None))
    assert P.VERSION == 2
    with pytest.raises(FirmwareError, match="the board speaks microtrain protocol 1, this host 2: install the same"):
        b.connect()
    assert seen == [P.HELLO]
