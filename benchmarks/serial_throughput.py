"""Samples per second over the serial link to the qemu MPS2_AN500 board: the raw
UART, the protocol alone, and training, for a model whose step takes about 1 ms on
the board. Prints figures; decides nothing.

    .venv/bin/python benchmarks/serial_throughput.py [--samples 400] [--hidden 96]
    .venv/bin/python benchmarks/serial_throughput.py --staged   # samples bigger than a frame

raw UART      x and y bytes with no framing at all, read by a plain loop on the board
              (stop-and-wait chunks of the protocol's size, and one stream)
link alone    TRAIN frames that the board receives and checks but does not train on
train         TRAIN frames trained on (with and without the running accuracy)
on the board  t.step() in a loop over samples already in RAM

protocol cost = 1 - (link alone) / (raw UART, stop-and-wait chunks of the same size).

--staged: bytes/s and samples/s training samples too big for one frame (STAGE pieces, then
TRAIN by tag): serial_support's 1x32x40 float32 spectrogram and 3x96x96 uint8 image plans,
each beside the raw UART's stream of the same bytes measured right after it.
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))

import microtrain  # noqa: E402
import models  # noqa: E402
from microtrain.device import protocol as P  # noqa: E402
from microtrain.device.board import Board  # noqa: E402
from microtrain.device.emulated import QemuBoard  # noqa: E402
from microtrain.device.link import POLL  # noqa: E402

FIRMWARE = os.path.join(ROOT, "build", "firmware", "mps2_an500", "firmware.elf")

# a plain reader on the board: `chunks` reads of `size` bytes, one byte back after each
RAW = """import sys, time
b = bytearray(%d)
rx, tx = sys.stdin.buffer, sys.stdout.buffer
t0 = time.ticks_ms()
for i in range(%d):
    rx.readinto(b)
    %s
print(time.ticks_diff(time.ticks_ms(), t0))
"""

STEPS = """from microtrain import ramdisk
ramdisk.mount()
import _microtrain, time, gc
from array import array
gc.collect()
t = _microtrain.Trainer(open('mt/plan.mtp', 'rb').read())
x = array('f', [0.5] * t.input_len)
lo = array('f', [0])
best = None
for r in range(%d):
    t0 = time.ticks_us()
    for i in range(%d):
        t.step(x, i %% t.output_len, lo)
    dt = time.ticks_diff(time.ticks_us(), t0)
    best = dt if best is None else min(best, dt)
