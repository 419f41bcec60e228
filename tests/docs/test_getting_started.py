"""docs/getting-started.md as a newcomer runs it: a new virtual environment made by the page's own
install block (`python3 -m venv ~/microtrain-venv`, `pip install ./host`, with HOME a fresh folder
and pip's cache the machine's, so nothing but PyPI is reached), then every command of the page in
it, as written, from the top of a clone (a scratch folder with the repository's folders linked in).

The emulated-board block builds the firmware with `make`; its `make` lines run in the repository
itself (a `make` on PATH that changes to the repository first), where `make test` builds the same
firmware, so the test neither rebuilds it nor writes a second copy."""
import os
import re
import subprocess
import sys

import pytest

import doc_blocks as D
from repo import ROOT

PAGE = "docs/getting-started.md"
pytestmark = pytest.mark.slow


def _pip_cache():
    r = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def _clean_env(home):
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("PYTEST")}
    # no venv of the suite's on PATH: `python3` is the machine's, as in a new shell
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not os.path.exists(os.path.join(p, "activate")))
    env["MICROPY_DIR"] = os.environ.get("MICROPY_DIR") or os.path.expanduser("~/.cache/microtrain/micropython")
    cache = _pip_cache()
    if cache:
        env["PIP_CACHE_DIR"] = cache
    env["HOME"] = str(home)
    return env


def _sh(script, cwd, env, timeout=900):
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout)


def _check(r, what):
    assert r.returncode == 0, "%s: exit status %d\n--- stdout\n%s\n--- stderr\n%s" % (
        what, r.returncode, r.stdout[-4000:], r.stderr[-4000:])
    return r.stdout


def _run_by_this_test(blocks):
    mine = [b for b in blocks if b.marker == "run-by tests/docs/test_getting_started.py"]
    install = [b for b in mine if "pip install ./host" in b.text]
    board = [b for b in mine if "microtrain.device.emulated" in b.text]
    assert len(install) == 1 and len(board) == 1 and len(mine) == 2, mine
    return install[0], board[0]


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory):
    """(clone, env, venv): the page's install block run in a new HOME."""
    home = tmp_path_factory.mktemp("home")
    clone = D.scratch_clone(tmp_path_factory.mktemp("clone"))
    env = _clean_env(home)
    install, _ = _run_by_this_test(D.blocks(PAGE))
    out = _check(_sh(install.text, clone, env), install.where)
    assert re.search(r"^microtrain \d+\.\d+\.\d+ \(plan format version \d+\)$", out, re.M), out
    return clone, env, home / "microtrain-venv"


def _host_blocks(clone, env, venv):
    outs = []
    for b in D.runnable(PAGE):
        if b.kind == "sh":
            r = _sh(". ~/microtrain-venv/bin/activate\n" + b.text, clone, env)
        else:
            r = subprocess.run([str(venv / "bin" / "python"), "-c", b.text], cwd=str(clone), env=env,
                               capture_output=True, text=True, timeout=600)
        outs.append(_check(r, b.where))
    return "\n".join(outs)


def test_the_host_commands_in_a_clean_venv(newcomer):
    clone, env, venv = newcomer
    # the venv has the host package's dependencies only: no PyTorch, no onnxruntime
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], capture_output=True, env=env)
    assert r.returncode != 0
    out = _host_blocks(clone, env, venv)
    before = float(re.search(r"^accuracy before training .*: (0\.\d+)$", out, re.M).group(1))
    after = float(re.search(r"^accuracy after 5 epochs .*: (0\.\d+)$", out, re.M).group(1))
    assert 0.25 < before < 0.4 and after > 0.85, (before, after)    # the page's "0.32 to about 0.90"
    assert re.search(r"^after: +0\.(8[5-9]|9\d)$", out, re.M), out
    for f in ("digits.mtp", "digits-arena.svg", "trained.npz", "digits_trained.onnx", "digits_trained_py.onnx"):
        assert (clone / "build" / f).exists(), f


def test_the_board_profiles_come_with_the_package(newcomer):
    """`microtrain boards` and --board after `pip install ./host`, run away from the clone and with
    no MICROTRAIN_BOARDS: the wheel carries boards/*.json (host/setup.py)."""
    clone, env, venv = newcomer
    env = {k: v for k, v in env.items() if k != "MICROTRAIN_BOARDS"}
    out = _check(_sh(". ~/microtrain-venv/bin/activate\ncd ~\nmicrotrain boards", env["HOME"], env), "microtrain boards")
    names = sorted(os.path.basename(p)[:-5] for p in (clone / "boards").glob("*.json"))
    assert len(names) >= 10 and all(re.search(r"^\s*%s\b" % n, out, re.M) for n in names), out


@pytest.mark.device
def test_the_emulated_board_in_the_clean_venv(newcomer, tmp_path):
    clone, env, venv = newcomer
    if not (clone / "build" / "digits.mtp").exists():
        _host_blocks(clone, env, venv)
    _, board = _run_by_this_test(D.blocks(PAGE))
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "make").write_text("#!/bin/sh\nexec %s -C %s \"$@\"\n" % (subprocess.run(
        ["sh", "-c", "command -v make"], capture_output=True, text=True).stdout.strip(), ROOT))
    (shim / "make").chmod(0o755)
    os.makedirs(os.path.join(ROOT, "build", "firmware"), exist_ok=True)
    if not (clone / "build" / "firmware").exists():
        os.symlink(os.path.join(ROOT, "build", "firmware"), str(clone / "build" / "firmware"))
    env = dict(env, PATH=str(shim) + os.pathsep + env["PATH"])
    out = _check(_sh(". ~/microtrain-venv/bin/activate\n" + board.text, clone, env, timeout=1800), board.where)
    acc = [float(a) for a in re.findall(r"accuracy[^\n]*?(0\.\d+)", out)]
    assert len(acc) >= 2 and acc[0] < 0.4 and acc[-1] > 0.85, out[-3000:]
    assert (clone / "build" / "digits_board.onnx").exists()
