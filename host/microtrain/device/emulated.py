"""Boards without hardware, for the tests, the benchmark and `make serial-demo`: each
gives a serial port path (a pseudo-terminal) that the host opens as it would a USB
serial port, and ways to reset the board or cut its power.

QemuBoard   a MicroPython qemu firmware, its UART on a pty (`-serial pty`): MPS2_AN500
            (and AN385/AN386) in qemu-system-arm, VIRT_RV32 in qemu-system-riscv32.
            Its filesystem (microtrain.ramdisk) lives in RAM that qemu maps from a
            file (QEMU_MACHINES: the MPS2 boards' 16 MB PSRAM, which the firmware
            does not use; the RISC-V virt machine's 32 MB of RAM, whose first 6 MB
            the firmware's image, heap and stack take): a reset (the monitor's
            system_reset) reloads the firmware but not that memory, and a power cut
            (qemu killed) leaves the file as the memory was at that instant, as flash
            would be. The firmware must be built with MICROPY_VFS_LFS2=1.
UnixBoard   MicroPython's unix port on a pty of its own, in a directory that is its
            filesystem; a reset is a power cut (the process killed and started again).
PicoBoard   the RPI_PICO firmware in rp2040js (npm), its USB CDC serial on a pty
            (tests/device/rp2040js/pty_bridge.py): the path a real Pico's USB serial takes.
            rp2040js does not emulate flash writes, so the board's filesystem is a RAM
            disk in its heap (microtrain.ramdisk over a bytearray), mounted through the
            raw REPL before the server starts; a reset or power cut loses it.
Proxy       copies bytes between a board's port and a new pty, optionally corrupting
            or dropping a fraction of them in each direction; the host opens
            proxy.port. The port stays the same when the board behind it restarts.
"""
from __future__ import annotations

import atexit
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tty

PSRAM_BYTES = 16 * 1024 * 1024


class QemuMachine:
    """A qemu machine a MicroPython firmware runs on: the emulator, extra arguments, and the
    RAM qemu maps from a host file: where it is (ram_addr), how big (ram_bytes), whether the
    machine takes it as its PSRAM (the MPS2 boards, hw/arm/mps2.c) or as its RAM (virt), and
    the first address in it the firmware leaves alone (free_addr: microtrain.ramdisk's disk
    starts there; the device tests' ROMFS images take the file's last megabytes)."""

    def __init__(self, qemu, ram_addr, ram_bytes, free_addr, args=(), psram=False):
        self.qemu, self.ram_addr, self.ram_bytes, self.free_addr = qemu, ram_addr, ram_bytes, free_addr
        self.args, self.psram = list(args), psram

    def command_args(self, name, path):
        """-machine NAME with its memory mapped from the file at path, and the extra arguments."""
        backend = "psram" if self.psram else "ram"
        size = [] if self.psram else ["-m", "%dM" % (self.ram_bytes >> 20)]
        return ["-machine", "%s,memory-backend=%s" % (name, backend), "-object",
                "memory-backend-file,id=%s,size=%d,mem-path=%s,share=on" % (backend, self.ram_bytes, path)] + \
            size + self.args


# the MPS2 boards: 16 MB of PSRAM (0x60000000 on AN500, 0x21000000 on AN385/AN386; `info mtree`),
# firmware in SSRAM1 at 0. virt: RAM at 0x80000000, the firmware's image, heap and stack in its
# first 6.1 MB (ports/qemu/mcu/rv32/virt.ld), -bios none runs the ELF directly.
QEMU_MACHINES = {
    "mps2-an500": QemuMachine("qemu-system-arm", 0x60000000, PSRAM_BYTES, 0x60000000, psram=True),
    "mps2-an385": QemuMachine("qemu-system-arm", 0x21000000, PSRAM_BYTES, 0x21000000, psram=True),
    "mps2-an386": QemuMachine("qemu-system-arm", 0x21000000, PSRAM_BYTES, 0x21000000, psram=True),
    "virt": QemuMachine("qemu-system-riscv32", 0x80000000, 32 << 20, 0x81000000, args=["-bios", "none"]),
}
QEMU_APT = {"qemu-system-arm": "qemu-system-arm", "qemu-system-riscv32": "qemu-system-misc"}


