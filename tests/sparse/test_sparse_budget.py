"""--budget: the scheme chosen fits the budget and follows budget.py's rule; bad budgets fail
clearly. The model is tests/sparse/test_sparse.py's CNN (both exporters)."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import microtrain
from microtrain.budget import choose, parse_bytes, probe_loss
from oracle_models import export
from test_sparse import Block


@pytest.fixture(scope="module", params=["ts13", "dynamo"])
def path(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    return export(Block().eval(), torch.zeros(1, 3, 6, 6), request.param, str(d / "block.onnx"))


def peak(path, **kw):
    return microtrain.compile(path, **kw).report()["peak_ram_bytes"]


def test_budget_fits_and_is_maximal(path):
    low = peak(path, update="last-layer")
    high = peak(path, update="full")
    assert low < high
    budget = (low + high) // 2
    scheme, plan = choose(path, budget, momentum=0.9)
    assert plan.report()["peak_ram_bytes"] <= budget
    assert plan.meta["update"] == scheme
    n = len(scheme["bias_updates"])
    first = scheme["bias_updates"][0]["conv_index"] if n else 4
    assert [b["conv_index"] for b in scheme["bias_updates"]] == list(range(first, 4))   # the last n convs
    if n < 4:   # one bias more does not fit (the rule takes the largest n)
        more = dict(scheme, bias_updates=[{"conv_index": first - 1}] + scheme["bias_updates"], weight_updates=[])
        assert peak(path, update=more, momentum=0.9) > budget
    for w in scheme["weight_updates"]:   # only non-depthwise convs among the bias-trained ones
        assert w["conv_index"] >= first and w["conv_index"] != 2
    assert microtrain.compile(path, budget=budget, momentum=0.9).report()["peak_ram_bytes"] <= budget


def test_budget_everything_fits(path):
    scheme, plan = choose(path, "10MB")
    assert len(scheme["bias_updates"]) == 4
    assert sorted(w["conv_index"] for w in scheme["weight_updates"]) == [0, 1, 3]
    assert all(w["ratio"] == 1.0 for w in scheme["weight_updates"])


def test_budget_errors(path, tmp_path):
    with pytest.raises(ValueError, match="too small: the classifier alone needs"):
        choose(path, 100)
    for bad in ("96 parsecs", "KB", "-5KB"):
        with pytest.raises(ValueError, match="give bytes"):
            parse_bytes(bad)
    assert parse_bytes("96KB") == parse_bytes("96k") == 98304 and parse_bytes("1.5MB") == 1572864
    with pytest.raises(ValueError, match="without update/scheme"):
        microtrain.compile(path, update="full", budget="1MB")
    r = subprocess.run([sys.executable, "-m", "microtrain", "compile", path, "-o", str(tmp_path / "b.mtp"),
                        "--budget", "10MB"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "budget: chosen: classifier, biases of the last 4 convs" in r.stdout
    assert (tmp_path / "b.mtp").exists()


def probe_data(n=40, seed=0):
    """Labelled samples for Block (3x6x6 inputs, its 4 classes): the label is the channel-summed
    quadrant with the most mass, something a few steps can learn."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3, 6, 6)).astype(np.float32)
    q = x.sum(1).reshape(n, 2, 3, 2, 3).sum((2, 4)).reshape(n, 4)
    return x, q.argmax(1)


