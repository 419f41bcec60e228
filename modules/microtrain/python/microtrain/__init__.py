# microtrain on the board: the C module `_microtrain` (Trainer, FORMAT_VERSION),
# built into the firmware or loaded from _microtrain.mpy, plus Python-level helpers.
# Users write `import microtrain; microtrain.Trainer(plan)`.
from _microtrain import *  # noqa: F401,F403
