"""`make demo` installs the host package and what builds its C core, not the test stack, and
no setuptools deprecation banner is printed (issue 31: it installed torch, onnxruntime,
scikit-learn and onnxscript, and printed the licence banner five times). `make test` after
it must still install the test stack: the venv stamps are shared.

The Makefile is read by make itself (`make -n` in a copy of the repository, so nothing is built
here), the packaging metadata by setuptools itself; the slow test runs `make demo` for real in a
fresh copy with its own venv.
"""
import os
import shutil
import subprocess
import warnings

import pytest

from repo import ROOT

TEST_STACK = ("torch", "onnxruntime", "scikit-learn", "onnxscript", "flwr", "pytest")


def copy_of_the_repo(dest):
    """The files git tracks (and new ones it does not ignore), as a fresh clone has them."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, f))
    return dest


def dry_run(repo, target):
    # the make of a newcomer's shell: none of the variables of a make this suite may run under
    # (`make test-host SANITIZE=1` passes SANITIZE down, and that build reinstalls the package)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SANITIZE")}
    r = subprocess.run(["make", "-n", target], cwd=repo, capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if "pip install" in line]


def test_demo_installs_the_host_package_and_test_after_it_the_test_stack(tmp_path):
    repo = copy_of_the_repo(str(tmp_path / "repo"))
    demo = dry_run(repo, "demo")
    assert demo, "make demo installs nothing?"
    assert not any("requirements-test" in line or "requirements.txt" in line for line in demo), demo
    assert any("-r requirements-build.txt" in line for line in demo) and any("-e host" in line for line in demo)
    with open(os.path.join(repo, "requirements-build.txt")) as f:
        build = [line.split(">")[0].split("=")[0].strip() for line in f if line.strip() and line[0] != "#"]
    assert sorted(build) == ["cffi", "setuptools"]
    # make demo done (its stamps newer than every file): make test still brings the test stack
    os.makedirs(os.path.join(repo, ".venv"))
    os.makedirs(os.path.join(repo, "build"), exist_ok=True)
    for stamp in (".venv/.installed-host", "build/native.stamp"):
        open(os.path.join(repo, stamp), "w").close()
    for target in ("test-host", "venv"):
        lines = dry_run(repo, target)
        assert any("-r requirements-test.txt" in line for line in lines), (target, lines)
        assert not any("-e host" in line for line in lines), "the host package and its C core built again"


def test_packaging_metadata_raises_no_setuptools_warning():
    """setuptools' own reading of host/pyproject.toml: the licence as a TOML table is deprecated
    (the banner), and so is anything else it warns about."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution
    from setuptools.warnings import SetuptoolsWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), os.path.join(ROOT, "host", "pyproject.toml"))
    assert not [w for w in caught if issubclass(w.category, SetuptoolsWarning)], [str(w.message) for w in caught]
    assert dist.metadata.license_expression == "MIT"
    assert dist.package_dir == {"": "."}   # an editable install is a .pth line, without setuptools' banner


@pytest.mark.slow
def test_make_demo_in_a_fresh_copy(tmp_path):
    repo = copy_of_the_repo(str(tmp_path / "repo"))
    r = subprocess.run(["make", "demo"], cwd=repo, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "accuracy after 5 epochs" in out
    for banner in ("Deprecat", "!!", "BuildBackendWarning", "*****"):
        assert banner not in out, "a banner in make demo's output:\n" + out[-3000:]
    pip = subprocess.run([os.path.join(repo, ".venv", "bin", "python"), "-m", "pip", "list", "--format=freeze"],
                         capture_output=True, text=True, check=True).stdout.lower()
    installed = {line.split("==")[0] for line in pip.splitlines()}
    assert not installed & set(TEST_STACK), sorted(installed & set(TEST_STACK))
    assert {"numpy", "onnx", "cffi", "tqdm", "microtrain"} <= installed
