"""Samples too big for one frame cross the link staged (STAGE, docs/serial.md): a 1x32x40
float32 spectrogram (5,120 bytes) and a 3x96x96 uint8 image (27,648 bytes, an int8 plan's
input) train, evaluate and predict on the unix port and the qemu MPS2_AN500 exactly as the
host simulator does; a sample the board's RAM cannot hold is refused on one line.
With -s each run prints its throughput on the emulated link."""
import time

import numpy as np
import pytest

import microtrain
from microtrain.device.board import Board
from microtrain.device.errors import BoardError, DataError
from microtrain.device.training import train
from serial_support import image, make_board, reset_after_next_write, spectrogram

SEED = 5
MODELS = {"spectrogram": spectrogram, "image": image}   # serial_support.py


def oracle(plan, x, y, epochs):
    sim = microtrain.Simulator(plan)
    sim.fit(x, y, epochs=epochs, seed=SEED, progress=False)
    return sim


@pytest.mark.device
# qemu's UART moves about 3 KB/s here: its runs (about 3 minutes) are in `make test-slow`
@pytest.mark.parametrize("target", ["unix", pytest.param("qemu", marks=pytest.mark.slow)])
@pytest.mark.parametrize("model", ["spectrogram", "image"])
def test_staged_samples_train_as_the_simulator(tmp_path, target, model):
    plan, x, y, xt, yt = MODELS[model](tmp_path)
    epochs = 2
    sim = oracle(plan, x, y, epochs)
    board = make_board(target)
    try:
        with Board(board.port) as b:
            b.deploy(plan)
            xs, ys = b.check_data(x, y)
            assert b.staged(xs, ys) and b.staged(xs, head=4), "the test's samples must need staging"
            before = b.stats.bytes_out
            t0 = time.monotonic()
            trained = train(b, x, y, epochs=1, seed=SEED)["trained"]
            free = [b.connect()["mem_free"]]
            trained += train(b, x, y, epochs=epochs, seed=SEED, resume=True)["trained"]
            seconds = time.monotonic() - t0
            free.append(b.connect()["mem_free"])
            sent = b.stats.bytes_out - before
            got = b.params()
            acc = b.evaluate(xt, yt)
            out = b.predict(xt)
            staging = b.connect()["plan"]["staging"]
    finally:
        board.close()
    assert trained == epochs * len(x)
    assert free[1] == free[0], "the board's heap grew by %d bytes in an epoch" % (free[0] - free[1])
    want = sim.params()
    assert sorted(got) == sorted(want)
    for k in want:     # the same C core, the same steps: bit for bit
        assert np.array_equal(got[k], want[k]), (k, np.abs(got[k] - want[k]).max())
    assert acc == sim.evaluate(xt, yt)
    assert np.array_equal(out, sim.predict(xt).reshape(len(xt), -1))
    assert staging == xs[0].nbytes + 4     # one buffer: an input and its label
    n = epochs * len(x)
    print("\n%s on %s: %d samples of %d bytes trained in %.1f s: %.0f bytes/s of samples (%.0f on the line), "
          "%.2f samples/s" % (model, target, n, xs[0].nbytes, seconds, n * xs[0].nbytes / seconds, sent / seconds,
                              n / seconds))


@pytest.mark.device
@pytest.mark.slow
def test_staged_samples_on_a_noisy_line(tmp_path):
    """1% of the bytes damaged each way (half dropped, half corrupted) on the unix board's line
    once the server runs (the unix port's raw REPL is not what is tested here): the pieces of
    staged samples resent, shortened, skipped when the board has them, the parameters and
    predictions still the simulator's."""
    from microtrain.device.emulated import Proxy
    plan, x, y, xt, _ = spectrogram(tmp_path)
    sim = oracle(plan, x, y, 1)
    board = make_board("unix")
    proxy = None
    try:
        proxy = Proxy(board.port, seed=3)
        proxy.start()
        b = Board(proxy.port)
        b.connect()
        b.deploy(plan)
        proxy.rate = 0.01
        train(b, x, y, epochs=1, seed=SEED)
        got, out = b.params(), b.predict(xt)
        b.close()
    finally:
        if proxy is not None:
            proxy.close()
        board.close()
    print("\nstaged samples on a noisy line: %d bytes damaged; %s" % (sum(proxy.damaged.values()), b.stats))
    assert b.stats.resent > 0 and proxy.damaged["to_board"] > 0
    for k, v in sim.params().items():
        assert np.array_equal(got[k], v), k
    assert np.array_equal(out, sim.predict(xt).reshape(len(xt), -1))


@pytest.mark.device
def test_a_sample_the_board_cannot_hold(tmp_path):
    """The image plan on a unix board whose heap holds the plan but not a second copy of a
    sample: train refuses on one line before sending anything; a board that runs out anyway
    (the host's check skipped) says the same in its MemoryError."""
    plan, x, y, _, _ = image(tmp_path)
    board = make_board("unix", heapsize="%d" % HEAP_FOR_IMAGE)
    try:
        with Board(board.port) as b:
            b.deploy(plan)
            sent = b.stats.sent
            with pytest.raises(DataError, match=r"a sample takes 27652 bytes on the board \(input 3x96x96 uint8 and "
                                                r"its label or target\).* does not fit the board's RAM"):
                train(b, x, y)
            with pytest.raises(DataError, match="does not fit the board's RAM"):
                b.predict(x)
            assert b.stats.sent == sent
            b._check_staging = lambda *a: None     # the board tries again at the first STAGE
            with pytest.raises(BoardError, match=r"MemoryError: a sample takes 27652 bytes .* does not fit the "
                                                 r"board's RAM"):
                b.predict(x)
    finally:
        board.close()


# heap of the unix board above (64-bit): the image plan's Trainer and the server fit, a staging
# buffer beside them does not
HEAP_FOR_IMAGE = 100 * 1024


@pytest.mark.device
@pytest.mark.slow
def test_staged_sample_lost_in_a_reset(tmp_path):
    """The unix board killed and started again while a sample's first piece is on its way:
    the host reconnects, the board restores its checkpoint (sample 4), stages again from
    there with a new tag, and ends with the simulator's parameters, bit for bit."""
    plan, x, y, _, _ = spectrogram(tmp_path)
    sim = oracle(plan, x, y, 2)
    board = make_board("unix")
    try:
        with Board(board.port) as b:
            b.deploy(plan)
        b = Board(board.port)
        b.connect()
        resets = []
        real_stage = b.stage

        def stage(*a):
            if not resets and b.stage_tag == 6:     # sample 6 of 12, two past the checkpoint at 4
                resets.append(b.stage_tag)
                reset_after_next_write(b, board)
            return real_stage(*a)
        b.stage = stage
        notes = []
        out = train(b, x, y, epochs=2, seed=SEED, checkpoint_every=4, log=notes.append)
        got = b.params()
        b.close()
    finally:
        board.close()
    print("\nstaged sample lost in a reset: %s" % " / ".join(notes))
    assert resets and out["recoveries"] >= 1 and "resuming at sample 4" in notes
    for k, v in sim.params().items():
        assert np.array_equal(got[k], v), k
