"""Weights that train on some input channels keep only those channels in RAM (split.py).

tests/sparse/test_sparse.py checks the training against PyTorch autograd with channel masks; this
file checks what the split is: which tensors the plan holds and where, that the exported
model (run by onnxruntime, an oracle nobody here wrote) computes what the simulator does, and
that the core refuses a GATHER_CH whose channel list does not fit at load.
"""
import struct
import zlib

import numpy as np
import onnxruntime as ort
import pytest

import microtrain
from microtrain import format as F
from microtrain.plan import Plan

import models

SCHEME = {"classifier": "full", "bias_updates": [{"initializer": "c1.bias"}, {"initializer": "dw.bias"}],
          "weight_updates": [{"initializer": "c1.weight", "channel_axis": 1, "selected_channels": [1]},
                             {"initializer": "pw.weight", "channel_axis": 1, "selected_channels": [3, 0]}]}


def compiled(**kw):
    model = models.cnn(seed=3, hw=6, n_out=3)
    return model, microtrain.compile(model, update=SCHEME, lr=0.05, momentum=0.9, **kw)


def samples(n=12):
    rng = np.random.default_rng(5)
    return rng.normal(size=(n, 2, 6, 6)).astype(np.float32), rng.integers(0, 3, n)


def test_only_the_trained_channels_are_state():
    model, plan = compiled()
    by_name = {t["name"]: t for t in plan.tensors}
    assert "c1.weight" not in by_name and "pw.weight" not in by_name
    assert by_name["c1.weight@trained"]["storage"] == "STATE" and by_name["c1.weight@trained"]["shape"] == (4, 1, 3, 3)
    assert by_name["pw.weight@trained"]["shape"] == (6, 2, 1, 1)
    init = {i.name: np.frombuffer(i.raw_data, np.float32).reshape(i.dims) for i in model.graph.initializer}
    frozen = plan.constant("pw.weight@frozen")
    assert by_name["pw.weight@frozen"]["storage"] == "CONST"
    assert not frozen[:, [0, 3]].any() and np.array_equal(frozen[:, [1, 2]], init["pw.weight"][:, [1, 2]])
    sim = microtrain.Simulator(plan)
    assert plan.meta["split"]["pw.weight"]["channels"] == [0, 3]   # in channel order, whatever the scheme's
    assert np.array_equal(sim.params()["pw.weight@trained"], init["pw.weight"][:, [0, 3]])
    # state: the parameters and one momentum each, and only the trained channels of the two weights
    trained = (4 * 1 * 9, 4, 6 * 2, 4, 3 * 6, 3)   # c1 slice, c1.bias, pw slice, dw.bias, fc
    assert plan.report()["param_bytes"] == 2 * sum(-(-4 * n // F.ALIGN) * F.ALIGN for n in trained)


def test_export_puts_the_slices_back(tmp_path):
    """After training, the exported ONNX model run by onnxruntime gives the simulator's outputs;
    its weights hold the trained slices in their channels and the frozen channels' original bits."""
    model, plan = compiled()
    sim = microtrain.Simulator(plan)
    xs, ys = samples()
    for x, y in zip(xs, ys):
        sim.step(x, y)
    params = plan.onnx_params(sim.params())
    assert set(params) == {"c1.weight", "c1.bias", "pw.weight", "dw.bias", "fc.weight", "fc.bias"}
    out = tmp_path / "trained.onnx"
    trained = plan.export(sim.params(), model, str(out))
    w = {i.name: np.frombuffer(i.raw_data, np.float32).reshape(i.dims) for i in trained.graph.initializer}
    orig = {i.name: np.frombuffer(i.raw_data, np.float32).reshape(i.dims) for i in model.graph.initializer}
    assert np.array_equal(w["pw.weight"][:, [1, 2]], orig["pw.weight"][:, [1, 2]])
    assert not np.array_equal(w["pw.weight"][:, [0, 3]], orig["pw.weight"][:, [0, 3]])
    assert np.array_equal(w["pw.weight"], params["pw.weight"])
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for x in xs[:4]:
        want = sim.predict(x).reshape(-1)
        got = sess.run(None, {sess.get_inputs()[0].name: x[None]})[0].reshape(-1)
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def with_channels(plan, name, values):
    """The plan's bytes with constant int32 tensor `name` rewritten, CRC fixed."""
    data = bytearray(plan.data)
    t = plan.tensors[plan.tensor_index(name)]
    struct.pack_into("<%di" % len(values), data, plan.header["data_off"] + t["offset"], *values)
    crc = F.header_offsets()["crc32"]
    data[crc:crc + 4] = struct.pack("<I", zlib.crc32(bytes(data[F.CRC_START:])))
    return bytes(data)


def test_rewriting_the_channels_keeps_a_valid_plan_valid():
    _, plan = compiled()
    idx = next(t["name"] for t in plan.tensors if t["name"].endswith("@channels") and t["shape"] == (2,))
    microtrain.Simulator(Plan(with_channels(plan, idx, [2, 1])))


@pytest.mark.parametrize("channels, what", [([4, 0], "past the last channel"), ([-1, 0], "negative"),
                                            ([3, 3], "a channel twice")])
def test_bad_channel_lists_are_refused_at_load(channels, what):
    _, plan = compiled()
    idx = next(t["name"] for t in plan.tensors if t["name"].endswith("@channels") and t["shape"] == (2,))
    with pytest.raises(ValueError, match=r"tensor shapes do not fit the op \(op \d+"):
        microtrain.Simulator(Plan(with_channels(plan, idx, channels)))


DW_SCHEME = dict(SCHEME, weight_updates=SCHEME["weight_updates"] + [
    {"initializer": "dw.weight", "channel_axis": 0, "selected_channels": [2, 0]}])


def test_depthwise_split_runs_the_same_in_place_or_not(tmp_path):
    """A depthwise weight trained on channels 0 and 2 is a parameter of those channels; its
    trained convolution is added into the frozen one's output (SCATTER_ACC_CH), in place with the
    greedy planner and into memory of its own with the naive one: the same numbers either way.
    The exported model, run by onnxruntime, gives the simulator's outputs."""
    model = models.cnn(seed=3, hw=6, n_out=3)
    xs, ys = samples()
    trained = {}
    for planner in ("greedy", "naive"):
        plan = microtrain.compile(model, update=DW_SCHEME, lr=0.05, momentum=0.9, planner=planner)
        phases = {o["phase"] for o in plan.ops if o["op"] == "SCATTER_ACC_CH"}
        assert phases == {"FORWARD", "TRAIN"}
        sim = microtrain.Simulator(plan)
        assert sim.params()["dw.weight@trained"].shape == (2, 1, 3, 3)
        for x, y in zip(xs, ys):
            sim.step(x, y)
        trained[planner] = plan.onnx_params(sim.params())
    init = {i.name: np.frombuffer(i.raw_data, np.float32).reshape(i.dims) for i in model.graph.initializer}
    for k in trained["greedy"]:
        assert np.array_equal(trained["greedy"][k], trained["naive"][k]), k
    dw = trained["greedy"]["dw.weight"]
    assert np.array_equal(dw[[1, 3]], init["dw.weight"][[1, 3]]) and not np.array_equal(dw[[0, 2]], init["dw.weight"][[0, 2]])
    out = tmp_path / "trained.onnx"
    plan.export(sim.params(), model, str(out))
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for x in xs[:4]:
        want = sim.predict(x).reshape(-1)
        got = sess.run(None, {sess.get_inputs()[0].name: x[None]})[0].reshape(-1)
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_split_weight_behind_a_view_trains_as_without_it():
    """A split conv whose input is a view (a Reshape to the same shape): the gathered channels'
    gradient goes back through SCATTER_CH and an ADD instead of SCATTER_ACC_CH, with the same
    parameters after five steps as the model without the view."""
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(5, 1, 2, 4, 4)).astype(np.float32), rng.integers(0, 3, 5)
    got = {}
    for view in (False, True):
        plan = microtrain.compile(models.conv_view_conv(view), update=models.SPLIT_VIEW_SCHEME, lr=0.1)
        train = [o["op"] for o in plan.ops if o["phase"] == "TRAIN"]
        assert ("SCATTER_CH" in train) == view and ("SCATTER_ACC_CH" in train) != view
        sim = microtrain.Simulator(plan)
        initial = plan.onnx_params(sim.params())
        for x, y in zip(xs, ys):
            sim.step(x, y)
        got[view] = plan.onnx_params(sim.params())
    for k, v in got[False].items():
        assert np.array_equal(got[True][k], v) and not np.array_equal(v, initial[k]), k
