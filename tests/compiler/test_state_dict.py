"""`simulate --save-params --state-dict` for models whose BatchNorm was folded into a conv (issue 31).

The default exports fold an eval-mode BatchNorm into the conv before microtrain sees it
(TorchScript: initializers renamed onnx::Conv_N; the dynamo exporter's optimizer: the conv's own
names holding folded values), and microtrain's importer folds the ones left in the graph. The
trained folded layer must come back un-folded into the module's state_dict: loaded with PyTorch's
own load_state_dict (strict) into a fresh module, PyTorch's eval output must be the simulator's.
PyTorch, nobody here, is the oracle.
"""
import contextlib
import io
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import microtrain


TOL = 2e-5


class ConvBNNet(nn.Module):
    """conv (no bias) + BN + ReLU, conv (bias) + BN + ReLU, Linear: the two ways a conv meets its BN."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU()),
            nn.Sequential(nn.Conv2d(4, 6, 3), nn.BatchNorm2d(6, eps=1e-3), nn.ReLU()))
        self.fc = nn.Linear(6 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def trained_bn_net():
    torch.manual_seed(0)
    m = ConvBNNet()
    with torch.no_grad():   # BatchNorms as training leaves them, not the identity of a fresh one
        for bn in (m.features[0][1], m.features[1][1]):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0, 0.3)
            bn.running_mean.normal_(0, 0.3)
            bn.running_var.uniform_(0.5, 2.0)
            bn.num_batches_tracked.fill_(7)
        m.features[0][1].weight[2] = 0.0   # a channel switched off (gamma 0), as zero-init residuals have
    return m.eval()


def export(module, path, shape=(1, 8, 8), **kw):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.zeros((1,) + shape),), path, input_names=["x"], **kw)


def run(*args):
    return subprocess.run([sys.executable, "-m", "microtrain"] + [str(a) for a in args], capture_output=True,
                          text=True)


# both default exports (the exporter folds), and both with the BatchNorm left for microtrain to fold
EXPORTS = {
    "torchscript": dict(dynamo=False),
    "dynamo": dict(dynamo=True),
    "torchscript-preserve": dict(dynamo=False, training=torch.onnx.TrainingMode.PRESERVE),
    "dynamo-noopt": dict(dynamo=True, optimize=False),
}


@pytest.mark.parametrize("exporter", list(EXPORTS))
def test_state_dict_of_a_bn_folded_model_loads_strict_and_predicts_like_the_simulator(exporter, tmp_path):
    module = trained_bn_net()
    path = str(tmp_path / "m.onnx")
    export(module, path, **EXPORTS[exporter])
    torch.save(module.state_dict(), tmp_path / "model.pt")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 1, 8, 8)).astype(np.float32)
    y = np.stack([x[:, 0, :4, :4].mean((1, 2)), x[:, 0, 4:, :4].mean((1, 2)), x[:, 0, :, 4:].mean((1, 2))]).argmax(0)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    plan, saved = tmp_path / "p.mtp", tmp_path / "trained.npz"
    r = run("compile", path, "-o", plan, "--update", "full", "--lr", "0.01", "--momentum", "0.9")
    assert r.returncode == 0, r.stderr
    r = run("simulate", plan, "--data", tmp_path / "d.npz", "--epochs", "3", "--save-params", saved,
            "--state-dict", tmp_path / "model.pt")
    assert r.returncode == 0, r.stderr
    assert "PyTorch state dict written to" in r.stdout

    state = dict(np.load(saved))
    fresh = ConvBNNet()
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})   # strict: every key, no other
    fresh.eval()
    sim = microtrain.Simulator(microtrain.load_plan(str(plan)))
    sim.set_params(_plan_params(tmp_path, plan))
    with torch.no_grad():
        want = fresh(torch.from_numpy(x)).numpy()
        before = module(torch.from_numpy(x)).numpy()
    got = sim.predict(x)
    # the test proves something only if training moved the convs and their ReLUs still pass signal
    assert np.abs(got - before).max() > 0.05, "training changed nothing"
    assert got.std(0).min() > 0.03, "the outputs no longer depend on the input (dead ReLUs)"
    assert np.abs(state["features.1.0.weight"] - module.state_dict()["features.1.0.weight"].numpy()).max() > 1e-3
    err = np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))
    assert err <= TOL, "%s: PyTorch with the saved state dict is off the simulator by %.3g" % (exporter, err)
    # what never trained keeps its value: running statistics, gamma of a live channel, num_batches_tracked
    ref = module.state_dict()
    for k in ("features.0.1.running_mean", "features.0.1.running_var", "features.1.1.running_var",
              "features.1.1.weight", "features.0.1.num_batches_tracked"):
        assert np.array_equal(state[k], ref[k].numpy()), k
    g = state["features.0.1.weight"]
    assert np.array_equal(np.delete(g, 2), np.delete(ref["features.0.1.weight"].numpy(), 2))


def _plan_params(tmp_path, plan):
    """The parameters the same training run leaves (simulate --save-params without --state-dict)."""
    plain = tmp_path / "plain.npz"
    r = run("simulate", plan, "--data", tmp_path / "d.npz", "--epochs", "3", "--save-params", plain)
    assert r.returncode == 0, r.stderr
    return dict(np.load(plain))


def test_state_dict_needs_save_params_and_a_state_dict(tmp_path):
    module = trained_bn_net()
    path = str(tmp_path / "m.onnx")
    export(module, path, dynamo=False)
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 1, 8, 8), np.float32), y=np.zeros(2, int))
    assert run("compile", path, "-o", tmp_path / "p.mtp", "--update", "full").returncode == 0
    other = nn.Linear(3, 2).state_dict()
    torch.save(other, tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_text("not a state dict")
    for args, pattern in [
            (["--state-dict", tmp_path / "other.pt"], "read only by --save-params"),
            (["--state-dict", tmp_path / "other.pt", "--save-params", tmp_path / "s.npz"],
             "no entry of the state dict is its weight"),
            (["--state-dict", tmp_path / "junk.pt", "--save-params", tmp_path / "s.npz"], "is not a state dict"),
            (["--state-dict", tmp_path / "none.pt", "--save-params", tmp_path / "s.npz"], "no such file")]:
        r = run("simulate", tmp_path / "p.mtp", "--data", tmp_path / "d.npz", *args)
        assert r.returncode == 2 and pattern in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "s.npz").exists()


class LinearBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.bn(self.a(x))))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_linear_batchnorm1d_through_the_python_api(exporter, tmp_path):
    """A Linear's BatchNorm1d (a Gemm fold), through microtrain.state_dict."""
    torch.manual_seed(0)
    module = LinearBN()
    with torch.no_grad():
        module.bn.weight.uniform_(0.5, 1.5)
        module.bn.bias.normal_(0, 0.3)
        module.bn.running_mean.normal_(0, 0.3)
        module.bn.running_var.uniform_(0.5, 2.0)
    module.eval()
    path = str(tmp_path / "m.onnx")
    export(module, path, (6,), **EXPORTS[exporter])
    sim = microtrain.Simulator(microtrain.compile(path, update="full", lr=0.05))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype(np.float32)
    sim.fit(x, x[:, :3].argmax(1), epochs=3, progress=False)
    state = microtrain.state_dict(sim.plan, sim.params(), module.state_dict())
    fresh = LinearBN()
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    fresh.eval()
    with torch.no_grad():
        want = fresh(torch.from_numpy(x)).numpy()
        before = module(torch.from_numpy(x)).numpy()
    got = sim.predict(x)
    assert np.abs(got - before).max() > 0.05
    assert np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))) <= TOL


