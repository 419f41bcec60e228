"""tests/conftest.py's rules, run on a small suite of their own: under CI=true a skipped
`device` test fails; elsewhere it stays a skip; other tests may skip anywhere. A test not
marked `device` cannot start an emulator."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_suite(tmp_path, ci):
    shutil.copy(os.path.join(os.path.dirname(HERE), "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_board.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.device\n\n"
        "def test_port():\n    pytest.skip('no MicroPython checkout at /nowhere')\n")
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\ndef test_optional():\n    pytest.skip('optional')\n\ndef test_ok():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path))


def test_skipped_device_test_fails_in_ci(tmp_path):
    r = run_suite(tmp_path, "true")
    assert r.returncode == 1, r.stdout
    assert "1 failed, 1 passed, 1 skipped" in r.stdout
    assert "CI=true: a device test may not be skipped; it was skipped because: no MicroPython checkout" in r.stdout


def test_outside_ci_it_is_a_skip(tmp_path):
    for ci in (None, "false", ""):
        r = run_suite(tmp_path, ci)
        assert r.returncode == 0 and "1 passed, 2 skipped" in r.stdout, r.stdout


def test_only_device_tests_start_an_emulator(tmp_path):
    """The guard behind `pytest -m "not device"` running no emulator: the same start of a
    (stand-in) `micropython` passes in a `device` test and fails in an unmarked one."""
    fake = tmp_path / "micropython"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    shutil.copy(os.path.join(os.path.dirname(HERE), "conftest.py"), tmp_path / "conftest.py")
    body = "import subprocess\n\n{mark}def test_start():\n    subprocess.run([%r, '-c', 'pass'], check=True)\n" % str(fake)
    (tmp_path / "test_marked.py").write_text("import pytest\n" + body.format(mark="@pytest.mark.device\n"))
    (tmp_path / "test_unmarked.py").write_text(body.format(mark=""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert "1 failed, 1 passed" in r.stdout, r.stdout
    assert "test_unmarked.py::test_start is not marked `device` but starts" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not device",
                        str(tmp_path)], capture_output=True, text=True, cwd=str(tmp_path))
    assert "1 failed, 1 deselected" in r.stdout, r.stdout
