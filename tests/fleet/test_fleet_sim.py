"""A fleet of emulated boards in Flower's simulation engine, each with a label-skewed share of
the digits adaptation data in its own sample store (Dirichlet 0.5: each board sees a few
classes mostly), training the digits CNN's last layer with FedAvg. The federated model beats
every board trained alone on its own share (as long: one epoch a round, as many epochs as
rounds) on the common held-out set, and each round's global model is the FedAvg of the host
simulator's replays of the boards' rounds from the previous round's checkpoint: the boards
trained exactly the samples of their own stores, in the order the host replays, and the
server averaged what they sent.

Two fleets: three unix-port boards for 2 rounds (`make test`: Flower's Ray workers take most
of its time), and the demo's four boards, one of them qemu's MPS2_AN500 on a serial pty (the
path a USB serial port takes), for 4 rounds (slow)."""
import pytest

from fleet_helpers import digits, digits_plan, fleet_factory, shards  # noqa: F401


@pytest.mark.device
@pytest.mark.parametrize("kinds,rounds", [
    pytest.param(["unix"] * 3, 2, id="3unix"),
    pytest.param(["unix", "unix", "unix", "qemu"], 4, id="3unix+qemu", marks=pytest.mark.slow),
])
def test_fleet_beats_every_board_alone(fleet_factory, kinds, rounds):  # noqa: F811
    import microtrain
    from microtrain.fleet.sim import solo
    plan = digits_plan()
    parts = shards(len(kinds))
    f = fleet_factory(plan, kinds, parts)
    fleet = f.run(**{"num-rounds": rounds, "seed": 0})
    _, _, xt, yt = digits()
    alone = solo(plan, parts, (xt, yt), epochs=rounds)
    before = microtrain.Simulator(plan).evaluate(xt, yt)
    accs = [h["accuracy"] for h in fleet.history]
    print("global accuracy per round %s; each board alone %s; before %.4f"
          % (["%.4f" % a for a in accs], ["%.4f" % a for a in alone], before))
    assert [h["round"] for h in fleet.history] == list(range(rounds + 1))
    for r in range(1, rounds + 1):
        h = f.round(r)
        assert len(h["accepted"]) == len(kinds) and not h["left_out"], h
        assert h["bytes_out"] > 0 and h["bytes_in"] > 0
        f.assert_round_is_the_oracle(r, list(range(len(kinds))))
    assert accs[-1] > max(alone), "the fleet (%.4f) does not beat the best board alone (%.4f)" % (accs[-1], max(alone))
    assert accs[-1] > before + 0.3
