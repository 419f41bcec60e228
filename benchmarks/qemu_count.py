"""Exact guest instruction counts on qemu, read by the guest itself.

Method. qemu runs with `-icount shift=S`: every guest instruction advances the
virtual clock by exactly 2**S ns, and every device timer runs on that clock.

On the MPS2 boards (Cortex-M) the guest reads a hardware timer before and after
the code it measures, so instructions = timer ticks * tick length / 2**S. With
S = 7 (128 ns per instruction) and the MPS2 boards' 25 MHz timers (40 ns per
tick) one instruction is 3.2 ticks, so the tick count, rounded, gives the
instruction count exactly: the two reads' phase errors stay below one tick, a
third of an instruction. The fine timer (CMSDK APB timer 0, reloaded at 2**30 so
its values stay MicroPython small ints and allocate nothing) wraps after 335 M
instructions; a second timer prescaled by 256 (the dual timer) says how many
times it wrapped, so long windows (MCUNet) are exact too (count_cmsdk.py).

On the RISC-V virt board (VIRT_RV32) the guest reads the instret counter
(minstret/minstreth) with two CSR instructions; under -icount qemu answers with
its virtual clock in ns, 2**S per instruction, so with S = 0 the difference of
two reads is the instruction count itself, 64 bits wide (count_csr.py; a window
around a loop of n two-instruction iterations counts 2n more than the empty one,
tests/bench/test_bench.py).

Determinism. The only interrupt the MicroPython qemu port enables on the MPS2
boards is SysTick's (1 ms, i.e. every 7812 instructions at S = 7); the device
script turns it off while it measures (on virt the port enables none), calls
gc.collect() before each window, and the measured calls (Trainer.step with a
loss buffer, Trainer.predict with an output buffer) allocate nothing. What is
left is a pure function of the code and the data: two runs give the same counts
(benchmarks/bench.py --runs 2 checks it).

The data (plans, inputs, weights) does not travel over the serial line: qemu's
generic loader puts one blob at the board's `blob` address (RAM the firmware
does not use) and the script reads it in place with uctypes.bytearray_at.

This module is the host side: the board table, the blob, running a script and
turning the four raw counter readings of a window into an instruction count.
"""
import os
import shlex
import shutil
import struct
import sys
import tempfile

from microtrain.device.emulated import QEMU_APT

SHIFT = 7                     # 2**7 ns of virtual time per guest instruction (the MPS2 boards)
FINE_MASK = (1 << 30) - 1     # timer reload: values stay MicroPython small ints
PRESCALE = 256                # the coarse timer counts every 256 fine ticks
HERE = os.path.dirname(os.path.abspath(__file__))

# Per qemu board: the emulator and machine, the counter the script reads (`cmsdk`: the
# timers, with their clock and the fine and coarse timers' register bases; `csr`: instret)
# and its -icount shift, and the RAM where the blob goes (unused by the firmware). The MPS2
# FPGA images share the CMSDK peripheral map (timer 0 at 0x40000000, dual timer at
# 0x40002000), their image, heap and stack live in the 4 MB SSRAM at 0, and qemu gives them
# 16 MB more RAM, at 0x60000000 on AN500 and at 0x21000000 on AN385 and AN386 (`info mtree` in the qemu
# monitor). virt's RAM is at 0x80000000 (128 MB by default), the firmware in its first 6.1 MB
# (ports/qemu/mcu/rv32/virt.ld). A board whose blob address is not RAM would read zeros: the
# script checks a magic word first.
BOARDS = {
    "MPS2_AN500": dict(machine="mps2-an500", core="Cortex-M7", fpu="double-precision FPU", counter="cmsdk",
                       shift=SHIFT, timer_hz=25_000_000, fine=0x40000000, coarse=0x40002000,
                       blob=0x60000000, blob_max=16 << 20),
    "MPS2_AN385": dict(machine="mps2-an385", core="Cortex-M3", fpu="soft float", counter="cmsdk",
                       shift=SHIFT, timer_hz=25_000_000, fine=0x40000000, coarse=0x40002000,
                       blob=0x21000000, blob_max=16 << 20),
    "MPS2_AN386": dict(machine="mps2-an386", core="Cortex-M4", fpu="single-precision FPU", counter="cmsdk",
                       shift=SHIFT, timer_hz=25_000_000, fine=0x40000000, coarse=0x40002000,
                       blob=0x21000000, blob_max=16 << 20),
    "VIRT_RV32": dict(machine="virt", core="RV32IMAC", fpu="soft float",
                      counter="csr", shift=0, qemu="qemu-system-riscv32", qemu_args="-bios none",
                      blob=0x81000000, blob_max=112 << 20),
}
MAGIC = b"MTBENCH1"


def board(name):
    """A board's setup, by MicroPython's board name (MPS2_AN500) or the profile's (mps2_an500)."""
    name = name.upper()
    if name not in BOARDS:
        raise ValueError("no instruction-counting setup for qemu board %r; known: %s (add its timers and a free "
                         "RAM address to BOARDS in benchmarks/qemu_count.py)" % (name, ", ".join(sorted(BOARDS))))
    return BOARDS[name]


def pyboard_module(micropy_dir):
    """MicroPython's tools/pyboard.py: it drives the raw REPL over qemu's serial pty."""
    tools = os.path.join(micropy_dir, "tools")
    if not os.path.isfile(os.path.join(tools, "pyboard.py")):
        raise FileNotFoundError("no tools/pyboard.py in the MicroPython checkout %s; set MICROPY_DIR" % micropy_dir)
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import pyboard
    return pyboard


