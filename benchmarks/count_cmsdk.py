# Runs on the board (MicroPython) before benchmarks/device_count.py, on the MPS2 boards: the
# windows read the CMSDK timers (benchmarks/qemu_count.py says why they count instructions
# exactly under -icount). Data: FINE, COARSE, MASK, COARSE_CTRL (qemu_count.device_prelude).
# Each window returns the four raw timer values, fine and coarse at its start and its end.
import machine

mem = machine.mem32
SYST_CSR = 0xE000E010   # SysTick control: bit 1 enables its (1 ms) interrupt


def w_empty(m=mem, F=FINE + 4, C=COARSE + 4):
    a = m[F]; b = m[C]
    c = m[F]; d = m[C]
    return a, b, c, d


def w_call2(f, p, q, m=mem, F=FINE + 4, C=COARSE + 4):
    a = m[F]; b = m[C]
    f(p, q)
    c = m[F]; d = m[C]
    return a, b, c, d


def w_call3(f, p, q, r, m=mem, F=FINE + 4, C=COARSE + 4):
    a = m[F]; b = m[C]
    f(p, q, r)
    c = m[F]; d = m[C]
    return a, b, c, d


def counting_on():
    """Start both timers and turn SysTick's interrupt off; returns what counting_off restores."""
    timers_csr = mem[SYST_CSR]
    mem[FINE + 8] = MASK   # RELOAD
    mem[FINE + 4] = MASK   # VALUE
    mem[FINE] = 1          # CTRL: enable, no interrupt
    mem[COARSE] = MASK     # Timer1Load
    mem[COARSE + 8] = COARSE_CTRL
    mem[SYST_CSR] = timers_csr & ~2
    return timers_csr


def counting_off(timers_csr):
    mem[SYST_CSR] = timers_csr
