"""The command line as a person meets it: every mistake of issue 5's list gives one line
naming the file, array or option, the offending value and the fix, with exit status 2
and never a traceback; --version, help text, --lr, the held-out line, pipes."""
import os
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import microtrain
from microtrain import format as F

import models

from repo import ROOT


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "microtrain"] + [str(a) for a in args], capture_output=True,
                          text=True, cwd=cwd)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A cross-entropy plan (MLP, 6 inputs, 3 classes), an mse plan, its ONNX model and good data."""
    d = tmp_path_factory.mktemp("cli")
    model = d / "mlp.onnx"
    import onnx
    onnx.save(models.mlp(), str(model))
    microtrain.compile(str(model), update="full", lr=0.05).save(str(d / "ce.mtp"))
    microtrain.compile(str(model), update="full", loss="mse", lr=0.05).save(str(d / "mse.mtp"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    np.savez(d / "good.npz", x=x, y=y, x_test=x[:10], y_test=y[:10])
    return d, x, y


def bad_cases(d, x, y):
    """(what, args, pattern the error line must match): the problems issue 5 lists."""
    def npz(name, **arrays):
        np.savez(d / name, **arrays)
        return d / name

    ce, mse = d / "ce.mtp", d / "mse.mtp"
    v2 = bytearray((d / "ce.mtp").read_bytes())
    v2[F.header_offsets()["version"]:F.header_offsets()["version"] + 2] = struct.pack("<H", F.VERSION + 1)
    v2[F.header_offsets()["crc32"]:F.header_offsets()["crc32"] + 4] = struct.pack("<I", zlib.crc32(bytes(v2[16:])))
    (d / "v2.mtp").write_bytes(bytes(v2))
    (d / "text.npz").write_text("x,y\n1,2\n")
    (d / "zero_bytes.npz").write_bytes(b"")
    np.save(d / "x.npy", x)
    labels = y.copy()
    labels[17] = 12
    nan = x[:10].copy()
    nan[3, 2] = np.nan
    return [
        ("one-hot y", ["simulate", ce, "--data", npz("onehot.npz", x=x, y=np.eye(3)[y])],
         r"--data .*onehot.npz: y holds one-hot rows \(shape \(40, 3\)\).*use y.argmax\(1\)"),
        ("len(y) != len(x)", ["simulate", ce, "--data", npz("short.npz", x=x, y=y[:30])],
         r"x has 40 samples but y has 30"),
        ("wrong mse target width", ["simulate", mse, "--data", npz("wide.npz", x=x, y=np.zeros((40, 4)))],
         r"y has shape \(40, 4\): 4 target values per sample, but the model output has 3"),
        ("regression targets on a cross-entropy plan", ["simulate", ce, "--data", npz("reg.npz", x=x, y=x[:, 0])],
         r"y\[0\] = -?[0-9.]+ is not a class label.*compile with --loss mse"),
        ("zero samples", ["simulate", ce, "--data", npz("empty.npz", x=x[:0], y=y[:0])], r"x has no samples"),
        ("a non-npz file", ["simulate", ce, "--data", d / "text.npz"], r"--data .*text.npz is not an .npz archive"),
        ("an empty file", ["simulate", ce, "--data", d / "zero_bytes.npz"],
         r"--data .*zero_bytes.npz is not an .npz archive"),
        (".npy as --data", ["simulate", ce, "--data", d / "x.npy"],
         r"--data .*x.npy is a single .npy array, not an .npz archive.*np.savez"),
        ("label out of range", ["simulate", ce, "--data", npz("labels.npz", x=x, y=labels)],
         r"y\[17\] = 12 is not a class of this model: labels go from 0 to 2"),
        ("NaN in x_test", ["simulate", ce, "--data", npz("nan.npz", x=x, y=y, x_test=nan, y_test=y[:10])],
         r"x_test\[3\] contains NaN or infinity"),
        ("-o into a missing directory", ["compile", d / "mlp.onnx", "-o", d / "nodir" / "p.mtp"],
         r"cannot write -o .*nodir/p.mtp: directory .*nodir does not exist"),
        ("--save-params into a missing directory", ["simulate", ce, "--data", d / "good.npz", "--save-params",
                                                     d / "nodir" / "p.npz"],
         r"cannot write --save-params .*nodir/p.npz: directory .*nodir does not exist"),
        ("a diverging run", ["simulate", ce, "--data", npz("big.npz", x=x * 1e15, y=y), "--lr", "1e30"],
         r"training diverged at epoch 1, sample \d+ \(step \d+ of the epoch\): the loss is not finite.*lower --lr "
         r"\(now 1e\+30\)"),
        ("a plan of another format version", ["report", d / "v2.mtp"],
         r"plan format version %d, this runtime reads %d: recompile" % (F.VERSION + 1, F.VERSION)),
        ("report on an ONNX model", ["report", d / "mlp.onnx"],
         r"mlp.onnx is an ONNX model, not a training plan: compile it first \(microtrain compile"),
        ("--epochs -1", ["simulate", ce, "--data", d / "good.npz", "--epochs", "-1"], r"--epochs: .*-1 is below 1"),
        ("--lr -1", ["simulate", ce, "--data", d / "good.npz", "--lr", "-1"], r"--lr: .*must be a finite number"),
        ("--batch 0", ["compile", d / "mlp.onnx", "-o", d / "b.mtp", "--batch", "0"], r"--batch: 0 is below 1"),
        ("a missing model", ["compile", d / "none.onnx", "-o", d / "n.mtp"], r"cannot read ONNX model .*none.onnx"),
        ("export with parameters of another plan", ["export", ce, "--params", npz("p.npz", w=np.zeros(2)), "--onnx",
                                                    d / "mlp.onnx", "-o", d / "t.onnx"],
         r"params do not match the plan's trainable parameters: missing 'fc1.bias'.*not in the plan 'w'"),
    ]


def test_every_bad_input_is_one_line_with_exit_status_2(files):
    d, x, y = files
    for what, args, pattern in bad_cases(d, x, y):
        r = run(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, "%s: exit status %d\n%s" % (what, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr, "%s: %s" % (what, r.stderr)
        assert len(lines) == 1, "%s: %d lines on stderr:\n%s" % (what, len(lines), r.stderr)
        assert re.search(pattern, lines[-1]), "%s: %r does not match %r" % (what, lines[-1], pattern)
        assert lines[-1].startswith("microtrain ") and ": error: " in lines[-1]
        if what != "a diverging run":   # everything else is found before any work is done
            assert "before training" not in r.stdout and "epoch" not in r.stdout, what


def test_version_and_help(files):
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == "microtrain %s (plan format version %d)" % (
        microtrain.__version__, F.VERSION)
    from microtrain.cli import parser
    subs = next(a for a in parser()._actions if a.dest == "cmd").choices
    assert set(subs) == {"compile", "report", "simulate", "export", "boards", "flash", "deploy", "train", "eval", "pull", "romfs",
                         "fleet"}
    # each command's and each fleet command's options
    cmds = [((cmd,), sub) for cmd, sub in subs.items()]
    cmds += [(("fleet", cmd), sub) for cmd, sub in next(a for a in subs["fleet"]._actions
                                                         if a.dest == "fleet_cmd").choices.items()]
    for cmd, sub in cmds:
        text = " ".join(run(*cmd, "--help").stdout.split())
        for action in sub._actions:
            if action.dest == "help":
                continue
            assert action.help and len(action.help.split()) >= 3, "%s %s has no description" % (cmd, action.dest)
            assert " ".join(action.help.split()[:3]) in text
            own = "(default" in action.help or (action.nargs == 0 and action.default is True)  # test_rough_edges
            if action.default not in (None, False) and not action.required and not own:
                assert "(default: %s)" % action.default in text, (cmd, action.dest)


def test_simulate_lr_and_held_out_line(files):
    d, x, y = files
    out = run("simulate", d / "ce.mtp", "--data", d / "good.npz", "--epochs", "2", "--lr", "0.2").stdout
    assert "lr              0.2 (--lr; the plan says 0.05)" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 2 and all(re.match(r"epoch \d/2: mean loss [0-9.]+, held-out accuracy [0-9.]+$", ln)
                                   for ln in lines)
    # the same run in Python with lr 0.2 ends with the accuracy the CLI prints
    sim = microtrain.Simulator(microtrain.load_plan(str(d / "ce.mtp")))
    sim.lr = 0.2
    sim.fit(x, y, epochs=2, seed=0)
    assert "accuracy after 2 epochs (80 steps): %.4f" % sim.evaluate(x[:10], y[:10]) in out


def test_report_into_a_closed_pipe(files):
    d, _, _ = files
    r = subprocess.run("%s -m microtrain report %s | head -1" % (sys.executable, d / "ce.mtp"), shell=True,
                       capture_output=True, text=True)
    assert r.stdout.startswith("plan") and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_progress_bars_only_on_a_terminal(files, capsys):
    """Not a terminal: plain lines only (the CLI's per-epoch lines); progress=True draws tqdm's bar."""
    d, x, y = files
    r = run("simulate", d / "ce.mtp", "--data", d / "good.npz", "--epochs", "2")
    assert r.returncode == 0 and "\r" not in r.stderr + r.stdout
    sim = microtrain.Simulator(microtrain.load_plan(str(d / "ce.mtp")))
    sim.fit(x, y, epochs=1, progress=True)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "40/40" in err and "sample" in err
