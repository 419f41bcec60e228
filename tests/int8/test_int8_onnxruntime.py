"""int8 models against onnxruntime, the independent oracle: a CNN trained on scikit-learn's
digits, exported by both PyTorch exporters, quantized by onnxruntime (QDQ, per channel,
int8 or uint8 activations, with and without nodes left float) and compiled as it is, and
the same float model quantized by microtrain's own post-training quantization (written
back as QDQ so onnxruntime runs the same integers). On 200 held-out samples every output
agrees with onnxruntime within 1 LSB of the output scale, and every int8 tensor agrees
bit for bit with the numpy reference of the integer arithmetic (tests/support/q8_reference.py)."""
import numpy as np
import pytest
import torch

import int8_models as M
import q8_reference as R
import microtrain
from microtrain.compiler import build_plan, resolve_update
from microtrain.native import Core
from microtrain.onnx_frontend import import_onnx
from microtrain.onnx_import import UnsupportedModel
from microtrain.quantize import QuantizeError, ptq

N_SAMPLES = 200


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    x, y = M.digits()
    torch.manual_seed(0)   # the initial weights: the same whatever ran before on this xdist worker
    model = M.train(M.DigitsNet(), x[:1000], y[:1000])
    d = tmp_path_factory.mktemp("int8")
    return dict(model=model, x=x, y=y, dir=d,
                onnx={e: M.export(model, str(d / ("digits_%s.onnx" % e)), e) for e in ("ts", "dynamo")})


def output_quant(plan):
    """The quantization of the int8 tensor the final DEQUANTIZE reads."""
    last = plan.ops[-1] if plan.ops[-1]["phase"] == "FORWARD" else None
    assert last is not None and last["op"] == "DEQUANTIZE", [o["op"] for o in plan.ops]
    return plan.tensors[last["slots"][0]]["quant"]


def compare(plan, onnx_path, xs):
    """(largest |difference| in output LSBs against onnxruntime, samples whose int8 tensors all
    equal the reference's)."""
    sess = M.ort_session(onnx_path)
    name = sess.get_inputs()[0].name
    core = Core(plan.data)
    q = output_quant(plan)
    worst, exact = 0, 0
    int8 = [(i, t) for i, t in enumerate(plan.tensors) if t["dtype"] == "I8" and t["storage"] == "ARENA"]
    floats = [o["slots"][-1] for o in plan.ops if o["phase"] == "FORWARD" and o["op"] in R.FLOAT_OPS]
    for x in xs:
        ours = core.predict(x)
        theirs = sess.run(None, {name: x[None]})[0].reshape(-1)
        lsb = lambda v: np.rint(v / np.float32(q.scale)).astype(np.int64)   # noqa: E731  both are on the grid
        worst = max(worst, int(np.abs(lsb(ours) - lsb(theirs)).max()))
        # the float ops (layers onnxruntime left float) are not the reference's: it takes their results
        ref = R.run_plan(plan, x, {plan.tensors[i]["name"]: core.array(i).copy() for i in floats})
        exact += all(np.array_equal(ref[t["name"]], core.array(i).reshape(t["shape"])) for i, t in int8
                     if t["name"] in ref)
    return worst, exact


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_onnxruntime_qdq_model_runs_as_it_is(trained, exporter, activation):
    src = trained["onnx"][exporter]
    dst = M.ort_qdq(src, str(trained["dir"] / ("q_%s_%s.onnx" % (exporter, activation))), trained["x"][:300],
                    activation)
    plan = microtrain.compile(dst, update="none", planner="naive")
    ops = [o["op"] for o in plan.ops]
    assert ops.count("CONV2D_Q8") == 5 and "GEMM_Q8" in ops and "ADD_Q8" in ops and "GAP_Q8" in ops, ops
    assert not {"CONV2D", "GEMM", "ADD"} & set(ops), ops     # nothing quantized ran dequantized
    worst, exact = compare(plan, dst, trained["x"][-N_SAMPLES:])
    assert worst <= 1, worst
    assert exact == N_SAMPLES


