"""A fleet of a plan whose trained weights are int8 (compile(trained_weights="int8"): the sparse
digits scheme, its 1x1 convolution's slice and its classifier int8 with a scale per channel).
Over the link they travel as int8 codes (with their scales on the way down); every board's
round is still the simulator's replay bit for bit; the server averages their real values and
puts the aggregate back on the codes with the plan's scales (round half to even, clamped to
+-127), independently recomputed here from the plan's own quantization records. With federated
evaluation on, each board scores the global model on its own samples as the simulator does."""
import numpy as np
import pytest

import microtrain

from fleet_helpers import SPARSE, digits_plan, fleet_factory, shards  # noqa: F401


def scales_of(plan, name):
    t = plan.tensors[plan.tensor_index(name)]
    q = t["quant"]
    shape = t["shape"]
    s = np.asarray(q.scale, np.float32)
    # broadcast the per-channel scale along its axis over the parameter's shape
    view = [1] * len(shape)
    view[q.axis] = shape[q.axis]
    return np.broadcast_to(s.reshape(view), shape).reshape(-1)


@pytest.mark.device
@pytest.mark.slow
def test_int8_weights_averaged_as_real_values_and_requantized(fleet_factory):  # noqa: F811
    from microtrain.fleet.layout import Layout
    plan = digits_plan(SPARSE, trained_weights="int8", lr=0.01)    # lr 0.05 diverges with this scheme
    lay = Layout(plan)
    i8 = [p.name for p in lay.params if p.enc == "i8"]
    assert sorted(i8) == ["fc.weight", "onnx::Conv_47@trained"]
    float_twin = Layout(digits_plan(SPARSE, lr=0.01))
    assert lay.down_bytes < float_twin.down_bytes / 3 and lay.up_bytes < float_twin.up_bytes / 3
    f = fleet_factory(plan, ["unix", "unix"], shards(2, limit=60))
    f.run(**{"num-rounds": 2, "min-available-nodes": 2, "fraction-evaluate": 1.0})
    for r in (1, 2):
        h = f.round(r)
        assert len(h["accepted"]) == 2
        # what crossed the link each way is about the int8 payload, not 4 bytes a value
        assert h["bytes_out"] / 2 < lay.down_bytes + 800 and h["bytes_in"] / 2 < lay.up_bytes + 800, h
        got = f.checkpoint(r)
        _, replays = f.oracle(r, [0, 1])
        w = [len(x) for x, _ in f.shards]
        for name in i8:
            s = scales_of(plan, name)
            for rep in replays:         # each board's values are on its codes (they came as codes)
                q = rep[name].reshape(-1) / s       # code x scale in float32, over the scale: the code
                assert np.abs(q - np.rint(q)).max() < 1e-3 and np.abs(q).max() <= 127.001
            avg = (replays[0][name] * np.float32(w[0] / sum(w)) + replays[1][name] * np.float32(w[1] / sum(w)))
            want = np.clip(np.rint(avg.reshape(-1) / s), -127, 127)
            codes = got[name].reshape(-1) / s
            assert np.abs(codes - np.rint(codes)).max() < 1e-3, "%s: the global values are not on the plan's codes" % name
            assert np.array_equal(got[name].reshape(-1), (np.rint(codes) * s).astype(np.float32))
            codes = np.rint(codes)
            # a code may differ where the float average sits within float32 rounding of a half
            off = codes != want
            assert np.abs(codes - want).max() <= 1 and off.mean() <= 0.01, (name, int(off.sum()))
            assert not np.array_equal(got[name], f.checkpoint(r - 1)[name])
        # federated evaluation: each board scores the new global model on its own samples
        sim = microtrain.Simulator(plan)
        sim.set_params(got)
        want_acc = sum(sim.evaluate(x, y) * len(x) for x, y in f.shards) / sum(w)
        assert abs(h["boards_eval"]["eval-accuracy"] - want_acc) < 1e-9, (h["boards_eval"], want_acc)
        for name in (p.name for p in lay.params if p.enc == "f4"):
            avg = replays[0][name] * (w[0] / sum(w)) + replays[1][name] * (w[1] / sum(w))
            assert np.abs(got[name] - avg).max() <= 1e-6 * max(1.0, float(np.abs(avg).max()))

    # one more round on board 1 straight from the host, from the last global model: its int8
    # values come back as codes and equal the replay's bit for bit
    from microtrain.fleet.board import FleetBoard, replay
    start = f.checkpoint(2)
    x, y = f.shards[1]
    with FleetBoard(f.ports[1]) as fb:
        fb.connect()
        res = fb.train_round(lay, start, run=12345, seed=77, epochs=2)
    want = replay(plan, start, x, y, 77, 2 * len(x))
    for k in want:
        assert np.array_equal(res.params[k], want[k]), k
    assert res.link_bytes["in"] < lay.up_bytes + 800
