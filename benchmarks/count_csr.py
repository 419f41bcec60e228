# Runs on the board (MicroPython) before benchmarks/device_count.py, on the RISC-V virt board
# (VIRT_RV32): the windows read the instret counter (CSRs minstret and minstreth), which qemu
# runs on its instruction count under -icount (benchmarks/qemu_count.py). MicroPython runs in
# machine mode there and the port enables no interrupt source, so nothing else runs inside a
# window. Each window returns the counter's low and high words at its start and its end.
import micropython
from array import array

B0 = array("I", [0, 0])
B1 = array("I", [0, 0])


@micropython.asm_rv32
def instret(a0):
    # the 64-bit counter into the two words at a0: high, low, high again until the two highs agree
    label(again)
    csrrs(a1, zero, 0xB82)   # minstreth
    csrrs(a2, zero, 0xB02)   # minstret
    csrrs(a3, zero, 0xB82)
    bne(a1, a3, again)
    sw(a2, 0(a0))
    sw(a1, 4(a0))
    li(a0, 0)   # returned as a small int: a0 (an address) would be a long int, allocated in the window


def w_empty(r=instret, b0=B0, b1=B1):
    r(b0)
    r(b1)
    return b0[0], b0[1], b1[0], b1[1]


def w_call2(f, p, q, r=instret, b0=B0, b1=B1):
    r(b0)
    f(p, q)
    r(b1)
    return b0[0], b0[1], b1[0], b1[1]


def w_call3(f, p, q, r_, r=instret, b0=B0, b1=B1):
    r(b0)
    f(p, q, r_)
    r(b1)
    return b0[0], b0[1], b1[0], b1[1]


def counting_on():
    return None


def counting_off(state):
    pass
