"""The trained model back as ONNX, and parameters saved and loaded by name.

After training in the simulator, Plan.export / Simulator.export / `microtrain export`
write the original model with the trained values in place; onnxruntime and
onnx.reference (nobody here wrote either) must then compute the simulator's
predictions. Saved parameters carry the ONNX initializer names, which the exporters
take from PyTorch's state_dict: loaded into the PyTorch module, they make it predict
what the simulator predicts.
"""
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import microtrain

from oracle_models import MODEL_CASES, OP_CASES, VIEW_CASES, case_onnx
from test_shared_weights import AlphaShared, TiedConvBN, TiedMLP

TOL = 1e-5
OPS = {c.name: c for c in OP_CASES}


def close(a, b, what):
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    assert a.shape == b.shape, what
    err = np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)))
    assert err <= TOL, "%s: worst relative difference %.3g" % (what, err)


def reference(model):
    """onnx.reference's BatchNormalization-9 (opsets below 14) uses batch statistics; see test_torch_exactness."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 14 and any(n.op_type == "BatchNormalization" for n in model.graph.node):
        model = onnx.version_converter.convert_version(model, 15)
    return ReferenceEvaluator(model)


def trained(path, update, shape, n_out, steps=12, seed=0):
    plan = microtrain.compile(path, update=update, lr=0.05, momentum=0.9)
    sim = microtrain.Simulator(plan)
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(steps,) + tuple(shape)).astype(np.float32)
    for x in xs:
        sim.step(x, int(rng.integers(n_out)))
    return sim, xs


def check_runs_like_the_simulator(sim, model, xs):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = reference(model)
    name = sess.get_inputs()[0].name
    for x in xs[:4]:
        want = sim.predict(x)
        close(sess.run(None, {name: x[None]})[0], want, "onnxruntime on the trained model")
        close(ref.run(None, {name: x[None]})[0], want, "onnx.reference on the trained model")


def changed(original, model, params):
    """The trained model holds values the original does not (something was written)."""
    before = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return any(k not in before or before[k].shape != v.shape or not np.array_equal(before[k], v)
               for k, v in after.items())


# ---- models: (name, builder of (onnx path or ModelProto, input shape, classes), update) -------

def _case(case, exporter):
    def build(tmp):
        path, _ = case_onnx(case, exporter, str(tmp))
        return path, case.shape, case.n_out
    return build


def _module(make, shape, exporter, n_out=3):
    def build(tmp):
        from oracle_models import export
        path = str(tmp / "m.onnx")
        export(make().eval(), torch.zeros((1,) + shape), exporter, path)
        return path, shape, n_out
    return build


def _matmul_bn(tmp):
    """MatMul without a bias, then a BatchNormalization folded into it: exported as a Gemm with a bias."""
    rng = np.random.default_rng(2)
    f = lambda *s: numpy_helper.from_array(rng.normal(0, 0.5, s).astype(np.float32))   # noqa: E731
    inits = [f(6, 5), f(5), f(5), f(5), numpy_helper.from_array(rng.uniform(0.5, 2, 5).astype(np.float32)),
             f(3, 5), f(3)]
    for t, n in zip(inits, ["W", "g", "b", "mean", "var", "V", "c"]):
        t.name = n
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("BatchNormalization", ["m", "g", "b", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "V", "c"], ["y"], transB=1, name="head")]
    g = helper.make_graph(nodes, "mmbn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]), (6,), 3


def _gemm_alpha(tmp):
    """Gemm alpha=0.5, beta=2 on weights used once: folded in place, exported with alpha = beta = 1."""
    m = AlphaShared().onnx()
    m.graph.node[1].input[0] = "g1"
    g2 = m.graph.node[2]
    g2.input[:] = ["r", "V2", "c2"]
    g2.attribute.extend([helper.make_attribute("alpha", 0.5), helper.make_attribute("beta", 2.0)])
    rng = np.random.default_rng(4)
    m.graph.initializer.extend([numpy_helper.from_array(rng.normal(0, .5, (4, 4)).astype(np.float32), "V2"),
                                numpy_helper.from_array(rng.normal(0, .5, 4).astype(np.float32), "c2")])
    return m, (4,), 3


CASES = [
    ("mlp-ts13", _case(MODEL_CASES["mlp"], "ts13"), "full"),
    ("cnn-dynamo", _case(MODEL_CASES["cnn"], "dynamo"), "full"),
    ("cnn-ts13-last2", _case(MODEL_CASES["cnn"], "ts13"), "last:2"),
    ("keyword-spotting-dynamo", _case(VIEW_CASES["keyword_spotting"], "dynamo"), "full"),
    ("conv1d-ts13", _case(OPS["conv1d"], "ts13"), "full"),
    ("batchnorm-conv-nofold", _case(OPS["batchnorm_conv"], "ts13-nofold"), "full"),
    ("batchnorm-conv-nobias-dynamo", _case(OPS["batchnorm_conv_nobias"], "dynamo-noopt"), "full"),
    ("batchnorm-conv-bias-only", _case(OPS["batchnorm_conv"], "ts13-nofold"), "bias"),
    ("batchnorm-linear-dynamo", _case(OPS["batchnorm_linear"], "dynamo-noopt"), "full"),
    ("matmul-transpose-add", _case(OPS["matmul_transpose_helper"], "helper"), "full"),
    ("matmul-batchnorm", _matmul_bn, "full"),
    ("gemm-alpha-beta", _gemm_alpha, "full"),
    ("tied-linear-ts13", _module(TiedMLP, (6,), "ts13"), "full"),
    ("tied-linear-dynamo", _module(TiedMLP, (6,), "dynamo"), "full"),
    ("tied-conv-bn-conv", _module(TiedConvBN, (3, 5, 5), "dynamo-noopt"), "full"),
    ("mobilenetv3-block-dynamo", _case(MODEL_CASES["mobilenetv3_block"], "dynamo"), "full"),
    ("mobilenetv3-block-ts13", _case(MODEL_CASES["mobilenetv3_block"], "ts13"), "full"),
    ("frozen-bn-after-add-ts13", _case(OPS["batchnorm_after_add"], "ts13"), "full"),   # stays a BatchNormalization
    ("const-arith-dynamo", _case(OPS["const_arith"], "dynamo"), "full"),
    ("concat-dynamo", _case(OPS["concat_channels"], "dynamo"), "full"),
]


@pytest.mark.parametrize("name, build, update", CASES, ids=[c[0] for c in CASES])
def test_trained_model_runs_like_the_simulator(name, build, update, tmp_path):
    model, shape, n_out = build(tmp_path)
    sim, xs = trained(model, update, shape, n_out)
    original = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
    out = tmp_path / "trained.onnx"
    exported = sim.export(model, str(out))
    assert out.exists() and onnx.load(str(out)) == exported
    assert changed(original, exported, sim.params())
    check_runs_like_the_simulator(sim, exported, xs)
    assert exported == sim.plan.export(sim.params(), model)
    if "batchnorm" in name and "tied" not in name:   # folded layers are written folded
        assert not any(n.op_type == "BatchNormalization" for n in exported.graph.node)
    if "tied" in name and "bn" not in name:          # still one initializer for both uses
        gemms = [n.input[1] for n in exported.graph.node if n.op_type == "Gemm"]
        assert gemms[1] == gemms[2]
    # otherwise the original model: the same nodes in the same order, but for folded
    # BatchNormalizations (now Identity) and a MatMul that gained a bias (now a Gemm)
    orig = [(n.name, n.op_type) for n in original.graph.node]
    new = [(n.name, n.op_type) for n in exported.graph.node]
    allowed = {("BatchNormalization", "Identity"), ("MatMul", "Gemm")}
    assert len(orig) == len(new) and all(a[0] == b[0] and (a[1] == b[1] or (a[1], b[1]) in allowed)
                                         for a, b in zip(orig, new)), (orig, new)


def test_export_through_the_cli_with_saved_params(tmp_path):
    """compile, simulate --save-params, export: TRAINED.onnx in onnxruntime predicts what
    set_params() makes a fresh simulator predict."""
    path, module = case_onnx(MODEL_CASES["cnn"], "ts13", str(tmp_path))
    plan, params, out = tmp_path / "p.mtp", tmp_path / "trained.npz", tmp_path / "trained.onnx"
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(16, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=xs, y=rng.integers(0, 10, 16))

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "microtrain"] + [str(a) for a in args], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    cli("compile", path, "-o", plan, "--update", "full", "--lr", "0.05")
    cli("simulate", plan, "--data", tmp_path / "d.npz", "--epochs", "2", "--save-params", params)
    text = cli("export", plan, "--params", params, "--onnx", path, "-o", out)
    assert str(out) in text
    sim = microtrain.Simulator(microtrain.load_plan(str(plan)))
    before = sim.predict(xs[:2])
    saved = dict(np.load(params))
    sim.set_params(saved)
    assert not np.allclose(sim.predict(xs[:2]), before)
    check_runs_like_the_simulator(sim, onnx.load(str(out)), xs)


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_saved_parameter_names_are_pytorch_state_dict_names(exporter, tmp_path):
    """The exporters keep state_dict names as initializer names; params() uses them, so the trained
    values load straight into the PyTorch module, which then predicts what the simulator does."""
    case = MODEL_CASES["cnn"]
    path, module = case_onnx(case, exporter, str(tmp_path))
    sim, xs = trained(path, "full", case.shape, case.n_out)
    params = sim.params()
    state = module.state_dict()
    assert set(params) == set(state), "not state_dict names: %s" % sorted(set(params) ^ set(state))
    module.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    with torch.no_grad():
        close(module(torch.from_numpy(xs[:4])).numpy(), sim.predict(xs[:4]), "PyTorch with the saved parameters")


def test_set_params_checks_everything_before_writing(tmp_path):
    path, _ = case_onnx(MODEL_CASES["mlp"], "ts13", str(tmp_path))
    sim = microtrain.Simulator(microtrain.compile(path, update="full"))
    before = sim.params()
    good = {k: v + 1 for k, v in before.items()}
    for bad, pattern in [({"nope": before["fc1.weight"]}, "'nope' is not a trainable parameter"),
                         ({"fc1.weight": np.zeros(3)}, r"'fc1.weight'.*shape \(3,\).*\(32, 64\)"),
                         ({"fc1.bias": np.full(32, np.nan)}, "'fc1.bias' contains NaN")]:
        with pytest.raises(ValueError, match=pattern):
            sim.set_params(dict(good, **bad))
        assert all(np.array_equal(sim.params()[k], v) for k, v in before.items()), "a refused set_params wrote"
    sim.set_params(good)
    assert all(np.array_equal(sim.params()[k], v.astype(np.float32)) for k, v in good.items())
    with pytest.raises(TypeError):
        sim.set_params([1, 2])


def test_export_refuses_another_model_and_wrong_params(tmp_path):
    path, _ = case_onnx(MODEL_CASES["mlp"], "ts13", str(tmp_path))
    other, _ = case_onnx(MODEL_CASES["cnn"], "ts13", str(tmp_path))
    sim = microtrain.Simulator(microtrain.compile(path, update="full"))
    with pytest.raises(ValueError, match="not the one the plan was compiled from"):
        sim.export(other)
    params = sim.params()
    with pytest.raises(ValueError, match="missing 'fc1.bias'"):
        sim.plan.export({k: v for k, v in params.items() if k != "fc1.bias"}, path)
    with pytest.raises(ValueError, match=r"'fc1.bias' has shape \(2,\)"):
        sim.plan.export(dict(params, **{"fc1.bias": np.zeros(2)}), path)
    with pytest.raises(ValueError, match="cannot read ONNX model"):
        sim.export(str(tmp_path / "missing.onnx"))
