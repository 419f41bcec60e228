"""Stack budgets: the peak C stack depth of Trainer(plan), step and predict for each
reference model, measured on qemu MPS2_AN500 by stack painting (tests/support/stack_usage.py),
fits every board's stack (boards/*.json stack_bytes), and the figures recorded in the
measured board's profile are not below what is measured now.

The figures are Cortex-M7 (Thumb-2, hardware float) code; the other Arm boards run the
same C built for their core, so their figures differ by the compiler's choices, which
is why the check keeps a margin (MARGIN) below each board's stack.
"""
import os

import pytest

import stack_usage
from microtrain import boards
from test_micropython import need_target, TARGETS

pytestmark = pytest.mark.device

BOARD = "mps2_an500"
MARGIN = 1024   # bytes kept free below every board's stack_bytes


@pytest.fixture(scope="module")
def measured():
    need_target(TARGETS[BOARD])
    return stack_usage.measure(BOARD)


def test_the_painting_itself_touches_no_painted_word(measured):
    """Painting then scanning with no call in between finds the paint intact, and every
    measured call reached below where the paint started (else it was not measured)."""
    result, (found, start) = measured
    assert found == start
    for name, calls in result.items():
        for call in ("load", "step", "predict"):
            assert calls[call] > calls["painted from"], "%s %s: no deeper than the paint's start: not measured" % (
                name, call)


def test_peak_stack_fits_every_board(measured):
    result, _ = measured
    peak = max(calls[c] for calls in result.values() for c in ("load", "step", "predict"))
    for name, b in boards.all_boards().items():
        assert peak + MARGIN <= b["stack_bytes"], "%s: peak stack %d bytes + %d margin > stack_bytes %d" % (
            name, peak, MARGIN, b["stack_bytes"])


def test_the_profile_records_the_figures(measured):
    result, _ = measured
    recorded = boards.load_board(BOARD).get("stack_use")
    assert recorded, "boards/%s.json has no stack_use: run python tests/support/stack_usage.py --update-profiles" % BOARD
    for name, calls in result.items():
        for call in ("load", "step", "predict"):
            depth = calls[call]
            assert recorded[name][call] >= depth, (
                "%s %s now needs %d bytes of stack, the profile says %d: run python tests/support/stack_usage.py "
                "--update-profiles" % (name, call, depth, recorded[name][call]))
