"""The training graph's structure: pruning, views, dead branches, in-place ops."""
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import microtrain

import models


def ops_of(plan):
    return [o["op"] for o in plan.ops]


def conv_gap_flatten(seed=0):
    """No Gemm: the output is Flatten's view of the pooled conv output."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.5, (3, 2, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["y"], name="flat")]
    g = helper.make_graph(nodes, "cgf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), w, b


def test_model_whose_output_is_a_view_trains_like_pytorch():
    m, w, b = conv_gap_flatten()
    sim = microtrain.Simulator(microtrain.compile(m, update="full", lr=0.1, momentum=0.9))
    conv = torch.nn.Conv2d(2, 3, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(w))
        conv.bias.copy_(torch.tensor(b))
    opt = torch.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(1)
    for _ in range(10):
        x, y = rng.normal(size=(2, 5, 5)).astype(np.float32), int(rng.integers(3))
        out = conv(torch.tensor(x)[None]).mean((2, 3))
        loss = torch.nn.functional.cross_entropy(out, torch.tensor([y]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(sim.step(x, y) - loss.item()) <= 1e-4 * max(1.0, abs(loss.item()))
    p = sim.params()
    assert np.abs(p["w"] - conv.weight.detach().numpy()).max() <= 1e-4 * np.abs(p["w"]).max()


def test_last_layer_prunes_every_input_gradient():
    plan = microtrain.compile(models.cnn(), update="last-layer")
    ops = ops_of(plan)
    assert ops.count("GEMM_BWD_WEIGHT") == 1 and ops.count("BIAS_BWD") == 1
    assert not [o for o in ops if o.endswith("BWD_INPUT") or o in ("CLIP_BWD", "MAXPOOL_BWD", "GAP_BWD")]


def test_bias_update_trains_no_weight_and_stops_at_the_first_layer():
    plan = microtrain.compile(models.cnn(), update="bias")
    ops = ops_of(plan)
    assert "CONV2D_BWD_WEIGHT" not in ops and "GEMM_BWD_WEIGHT" not in ops
    assert ops.count("BIAS_BWD") == 4
    # the first conv's input gradient is never needed: nothing upstream trains
    first_conv_input = plan.tensor_index("x")
    assert not any(o["op"] == "CONV2D_BWD_INPUT" and plan.tensors[o["slots"][2]]["name"] == "d(x)"
                   for o in plan.ops)
    assert first_conv_input is not None
    assert set(plan.params()) == {"c1.bias", "dw.bias", "pw.bias", "fc.bias"}


def test_frozen_weights_stay_in_constants_and_unchanged():
    """Frozen layers' weights are plan constants and keep the ONNX model's exact values through
    training (their input gradients are computed from them), while the trained ones move."""
    model = models.cnn()
    onnx_values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    trained = ["c1.bias", "pw.weight", "pw.bias", "fc.weight", "fc.bias"]
    sim = microtrain.Simulator(microtrain.compile(model, update=trained, lr=0.5, momentum=0.9))
    frozen = {t["name"] for t in sim.plan.tensors if t["storage"] == "CONST"}
    assert {"c1.weight", "dw.weight", "dw.bias"} <= frozen
    assert set(sim.params()) == set(trained)
    names = [t["name"] for t in sim.plan.tensors]   # dw's frozen weight is read by the backward
    assert any(o["op"] in ("CONV2D_BWD_INPUT", "CONV2D_BWD_INPUT_DW_INPLACE") and names[o["slots"][1]] == "dw.weight"
               for o in sim.plan.ops)
    rng = np.random.default_rng(0)
    for _ in range(5):
        sim.step(rng.normal(size=(2, 8, 8)).astype(np.float32), int(rng.integers(4)))
    for name in ("c1.weight", "dw.weight", "dw.bias"):
        assert np.array_equal(sim.tensor(name).reshape(onnx_values[name].shape), onnx_values[name]), name
    for name, v in sim.params().items():
        assert not np.array_equal(v, onnx_values[name]), name + " did not train"


def test_dead_branch_is_dropped():
    m = models.mlp()
    m.graph.node.append(helper.make_node("Relu", ["h"], ["unused"], name="dead_relu"))
    plan = microtrain.compile(m, update="full")
    assert "unused" not in [t["name"] for t in plan.tensors]


def test_shared_weight_is_one_parameter_updated_at_the_batch_end():
    """A weight two layers use is one parameter: both gradient ops add into its accumulator
    and one SGD op applies the sum, also with batch 1 (tests/compiler/test_shared_weights.py compares
    the training with PyTorch)."""
    m = models.mlp(n_in=5, hidden=5, n_out=5)
    nodes = list(m.graph.node)
    nodes.append(helper.make_node("Gemm", ["y", "fc1.weight"], ["z"], transB=1, name="reuse"))
    m.graph.ClearField("node")
    m.graph.node.extend(nodes)
    m.graph.output[0].name = "z"
    plan = microtrain.compile(m, update="full", momentum=0.9)
    names = [t["name"] for t in plan.tensors]
    grads = [o for o in plan.ops if o["op"] == "GEMM_BWD_WEIGHT" and names[o["slots"][2]] == "fc1.weight"]
    assert len(grads) == 2 and {names[o["slots"][4]] for o in grads} == {"acc(fc1.weight)"}
    assert all(o["slots"][3] is None for o in grads)   # no update on the spot
    sgd = [o for o in plan.ops if o["op"] == "SGD"]
    assert [(names[o["slots"][0]], names[o["slots"][1]], o["phase"]) for o in sgd] == [
        ("fc1.weight", "mom(fc1.weight)", "BATCH_END")]
    plan = microtrain.compile(m, update=["fc2.weight"])
    assert plan.params() == ["fc2.weight"] and not any(o["op"] == "SGD" for o in plan.ops)


def test_relu_and_residual_add_run_in_place():
    r = microtrain.compile(models.cnn(), update="last-layer").report()
    t = {x["name"]: x for x in r["tensors"]}
    assert t["a_r"]["memory_of"] == "a" and t["c_r"]["memory_of"] == "c"   # Relu over its input
    assert t["s"]["memory_of"] in ("a", "b")                                 # Add over a dead input


def test_momentum_buffers_only_when_momentum_is_on():
    names = lambda p: {t["name"] for t in p.tensors}   # noqa: E731
    assert not any(n.startswith("mom(") for n in names(microtrain.compile(models.mlp(), update="full")))
    with_m = names(microtrain.compile(models.mlp(), update="full", momentum=0.5))
    assert {"mom(fc1.weight)", "mom(fc2.bias)"} <= with_m
    batched = names(microtrain.compile(models.mlp(), update="full", batch=4))
    assert {"acc(fc1.weight)", "acc(fc2.bias)"} <= batched


def test_naive_planner_keeps_every_tensor_readable():
    sim = microtrain.Simulator(microtrain.compile(models.mlp(), update="full", planner="naive", batch=2))
    x = np.random.default_rng(0).normal(size=6).astype(np.float32)
    sim.step(x, 1)
    h, r = sim.tensor("h"), sim.tensor("r")
    assert (h < 0).any() and np.array_equal(r, np.maximum(h, 0))   # pre- and post-ReLU both intact
    assert not any(t["memory_of"] for t in sim.plan.report()["tensors"])


def test_a_trainable_parameter_without_a_gradient_path_is_an_internal_error():
    """The compiler's closing invariant: drop the op that carries the loss's gradient down to
    the first layer (or the first layer's own gradient op) and the plan is refused."""
    from microtrain.onnx_frontend import import_onnx
    from microtrain.training import InternalError, build_training, check_gradient_paths
    graph = import_onnx(models.cnn())
    trainable = {"c1.weight", "c1.bias", "fc.weight", "fc.bias"}
    tensors, ops = build_training(graph, trainable, "cross-entropy", 1, 0.0)
    check_gradient_paths(tensors, ops, trainable)   # the real plan keeps it
    name = lambda o, slot: tensors[o.slots[o.spec.slot_index(slot)]].name   # noqa: E731
    cut = [k for k, o in enumerate(ops) if o.name == "GAP_BWD"]
    assert len(cut) == 1
    with pytest.raises(InternalError, match="'c1.bias', 'c1.weight' reported trainable but no gradient"):
        check_gradient_paths(tensors, ops[:cut[0]] + ops[cut[0] + 1:], trainable)
    own = [k for k, o in enumerate(ops) if o.name == "CONV2D_BWD_WEIGHT" and name(o, "w") == "c1.weight"]
    with pytest.raises(InternalError, match="'c1.weight' reported trainable"):
        check_gradient_paths(tensors, ops[:own[0]] + ops[own[0] + 1:], trainable)
