"""Run a batch of MicroPython test scripts on one target: one boot for the whole batch, each
script's output returned on its own (tests/device/test_micropython.py makes each a pytest case).

Each script runs on a fresh interpreter state (a soft reset before it, or a process of its own
on the unix ports) and is started by a few lines (`stub`) that put the script's folder first on
sys.path, load the native module where the target runs one, and `import` the script. How the
scripts reach the target:

  unix      a folder of .py files, a process per script (`micropython -c STUB`).
  qemu      a ROMFS image in the last 4 MB of the RAM that microtrain.device.emulated.QemuBoard
            maps from a host file (the MPS2 boards' PSRAM, the virt machine's RAM), mounted at /rom: the scripts compiled by mpy-cross, and for a native-
            module target its .mpy and the device package. Nothing crosses the emulated UART
            but the stub and the output, which used to be the whole cost: a script's data at
            ~19 KB/s through the raw REPL (a native-module target's scripts carried the 60-80 KB
            .mpy each, 175 s a target; now a few seconds).
  rp2040js  the stock RPI_PICO firmware has no memory a host can fill, so each script's source
            goes through the raw REPL over the emulated USB CDC, the path a real board's takes.

Every emulator is started by microtrain.device.emulated (its own process group, killed with the
process that started it) and stopped when the batch ends, however it ends.
"""
import contextlib
import os
import subprocess
import threading
import time

from microtrain import romfs
from microtrain.device import emulated

import mptargets

ROM_BYTES = 4 * 1024 * 1024
# the qemu machine of each qemu board profile (emulated.QEMU_MACHINES: where qemu maps RAM from a
# file); the scripts' ROMFS is that RAM's last 4 MB
QEMU_MACHINE = {"mps2_an385": "mps2-an385", "mps2_an386": "mps2-an386", "mps2_an500": "mps2-an500",
                "virt_rv32": "virt"}


class Result:
    """A script's output (stdout then stderr, CR LF as LF), its wall time, and for a run that
    did not end (timeout, crash) what happened."""

    def __init__(self, output, seconds, problem=None):
        self.output, self.seconds, self.problem = output, seconds, problem


def stub(name, where, natmod, mount=""):
    """The lines that start script `name` from folder `where`: with `natmod`, the native module
    _mtnative.mpy found there registers as _microtrain, and the package there (not a frozen one)
    must take it."""
    lines = [mount, "import sys", "sys.path.insert(0, %r)" % where]
    if natmod:
        lines += ["import _mtnative", "sys.modules['_microtrain'] = _mtnative", "import microtrain",
                  "if microtrain.Trainer is not _mtnative.Trainer:",
                  "    raise SystemExit('the native module did not load')"]
    lines.append("import %s" % name)
    return "\n".join(line for line in lines if line) + "\n"


def run_batch(target, scripts, workdir, timeout=None):
    """{name: Result} for scripts {name: source} (each name a Python identifier) on target
    (mptargets.Target), in workdir."""
    timeout = timeout or (300 if target.board == "rpi_pico" else 120)
    os.makedirs(workdir, exist_ok=True)
    if target.kind == "unix":
        return _run_unix(target, scripts, workdir, timeout)
    if target.board == "rpi_pico":
        return _run_pico(target, scripts, workdir, timeout)
    return _run_qemu(target, scripts, workdir, timeout)


def _package_files(target):
    """{relative path: bytes}: the native module and the device package's __init__ for a
    native-module target (the serial server's modules are the serial tests' business)."""
    if not target.natmod:
        return {}
    with open(target.mpy, "rb") as f:
        files = {"_mtnative.mpy": f.read()}
    with open(os.path.join(mptargets.PACKAGE, "microtrain", "__init__.py"), "rb") as f:
        files[os.path.join("microtrain", "__init__.py")] = f.read()
    return files


