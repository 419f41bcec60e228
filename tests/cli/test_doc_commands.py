"""The commands of docs/quantization.md's and docs/sparse.md's first examples run as written
(issue 31's copy-paste failures: a `...` placeholder, files that were not where the page said),
in a fresh folder, with `microtrain` and `python` those of this interpreter."""
import os
import re
import subprocess
import sys

from repo import ROOT, need_tte


def block(doc, heading, lang):
    """The first ```lang block after the line `heading` of docs/doc."""
    with open(os.path.join(ROOT, "docs", doc)) as f:
        text = f.read()
    after = text[text.index(heading + "\n"):]
    m = re.search(r"^```%s\n(.*?)^```$" % lang, after, re.S | re.M)
    return m.group(1)


def sh(script, cwd):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = subprocess.run(["bash", "-e", "-c", script], cwd=str(cwd), env=env, capture_output=True, text=True)
    assert r.returncode == 0, "exit status %d\n%s\n%s" % (r.returncode, r.stdout, r.stderr)
    return r.stdout


def test_quantization_two_ways_in(tmp_path):
    os.symlink(os.path.join(ROOT, "examples"), str(tmp_path / "examples"))
    with open(os.path.join(ROOT, "docs", "quantization.md")) as f:
        prepare = re.search(r"first `(cp [^`]*)` and\s+`(python -c [^`]*)`", f.read())
    assert prepare, "the page says how to make model.onnx and calib.npz from the examples"
    sh("\n".join(prepare.groups()), tmp_path)
    out = sh(block("quantization.md", "## Two ways in", "sh"), tmp_path)
    assert "(post-training quantization, min/max calibration)" in out and "(QDQ model)" in out, out
    assert (tmp_path / "model_qdq.onnx").exists() and (tmp_path / "model.mtp").exists()


def test_sparse_using_a_scheme(tmp_path):
    need_tte()
    os.symlink(os.path.join(ROOT, "benchmarks"), str(tmp_path / "benchmarks"))
    out = sh(block("sparse.md", "## Using a scheme", "sh"), tmp_path)
    assert (tmp_path / "scheme-49kb.json").exists() and (tmp_path / "calib.npz").exists()
    assert re.search(r"^RAM \(peak\) +99\.2 KB", out, re.M), out      # the figure docs/sparse.md gives
    with open(tmp_path / "doc.py", "w") as f:
        f.write(block("sparse.md", "## Using a scheme", "python"))
        f.write("print(plan.report()['trainable'])\n")
    out = sh("python doc.py", tmp_path)
    assert "classifier.weight" in out and "@trained" in out, out
