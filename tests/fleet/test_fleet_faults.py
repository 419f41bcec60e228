"""The faults a fleet has, each in Flower's simulation engine with emulated boards: a board
unplugged in the middle of a round, a board reset in the middle of a round, a board running
another plan, a board that does not finish before the round's timeout. In each the round
goes on (Flower's sampling with min-available and min-train nodes below the fleet's size)
and no global state is lost: every round's checkpoint is the FedAvg of the host simulator's
replays of exactly the boards that were averaged, from the previous round's checkpoint."""
import json
import os
import signal
import struct
import time
import zlib

import numpy as np
import pytest

from fleet_helpers import digits_plan, fleet_factory, hooked_fedavg, shards  # noqa: F401


def watch_round_start(workdir, then, timeout=120):
    """Call then() as soon as the unix board whose filesystem is workdir has taken a round's
    values (fedround writes mt/round.bin at FED_APPLY): it is training now."""
    path = os.path.join(workdir, "mt", "round.bin")

    def run():
        old = os.stat(path).st_mtime_ns if os.path.exists(path) else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(path) and os.stat(path).st_mtime_ns != old:
                then()
                return
            time.sleep(0.002)
    return run


def checkpointed_count(workdir):
    """The sample count of the unix board's newest checkpoint (mt/ckpt.bin's JSON meta), or None."""
    try:
        with open(os.path.join(workdir, "mt", "ckpt.bin"), "rb") as f:
            head = f.read(20)
            _, _, _, _, n_meta, _ = struct.unpack("<4sHHIII", head)
            return json.loads(f.read(n_meta))["samples"]
    except (OSError, ValueError, KeyError, struct.error):
        return None


def assert_resumed_exactly(f, board, every):
    """Board `board` lost round 2 and resumed it at checkpoints (multiples of `every`); every
    round averaged all three boards and is the FedAvg of their replays. Returns its round-2 facts."""
    node = [n for n in f.round(2)["nodes"].values() if f.board_of(n) == board][0]
    assert node["recoveries"] >= 1 and node["resumed_at"], node
    assert all(k % every == 0 for k in node["resumed_at"]), node
    for r in (1, 2, 3):
        assert len(f.round(r)["accepted"]) == 3
        f.assert_round_is_the_oracle(r, [0, 1, 2])
    return node


@pytest.mark.device
@pytest.mark.slow
def test_unplugged_board_is_left_out_and_rejoins(fleet_factory):  # noqa: F811
    """Board 2 is pulled out (powered off, its port gone) right after it took round 2's values
    (100,000 local samples: it is training); round 2 averages boards 0 and 1; the board is plugged
    in again after round 2 (on another port), boots on its files and trains round 3 with the others."""
    plan = digits_plan()
    f = fleet_factory(plan, ["unix"] * 3, shards(3))
    victim = f.boards.boards[2]
    old_port = victim.port
    f.run(strategy=hooked_fedavg({2: (0.0, watch_round_start(victim.workdir, lambda: f.unplug(2)))}, n=2,
                                 after={2: lambda: f.replug(2)}),
          **{"num-rounds": 3, "local-steps": 100000, "round-timeout": 120.0, "min-available-nodes": 2,
             "min-train-nodes": 2})
    h1, h2, h3 = f.round(1), f.round(2), f.round(3)
    assert len(h1["accepted"]) == 3
    assert sorted(f.board_of(n) for n in h2["nodes"].values()) == [0, 1], h2
    ((who, why),) = h2["left_out"].items()
    print("round 2 left out the unplugged board (%s, %.1f s): %s" % (who, h2["seconds"], why))
    assert who == old_port and "the board on %s went away" % old_port in why and "\n" not in why
    assert len(h3["accepted"]) == 3 and f.boards.boards[2] is not victim
    f.assert_round_is_the_oracle(1, [0, 1, 2])
    f.assert_round_is_the_oracle(2, [0, 1])
    f.assert_round_is_the_oracle(3, [0, 1, 2])


@pytest.mark.device
@pytest.mark.slow
def test_board_reset_mid_round_resumes_from_its_checkpoint(fleet_factory):  # noqa: F811
    """The qemu board is reset (qemu's system_reset: the firmware starts again, its littlefs in
    PSRAM stays) six seconds into round 2, 20,000 local samples at about 0.4 ms each with a
    checkpoint every 2,000: its ClientApp reconnects, the board has restored the round and its
    count from its checkpoint, and the round ends with exactly the values of a run never reset
    (the oracle); it trains round 3 too."""
    plan = digits_plan()
    f = fleet_factory(plan, ["unix", "unix", "qemu"], shards(3))
    qemu = f.boards.boards[2]
    f.run(strategy=hooked_fedavg({2: (6.0, qemu.reset)}, n=3),
          **{"num-rounds": 3, "local-steps": 20000, "checkpoint-every": 2000, "round-timeout": 300.0})
    node = assert_resumed_exactly(f, 2, 2000)
    print("round 2, the reset board: %d recoveries, resumed at samples %s, %.1f s"
          % (node["recoveries"], node["resumed_at"], node["seconds"]))


