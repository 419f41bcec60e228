"""Suite-wide rules.

Under CI (CI=true, as .ci/run runs), a skipped MicroPython test is a failure: a fresh
machine must build and run them (make micropython, make firmware), and a skip there
would report a pass that never happened.
"""
import os
import sys

import pytest

MUST_RUN_IN_CI = ("test_micropython.py", "test_romfs_qemu.py", "test_pico_romfs.py")


def in_ci():
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and os.path.basename(str(item.fspath)) in MUST_RUN_IN_CI:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        report.outcome = "failed"
        report.longrepr = "CI=true: a MicroPython test may not be skipped; it was skipped because: %s" % reason


@pytest.fixture(scope="module", autouse=True)
def no_emulator_left():
    """Every emulator a test module starts (microtrain.device.emulated) is stopped by the
    time the module's tests and fixtures are done, on success and on failure alike."""
    yield
    emulated = sys.modules.get("microtrain.device.emulated")
    if emulated is None:
        return
    left = emulated.running()
    for proc in left:
        emulated._kill_group(proc)
    assert not left, "emulators left running: %s" % ", ".join(" ".join(map(str, p.args[-3:])) for p in left)