def test_pull_state_dict_from_a_board(tmp_path, monkeypatch):
    """pull -o params.npz --state-dict: what a board trained, un-folded the same way (a stand-in board
    holding a simulator's parameters: the serial link has tests of its own)."""
    from microtrain import cli
    from microtrain.device import commands
    module = trained_bn_net()
    path = str(tmp_path / "m.onnx")
    export(module, path, dynamo=False)
    torch.save(module.state_dict(), tmp_path / "model.pt")
    sim = microtrain.Simulator(microtrain.compile(path, update="full", lr=0.01, momentum=0.9))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 1, 8, 8)).astype(np.float32)
    sim.fit(x, (x.reshape(32, -1)[:, :3]).argmax(1), epochs=2, progress=False)

    class Board:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def params(self):
            return sim.params()

        def plan(self):
            return sim.plan

    monkeypatch.setattr(commands, "_board", lambda args: Board())
    out = tmp_path / "pulled.npz"
    assert cli.main(["pull", "-o", str(out), "--state-dict", str(tmp_path / "model.pt")]) == 0
    fresh = ConvBNNet()
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(out).items()})
    fresh.eval()
    with torch.no_grad():
        want = fresh(torch.from_numpy(x)).numpy()
    assert np.max(np.abs(sim.predict(x) - want) / np.maximum(1.0, np.abs(want))) <= TOL
    assert cli.main(["pull", "-o", str(tmp_path / "t.onnx"), "--onnx", path, "--state-dict",
                     str(tmp_path / "model.pt")]) == 2