def test_nodes_left_float_by_onnxruntime_run_float(trained):
    """nodes_to_exclude: the layer keeps its float weight and runs float between DEQUANTIZE and
    QUANTIZE. Its float sums may round an output onto the other side of a rounding boundary than
    onnxruntime's (another summation order), so the excluded layer is one late in the network,
    where such a flip cannot grow."""
    src = trained["onnx"]["ts"]
    name = [n for n in M.onnx.load(src).graph.node if n.op_type == "Conv"][-1].name
    dst = M.ort_qdq(src, str(trained["dir"] / "q_exclude.onnx"), trained["x"][:300], exclude=[name])
    plan = microtrain.compile(dst, update="none", planner="naive")
    ops = [o["op"] for o in plan.ops]
    assert ops.count("CONV2D") == 1 and ops.count("CONV2D_Q8") == 4 and "GEMM_Q8" in ops, ops
    k = ops.index("CONV2D")
    assert ops[k - 1] == "DEQUANTIZE" and "QUANTIZE" in ops[k:], ops
    worst, exact = compare(plan, dst, trained["x"][-N_SAMPLES:])
    assert worst <= 1 and exact == N_SAMPLES


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_own_post_training_quantization_matches_onnxruntime(trained, exporter):
    """microtrain's PTQ, written back as QDQ with microtrain's scales, run by onnxruntime."""
    src = trained["onnx"][exporter]
    calib = trained["x"][:300]
    plan = microtrain.compile(src, update="none", planner="naive", quantize="int8", calibration=calib)
    graph = import_onnx(src)
    ptq(graph, set(), calib, build_plan)
    dst = M.qdq_from_plan_quantization(src, graph, str(trained["dir"] / ("ptq_%s.onnx" % exporter)))
    worst, exact = compare(plan, dst, trained["x"][-N_SAMPLES:])
    assert worst <= 1, worst
    assert exact == N_SAMPLES
    # and the int8 model still classifies digits as the float one does
    sim, fsim = microtrain.Simulator(plan), microtrain.Simulator(microtrain.compile(src, update="none"))
    x, y = trained["x"][-N_SAMPLES:], trained["y"][-N_SAMPLES:]
    assert sim.evaluate(x, y) >= fsim.evaluate(x, y) - 0.03


def test_last_layer_of_a_qdq_model_trains_in_float(trained):
    dst = M.ort_qdq(trained["onnx"]["ts"], str(trained["dir"] / "q_train.onnx"), trained["x"][:300])
    plan = microtrain.compile(dst, update="last-layer", lr=0.05)
    ops = [o["op"] for o in plan.ops]
    fwd = [o["op"] for o in plan.ops if o["phase"] == "FORWARD"]
    assert fwd[-2:] == ["DEQUANTIZE", "GEMM"] and "GEMM_Q8" not in ops, ops
    assert any("float32" in n for n in plan.report()["notes"])
    sim = microtrain.Simulator(plan)
    x, y = trained["x"][-300:], trained["y"][-300:]
    before = sim.evaluate(x, y)
    sim.fit(x[:200], y[:200], epochs=1)
    assert sim.evaluate(x, y) > 0.5 and np.isfinite(before)


def test_unsupported_quantized_node_is_refused_by_name(tmp_path):
    """A Sigmoid or a lone Relu between QuantizeLinear and DequantizeLinear: no int8 kernel, and the
    model is never silently run dequantized."""
    from onnx import helper
    relu = M.conv_relu_qdq_with(lambda a, b: helper.make_node("Relu", [a], [b], name="lonely_relu"),
                                str(tmp_path / "relu.onnx"))
    with pytest.raises(QuantizeError, match="'lonely_relu'.*no int8 kernel"):
        microtrain.compile(relu, update="none")
    sig = M.conv_relu_qdq_with(lambda a, b: helper.make_node("Sigmoid", [a], [b], name="sig"),
                               str(tmp_path / "sig.onnx"))
    with pytest.raises(QuantizeError, match="'sig'.*no int8 kernel"):
        microtrain.compile(sig, update="none")


def test_other_quantized_forms_are_refused(trained):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static, CalibrationDataReader
    src = trained["onnx"]["ts"]
    with pytest.raises(UnsupportedModel, match="int16"):
        microtrain.compile(M.ort_qdq(src, str(trained["dir"] / "q16.onnx"), trained["x"][:50], "int16"),
                           update="none")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"input": s[None]} for s in trained["x"][:50])

        def get_next(self):
            return next(self.it, None)

    qop = str(trained["dir"] / "qop.onnx")
    quantize_static(src, qop, Reader(), quant_format=QuantFormat.QOperator, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    with pytest.raises(UnsupportedModel, match="QOperator.*QLinearConv.*QuantFormat.QDQ"):
        microtrain.compile(qop, update="none")


def test_inference_only_plan(trained):
    plan = microtrain.compile(trained["onnx"]["ts"], update="none", quantize="int8", calibration=trained["x"][:100])
    assert all(o["phase"] == "FORWARD" for o in plan.ops) and plan.report()["param_bytes"] == 0
    sim = microtrain.Simulator(plan)
    assert sim.predict(trained["x"][0]).shape == (10,)
    with pytest.raises(ValueError, match="no training ops"):
        sim.step(trained["x"][0], 1)


def test_compile_arguments_are_checked(trained):
    src = trained["onnx"]["ts"]
    with pytest.raises(ValueError, match="calibration"):
        microtrain.compile(src, quantize="int8")
    with pytest.raises(ValueError, match="unknown quantize"):
        microtrain.compile(src, quantize="int4", calibration=trained["x"][:10])
    with pytest.raises(ValueError, match="int8 model"):
        microtrain.compile(src, input_dtype="int8")
    with pytest.raises(ValueError, match="do not fit the model input"):
        microtrain.compile(src, quantize="int8", calibration=np.zeros((4, 3)))
    _ = resolve_update
