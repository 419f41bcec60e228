"""tests/conftest.py's rule, run on a small suite of its own: under CI=true a skipped
MicroPython test fails; elsewhere it stays a skip; other tests may skip anywhere."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_suite(tmp_path, ci):
    shutil.copy(os.path.join(HERE, "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_micropython.py").write_text(
        "import pytest\n\ndef test_port():\n    pytest.skip('no MicroPython checkout at /nowhere')\n")
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\ndef test_optional():\n    pytest.skip('optional')\n\ndef test_ok():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path))


def test_skipped_micropython_test_fails_in_ci(tmp_path):
    r = run_suite(tmp_path, "true")
    assert r.returncode == 1, r.stdout
    assert "1 failed, 1 passed, 1 skipped" in r.stdout
    assert "CI=true: a MicroPython test may not be skipped; it was skipped because: no MicroPython checkout" in r.stdout


def test_outside_ci_it_is_a_skip(tmp_path):
    for ci in (None, "false", ""):
        r = run_suite(tmp_path, ci)
        assert r.returncode == 0 and "1 passed, 2 skipped" in r.stdout, r.stdout