def _run_unix(target, scripts, workdir, timeout):
    for rel, data in dict(_package_files(target), **{n + ".py": s.encode() for n, s in scripts.items()}).items():
        path = os.path.join(workdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    env = dict(os.environ, **mptargets.gcov_env(target, workdir))
    results = {}
    for name in scripts:
        t0 = time.monotonic()
        try:
            r = subprocess.run([target.firmware, "-c", stub(name, workdir, target.natmod)], cwd=workdir, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
            problem = "exit status %d" % r.returncode if r.returncode else None
            results[name] = Result(_text(r.stdout), time.monotonic() - t0, problem)
        except subprocess.TimeoutExpired as e:
            results[name] = Result(_text(e.stdout or b""), time.monotonic() - t0, "no end within %d s" % timeout)
    return results


def mpy_cross():
    exe = os.path.join(mptargets.MICROPY_DIR, "mpy-cross", "build", "mpy-cross")
    if not os.path.isfile(exe):
        raise FileNotFoundError("no mpy-cross at %s (built with the firmware: make firmware)" % exe)
    return exe


def _run_qemu(target, scripts, workdir, timeout):
    files = {}
    for name, source in scripts.items():
        src, out = os.path.join(workdir, name + ".py"), os.path.join(workdir, name + ".mpy")
        with open(src, "w") as f:
            f.write(source)
        subprocess.run([mpy_cross(), "-o", out, src], check=True, capture_output=True)
        with open(out, "rb") as f:
            files[name + ".mpy"] = f.read()
    for rel, data in _package_files(target).items():
        # ROMFS names here are flat: the device package's __init__ goes as the module microtrain.py
        files[rel.replace(os.sep + "__init__", "")] = data
    image = romfs.build(files)
    if len(image) > ROM_BYTES:
        raise ValueError("the scripts' ROMFS image is %d bytes, more than the %d reserved" % (len(image), ROM_BYTES))
    machine = QEMU_MACHINE[target.board]
    spec = emulated.qemu_machine(machine)
    flash = os.path.join(workdir, "ram.img")
    with open(flash, "wb") as f:
        f.truncate(spec.ram_bytes)
        f.seek(spec.ram_bytes - ROM_BYTES)
        f.write(image)
    mount = "import uctypes, vfs\nvfs.mount(vfs.VfsRom(uctypes.bytearray_at(%d, %d)), '/rom')" % (
        spec.ram_addr + spec.ram_bytes - ROM_BYTES, ROM_BYTES)
    board = emulated.QemuBoard(target.firmware, flash=flash, workdir=workdir, machine=machine)
    return _run_on_board(board, scripts, lambda name: stub(name, "/rom", target.natmod, mount), timeout)


def pico_board(firmware, images=()):
    """The RPI_PICO firmware in rp2040js, with further UF2 images in its flash (a ROMFS one)."""
    bootrom = os.path.join(mptargets.vendor_dir() or "", "rp2040-bootrom-B1.ts")
    return emulated.PicoBoard(firmware, bootrom, emulated.PICO_BRIDGE, disk_bytes=0, images=images)


def _run_pico(target, scripts, workdir, timeout):
    return _run_on_board(pico_board(target.firmware), scripts, lambda name: scripts[name], timeout)


def _run_on_board(board, scripts, code_of, timeout):
    """Each script on a board behind a serial port, after a soft reset; a script that does not
    end (or ends the board) costs a new boot for the next one."""
    results = {}
    link = None
    try:
        for name in scripts:
            if link is None:
                board.start()
                link = _connect(board.port)
            t0 = time.monotonic()
            try:
                with _watchdog(board, timeout):
                    link.enter_raw_repl(soft_reset=True)
                    out, err = link.exec_raw(code_of(name), timeout=timeout)
                results[name] = Result(_text(out + err), time.monotonic() - t0)
            except Exception as e:   # a timeout or a board that went away: its state is unknown
                results[name] = Result("", time.monotonic() - t0, "%s: %s" % (type(e).__name__, e))
                link.close()
                link = None
                board.power_cut()
    finally:
        if link is not None:
            link.close()
        board.close()
    return results


@contextlib.contextmanager
def _watchdog(board, timeout):
    """The board's power cut once `timeout` (+ a margin) has passed: a board that stopped
    answering (a fault loop) would otherwise keep a blocked write or read waiting for ever."""
    timer = threading.Timer(timeout + 30, board.power_cut)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _connect(port):
    from mpremote.transport_serial import SerialTransport
    return SerialTransport(port, baudrate=115200)


def exec_on(port, code, timeout=600):
    """Run code in the raw REPL of the board on `port` (after a soft reset); (stdout, stderr)
    as text: an exception on the board is its stderr, not raised. code may be a list of pieces,
    run one after the other in the same session (what one defines, the next sees) until one
    raises: each piece's bytecode is freed from the heap when it ends."""
    link = _connect(port)
    outs = []
    try:
        link.enter_raw_repl(soft_reset=True)
        for piece in [code] if isinstance(code, str) else code:
            out, err = link.exec_raw(piece, timeout=timeout)
            outs.append(_text(out))
            if err:
                break
        return "".join(outs), _text(err)
    finally:
        link.close()


def run_source(target, code, timeout=600):
    """Run CODE (a string) as it is, on a fresh boot of target; returns what it printed (raises
    on an exception): a process for the unix ports, the raw REPL for the boards."""
    if target.kind == "unix":
        env = dict(os.environ, **mptargets.gcov_env(target, os.path.join(mptargets.BUILD, "gcov-run-script")))
        r = subprocess.run([target.firmware, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode:
            raise RuntimeError("%s: exit status %d: %s" % (target.name, r.returncode, r.stderr or r.stdout))
        return r.stdout
    if target.board == "rpi_pico":
        board = pico_board(target.firmware)
    else:
        board = emulated.QemuBoard(target.firmware, machine=QEMU_MACHINE[target.board])
    try:
        port = board.start()
        with _watchdog(board, timeout):
            out, err = exec_on(port, code, timeout)
    finally:
        board.close()
    if err:
        raise RuntimeError("%s raised: %s" % (target.name, err))
    return out


def _text(data):
    return data.decode(errors="replace").replace("\r\n", "\n")