@pytest.mark.device
@pytest.mark.slow
def test_board_power_cycled_while_training_resumes_at_its_checkpoint(fleet_factory):  # noqa: F811
    """A unix-port board loses power once it has checkpointed round 2 after some training
    (100,000 local samples, a checkpoint every 20,000) and is powered on again at once: it boots
    on its files, restores the round at its last checkpoint (a count above 0), and the round ends
    with exactly the values of a run never interrupted."""
    plan = digits_plan()
    f = fleet_factory(plan, ["unix"] * 3, shards(3))
    victim = f.boards.boards[2]
    cut_at = []

    def cycle():
        deadline = time.monotonic() + 120
        # the round's own checkpoints: 0 at its start, 100,000 (round 1's) at its end
        while time.monotonic() < deadline and not 0 < (checkpointed_count(victim.workdir) or 0) < 100000:
            time.sleep(0.002)
        time.sleep(0.2)         # in the middle of the next stretch of samples
        cut_at.append(checkpointed_count(victim.workdir))
        victim.reset()
    f.run(strategy=hooked_fedavg({2: (0.0, watch_round_start(victim.workdir, cycle))}, n=3),
          **{"num-rounds": 3, "local-steps": 100000, "checkpoint-every": 20000, "round-timeout": 300.0})
    node = assert_resumed_exactly(f, 2, 20000)
    print("round 2, the power-cycled board (cut after its checkpoint at %s, %d soft resets): %d recoveries, "
          "resumed at samples %s" % (cut_at, victim.soft_resets, node["recoveries"], node["resumed_at"]))
    assert cut_at and cut_at[0] and node["resumed_at"][0] >= cut_at[0] > 0, (cut_at, node)


@pytest.mark.device
@pytest.mark.slow
def test_board_with_another_plan_is_refused_never_averaged(fleet_factory):  # noqa: F811
    """Board 1 runs a plan of another learning rate (another plan hash): its ClientApp refuses the
    round with a one-line error naming both hashes and the fix, the others are averaged. The
    server's own check refuses a reply that claims another plan, or carries values that are not
    the plan's, even from a ClientApp that did not check."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from microtrain.device.board import Board
    from microtrain.fleet.server import wrap
    from flwr.serverapp.strategy import FedAvg
    plan = digits_plan()
    other = digits_plan(lr=0.01)
    f = fleet_factory(plan, ["unix"] * 3, shards(3))
    b = Board(f.ports[1])
    try:
        b.connect()
        b.deploy(other)
    finally:
        b.close(quit=False)
    f.run(**{"num-rounds": 2, "min-available-nodes": 3, "min-train-nodes": 2})
    for r in (1, 2):
        h = f.round(r)
        assert sorted(f.board_of(n) for n in h["nodes"].values()) == [0, 2], h
        ((who, why),) = h["left_out"].items()
        assert who == f.ports[1], h["left_out"]
        assert "runs plan %08x, the fleet trains plan %08x" % (zlib.crc32(other.data), f.fleet.layout.crc) in why, why
        assert "microtrain deploy" in why and "\n" not in why
        f.assert_round_is_the_oracle(r, [0, 2])
    print("round 1 left out board 1: %s" % why)

    # the server's own check
    fleet = f.fleet
    s = wrap(FedAvg(), fleet)
    good = f.checkpoint(2)

    def reply(crc, values, node):
        ask = Message(content=RecordDict({"config": ConfigRecord({"a": 1})}), dst_node_id=node, message_type="train")
        return Message(content=RecordDict({
            "arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in values.items()}),
            "metrics": MetricRecord({"num-examples": 10}),
            "fleet": ConfigRecord({"plan-crc": crc, "port": "p%d" % node})}), reply_to=ask)
    bad_values = dict(good, extra=np.zeros(3, np.float32))
    arrays, _ = s.aggregate_train(9, [reply(fleet.layout.crc ^ 1, good, 7), reply(fleet.layout.crc, bad_values, 8)])
    assert arrays is None
    left = fleet.rounds[9]["left_out"]
    assert "runs plan" in left["p7"] and "extra" in left["p8"], left
    arrays, _ = s.aggregate_train(10, [reply(fleet.layout.crc ^ 1, {k: v + 1 for k, v in good.items()}, 7),
                                       reply(fleet.layout.crc, good, 8)])
    for k in good:
        assert np.array_equal(arrays[k].numpy(), good[k])      # the refused reply changed nothing


@pytest.mark.device
@pytest.mark.slow
def test_round_timeout_goes_on_without_the_late_board(fleet_factory):  # noqa: F811
    """Board 2 is frozen (SIGSTOP: its port stays, it answers nothing) as round 2 starts: the round
    ends at its timeout with boards 0 and 1 averaged, the board's ClientApp, trying to reach it
    until then, gives up at its own deadline and lets go of it; thawed after round 2, the board
    trains round 3 with the others."""
    plan = digits_plan()
    f = fleet_factory(plan, ["unix"] * 3, shards(3))
    victim = f.boards.boards[2]
    timeout = 30.0   # rounds 1 and 3 (133 samples a board) take a few seconds
    try:
        f.run(strategy=hooked_fedavg({2: (0.0, lambda: os.kill(victim.proc.pid, signal.SIGSTOP))}, n=2,
                                     after={2: lambda: os.kill(victim.proc.pid, signal.SIGCONT)}),
              **{"num-rounds": 3, "round-timeout": timeout, "min-available-nodes": 2, "min-train-nodes": 2})
    finally:
        if victim.proc is not None:
            os.kill(victim.proc.pid, signal.SIGCONT)
    h2 = f.round(2)
    print("round 2: %.1f s, averaged %s, left out %s" % (h2["seconds"], [n["port"] for n in h2["nodes"].values()],
                                                          h2["left_out"]))
    assert sorted(f.board_of(n) for n in h2["nodes"].values()) == [0, 1]
    assert h2["seconds"] >= timeout - 1
    ((who, why),) = h2["left_out"].items()
    assert who == victim.port and "no reply within the round's timeout" in why
    assert len(f.round(3)["accepted"]) == 3
    for r, boards in ((1, [0, 1, 2]), (2, [0, 1]), (3, [0, 1, 2])):
        f.assert_round_is_the_oracle(r, boards)
