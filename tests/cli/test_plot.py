"""`simulate --plot` and `train --plot` (issue 31): the loss/accuracy curve as a PNG.

Pillow (not ours) decodes the file; the points it shows are read back from the PNG's
`microtrain:curve` text chunk and must be the figures the run printed, one loss a epoch and
one accuracy before training and after each epoch, both drawn in their colours. Without
matplotlib, --plot is one error line naming `pip install matplotlib`, before any training.
"""
import contextlib
import io
import json
import os
import re
import sys

import numpy as np
import pytest
from PIL import Image

from microtrain import cli
from repo import ROOT

MODEL = os.path.join(ROOT, "examples", "digits_cnn.onnx")
DATA = os.path.join(ROOT, "examples", "digits_user.npz")
RED, BLUE = (214, 39, 40), (31, 119, 180)   # matplotlib's tab:red (loss) and tab:blue (accuracy)


def main(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("plot") / "digits.mtp"
    assert main("compile", MODEL, "-o", path, "--update", "last-layer", "--lr", "0.05")[0] == 0
    return path


def curve(path):
    """The PNG's size, its points, and how many pixels of each line colour it has."""
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.load()
        data = json.loads(im.text["microtrain:curve"])
        px = np.asarray(im.convert("RGB")).reshape(-1, 3).astype(int)
    near = lambda c: int((np.abs(px - c).sum(1) < 30).sum())   # noqa: E731
    return im.size, data, near(RED), near(BLUE)


def test_simulate_plot_holds_every_epoch(plan, tmp_path):
    png = tmp_path / "curve.png"
    code, out, err = main("simulate", plan, "--data", DATA, "--epochs", "3", "--plot", png)
    assert code == 0, err
    assert "curve written to %s" % png in out
    size, data, red, blue = curve(png)
    assert size == (640, 400)
    losses = [float(v) for v in re.findall(r"mean loss ([\d.]+)", out)]
    accs = [float(re.search(r"before training .*: ([\d.]+)", out).group(1))] + \
        [float(v) for v in re.findall(r"held-out accuracy ([\d.]+)", out)]
    assert [e for e, _ in data["loss"]] == [1, 2, 3] and [e for e, _ in data["values"]] == [0, 1, 2, 3]
    assert np.allclose([v for _, v in data["loss"]], losses, atol=5e-5)
    assert np.allclose([v for _, v in data["values"]], accs, atol=5e-5)
    assert red > 200 and blue > 200, "a line is not drawn (%d loss pixels, %d accuracy pixels)" % (red, blue)


def test_plot_without_matplotlib_is_one_line_before_training(plan, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib raises ImportError
    png = tmp_path / "curve.png"
    code, out, err = main("simulate", plan, "--data", DATA, "--plot", png)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "pip install matplotlib" in err and "--plot" in err
    assert "epoch" not in out and not png.exists()


def test_train_plot_on_a_board(tmp_path, monkeypatch):
    """train --plot: the board's epochs (a stand-in board: the serial link has tests of its own)."""
    from microtrain.device import commands, training

    class Board:
        port = "fake"

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def plan(self):
            return type("P", (), {"loss": "cross-entropy"})()

    def run(board, x, y, epochs, on_epoch, **kw):
        for e in range(1, epochs + 1):
            on_epoch(e, 2.0 / e, 0.3 + 0.1 * e)
        return {"trained": epochs * len(x), "samples_per_s": 1.0, "samples": epochs * len(x),
                "stats": type("S", (), {"resent": 0})()}

    monkeypatch.setattr(commands, "_board", lambda args: Board())
    monkeypatch.setattr(training, "train", run)
    png = tmp_path / "board.png"
    code, out, err = main("train", "--data", DATA, "--epochs", "4", "--plot", png)
    assert code == 0, err
    _, data, red, blue = curve(png)
    assert data["loss"] == [[e, 2.0 / e] for e in range(1, 5)]
    assert data["values"] == [[e, 0.3 + 0.1 * e] for e in range(1, 5)] and data["metric"] == "running accuracy"
    assert red > 200 and blue > 200
