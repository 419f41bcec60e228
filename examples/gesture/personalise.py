# On the board, with no host attached: personalise the gesture model to its wearer.
# The plan is in mt/plan.mtp (put there by `microtrain deploy`); sensor.py is next to
# this script. Every EVERY windows the model is checkpointed (atomically, in
# mt/ckpt.bin); a board that is reset or loses power carries on from the last
# checkpoint when this script runs again, and trains no window twice.
#
#     python examples/gesture/make_model.py build/gesture    # on the host: gesture.mtp
#     microtrain deploy build/gesture/gesture.mtp --port PORT  # the plan into mt/plan.mtp
#     micropython personalise.py                # unix port, in the board's directory
#     mpremote connect PORT cp sensor.py : + run personalise.py
#
# The emulated qemu boards (MPS2_AN500, VIRT_RV32) mount no filesystem at boot, so `cp` fails
# with "No such device": mount their RAM disk in the same mpremote line (a new mpremote
# connection soft-resets the board, which unmounts it; the files stay in its RAM):
#
#     mpremote connect PORT exec "from microtrain import ramdisk; ramdisk.mount()" \
#         + cp sensor.py : + run personalise.py
import sys
from array import array

import microtrain
from microtrain.checkpoint import Checkpoint
import sensor

SAMPLES = 160           # labelled windows from the wearer (in an app: "now shake your wrist")
EVERY = 20              # checkpoint every this many
WEARER = 1
TEST = 10000            # held-out windows are numbered from here

if sys.platform == "qemu":
    # the emulated board keeps its filesystem in PSRAM; real boards mount theirs at boot
    from microtrain import ramdisk
    ramdisk.mount()

t = microtrain.Trainer(open("mt/plan.mtp", "rb").read())
ck = Checkpoint(t, "mt/ckpt.bin")
meta = ck.restore()
start = meta["samples"] if meta and meta.get("run") == "personalise" else 0
out = array("f", bytes(4 * t.output_len))
loss = array("f", [0])


def accuracy(n=60):
    right = 0
    for i in range(n):
        x, label = sensor.window(WEARER, TEST + i)
        t.predict(array("f", x), out)
        right += max(range(len(out)), key=lambda j: out[j]) == label
    return right / n


print("resumed at sample %d" % start if start else "starting: accuracy for this wearer %.2f" % accuracy())
for k in range(start, SAMPLES):
    x, label = sensor.window(WEARER, k)
    t.step(array("f", x), label, loss)
    if (k + 1) % EVERY == 0:
        ck.save({"run": "personalise", "samples": k + 1})
        print("checkpoint at sample %d, loss %.3f" % (k + 1, loss[0]))
print("personalised: accuracy for this wearer %.2f" % accuracy())
