"""No emulator outlives the test run that started it, however the run ends: a pytest run with
xdist workers boots a board, and the whole run is killed with SIGKILL halfway (no atexit, no
fixture teardown, as `timeout` or a CI runner's kill would end it). qemu and the rp2040js bridge
die by the death signal microtrain.device.emulated gives them, rp2040js's node by the one the
bridge gives it (tests/device/rp2040js/pty_bridge.py)."""
import os
import signal
import subprocess
import sys
import time

import pytest

import mptargets

pytestmark = pytest.mark.device

HOLD = '''
import os, time
from microtrain.device import emulated

def test_hold():
    kind, firmware, workdir = os.environ["HOLD_KIND"], os.environ["HOLD_FIRMWARE"], os.environ["HOLD_DIR"]
    if kind == "qemu":
        board = emulated.QemuBoard(firmware, workdir=workdir)
    else:
        board = emulated.PicoBoard(firmware, os.environ["HOLD_BOOTROM"], emulated.PICO_BRIDGE, disk_bytes=0)
    board.start()
    with open(os.path.join(workdir, "ready"), "w") as f:
        f.write(board.port)
    time.sleep(600)
'''


def processes_naming(marker):
    """(pid, command line) of every process whose command line holds `marker`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and int(pid) != os.getpid():
            out.append((int(pid), cmd))
    return out


def kill_a_run_halfway(tmp_path, kind, firmware, env=()):
    """Boot `kind` from a run of pytest -n 2, SIGKILL the run's whole process group once the
    board is up; returns the processes that named the run's folder before and after."""
    marker = str(tmp_path / "run")
    os.makedirs(marker)
    fw = os.path.join(marker, os.path.basename(firmware))   # the folder in every emulator's command line
    os.symlink(firmware, fw)
    (tmp_path / "test_hold.py").write_text(HOLD)
    env = dict(os.environ, HOLD_KIND=kind, HOLD_FIRMWARE=fw, HOLD_DIR=marker, **dict(env))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                            str(tmp_path / "test_hold.py")], cwd=str(tmp_path), env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not os.path.exists(os.path.join(marker, "ready")):
            assert run.poll() is None and time.monotonic() < deadline, "the board did not come up"
            time.sleep(0.2)
        before = processes_naming(marker)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    deadline = time.monotonic() + 10
    while processes_naming(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return before, processes_naming(marker)


def test_qemu_dies_with_a_killed_run(tmp_path):
    target = mptargets.targets()["mps2_an500"]
    if target.missing():
        pytest.skip(target.missing())
    before, after = kill_a_run_halfway(tmp_path, "qemu", target.firmware)
    assert any("qemu-system-arm" in cmd for _, cmd in before), before
    assert after == [], "left running: %s" % after


@pytest.mark.slow
def test_pico_bridge_and_node_die_with_a_killed_run(tmp_path):
    target = mptargets.targets()["rpi_pico"]
    if target.missing():
        pytest.skip(target.missing())
    bootrom = os.path.join(mptargets.vendor_dir(), "rp2040-bootrom-B1.ts")
    before, after = kill_a_run_halfway(tmp_path, "pico", target.firmware, {"HOLD_BOOTROM": bootrom})
    assert any("pty_bridge.py" in cmd for _, cmd in before) and any(cmd.startswith("node ") for _, cmd in before), before
    assert after == [], "left running: %s" % after
