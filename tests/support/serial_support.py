"""Shared by the serial tests: boards to test against, a small data set, and the oracle.

Boards: the qemu MPS2_AN500 firmware on a pseudo-terminal (the code path of a real
USB serial port), the qemu VIRT_RV32 firmware (32-bit RISC-V) on one, the unix port on
one, and the RPI_PICO firmware in rp2040js with its USB CDC on one (a RAM disk for its
files: rp2040js has no flash writes); all built by `make firmware` (the Pico's emulator by
`make rp2040js`).
MICROTRAIN_FIRMWARE_QEMU / MICROTRAIN_FIRMWARE_UNIX point the tests at other builds.

Data: scikit-learn's bundled iris (150 samples, 4 features, 3 classes), standardised,
120 to train and 30 to test. Model: a PyTorch MLP 4-16-3 exported to ONNX. Oracle:
the host simulator doing the same steps in the same order (Simulator.fit with the
same seed) for the parameters, onnxruntime for the pulled ONNX model.
"""
import os
import shutil

import numpy as np
import pytest

import microtrain

from repo import ROOT
FIRMWARE = {
    "qemu": os.environ.get("MICROTRAIN_FIRMWARE_QEMU") or os.path.join(ROOT, "build", "firmware", "mps2_an500", "firmware.elf"),
    "unix": os.environ.get("MICROTRAIN_FIRMWARE_UNIX") or os.path.join(ROOT, "build", "firmware", "unix", "micropython"),
    "pico": os.path.join(ROOT, "build", "firmware", "rpi_pico", "firmware.uf2"),
    "virt": os.path.join(ROOT, "build", "firmware", "virt_rv32", "firmware.elf"),
}
RP2040JS = os.path.join(ROOT, "tests", "device", "rp2040js")
EPOCHS = 3
SEED = 7
TOL = 1e-5


def skip(reason):
    """Skip, except under CI (CI=true), where a device test that cannot run is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true and this device test cannot run: " + reason, pytrace=False)
    pytest.skip(reason)


def need(target):
    fw = FIRMWARE[target]
    if not os.path.exists(fw):
        skip("no %s firmware at %s; run `make firmware`" % (target, os.path.relpath(fw, ROOT)))
    if target == "qemu" and not shutil.which("qemu-system-arm"):
        skip("qemu-system-arm not found (Debian/Ubuntu: apt-get install qemu-system-arm)")
    if target == "virt" and not shutil.which("qemu-system-riscv32"):
        skip("qemu-system-riscv32 not found (Debian/Ubuntu: apt-get install qemu-system-misc)")
    if target == "pico":
        if not os.path.isdir(os.path.join(RP2040JS, "node_modules", "rp2040js")):
            skip("rp2040js is not installed; run `make rp2040js`")
        if bootrom() is None:
            skip("no RP2040 boot ROM for rp2040js (rp2040-bootrom-B1.ts in the vendored sources)")
    return fw


def bootrom():
    from microtrain.device.emulated import pico_bootrom
    try:
        return pico_bootrom()
    except FileNotFoundError:
        return None


def make_board(target, **kw):
    from microtrain.device.emulated import PICO_BRIDGE, PicoBoard, QemuBoard, UnixBoard
    fw = need(target)
    if target == "pico":
        b = PicoBoard(fw, bootrom(), PICO_BRIDGE, **kw)
    elif target == "virt":
        b = QemuBoard(fw, machine="virt", **kw)
    else:
        b = QemuBoard(fw, **kw) if target == "qemu" else UnixBoard(fw, **kw)
    b.start()
    return b


def iris():
    from sklearn.datasets import load_iris
    d = load_iris()
    x = d.data.astype(np.float32)
    x = (x - x.mean(0)) / x.std(0)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], d.target[order].astype(np.int64)
    return x[:120], y[:120], x[120:], y[120:]


def export_mlp(path, exporter="dynamo"):
    """A PyTorch MLP 4-16-3 as ONNX (exporter: "dynamo" or "ts13", see oracle_models)."""
    import torch
    import torch.nn as nn
    from oracle_models import export
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    return export(m, torch.zeros(1, 4), exporter, path)


def compile_mlp(onnx_path):
    return microtrain.compile(onnx_path, update="full", loss="cross-entropy", lr=0.05, momentum=0.9)


def oracle(plan, x, y, epochs=EPOCHS, seed=SEED):
    """The simulator after the run the board does: every sample once per epoch, in
    Simulator.fit's order."""
    sim = microtrain.Simulator(plan)
    sim.fit(x, y, epochs=epochs, seed=seed, progress=False)
    return sim


def assert_params_equal(got, sim, what="board"):
    want = sim.params()
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].shape == want[k].shape, (k, got[k].shape, want[k].shape)
        err = np.abs(got[k] - want[k]).max()
        assert err <= TOL * max(1.0, np.abs(want[k]).max()), "%s: %s differs from the simulator by %g" % (what, k, err)


def reset_after_next_write(b, board):
    """The emulated board is reset as soon as the host's next write (a frame) is on its way."""
    port = b.link.port
    send = port.write

    def write_then_reset(data):
        n = send(data)
        del port.write
        board.reset()
        return n
    port.write = write_then_reset


def run_until(cmd, marker, **kw):
    """Start cmd, read its output until a line starting with marker, then SIGKILL it.
    Returns the lines read (the marker's last)."""
    import signal
    import subprocess
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(marker):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(lines)
    return lines


def spectrogram(tmp_path):
    """A small keyword-spotting CNN on 1x32x40 float32 spectrograms (5,120 bytes, staged over serial),
    trained in full: (plan, x, y, x_test, y_test)."""
    import torch
    import torch.nn as nn
    from oracle_models import export
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, stride=4, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 10, 3))
    path = export(m.eval(), torch.zeros(1, 1, 32, 40), "dynamo", os.path.join(str(tmp_path), "kws.onnx"))
    plan = microtrain.compile(path, update="full", loss="cross-entropy", lr=0.05, momentum=0.9)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(10, 1, 32, 40)).astype(np.float32)
    return plan, x[:6], np.arange(6) % 3, x[6:], np.arange(4) % 3


def image(tmp_path):
    """A CNN on 3x96x96 uint8 images (27,648 bytes, staged over serial), int8 below its last layer
    (which trains): (plan, x, y, x_test, y_test)."""
    import torch
    import torch.nn as nn
    from oracle_models import export
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=4, padding=1),
                      nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 3))
    path = export(m.eval(), torch.zeros(1, 3, 96, 96), "dynamo", os.path.join(str(tmp_path), "img.onnx"))
    rng = np.random.default_rng(2)
    plan = microtrain.compile(path, update="last-layer", loss="cross-entropy", lr=0.05, momentum=0.9,
                              quantize="int8", calibration=rng.uniform(0, 1, (8, 3, 96, 96)).astype(np.float32),
                              input_dtype="uint8", input_quant=(1 / 255, 0))
    x = rng.integers(0, 256, (6, 3, 96, 96)).astype(np.uint8)
    return plan, x[:4], np.arange(4) % 3, x[4:], np.arange(2) % 3