def qemu_machine(name):
    if name not in QEMU_MACHINES:
        raise ValueError("no qemu machine %r here; known: %s" % (name, ", ".join(sorted(QEMU_MACHINES))))
    return QEMU_MACHINES[name]


_running = set()


@atexit.register
def _kill_all():
    """No emulator outlives the process that started it (tests stopped half way)."""
    for proc in list(_running):
        _kill_group(proc)


def _kill_group(proc):
    """SIGKILL an emulator and everything in its process group, and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    proc.wait()
    _running.discard(proc)


def _spawn(cmd, **kw):
    """Start an emulator in a session of its own (a Ctrl-C meant for the host stays with
    the host; a kill reaches its whole group), killed by the kernel when this process
    dies, even by SIGKILL where atexit never runs (setpriv --pdeathsig, util-linux).
    The kernel sends that signal when the *thread* that forked ends, not the process:
    so every emulator is forked by one thread that lives as long as the process, and a
    board reset from a short-lived thread (a timer in a test) does not die with it."""
    if shutil.which("setpriv"):
        cmd = ["setpriv", "--pdeathsig", "KILL", "--"] + list(cmd)
    proc = _SPAWNER.run(lambda: subprocess.Popen(cmd, start_new_session=True, **kw))
    _running.add(proc)
    return proc


class _Spawner:
    """Runs calls on one daemon thread, started at the first call, and hands back their
    results (or raises their exceptions) in the caller's thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs = None

    def run(self, fn):
        import queue
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.Queue()
                threading.Thread(target=self._serve, name="microtrain-emulator-spawner", daemon=True).start()
        done = threading.Event()
        box = {}
        self._jobs.put((fn, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _serve(self):
        while True:
            fn, box, done = self._jobs.get()
            try:
                box["value"] = fn()
            except BaseException as e:      # handed to the caller, raised there
                box["error"] = e
            done.set()


_SPAWNER = _Spawner()


def running():
    """The emulators started by this process that are still running (the tests check
    that none is left after each test)."""
    return [p for p in _running if p.poll() is None]


def _open_raw(path):
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    tty.setraw(fd)
    return fd


class _Emulated:
    """What both emulated boards share: a process that a power cut kills."""

    proc = None

    def _kill(self):
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc = None

    def power_on(self):
        return self.start()

    def stop(self):
        self.power_cut()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()


class QemuBoard(_Emulated):
    """flash: the host file qemu maps the machine's RAM from (QEMU_MACHINES; created empty
    if absent); machine: mps2-an500, mps2-an385, mps2-an386 or virt (VIRT_RV32)."""

    def __init__(self, firmware, flash=None, workdir=None, qemu=None, machine="mps2-an500"):
        if not os.path.exists(firmware):
            raise FileNotFoundError("no firmware at %s: build it with `make firmware`" % firmware)
        self.firmware = os.path.abspath(firmware)
        self.spec = qemu_machine(machine)
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="mt-qemu-")
        self.flash = flash or os.path.join(self.workdir, "psram.img")
        self.qemu = qemu or self.spec.qemu
        self.machine = machine
        self.proc = None
        self.port = None
        self._mon = None

    def start(self, timeout=20):
        self.stop()
        mon = os.path.join(self.workdir, "monitor.sock")
        if os.path.exists(mon):
            os.unlink(mon)
        log_path = os.path.join(self.workdir, "qemu.log")
        log = open(log_path, "wb")
        if shutil.which(self.qemu) is None:
            raise FileNotFoundError("%s not found (Debian/Ubuntu: apt-get install %s)"
                                    % (self.qemu, QEMU_APT.get(self.qemu, self.qemu)))
        if not os.path.exists(self.flash):
            with open(self.flash, "wb") as f:
                f.truncate(self.spec.ram_bytes)
        cmd = [self.qemu] + self.spec.command_args(self.machine, self.flash) + [
            "-display", "none", "-monitor", "unix:%s,server=on,wait=off" % mon, "-semihosting",
            "-serial", "pty", "-kernel", self.firmware]
        self.proc = _spawn(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        try:
            return self._connect(log_path, mon, timeout)
        except BaseException:
            self.power_cut()
            raise

    def _connect(self, log_path, mon, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log_path, "rb") as f:
                m = re.search(rb"(/dev/pts/\d+)", f.read())
            if m and os.path.exists(mon):
                self.port = m.group(1).decode()
                break
            if self.proc.poll() is not None:
                raise RuntimeError("qemu exited: %s" % open(log_path, "rb").read().decode(errors="replace"))
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("qemu did not start within %ds" % timeout)
        self._mon = socket.socket(socket.AF_UNIX)
        self._mon.connect(mon)
        self._monitor_read()
        return self.port

    def _monitor_read(self, timeout=10):
        data = b""
        deadline = time.monotonic() + timeout
        self._mon.settimeout(timeout)
        while not data.endswith(b"(qemu) ") and time.monotonic() < deadline:
            data += self._mon.recv(4096)
        return data

    def monitor(self, command):
        """Run a qemu monitor command; returns its output."""
        self._mon.sendall(command.encode() + b"\n")
        return self._monitor_read()

    def reset(self):
        """Press the reset button: the firmware starts again; the PSRAM (files) stays."""
        self.monitor("system_reset")

    def power_cut(self):
        """Pull the plug: qemu is killed at once; the PSRAM file keeps what was written."""
        self._kill()
        if self._mon is not None:
            self._mon.close()
            self._mon = None

    def close(self):
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class PicoBoard(_Emulated):
    """The RPI_PICO firmware in rp2040js (module docstring). bridge: tests/device/rp2040js/pty_bridge.py;
    bootrom: the RP2040 boot ROM for rp2040js (rp2040-bootrom-B1.ts, firmware/README.md);
    disk_bytes: the RAM disk the server keeps its plan and checkpoints on (0: none); images:
    further UF2 files written into the emulated flash after the firmware (a ROMFS partition's)."""

    # run in the raw REPL once the USB CDC is up: a littlefs RAM disk in a bytearray that the
    # module keeps alive, mounted at /
    MOUNT = ("import uctypes, microtrain.ramdisk as r\nr.DISK = bytearray(%d)\n"
             "r.mount('/', uctypes.addressof(r.DISK), %d)\n")

    def __init__(self, firmware, bootrom, bridge, disk_bytes=64 * 1024, images=()):
        for path, what in ((firmware, "firmware (make firmware-rpi_pico)"), (bootrom, "RP2040 boot ROM"),
                           (bridge, "rp2040js bridge")) + tuple((i, "flash image") for i in images):
            if not os.path.exists(path):
                raise FileNotFoundError("no %s at %s" % (what, path))
        self.firmware, self.bootrom, self.bridge = (os.path.abspath(p) for p in (firmware, bootrom, bridge))
        self.images = [os.path.abspath(i) for i in images]
        self.disk_bytes = disk_bytes
        self.workdir = tempfile.mkdtemp(prefix="mt-pico-")
        self.proc = None
        self.port = None

    def start(self, timeout=120):
        self.stop()
        log_path = os.path.join(self.workdir, "bridge.log")
        with open(log_path, "wb") as log:
            self.proc = _spawn([sys.executable, self.bridge, self.firmware, self.bootrom] + self.images,
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            with open(log_path, "rb") as f:
                text = f.read()
            m = re.search(rb"char device redirected to (/dev/pts/\d+)", text)
            if m:
                self.port = m.group(1).decode()
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.power_cut()
                raise RuntimeError("rp2040js did not bring up the Pico's USB serial: %s"
                                   % text.decode(errors="replace")[-500:])
            time.sleep(0.1)
        try:
            if self.disk_bytes:
                self._mount_disk()
        except BaseException:
            self.power_cut()
            raise
        return self.port

    def _mount_disk(self):
        from mpremote.transport_serial import SerialTransport
        t = SerialTransport(self.port, baudrate=115200)
        try:
            t.enter_raw_repl(soft_reset=False)
            t.exec(self.MOUNT % (self.disk_bytes, self.disk_bytes))
            t.exit_raw_repl()
        finally:
            t.close()

    def reset(self):
        """The reset button: the firmware starts again, and the RAM disk with it, empty."""
        self.power_cut()
        self.start()

    def power_cut(self):
        self._kill()

    def close(self):
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


class UnixBoard(_Emulated):
    """The unix port on a raw pty; the board's filesystem is `workdir`. MICROPYPATH
    may put a development copy of the microtrain package before the frozen one."""

    def __init__(self, firmware, workdir=None, micropypath=None, heapsize=None, soft_reset=False):
        """soft_reset: a Ctrl-D at the REPL's empty line (which ends the unix port, exit status 0)
        starts MicroPython again on the same files, as a board soft-resets: a host that resends
        a binary frame to a board that has just restarted must not switch it off."""
        if not os.path.exists(firmware):
            raise FileNotFoundError("no firmware at %s: build it with `make firmware-unix`" % firmware)
        self.firmware = os.path.abspath(firmware)
        self.workdir = workdir or tempfile.mkdtemp(prefix="mt-unix-")
        self.micropypath = micropypath
        self.heapsize = heapsize
        self.soft_reset = soft_reset
        self.soft_resets = 0
        self.proc = None
        self.master = None
        self._bridge = None
        self._lock = threading.RLock()

    def _restart_on_exit(self, proc):
        # each restart is waited on in turn, by this thread
        while proc.wait() == 0:     # else killed (power cut, close) or crashed: it stays off
            with self._lock:
                if self.proc is not proc:
                    return
                self.soft_resets += 1
                self._start(watch=False)
                proc = self.proc

    def start(self):
        with self._lock:
            return self._start()

    def _start(self, watch=True):
        self.stop()
        master, slave = os.openpty()
        # MicroPython runs code in the terminal mode it found at start: raw, so
        # that the binary protocol passes untouched (no CR/LF mapping, no signals)
        tty.setraw(slave)
        env = dict(os.environ)
        if self.micropypath:
            env["MICROPYPATH"] = self.micropypath
        cmd = [self.firmware] + (["-X", "heapsize=%s" % self.heapsize] if self.heapsize else [])
        self.proc = _spawn(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=self.workdir, env=env)
        os.close(slave)
        self.master = master
        if self._bridge is None:
            self._bridge = Proxy(self)      # the host's port: stable across restarts
            self._bridge.start()
        else:
            self._bridge.attach(self)
        self.port = self._bridge.port
        if self.soft_reset and watch:
            threading.Thread(target=self._restart_on_exit, args=(self.proc,), daemon=True).start()
        return self.port

    def board_fd(self):
        return self.master

    def reset(self):
        with self._lock:
            self.power_cut()
            self.start()

    def power_cut(self):
        with self._lock:
            self._power_cut()

    def _power_cut(self):
        if self._bridge is not None:
            self._bridge.attach(None)
        self._kill()
        if self.master is not None:
            os.close(self.master)
            self.master = None

    def close(self):
        self.stop()
        if self._bridge is not None:
            self._bridge.close()
            self._bridge = None


class Proxy:
    """Bytes between a board (a port path, or an object with board_fd()) and a new pty
    at self.port. rate: the fraction of bytes, in each direction, that are damaged;
    a damaged byte is dropped (with probability drop) or has bits flipped."""

    def __init__(self, board, rate=0.0, seed=0, drop=0.5):
        self.rate = rate
        self.drop = drop
        self.rng = random.Random(seed)
        self.master, slave = os.openpty()
        tty.setraw(slave)
        self.port = os.ttyname(slave)
        self._slave = slave             # kept open: the pty lives while the host reconnects
        self.damaged = {"to_board": 0, "to_host": 0}
        self.passed = {"to_board": 0, "to_host": 0}
        self._lock = threading.Lock()
        self._board_fd = None
        self._owns_fd = False
        self._generation = 0
        self._stop = False
        self._wake_r, self._wake_w = os.pipe()
        self.attach(board)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def attach(self, board):
        """Connect to (another) board, e.g. after a power cycle gave it a new pty;
        None: to nothing (the board is off)."""
        with self._lock:
            if self._board_fd is not None and self._owns_fd:
                os.close(self._board_fd)
            if board is None:
                self._board_fd, self._owns_fd = None, False
            elif isinstance(board, str):
                self._board_fd, self._owns_fd = _open_raw(board), True
            else:
                self._board_fd, self._owns_fd = board.board_fd(), False
            if self._board_fd is not None:
                os.set_blocking(self._board_fd, False)
            self._generation += 1       # the fd number may be the old one's, reused
        os.write(self._wake_w, b"x")

    def start(self):
        self._thread.start()
        return self.port

    def _mangle(self, data, direction):
        if not self.rate:
            self.passed[direction] += len(data)
            return data
        out = bytearray()
        for b in data:
            if self.rng.random() < self.rate:
                self.damaged[direction] += 1
                if self.rng.random() < self.drop:
                    continue                                    # dropped
                b ^= self.rng.randrange(1, 256)                 # corrupted
            out.append(b)
        self.passed[direction] += len(data)
        return bytes(out)

    def _run(self):
        # non-blocking both ways, with what is waiting to go out kept here: a board that
        # stops reading (busy, paused, dead) must not stall the other direction
        os.set_blocking(self.master, False)
        pending = {"to_board": bytearray(), "to_host": bytearray()}
        generation = None
        while not self._stop:
            with self._lock:
                bfd = self._board_fd
                if generation != self._generation:     # attached to another board (or to none)
                    generation = self._generation
                    pending["to_board"].clear()
            rl = [self.master, self._wake_r] + ([bfd] if bfd is not None else [])
            wl = ([self.master] if pending["to_host"] else []) + \
                ([bfd] if bfd is not None and pending["to_board"] else [])
            try:
                ready, writable, _ = select.select(rl, wl, [], 0.5)
            except (OSError, ValueError):
                time.sleep(0.01)
                continue
            if self._wake_r in ready:
                os.read(self._wake_r, 64)
                continue
            for fd in ready:
                try:
                    data = os.read(fd, 4096)
                except BlockingIOError:
                    continue
                except OSError:         # the board went away (killed): wait for attach()
                    with self._lock:
                        if self._board_fd == fd:
                            self._board_fd = None
                    continue
                direction = "to_board" if fd == self.master else "to_host"
                pending[direction] += self._mangle(data, direction)
            for fd in writable:
                direction = "to_host" if fd == self.master else "to_board"
                try:
                    n = os.write(fd, pending[direction])
                    del pending[direction][:n]
                except BlockingIOError:
                    pass
                except OSError:
                    pending[direction].clear()

    def close(self):
        self._stop = True
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(2)
        for fd in (self.master, self._slave, self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._owns_fd and self._board_fd is not None:
            try:
                os.close(self._board_fd)
            except OSError:
                pass


# the repository's rp2040js bridge and the vendored boot ROM (tests/device/rp2040js, firmware/README.md)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PICO_BRIDGE = os.path.join(REPO, "tests", "device", "rp2040js", "pty_bridge.py")


def pico_bootrom():
    """The RP2040 boot ROM rp2040js runs, where firmware/fetch-sources.sh finds the vendored sources."""
    from microtrain import thirdparty
    d = thirdparty.vendor_dir()
    if d is None or not os.path.isfile(os.path.join(d, "rp2040-bootrom-B1.ts")):
        raise FileNotFoundError("no rp2040-bootrom-B1.ts: set MICROTRAIN_VENDOR to the vendored sources (firmware/README.md)")
    return os.path.join(d, "rp2040-bootrom-B1.ts")


def main(argv=None):
    """python -m microtrain.device.emulated qemu|virt|unix|pico FIRMWARE -- COMMAND...: run COMMAND
    with an emulated board on a pseudo-terminal, its path in $PORT; the board stops after.
    qemu: an MPS2_AN500 firmware.elf; virt: a VIRT_RV32 firmware.elf (qemu-system-riscv32).
    pico: the RPI_PICO firmware.uf2 in rp2040js (`make rp2040js`), a 64 KB RAM disk for its files."""
    argv = list(sys.argv[1:] if argv is None else argv)
    kinds = ("qemu", "virt", "unix", "pico")
    if len(argv) < 4 or argv[0] not in kinds or argv[2] != "--":
        print("usage: python -m microtrain.device.emulated qemu|virt|unix|pico FIRMWARE -- COMMAND...", file=sys.stderr)
        return 2
    if argv[0] == "pico":
        board = PicoBoard(argv[1], pico_bootrom(), PICO_BRIDGE)
    elif argv[0] == "virt":
        board = QemuBoard(argv[1], machine="virt")
    else:
        board = (QemuBoard if argv[0] == "qemu" else UnixBoard)(argv[1])
    try:
        board.start()
        print("board: %s firmware %s on %s" % (argv[0], argv[1], board.port), flush=True)
        return subprocess.call(argv[3:], env=dict(os.environ, PORT=board.port))
    finally:
        board.close()


if __name__ == "__main__":
    raise SystemExit(main())
