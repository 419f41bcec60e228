"""--budget: the scheme chosen fits the budget and follows budget.py's rule; bad budgets fail
clearly. The model is tests/test_sparse.py's CNN (both exporters)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import microtrain
from microtrain.budget import choose, parse_bytes
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
