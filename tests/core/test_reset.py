"""Simulator.reset(): back to the plan's parameters with every optimizer buffer cleared, so
training after a reset repeats, bit for bit, what a fresh simulator does."""
import numpy as np
import pytest

import microtrain

import models


def run(sim, xs, ys):
    return [sim.step(x, y) for x, y in zip(xs, ys)], sim.params()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_training_after_reset_repeats_a_fresh_run(momentum, batch):
    plan = microtrain.compile(models.cnn(), update="full", lr=0.05, momentum=momentum, batch=batch)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(7, 2, 8, 8)).astype(np.float32)
    ys = rng.integers(0, 4, 7)
    fresh_losses, fresh = run(microtrain.Simulator(plan), xs, ys)
    sim = microtrain.Simulator(plan)
    run(sim, xs[::-1], ys[::-1])   # other samples first: momentum, and with batch 3 a part-filled accumulator
    assert sim.steps == 7
    sim.reset()
    assert sim.steps == 0 and sim.core.ctx.updates == 0
    initial = microtrain.Simulator(plan).params()
    assert all(np.array_equal(v, initial[k]) for k, v in sim.params().items())
    state = [t for t in plan.tensors if t["flags"] & (microtrain.format.TFLAGS["MOMENTUM"]
                                                      | microtrain.format.TFLAGS["GRAD_ACC"])]
    assert len(state) == (momentum > 0) * 8 + (batch > 1) * 8
    for t in state:
        assert not sim.tensor(t["name"]).any(), "%s not cleared by reset" % t["name"]
    losses, params = run(sim, xs, ys)
    assert losses == fresh_losses
    for k, v in fresh.items():
        assert np.array_equal(params[k], v), k