class Blob:
    """The bytes qemu loads at the board's blob address; add() returns (offset, length)."""

    def __init__(self):
        self.data = bytearray(MAGIC)   # the script checks it: the blob really is where it reads

    def add(self, b):
        b = bytes(b)
        self.data += b"\0" * (-len(self.data) % 16)   # plans and float buffers are read in place: keep them aligned
        off = len(self.data)
        self.data += b
        return off, len(b)

    def add_f32(self, a):
        import numpy as np
        return self.add(np.ascontiguousarray(a, dtype="<f4").tobytes())


def header(values):
    """Python source assigning each value: the data part of a device script."""
    return "".join("%s = %r\n" % kv for kv in values.items())


def device_prelude(board_name):
    """The constants the device script's counter code needs, as source."""
    b = board(board_name)
    values = dict(BLOB=b["blob"], MAGIC=MAGIC)
    if b["counter"] == "cmsdk":
        values.update(FINE=b["fine"], COARSE=b["coarse"], MASK=FINE_MASK,
                      COARSE_CTRL=0x80 | 0x40 | 0x08 | 0x02)   # enable, periodic, /256, 32-bit, no interrupt
    return header(values)


def counter_source(board_name):
    """The board's counting code (w_empty, w_call2, w_call3, counting_on, counting_off) as source."""
    with open(os.path.join(HERE, "count_%s.py" % board(board_name)["counter"])) as f:
        return f.read()


def instructions(reading, board_name):
    """Instructions between the two reads of one window, from its four raw counter values: on
    the MPS2 boards fine and coarse timer at the start, then at the end (both count down); on
    virt instret's low and high words at the start, then at the end."""
    b = board(board_name)
    if b["counter"] == "csr":
        lo0, hi0, lo1, hi1 = reading
        return (((hi1 << 32) | lo1) - ((hi0 << 32) | lo0)) >> b["shift"]
    f0, c0, f1, c1 = reading
    period = FINE_MASK + 1
    fine = (f0 - f1) % period
    coarse = (c0 - c1) % period
    wraps = round((coarse * PRESCALE - fine) / period)
    ticks = fine + wraps * period
    ns = ticks * 1e9 / b["timer_hz"]
    return int(round(ns / (1 << b["shift"])))


def qemu_exe(board_name):
    return board(board_name).get("qemu", "qemu-system-arm")


def qemu_command(board_name, firmware, blob_path):
    b = board(board_name)
    for p in (firmware, blob_path):
        if any(c.isspace() for c in p):
            raise ValueError("pyboard.py splits the qemu command at spaces: %r must not contain one" % p)
    return ("%s -machine %s %s -nographic -monitor null -semihosting -serial pty -icount shift=%d "
            "-device loader,file=%s,addr=0x%x,force-raw=on -kernel %s"
            % (qemu_exe(board_name), b["machine"], b.get("qemu_args", ""), b["shift"], blob_path, b["blob"], firmware))


def run(board_name, firmware, blob, script, micropy_dir, timeout=600, echo=None):
    """Boot qemu with the blob loaded, run the script in the raw REPL and return
    what it printed. echo(bytes) sees the output as it comes."""
    exe = qemu_exe(board_name)
    if shutil.which(exe) is None:
        raise FileNotFoundError("%s not found (Debian/Ubuntu: apt-get install %s)" % (exe, QEMU_APT.get(exe, exe)))
    b = board(board_name)
    if len(blob.data) > b["blob_max"]:
        raise ValueError("the benchmark data is %d bytes; %s has room for %d at 0x%x"
                         % (len(blob.data), board_name, b["blob_max"], b["blob"]))
    pyboard = pyboard_module(micropy_dir)
    with tempfile.TemporaryDirectory(prefix="mt-bench-") as tmp:
        path = os.path.join(tmp, "blob.bin")
        with open(path, "wb") as f:
            f.write(blob.data or b"\0")
        pyb = pyboard.Pyboard("execpty:" + qemu_command(board_name, firmware, path))
        try:
            pyb.enter_raw_repl()
            chunks = []

            def consume(b):
                chunks.append(b)
                if echo:
                    echo(b)

            _, err = pyb.exec_raw(script, timeout=timeout, data_consumer=consume)
        finally:
            pyb.close()
        out = b"".join(chunks)
    if err:
        raise RuntimeError("the benchmark script failed on %s:\n%s%s" % (board_name, out.decode(errors="replace"),
                                                                        err.decode(errors="replace")))
    return out.decode()


def parse(output, board_name):
    """Lines 'W <case> <what> f0 c0 f1 c1' -> {(case, what): [instructions, ...]};
    lines 'V <case> <what> <value>' -> {(case, what): value} (values the host checks)."""
    counts, values = {}, {}
    for line in output.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "W" and len(parts) == 7:
            counts.setdefault((parts[1], parts[2]), []).append(
                instructions([int(v) for v in parts[3:]], board_name))
        elif parts[0] == "V" and len(parts) == 4:
            values[(parts[1], parts[2])] = float(parts[3])
    return counts, values


def quote(cmd):
    return " ".join(shlex.quote(c) for c in cmd)


def f32_bits(v):
    """A float as the float32 the device printed (for exact comparisons)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]