print(best)
"""


def raw_rate(board, size, chunks, ack):
    """Bytes per second into the board through the raw REPL, with no protocol."""
    t = board.transport
    t.enter_raw_repl(soft_reset=False)
    t.exec_raw_no_follow(RAW % (size, chunks, "tx.write(b'k')" if ack else "pass"))
    data = bytes(range(256)) * (size // 256 + 1)
    t.serial.timeout = POLL     # the host waits as the protocol's link does
    t0 = time.monotonic()
    for i in range(chunks):
        t.serial.write(data[:size])
        while ack and not t.serial.read(1):
            pass
    end = b""
    while not end.endswith(b"\x04\x04>"):
        end += t.serial.read(64)
    wall = time.monotonic() - t0
    assert end.startswith(b"OK") or b"Traceback" not in end, end
    return size * chunks / wall


def staged_rates(firmware, repeat):
    """(sample, bytes, samples/s, bytes/s, raw stream bytes/s) for the staged samples, best of repeat."""
    import tempfile
    from microtrain.device.training import train
    from serial_support import image, spectrogram
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, make in (("1x32x40 float32", spectrogram), ("3x96x96 uint8", image)):
            plan, x, y, _, _ = make(d)
            # a board of its own: on one that ran the other plan, qemu's heap may have no block for this one
            qemu = QemuBoard(firmware)
            qemu.start()
            try:
                b = Board(qemu.port)
                b.connect()
                b.deploy(plan)
                nbytes = b.check_data(x, y)[0][0].nbytes
                b.close()
                rate = raw = 0.0
                for _ in range(repeat):
                    with Board(qemu.port) as b:
                        t0 = time.monotonic()
                        train(b, x, y, epochs=1)
                        rate = max(rate, len(x) / (time.monotonic() - t0))
                    b = Board(qemu.port)
                    raw = max(raw, raw_rate(b, P.MAX_PAYLOAD, len(x) * nbytes // P.MAX_PAYLOAD, ack=False))
                    b.transport.close()
            finally:
                qemu.close()
            rows.append((name, nbytes, rate, rate * nbytes, raw))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--hidden", type=int, default=96, help="MLP 64-H-10 trained in full (96: 0.4-1.4 ms a step on qemu, "
                    "depending on the core version and the host's load; the step time is printed)")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs of each (the machine is shared)")
    ap.add_argument("--firmware", default=FIRMWARE)
    ap.add_argument("--staged", action="store_true", help="samples bigger than a frame instead (see above)")
    args = ap.parse_args()
    if args.staged:
        print("%-16s %7s %10s %9s %17s  (best of %d)" % ("sample", "bytes", "samples/s", "bytes/s", "raw stream B/s",
                                                     args.repeat))
        for name, nbytes, rate, bps, raw in staged_rates(args.firmware, args.repeat):
            print("%-16s %7d %10.2f %9.0f %17.0f" % (name, nbytes, rate, bps, raw))
        return

    plan = microtrain.compile(models.mlp(n_in=64, hidden=args.hidden, n_out=10, seed=1), update="full",
                              loss="cross-entropy", lr=0.01)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, 64)).astype(np.float32)
    y = rng.integers(0, 10, args.samples)
    per_sample = 64 * 4 + 4

    with QemuBoard(args.firmware) as qemu:
        b = Board(qemu.port)
        b.connect()
        b.deploy(plan)
        xs, ys = b.check_data(x, y)
        rows = b.rows(b.sizer.limit, xs, ys)
        chunk_bytes = rows * per_sample
        n_chunks = max(1, args.samples // rows)
        b.close()

        def stream(b, dry, accuracy=False):
            b.start_run(1)
            t0, i = time.monotonic(), 0
            while i < len(xs):
                n = min(rows, len(xs) - i)
                b.train_chunk(i if not dry else 0, xs[i:i + n], ys[i:i + n], accuracy=accuracy, dry=dry)
                i += n
            return len(xs) / (time.monotonic() - t0)

        best = {}
        resent = 0

        def measure(name, fn):
            best[name] = max(best.get(name, 0), fn())

        # each round measures everything, so that a change in the (shared) machine's load
        # touches all of them alike
        for _ in range(args.repeat):
            b = Board(qemu.port)
            b.connect()
            measure("link", lambda: stream(b, dry=True))
            measure("train", lambda: stream(b, dry=False))
            measure("train_acc", lambda: stream(b, dry=False, accuracy=True))
            resent += b.stats.resent
            b.close()
            b = Board(qemu.port)
            measure("raw_ack", lambda: raw_rate(b, chunk_bytes, n_chunks, ack=True) / per_sample)
            measure("raw_stream", lambda: raw_rate(b, chunk_bytes, n_chunks, ack=False) / per_sample)
            b.transport.close()
        b = Board(qemu.port)
        # a soft reset first: a heap that the runs above left fragmented may have no
        # block for the Trainer (the RAM disk in PSRAM keeps the plan; STEPS mounts it)
        b.transport.enter_raw_repl(soft_reset=True)
        us = int(b.transport.exec(STEPS % (args.repeat, 200)).decode().split()[-1]) / 200
        b.transport.close()
    link, train, train_acc = best["link"], best["train"], best["train_acc"]
    raw_ack, raw_stream = best["raw_ack"], best["raw_stream"]

    on_board = 1e6 / us
    print("model: MLP 64-%d-10, full training, %d MACs per step; %d bytes per sample (x float32, label int32)"
          % (args.hidden, plan.report()["macs_per_step"], per_sample))
    print("step on the board (qemu's clock): %.0f us -> %.0f samples/s training alone" % (us, on_board))
    print("frames of %d samples (%d bytes of samples + %d of framing)" % (rows, chunk_bytes, P.OVERHEAD + 8))
    print("%-44s %8s  (best of %d)" % ("", "samples/s", args.repeat))
    print("%-44s %8.1f" % ("raw UART, one stream", raw_stream))
    print("%-44s %8.1f" % ("raw UART, stop-and-wait chunks", raw_ack))
    print("%-44s %8.1f" % ("link alone (protocol, no training)", link))
    print("%-44s %8.1f" % ("train", train))
    print("%-44s %8.1f" % ("train with running accuracy", train_acc))
    print("protocol cost vs raw stop-and-wait: %.1f%%; vs raw stream: %.1f%%"
          % (100 * (1 - link / raw_ack), 100 * (1 - link / raw_stream)))
    ideal = 1 / (1 / raw_stream + 1 / on_board)
    print("train vs raw stream + training one after the other (%.1f samples/s): %.1f%% slower"
          % (ideal, 100 * (1 - train / ideal)))
    print("frames resent: %d" % resent)


if __name__ == "__main__":
    main()
