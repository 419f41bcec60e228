"""Faults on the way to a board, each ending with exactly the parameters of a clean
run (the host simulator doing every sample once, in order): nothing lost, no sample
trained twice. Each test prints how many frames were resent.

- a line that corrupts or drops 1% of the bytes in each direction (a proxy between
  the board's pty and the host), on the qemu board and on the Pico in rp2040js
- the board reset in the middle of training
- the board reset, or its power cut, in the middle of a checkpoint save
- the host killed in the middle of training, then `microtrain train --resume`
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from microtrain.device import protocol as P
from microtrain.device.board import Board
from microtrain.device.emulated import Proxy
from microtrain.device.errors import LinkError, NoDevice
from microtrain.device.training import train
from serial_support import (EPOCHS, ROOT, SEED, assert_params_equal, compile_mlp, export_mlp, iris, make_board,
                            oracle, reset_after_next_write, run_until)

# emulated boards, and slow: `make test-all` (CI), not `make test`
pytestmark = [pytest.mark.device, pytest.mark.slow]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    plan = compile_mlp(export_mlp(str(d / "mlp.onnx"), "dynamo"))
    plan.save(str(d / "mlp.mtp"))
    x, y, xt, yt = iris()
    np.savez(d / "iris.npz", x=x, y=y)
    return plan, x, y, oracle(plan, x, y), d


def deploy(port, plan):
    with Board(port) as b:
        b.deploy(plan)


@pytest.mark.parametrize("target", ["qemu", "pico"])
def test_noisy_line(setup, target):
    """1% of the bytes damaged in each direction, half dropped and half corrupted, from
    the first byte of connect (the raw REPL starting the server) to the last of pull; on the
    qemu board's UART and on the Pico's USB CDC (rp2040js)."""
    plan, x, y, sim, _ = setup
    board = make_board(target)
    proxy = None
    try:
        proxy = Proxy(board.port, rate=0.01, seed=1)
        proxy.start()
        t0 = time.monotonic()
        b = Board(proxy.port)
        b.connect()
        b.deploy(plan)
        out = train(b, x, y, epochs=EPOCHS, seed=SEED, checkpoint_every=40)
        got = b.params()
        b.close()
        seconds = time.monotonic() - t0
    finally:
        if proxy is not None:
            proxy.close()
        board.close()
    print("\nnoisy line (%s): %d bytes damaged (to board %d, to host %d) in %.0f s; frames resent: %d; %s"
          % (target, sum(proxy.damaged.values()), proxy.damaged["to_board"], proxy.damaged["to_host"], seconds,
             b.stats.resent, b.stats))
    assert out["samples"] == EPOCHS * len(x)
    # the line really was that bad, in both directions
    for direction in ("to_board", "to_host"):
        assert proxy.damaged[direction] >= 0.005 * proxy.passed[direction] > 0
    assert b.stats.resent > 0 and b.stats.bad > 0
    assert_params_equal(got, sim)


@pytest.mark.parametrize("target", ["qemu", "unix"])
def test_reset_in_the_middle_of_training(setup, target):
    """The board is reset (qemu: the monitor's system_reset; unix: the process killed and
    started again) while a chunk is being trained; the host reconnects and the board
    carries on from its last checkpoint."""
    plan, x, y, sim, _ = setup
    board = make_board(target)
    try:
        deploy(board.port, plan)
        b = Board(board.port)
        b.connect()
        resets = []
        total = EPOCHS * len(x)
        real_train_chunk = b.train_chunk
        b.sizer.limit = b.sizer.size = 8 + 10 * 20     # 10 samples a frame: 3 frames past a checkpoint

        def train_chunk(start, xs, ys, *a, **kw):
            if not resets and start >= total // 2 and start % 40 == 30:
                # the reset comes as soon as this chunk's frame is on its way; the samples
                # trained since the checkpoint at start - 30 are lost with it
                resets.append(start)
                reset_after_next_write(b, board)
            return real_train_chunk(start, xs, ys, *a, **kw)

        b.train_chunk = train_chunk
        notes = []
        out = train(b, x, y, epochs=EPOCHS, seed=SEED, checkpoint_every=40, log=notes.append)
        got = b.params()
        b.close()
    finally:
        board.close()
    print("\nreset at sample %d (%s): %d recoveries, frames resent: %d; %s"
          % (resets[0], target, out["recoveries"], b.stats.resent, " / ".join(notes)))
    assert resets and out["recoveries"] >= 1
    resumed = [int(n.split("sample ")[1]) for n in notes if n.startswith("resuming at sample")]
    assert resumed and resumed[0] == resets[0] - 30       # back to the checkpoint, trained again from there
    assert out["samples"] == total
    assert_params_equal(got, sim)


@pytest.mark.parametrize("how", ["reset", "power cut"])
def test_reset_in_the_middle_of_a_checkpoint_save(setup, how):
    """The board stops half way through writing a checkpoint (a fault-test option of
    SAVE) and is reset, or loses power (qemu killed; its PSRAM, which holds the
    filesystem, stays in a file). It comes back with the previous checkpoint intact, and
    the run, resumed, ends with the clean run's parameters."""
    plan, x, y, sim, _ = setup
    board = make_board("qemu")
    proxy = Proxy(board.port)          # the host's port survives qemu restarting on a new pty
    proxy.start()
    try:
        b = Board(proxy.port)
        b.connect()
        b.deploy(plan)
        out = train(b, x, y, epochs=1, seed=SEED, checkpoint_every=40)     # checkpoints at 40, 80, 120
        assert out["samples"] == len(x)
        k1 = len(x)
        xs, ys = b.check_data(x, y)
        order = np.random.default_rng(SEED)
        order.permutation(len(x))
        rows = order.permutation(len(x))[:30]       # epoch 2's first samples, as the run orders them
        assert b.train_chunk(k1, xs[rows], ys[rows], accuracy=False)[0] == k1 + 30
        state_len = plan.report()["param_bytes"]    # the checkpoint file is larger than this
        b.link.retries = 1
        with pytest.raises(LinkError):
            b.link.request(P.SAVE, b'{"pause_at": %d}' % (state_len // 2), timeout=3, ack=True)
        if how == "reset":
            board.reset()
        else:
            board.power_cut()
            board.power_on()
            proxy.attach(board.port)
        b.link.retries = 30
        for cycle in range(3):
            try:
                facts = b.reconnect()
                break
            except NoDevice:
                # qemu notices a client on its pty by polling: a board powered on while the
                # proxy reattaches now and then never answers on that pty (nothing read at all);
                # pull the plug again, as a user would, up to twice
                if how == "reset" or cycle == 2:
                    raise
                board.power_cut()
                board.power_on()
                proxy.attach(board.port)
        # the previous checkpoint, intact: the board restored it at start
        assert facts["samples"] == k1, facts
        out = train(b, x, y, epochs=EPOCHS, seed=SEED, resume=True, checkpoint_every=40)
        got = b.params()
        b.close()
    finally:
        proxy.close()
        board.close()
    print("\n%s during a checkpoint save at sample %d: restored sample %d; frames resent: %d"
          % (how, k1 + 30, k1, b.stats.resent))
    assert out["samples"] == EPOCHS * len(x)
    assert_params_equal(got, sim)


def test_host_killed_then_resumed(setup):
    """`microtrain train` killed (SIGKILL) after its first epoch, then run again with --resume."""
    plan, x, y, sim, d = setup
    board = make_board("qemu")
    try:
        deploy(board.port, plan)
        cmd = [sys.executable, "-m", "microtrain", "train", "--port", board.port, "--data", str(d / "iris.npz"),
               "--epochs", str(EPOCHS), "--seed", str(SEED), "--checkpoint-every", "30"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        run_until(cmd, "epoch 1:", env=env, cwd=ROOT)
        second = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert second.returncode == 0, second.stdout + second.stderr
        with Board(board.port) as b:
            got = b.params()
    finally:
        board.close()
    resumed = [ln for ln in second.stderr.splitlines() if "resuming run at sample" in ln]
    print("\nhost killed after epoch 1; %s; %s" % (resumed[0] if resumed else "?",
                                                   second.stdout.strip().splitlines()[-1]))
    assert resumed and 0 < int(resumed[0].split("sample ")[1].split()[0]) < EPOCHS * len(x)
    assert "epoch 1:" not in second.stdout      # the resumed run did not start again
    assert_params_equal(got, sim)
