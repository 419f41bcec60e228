"""examples/gesture: the board personalises the model with no host attached, with
checkpoints, on the unix port and on qemu. The run on unix is killed half way and
started again; both end with exactly the parameters of the host simulator trained on
the same windows (sensor.py is plain Python, so the host computes them too)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import microtrain
from microtrain.device.board import Board
from serial_support import ROOT, assert_params_equal, make_board, need, run_until

EXAMPLE = os.path.join(ROOT, "examples", "gesture")
sys.path.insert(0, EXAMPLE)
import make_model  # noqa: E402
import sensor  # noqa: E402

# emulated boards, and slow: `make test-all` (CI), not `make test`
pytestmark = [pytest.mark.device, pytest.mark.slow]

SAMPLES, WEARER = 160, 1    # as personalise.py


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return make_model.main(str(tmp_path_factory.mktemp("gesture")))


def oracle(plan):
    sim = microtrain.Simulator(plan)
    for k in range(SAMPLES):
        x, label = sensor.window(WEARER, k)
        sim.step(np.array(x, np.float32), label)
    return sim


def test_personalise_on_unix_killed_and_restarted(plan, tmp_path):
    fw = need("unix")
    os.makedirs(tmp_path / "mt")
    plan.save(str(tmp_path / "mt" / "plan.mtp"))
    for f in ("sensor.py", "personalise.py"):
        shutil.copy(os.path.join(EXAMPLE, f), tmp_path)
    lines = run_until([fw, "personalise.py"], "checkpoint at sample 80", cwd=tmp_path)
    assert lines[0].startswith("starting: accuracy"), lines
    second = subprocess.run([fw, "personalise.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    out = second.stdout.splitlines()
    resumed = int(out[0].split("sample ")[1])
    print("\n" + lines[0].strip() + " / killed after 'checkpoint at sample 80' / " + out[0] + " / " + out[-1])
    assert 80 <= resumed < SAMPLES
    before, after = float(lines[0].split()[-1]), float(out[-1].split()[-1])
    assert after > before
    board = make_board("unix", workdir=str(tmp_path))
    try:
        with Board(board.port) as b:        # the server restores the example's checkpoint
            got = b.params()
    finally:
        board.close()
    sim = oracle(plan)
    assert_params_equal(got, sim)


def test_personalise_on_qemu(plan):
    board = make_board("qemu")
    try:
        with Board(board.port) as b:
            b.deploy(plan)              # mt/plan.mtp on the board's PSRAM disk
        b = Board(board.port)           # now as mpremote would: files, then run the script
        b.transport.enter_raw_repl(soft_reset=False)
        for f in ("sensor.py", "personalise.py"):
            with open(os.path.join(EXAMPLE, f), "rb") as src:
                b.transport.fs_writefile(f, src.read())
        out = b.transport.exec("exec(open('personalise.py').read(), {})").decode()
        b.transport.exit_raw_repl()
        b.transport.close()
        with Board(board.port) as b:
            got = b.params()
    finally:
        board.close()
    print("\n" + " / ".join(line.strip() for line in out.splitlines() if "accuracy" in line))
    assert "personalised" in out
    assert_params_equal(got, oracle(plan))
