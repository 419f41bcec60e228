"""An emulated board reset from a thread that then ends keeps running. The kernel's
parent-death signal that stops emulators with the host (setpriv --pdeathsig) follows the
thread that forked them: a board powered on again by a short-lived thread (a timer that
power-cycles it, as the fleet's fault tests do) used to be killed the moment that thread
ended, and a round then waited for a board that was gone (CI, stop 34)."""
import threading
import time

import pytest

from serial_support import make_board


@pytest.mark.device
@pytest.mark.parametrize("target", ["unix", "qemu"])
def test_board_power_cycled_by_a_thread_that_ends_stays_up(target):
    from microtrain.device.board import Board
    board = make_board(target)

    def power_cycle():
        board.power_cut()
        board.start()
    try:
        t = threading.Thread(target=power_cycle)
        t.start()
        t.join()
        time.sleep(0.5)         # the signal, had it come, comes as the thread ends
        assert board.proc is not None and board.proc.poll() is None, \
            "the board died with the thread that reset it (exit status %s)" % board.proc.poll()
        with Board(board.port) as b:
            assert b.facts["protocol"] >= 1
    finally:
        board.close()
