"""Plan files, the report, and the CLI built on them."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import onnx

import microtrain

import models

from repo import ROOT
EXAMPLE = os.path.join(ROOT, "examples", "digits_cnn.onnx")
KEYS = {"arena_bytes", "naive_bytes", "param_bytes", "const_bytes", "macs_per_step", "ops", "tensors"}


def cli(*args):
    r = subprocess.run([sys.executable, "-m", "microtrain"] + [str(a) for a in args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_save_load_round_trip(tmp_path):
    plan = microtrain.compile(models.cnn(), update="last:2", lr=0.02, momentum=0.5, batch=3)
    path = tmp_path / "p.mtp"
    plan.save(str(path))
    again = microtrain.load_plan(str(path))
    assert again.data == plan.data
    assert again.report() == plan.report()
    assert not os.path.exists(str(path) + ".tmp")


def test_report_keys_and_figures():
    plan = microtrain.compile(models.cnn(), update="full", momentum=0.9)
    r = plan.report()
    assert KEYS <= set(r)
    assert r["ops"] == len(plan.ops)
    for t in r["tensors"]:
        assert {"name", "bytes", "offset", "first", "last"} <= set(t)
    # parameters and momentum: every weight and bias of the model, twice, in float32
    n_params = sum(int(np.prod(i.dims)) for i in models.cnn().graph.initializer if i.name not in ("lo", "hi"))
    assert r["param_bytes"] >= 2 * 4 * n_params
    assert r["const_bytes"] == 0   # full update: nothing frozen but the clip bounds, which are folded away


def forward_macs(model):
    """MACs of the convolutions and Gemms, from onnx's own shape inference."""
    m = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in
              list(m.graph.value_info) + list(m.graph.output)}
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    total = {}
    for n in m.graph.node:
        if n.op_type == "Conv":
            w, y = inits[n.input[1]], shapes[n.output[0]]
            total[n.name] = int(np.prod(y[1:]) * np.prod(w[1:]))
        elif n.op_type == "Gemm":
            total[n.name] = int(np.prod(inits[n.input[1]]))
    return total


def test_macs_per_step_counts_forward_and_exactly_the_backward_it_needs():
    fwd = forward_macs(models.cnn())
    last = microtrain.compile(models.cnn(), update="last-layer").report()["macs_per_step"]
    assert last == sum(fwd.values()) + fwd["fc"]                    # + the head's weight gradient
    full = microtrain.compile(models.cnn(), update="full", recompute=False).report()["macs_per_step"]
    # every layer: forward + weight gradient, and an input gradient for all but the first
    assert full == 3 * sum(fwd.values()) - fwd["c1"]
    # replayed forward ops (recompute.py) are counted, at most the forward's again
    replayed = microtrain.compile(models.cnn(), update="full").report()["macs_per_step"] - full
    assert 0 < replayed <= sum(fwd.values()) and replayed in {fwd[k] for k in fwd} | {fwd["c1"] + fwd["dw"]}


def test_cli_compile_report_simulate(tmp_path):
    plan = tmp_path / "d.mtp"
    out = cli("compile", EXAMPLE, "-o", plan, "--update", "last-layer", "--lr", "0.05", "--momentum", "0.9")
    assert "wrote" in out and plan.exists()
    r = json.loads(cli("report", plan, "--json"))
    assert KEYS <= set(r) and r["trainable"] == ["fc.weight", "fc.bias"]
    assert r == microtrain.load_plan(str(plan)).report()
    svg = tmp_path / "a.svg"
    text = cli("report", plan, "--svg", svg)
    assert "arena" in text and "RAM (peak)" in text
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}rect")) > 5
    out = cli("simulate", plan, "--data", os.path.join(ROOT, "examples", "digits_user.npz"), "--epochs", "2",
              "--save-params", tmp_path / "p.npz")
    before = float(out.split("accuracy before training")[1].split(":")[1].split()[0])
    after = float(out.split("accuracy after")[1].split(":")[1].split()[0])
    assert after > before + 0.2
    saved = np.load(tmp_path / "p.npz")
    assert set(saved.files) == {"fc.weight", "fc.bias"} and saved["fc.weight"].shape == (10, 64)


def test_simulate_refuses_bad_data(tmp_path):
    plan = tmp_path / "d.mtp"
    cli("compile", EXAMPLE, "-o", plan)
    np.savez(tmp_path / "nox.npz", y=np.zeros(3))
    r = subprocess.run([sys.executable, "-m", "microtrain", "simulate", str(plan), "--data", str(tmp_path / "nox.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "lacks array(s) ['x']" in r.stderr


def test_alive_at_peak_without_a_tensor_counts_the_rest():
    """alive_at_peak(plan, without=[input]) (benchmarks/tte.py's live_without_input_bytes): at every
    op the live bytes less the input's where it is alive; its peak is the largest of those."""
    from microtrain.peak import alive_at_peak
    plan = microtrain.compile(models.cnn(), update="full")
    inp = plan.header["input_tensor"]
    size = -(-plan.tensors[inp]["bytes"] // 8) * 8
    whole, rest = alive_at_peak(plan), alive_at_peak(plan, without=[inp])
    assert rest["live_bytes"] >= whole["live_bytes"] - size
    assert rest["live_bytes"] <= whole["live_bytes"] and size > 0
    assert any(name == plan.tensors[inp]["name"] for name, *_ in whole["tensors"])   # kept for conv1's weight
    assert all(name != plan.tensors[inp]["name"] for name, *_ in rest["tensors"])
