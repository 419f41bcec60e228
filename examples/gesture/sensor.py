# A simulated 3-axis accelerometer worn on the wrist: windows of WINDOW readings of one
# of four gestures. Plain Python that runs on MicroPython (the board's "sensor") and on
# CPython (the host trains the generic model on it, and the tests use it as oracle).
#
# Window k of a wearer is a function of (wearer, k) alone, so a board that restarts
# from a checkpoint at sample k sees the same windows from k on.
import math

GESTURES = ("rest", "shake", "tilt", "circle")
WINDOW = 16
N_IN = 3 * WINDOW


class _Rand:
    """xorshift32: the same numbers on every Python."""

    def __init__(self, seed):
        self.s = (seed * 2654435761 + 12345) & 0xFFFFFFFF or 1

    def __call__(self):
        s = self.s
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self.s = s
        return s / 4294967296.0


def window(wearer, k):
    """(readings, label): sample k of a wearer, readings a list of N_IN floats
    (x, y, z per reading, in g). Wearer 0 is the population the model was trained on;
    wearer 1 wears the watch turned a quarter turn on the wrist and moves more slowly."""
    r = _Rand(wearer * 1000003 + k)
    label = int(r() * 4) % 4
    phase = 2 * math.pi * r()
    amp = 0.6 + 0.4 * r()
    speed = 1.0 if wearer == 0 else 0.7
    out = []
    for t in range(WINDOW):
        a = 2 * math.pi * speed * t / WINDOW
        if label == 0:      # rest: gravity only
            x, y, z = 0.0, 0.0, 1.0
        elif label == 1:    # shake: back and forth along the forearm
            x, y, z = amp * math.sin(3 * a + phase), 0.0, 1.0
        elif label == 2:    # tilt: the wrist turns over
            x, y, z = math.sin(a * 0.5), 0.0, math.cos(a * 0.5)
        else:               # circle
            x, y, z = amp * math.cos(a + phase), amp * math.sin(a + phase), 1.0
        if wearer == 1:     # the watch turned a quarter turn: x and y swap
            x, y = -y, x
        out += [x + 0.1 * (r() - 0.5), y + 0.1 * (r() - 0.5), z + 0.1 * (r() - 0.5)]
    return out, label
