# What Trainer(plan) takes from the heap against what `microtrain compile --board` counts
# for it (host/microtrain/boards.py ram_needed): never more, and no more than a few GC
# blocks less, so the board check neither lets a plan through that cannot be allocated nor
# refuses one that can.
import sys

word = 8 if sys.maxsize > 2 ** 32 else 4
plan = bytes(bytearray(PLAN))   # aligned, on the heap already, read-only: the constructor reads it and
                                # its runtime context in place (a bytearray's context it decodes into RAM)

used, t = allocation(plan)
print("allocated no more than counted", used <= NEED[word])
print("counted no more than 4 GC blocks too much", NEED[word] - used <= 4 * GC_BLOCK[word])
if not (used <= NEED[word] and NEED[word] - used <= 4 * GC_BLOCK[word]):
    print("used", used, "counted", NEED[word])
t.step(array("f", bytes(4 * t.input_len)), 1)
print("trains", t.info()["steps"] == 1)
