"""Boards over serial: the host's side of `microtrain deploy/train/eval/pull`.

board.Board     a board running microtrain's server (connect, deploy, train, pull)
link.Link       the framed protocol (protocol.py, shared with the board) with resends
training.py     a training run streamed to a board, with checkpoints and recovery
ports.py        serial ports and auto-detection of a MicroPython board
emulated.py     qemu and unix-port boards on pseudo-terminals, and a fault-injecting proxy
"""
from .errors import (BoardError, BoardReset, DataError, DeviceError, FirmwareError,  # noqa: F401
                     LinkError, NoDevice, PlanTooBig)
