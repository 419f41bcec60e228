"""Install on a stock board: `mpremote mip install --index http://127.0.0.1:PORT/<arch> microtrain`
from the package indexes of `make dist` (firmware/dist.py), served over local http, into MicroPython
firmware that has no microtrain (build/firmware-stock/, firmware/micropython.mk), then train there.

Boards: qemu MPS2_AN500 (Cortex-M7, the armv7emdp .mpy) and VIRT_RV32 (32-bit RISC-V without an
FPU, the rv32imc .mpy of the ESP32-C3/C6). A real board mounts its flash filesystem at boot and
has /lib on sys.path; the qemu port has no flash and runs no boot script, so the mpremote session
that installs starts with the lines that a board's boot runs (BOOT: a littlefs RAM disk mounted at
/, in RAM that microtrain.device.emulated.QemuBoard maps from a host file, so it keeps its files
across soft resets, and /lib on sys.path), then `mip install` in the same session, as a user types
it. The training runs in a fresh session (a soft reset: what the board has is what mip put on its
filesystem): it imports microtrain from /lib, trains a plan the host compiled and prints the losses
and parameters as float32 bits, which must equal the host simulator's (the oracle).
"""
import functools
import http.server
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import microtrain
from microtrain.device import emulated

import models
import mprun
import mptargets
from repo import BUILD, ROOT, skip

pytestmark = [pytest.mark.device, pytest.mark.slow]

DIST = os.path.join(BUILD, "dist", "mip")
STEPS = 20
# profile -> (qemu machine, .mpy architecture)
BOARDS = {"mps2_an500": ("mps2-an500", "armv7emdp"), "virt_rv32": ("virt", "rv32imc")}

BOOT = """\
import sys, uctypes, vfs
class RamDisk:
    def __init__(self, addr, size):
        self.mem = uctypes.bytearray_at(addr, size)
    def readblocks(self, n, buf, off=0):
        i = n * 1024 + off
        buf[:] = self.mem[i:i + len(buf)]
    def writeblocks(self, n, buf, off=0):
        i = n * 1024 + off
        self.mem[i:i + len(buf)] = buf
    def ioctl(self, op, arg):
        return {4: len(self.mem) // 1024, 5: 1024, 6: 0}.get(op)
disk = RamDisk(%d, 1 << 20)
try:
    fs = vfs.VfsLfs2(disk)
except OSError:
    vfs.VfsLfs2.mkfs(disk)
    fs = vfs.VfsLfs2(disk)
vfs.mount(fs, '/')
if '/lib' not in sys.path:
    sys.path.append('/lib')
"""

TRAIN = """
try:
    import _microtrain
except ImportError:
    print('no _microtrain')
import microtrain
from array import array
import binascii
print('from', microtrain.__file__, _microtrain.__file__)
t = microtrain.Trainer(PLAN)
xs = memoryview(array('f', X))
n = t.input_len
losses = array('f', [t.step(xs[(i %% N) * n:(i %% N + 1) * n], Y[i %% N]) for i in range(%d)])
print('losses', binascii.hexlify(bytes(losses)).decode())
for k, v in sorted(t.params().items()):
    print('param', k, binascii.hexlify(bytes(v)).decode())
"""


class Server:
    """DIST served over http on 127.0.0.1 (a free port), in a thread, for the test's duration."""

    def __init__(self, root):
        handler = functools.partial(Quiet, directory=root)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.requests = []
        self.httpd.requests = self.requests
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        self.server.requests.append(self.path)


def need(board):
    machine, arch = BOARDS[board]
    fw = os.path.join(mptargets.STOCK_FIRMWARE, board, "firmware.elf")
    index = os.path.join(DIST, arch, "package", "6", "microtrain", "latest.json")
    for path, how in ((fw, "make firmware-stock-%s" % board), (index, "make dist")):
        if not os.path.isfile(path):
            skip("no %s; run `%s`" % (os.path.relpath(path, ROOT), how))
    exe = emulated.qemu_machine(machine).qemu
    import shutil
    if shutil.which(exe) is None:
        skip("%s not found (apt-get install %s)" % (exe, emulated.QEMU_APT[exe]))
    return fw, machine, arch


def mpremote(port, *args, timeout=300):
    r = subprocess.run([sys.executable, "-m", "mpremote", "connect", port] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def host_run(plan, x, y):
    sim = microtrain.Simulator(plan)
    losses = np.array([sim.step(x[i % len(x)], y[i % len(y)]) for i in range(STEPS)], np.float32)
    return losses, sim.params()


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_mip_install_from_local_index_then_train(board, tmp_path):
    fw, machine, arch = need(board)
    plan = microtrain.compile(models.mlp(n_in=8, hidden=6, n_out=3, seed=11), update="full", lr=0.05, momentum=0.9)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(6, 8)).astype(np.float32)
    y = [int(v) for v in rng.integers(0, 3, 6)]
    want_losses, want_params = host_run(plan, x, y)
    with open(os.path.join(DIST, arch, "package", "6", "microtrain", "latest.json")) as f:
        listed = sorted(p for p, _ in json.load(f)["hashes"])
    # the C module and every module of the device package, compiled
    assert listed == sorted(["_microtrain.mpy"] + ["microtrain/%s.mpy" % n[:-3] for n in os.listdir(
        os.path.join(mptargets.PACKAGE, "microtrain")) if n.endswith(".py")])

    boot = BOOT % emulated.qemu_machine(machine).free_addr
    board_ = emulated.QemuBoard(fw, workdir=str(tmp_path), machine=machine)
    try:
        port = board_.start()
        # stock: nothing of microtrain on the board before the install
        out, err = mprun.exec_on(port, boot + "import os\nprint(sorted(os.listdir('/')))\n"
                                 "try:\n    import microtrain\nexcept ImportError:\n    print('no microtrain')\n")
        assert out.split("\n")[:2] == ["[]", "no microtrain"], (out, err)
        with Server(DIST) as server:
            code, text = mpremote(port, "exec", boot, "mip", "install", "--index", "%s/%s" % (server.url, arch),
                                  "microtrain")
        assert code == 0, text
        assert "Installing microtrain (latest) from %s/%s to /lib" % (server.url, arch) in text, text
        assert "/package/6/microtrain/latest.json" in server.requests[0], server.requests
        for path in listed:
            assert "Installing: /lib/" + path in text, (path, text)

        data = "PLAN = %r\nX = %r\nY = %r\nN = %d\n" % (plan.data, x.tobytes(), y, len(x))
        out, err = mprun.exec_on(port, boot + data + TRAIN % STEPS)
    finally:
        board_.close()
    assert not err, err
    lines = out.splitlines()
    assert lines[0] == "from /lib/microtrain/__init__.mpy /lib/_microtrain.mpy", out
    assert lines[1] == "losses " + want_losses.tobytes().hex(), "the board's losses differ from the host's"
    got = {l.split()[1]: l.split()[2] for l in lines[2:]}
    assert got == {k: np.asarray(v, np.float32).tobytes().hex() for k, v in want_params.items()}
    assert want_losses[-5:].mean() < want_losses[:5].mean()   # it learned: not two untrained runs agreeing