def test_budget_probe_chooses_the_candidate_with_the_lowest_held_out_loss(path):
    """Every N whose biases fit is a candidate (weights filled as the fit-first rule fills them);
    the one chosen has the lowest probe loss of them, measured again here on each candidate's plan,
    and fits the budget."""
    low, high = peak(path, update="last-layer"), peak(path, update="full")
    budget = (low + high) // 2
    lines = []
    x, y = probe_data()
    scheme, plan = choose(path, budget, log=lines.append, probe=(x, y), momentum=0.9, lr=0.05)
    cands = [re.match(r"candidate: biases of the last (\d+) convs, weights (.*): peak RAM (\d+) B, probe loss (\S+)", l)
             for l in lines]
    cands = [c for c in cands if c]
    assert len(cands) >= 2, lines
    assert plan.report()["peak_ram_bytes"] <= budget
    remeasured = []
    for c in cands:
        n = int(c.group(1))
        weights = [] if c.group(2) == "none" else [tuple(float(v) for v in w.split(" x")) for w in
                                                   (s.replace("conv ", "") for s in c.group(2).split(", "))]
        s = {"scheme": "c", "classifier": "full", "bias_updates": [{"conv_index": k} for k in range(4 - n, 4)],
             "weight_updates": [{"conv_index": int(k), "ratio": r, "select": "magnitude+"} for k, r in weights]}
        cp = microtrain.compile(path, update=s, momentum=0.9, lr=0.05)
        assert cp.report()["peak_ram_bytes"] == int(c.group(3)) <= budget
        loss = probe_loss(cp, (x, y), 2)
        assert loss == pytest.approx(float(c.group(4)), abs=1e-4)
        remeasured.append((loss, int(c.group(3)), n))
    best = min(remeasured)
    assert len(scheme["bias_updates"]) == best[2]
    assert plan.report()["peak_ram_bytes"] == best[1]
    assert len({r[0] for r in remeasured}) > 1   # the candidates do learn differently


def test_budget_probe_errors(path, tmp_path):
    x, y = probe_data()
    with pytest.raises(ValueError, match="give at least 5"):
        choose(path, "10MB", probe=(x[:4], y[:4]))
    with pytest.raises(ValueError, match="probe_epochs must be a whole number"):
        choose(path, "10MB", probe=(x, y), probe_epochs=0)
    with pytest.raises(ValueError, match=r"probe must be \(x, y\)"):
        choose(path, "10MB", probe=x)
    with pytest.raises(ValueError, match="give it with budget"):
        microtrain.compile(path, budget_probe=(x, y))
    np.savez(tmp_path / "probe.npz", x=x, y=y)
    cli = [sys.executable, "-m", "microtrain", "compile", path, "-o", str(tmp_path / "b.mtp")]
    r = subprocess.run(cli + ["--budget-probe", str(tmp_path / "probe.npz")], capture_output=True, text=True)
    assert r.returncode != 0 and "give it with --budget" in r.stderr, r.stderr
    r = subprocess.run(cli + ["--budget", "10MB", "--budget-probe", str(tmp_path / "nothere.npz")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--budget-probe" in r.stderr and "no such file" in r.stderr, r.stderr
    r = subprocess.run(cli + ["--budget", "10MB", "--budget-probe", str(tmp_path / "probe.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("budget: candidate: ") == 5 and "budget: chosen: " in r.stdout, r.stdout


@pytest.mark.parametrize("probe", [False, True])
def test_budget_skips_schemes_the_options_cannot_compile(path, probe):
    """With uint8 input the first conv cannot train (no int8 part would be left to take the
    input): a budget that everything else fits chooses the biases of the other three convs,
    with and without a probe, and says which scheme it could not compile."""
    x, y = probe_data()
    q = dict(quantize="int8", calibration=x[:16], input_dtype="uint8", input_quant=(1 / 50, 128))
    with pytest.raises(ValueError, match="needs an int8 model"):
        microtrain.compile(path, update={"classifier": "full", "bias_updates": [{"conv_index": k} for k in range(4)]},
                           **q)
    lines = []
    xu = np.clip(np.round(x * 50 + 128), 0, 255).astype(np.uint8)
    scheme, plan = choose(path, "10MB", log=lines.append, probe=(xu, y) if probe else None, **q)
    assert [b["conv_index"] for b in scheme["bias_updates"]] == [1, 2, 3] or probe
    assert all(b["conv_index"] > 0 for b in scheme["bias_updates"]), scheme
    assert any(l.startswith("cannot compile biases of 4 convs") and "needs an int8 model" in l for l in lines), lines
    assert plan.meta["input"]["dtype"] == "uint8"
    with pytest.raises(ValueError, match="input_quant is for quantize='int8'"):   # the options at fault: raised
        choose(path, "10MB", input_dtype="uint8", input_quant=(1 / 50, 128))
