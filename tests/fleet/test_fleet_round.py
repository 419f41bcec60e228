"""One federated round through the board's ClientApp (the handler Flower calls) on the unix
port: the trained values it returns are the host simulator's replay of the round bit for
bit (the round's global values, the optimizer cleared, the board's own samples in
samples.Order's order), its num-examples is the board's sample count, and what crossed the
link is the values and the commands, not the samples. And the emulated unix board the fleet
tests use survives a Ctrl-D as a board does. In `make test`, with the three-unix-board fleet
of test_fleet_sim.py; the rest of tests/fleet/ is slow."""
import numpy as np
import pytest

from fleet_helpers import digits, digits_plan, need_boards, need_flwr


def flower_message(layout, values, server_round, **config):
    """A train Message as the fleet's ServerApp sends it (server.run's train config)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1     # as Flower's engines set them
    cfg = dict(layout.to_config(), **{"fleet-id": "t", "seed": 3, "local-epochs": 2, "server-round": server_round})
    cfg.update(config)
    return Message(content=RecordDict({"arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in values.items()}),
                                       "config": ConfigRecord(cfg)}), dst_node_id=1, message_type="train")


@pytest.mark.device
def test_client_round_on_the_unix_port_is_the_simulators(tmp_path):
    need_flwr()
    need_boards(["unix"])
    from flwr.app import Context, RecordDict
    import microtrain
    from microtrain.device.board import Board
    from microtrain.device.emulated import UnixBoard
    from microtrain.fleet.board import provision, replay, round_seed
    from microtrain.fleet.client import train_message
    from microtrain.fleet.layout import Layout
    from fleet_helpers import FIRMWARE

    plan = digits_plan()
    layout = Layout(plan)
    x, y, _, _ = digits()
    x, y = x[:48], y[:48]
    # global values that are not the plan's own: one round of another board's training
    start = replay(plan, microtrain.Simulator(plan).params(), x[::-1][:20], y[::-1][:20], 1, 20)
    ub = UnixBoard(FIRMWARE["unix"])
    try:
        ub.start()
        b = Board(ub.port)
        b.connect()
        b.deploy(plan)
        stored_bytes, _ = provision(b, plan, x, y)
        b.close(quit=False)
        context = Context(run_id=1, node_id=1, node_config={"port": ub.port}, state=RecordDict(), run_config={})
        reply = train_message(flower_message(layout, start, 4), context)
    finally:
        ub.close()

    c = reply.content
    got = {k: c["arrays"][k].numpy() for k in c["arrays"].keys()}
    want = replay(plan, start, x, y, round_seed(3, 4), 2 * len(x))
    assert sorted(got) == sorted(want) == ["fc.bias", "fc.weight"]
    for k in want:
        assert got[k].dtype == np.float32 and got[k].shape == want[k].shape
        assert np.array_equal(got[k], want[k]), "%s differs from the simulator's replay by %g" % (
            k, np.abs(got[k] - want[k]).max())
        assert not np.array_equal(got[k], start[k])
    m, f = c["metrics"], c["fleet"]
    assert m["num-examples"] == 48 and f["trained"] == 96 and f["stored"] == 48
    assert 0 <= m["train-accuracy"] <= 1 and np.isfinite(m["train-loss"])
    assert f["plan-crc"] == layout.crc and f["port"] == ub.port
    # the link carried the values (2,600 bytes each way) and the commands; 96 trained samples of
    # 260 bytes each would be 24,960 bytes, the store alone 12,496
    assert layout.down_bytes <= f["bytes-out"] < layout.down_bytes + 800, f["bytes-out"]
    assert layout.up_bytes <= f["bytes-in"] < layout.up_bytes + 800, f["bytes-in"]
    assert f["bytes-out"] + f["bytes-in"] < stored_bytes / 2


@pytest.mark.device
@pytest.mark.parametrize("soft_reset", [True, False])
def test_emulated_unix_board_soft_resets_on_ctrl_d(soft_reset):
    """The unix port exits on a Ctrl-D at its REPL's empty line, where a board soft-resets; a host
    resending a frame to a board that has just restarted may send one. The fleet's emulated unix
    boards (soft_reset=True) start MicroPython again on the same files and port, and answer."""
    import os
    import time
    need_boards(["unix"])
    from microtrain.device.board import Board
    from microtrain.device.emulated import UnixBoard, _open_raw
    from fleet_helpers import FIRMWARE
    ub = UnixBoard(FIRMWARE["unix"], soft_reset=soft_reset)
    try:
        ub.start()
        time.sleep(0.5)
        fd = _open_raw(ub.port)
        try:
            os.write(fd, b"\x04")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not (ub.soft_resets if soft_reset else ub.proc.poll() is not None):
                time.sleep(0.05)
        finally:
            os.close(fd)
        if not soft_reset:
            assert ub.proc.poll() == 0 and ub.soft_resets == 0        # the unix port's own behaviour
            return
        assert ub.soft_resets == 1 and ub.proc.poll() is None
        b = Board(ub.port)
        b.connect()
        assert b.facts["protocol"]
        b.close()
    finally:
        ub.close()
