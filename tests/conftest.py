"""Suite-wide rules (docs/development/tests.md).

Layout: one folder per area (compiler/, core/, conformance/, int8/, sparse/, device/, serial/,
cli/, bench/, fleet/, suite/); the helpers the areas share in support/. Every folder is on sys.path,
so a test imports a helper (`import models`) or another area's test module by its name.

Markers (registered here, listed in docs/development/tests.md):
  device    starts an emulator or MicroPython (qemu, rp2040js, the unix port). A test without
            it that starts one fails (the guard below), so `pytest -m "not device"` runs none.
  slow      the rest of the matrix, run by `make test-all` and CI, not by `make test`.
  sanitize  builds and runs a sanitizer build of the C core of its own.
  long      minutes of host time: collected first, so that xdist, which hands tests out in
            collection order, starts it early instead of leaving it to end the run alone.

Under CI (CI=true, as .ci/run runs), a skipped `device` test is a failure: a fresh machine
must build and run them, and a skip there would report a pass that never happened.
"""
import os
import subprocess
import sys

import pytest

# one thread per process for PyTorch and numpy's BLAS: xdist already runs a process per core,
# and their own thread pools on top of that slow every worker down (set before they load)
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

HERE = os.path.dirname(os.path.abspath(__file__))
AREAS = sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)) and not d.startswith(("_", ".")))
for _d in ["support"] + AREAS:
    _p = os.path.join(HERE, _d)
    if _p not in sys.path:
        sys.path.insert(0, _p)

MARKERS = {
    "device": "starts an emulator or MicroPython (qemu, rp2040js, the unix port); `-m 'not device'` runs none",
    "slow": "the rest of the matrix: run by `make test-all` and CI, not by `make test`",
    "sanitize": "builds and runs a sanitizer build of the C core of its own",
    "long": "minutes of host time: collected first, so that xdist starts it early",
}
# what starts an emulator or a MicroPython: the program's base name (or the script's, after python)
EMULATORS = ("qemu-system-", "node", "micropython", "pty_bridge.py", "run-tests.py")


def in_ci():
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup as xdist documents it, which xdist 3.8 no longer does under pytest 9 (it
    renames item._nodeid, which pytest 9 ignores): a test whose parameter id ends in @GROUP runs
    on the same worker as every other of GROUP (a device target's scripts share one boot); the
    rest go one by one to whichever worker is free."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            param = nodeid.rsplit("[", 1)[-1] if nodeid.endswith("]") else ""
            return "@" + param[:-1].rsplit("@", 1)[1] if "@" in param else nodeid

    return Groups(config, log)


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", "%s: %s" % (name, what))


def pytest_collection_modifyitems(items):
    """`long` tests first, in their order (the sort is stable): a 7-minute test handed out last
    would keep one worker busy for 7 minutes after the other ran out of work."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and item.get_closest_marker("device") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        report.outcome = "failed"
        report.longrepr = "CI=true: a device test may not be skipped; it was skipped because: %s" % reason


def _starts_emulator(args):
    words = args.split() if isinstance(args, str) else [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike))
                                                        else str(a) for a in args]
    if words and os.path.basename(words[0]) == "setpriv" and "--" in words:   # emulated._spawn's wrapper
        words = words[words.index("--") + 1:]
    return any(os.path.basename(w).startswith(EMULATORS) for w in words[:2])


@pytest.fixture(autouse=True)
def emulators_only_in_device_tests(request, monkeypatch):
    """A test not marked `device` may not start an emulator or MicroPython: the marker is what
    `pytest -m "not device"` and the sanitizer run (which must not reach an emulator with its
    preloaded runtimes) select by."""
    if request.node.get_closest_marker("device") is not None:
        yield
        return
    real = subprocess.Popen.__init__

    def guarded(self, args, *a, **kw):
        if _starts_emulator(args):
            raise AssertionError("%s is not marked `device` but starts %r (tests/conftest.py)"
                                 % (request.node.nodeid, args))
        real(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield


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
