"""A depthwise convolution whose input nothing reads afterwards runs in place (training.py,
depthwise_in_place): CONV2D_DW_INPLACE writes y over x, CONV2D_BWD_INPUT_DW_INPLACE dx over dy,
each through one plane of scratch.

tests/sparse/test_sparse.py::test_saved_int8_relu6 trains such a plan against PyTorch; here: the
in-place ops appear exactly where they may, give the bits of the plain ops (planner="naive"
shares no memory, so it keeps CONV2D and CONV2D_BWD_INPUT), save arena memory, and the core
refuses a scratch of the wrong size at load.
"""
import os
import sys

import numpy as np
import pytest

import microtrain
from microtrain.plan import Plan
from repo import ROOT

sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import make_corpus  # noqa: E402
from test_ops_kernels import patched  # noqa: E402


def plans(update="bias"):
    model = make_corpus.mbconv()
    return {p: microtrain.compile(model, update=update, lr=0.05, momentum=0.9, saved="int8", planner=p)
            for p in ("greedy", "naive")}


def test_in_place_ops_give_the_plain_ops_bits():
    p = plans()
    ops = {k: [o["op"] for o in v.ops] for k, v in p.items()}
    assert "CONV2D_DW_INPLACE" in ops["greedy"] and "CONV2D_BWD_INPUT_DW_INPLACE" in ops["greedy"]
    assert not any(o.endswith("_DW_INPLACE") for o in ops["naive"])
    owner = p["greedy"].memory_owners()
    dw = next(o for o in p["greedy"].ops if o["op"] == "CONV2D_DW_INPLACE")
    assert owner[dw["slots"][4]] == owner[dw["slots"][0]], "y takes x's memory"
    bwd = next(o for o in p["greedy"].ops if o["op"] == "CONV2D_BWD_INPUT_DW_INPLACE")
    assert owner[bwd["slots"][3]] == owner[bwd["slots"][0]], "dx takes dy's memory"
    assert p["greedy"].report()["arena_bytes"] < p["naive"].report()["arena_bytes"]
    rng = np.random.default_rng(1)
    xs, ys = rng.normal(size=(10, 2, 6, 6)).astype(np.float32) * 2, rng.integers(0, 3, 10)
    out = {}
    for k, plan in p.items():
        sim = microtrain.Simulator(plan)
        losses = [sim.step(x, y) for x, y in zip(xs, ys)]
        out[k] = (np.array(losses, np.float32).tobytes(), {n: v.tobytes() for n, v in sim.params().items()})
    assert out["greedy"] == out["naive"]


def test_a_trained_depthwise_weight_keeps_its_input():
    """Its weight gradient reads x after the forward: no in-place forward."""
    ops = [o["op"] for o in plans(update="full")["greedy"].ops]
    assert "CONV2D_DW_INPLACE" not in ops and "CONV2D" in ops


@pytest.mark.parametrize("op, slot", [("CONV2D_DW_INPLACE", 3), ("CONV2D_BWD_INPUT_DW_INPLACE", 2)])
def test_a_scratch_of_the_wrong_size_is_refused_at_load(op, slot):
    """Every float arena tensor that is not one plane, put in the scratch slot, is refused; those
    that overlap no other slot of the op in memory by the shape check."""
    plan = plans()["greedy"]
    microtrain.Simulator(plan)
    plane = 36
    messages = []
    for i, t in enumerate(plan.tensors):
        if t["storage"] != "ARENA" or t["dtype"] != "F32" or t["bytes"] == 4 * plane:
            continue
        with pytest.raises(ValueError) as e:
            microtrain.Simulator(Plan(patched(plan, op, slot=slot, value=i)))
        messages.append(str(e.value))
    assert any("tensor shapes do not fit the op" in m for m in messages), messages
