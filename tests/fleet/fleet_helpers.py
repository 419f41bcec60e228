"""Shared by the fleet tests: the digits plans and shards, emulated fleets, Flower's
simulation with hooks into its rounds, and the oracle of a round.

Oracle: every board trains bit for bit as the host simulator does (replay: the round's
global values, the optimizer cleared, the board's samples in samples.Order's order), so a
round's global model is the FedAvg of the replays of the boards that were averaged, in
float32 as Flower's aggregate_arrayrecords computes it (the sum's order is the order the
replies came in, so the comparison allows float32 rounding: 1e-6)."""
import os
import threading

import numpy as np
import pytest

import microtrain
from repo import ROOT

DIGITS = os.path.join(ROOT, "examples", "digits_cnn.onnx")
DATA = os.path.join(ROOT, "examples", "digits_user.npz")
SPARSE = {"bias_updates": [{"conv_index": 1}, {"conv_index": 2}],
          "weight_updates": [{"conv_index": 2, "channel_axis": 1, "selected_channels": [0, 1, 2, 3]}],
          "classifier": "full"}
FIRMWARE = {"unix": os.path.join(ROOT, "build", "firmware", "unix", "micropython"),
            "qemu": os.path.join(ROOT, "build", "firmware", "mps2_an500", "firmware.elf")}
TOL = 1e-6


def need_flwr():
    try:
        import flwr  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        from serial_support import skip
        skip("flwr[simulation] is not installed: pip install './host[fleet]' (or make venv)")


def need_boards(kinds):
    import shutil
    from serial_support import skip
    for k in set(kinds):
        if not os.path.exists(FIRMWARE[k]):
            skip("no %s firmware at %s; run `make firmware-test`" % (k, os.path.relpath(FIRMWARE[k], ROOT)))
    if "qemu" in kinds and not shutil.which("qemu-system-arm"):
        skip("qemu-system-arm not found")


def digits_plan(update="last-layer", **kw):
    kw = dict(dict(loss="cross-entropy", lr=0.05, momentum=0.9), **kw)
    return microtrain.compile(DIGITS, update=update, **kw)


def digits():
    d = np.load(DATA)
    return d["x"], d["y"], d["x_test"], d["y_test"]


def shards(n_boards, alpha=0.5, seed=0, limit=None):
    from microtrain.fleet.sim import label_skew
    x, y, _, _ = digits()
    parts = label_skew(y, n_boards, alpha=alpha, seed=seed)
    if limit:
        parts = [p[:limit] for p in parts]
    return [(x[p], y[p]) for p in parts]


class Fleet:
    """Emulated boards with the plan deployed and their shards in their stores; the Flower run."""

    def __init__(self, tmp_path, plan, kinds, shard_xy):
        from microtrain.fleet.sim import EmulatedFleet, setup
        need_flwr()
        need_boards(kinds)
        self.tmp = str(tmp_path)
        self.plan = plan
        self.plan_path = os.path.join(self.tmp, "plan.mtp")
        plan.save(self.plan_path)
        self.shards = shard_xy
        self.boards = EmulatedFleet(kinds)
        self.boards.__enter__()
        try:
            setup(self.boards.ports, plan, shard_xy, say=lambda line: None)
        except BaseException:
            self.close()
            raise
        self.lines = []
        self.ports_file = os.path.join(self.tmp, "ports.json")
        self.write_ports()

    def write_ports(self):
        import json
        with open(self.ports_file + ".new", "w") as f:
            json.dump(self.ports, f)
        os.replace(self.ports_file + ".new", self.ports_file)

    def unplug(self, k):
        """Board k pulled out of its USB socket: powered off and its port gone (its files stay)."""
        self.boards.boards[k].close()

    def replug(self, k):
        """Board k plugged in again: it boots on its files, on a new port the ClientApps read."""
        from microtrain.device.emulated import UnixBoard
        old = self.boards.boards[k]
        b = UnixBoard(old.firmware, workdir=old.workdir, soft_reset=True)
        b.start()
        self.boards.boards[k] = b
        self.write_ports()

    def close(self):
        self.boards.close()

    @property
    def ports(self):
        return self.boards.ports

    def run(self, strategy=None, **config):
        from microtrain.fleet.sim import simulate
        cfg = {"plan": self.plan_path, "test-data": DATA, "out-dir": os.path.join(self.tmp, "out"),
               "min-available-nodes": len(self.ports), "min-train-nodes": len(self.ports)}
        cfg.update(config)
        self.config = cfg

        def say(line):
            self.lines.append(line)
            print(line, flush=True)
        self.fleet = simulate(self.ports_file, cfg, strategy=strategy, say=say)
        return self.fleet

    def checkpoint(self, r):
        d = np.load(os.path.join(self.config["out-dir"], "round-%03d.npz" % r))
        return {k: d[k] for k in d.files if not k.startswith("__")}

    def round(self, r):
        return [h for h in self.fleet.history if h["round"] == r][0]

    def oracle(self, r, boards):
        """The FedAvg of the replays of `boards` (indices) from round r-1's checkpoint."""
        from microtrain.fleet.board import replay, round_seed
        from microtrain.fleet.layout import Layout
        start = self.checkpoint(r - 1)
        seed = round_seed(self.config.get("seed", 0), r)
        epochs = self.config.get("local-epochs", 1)
        steps = self.config.get("local-steps", 0)
        outs, weights = [], []
        for b in boards:
            x, y = self.shards[b]
            outs.append(replay(self.plan, start, x, y, seed, steps or epochs * len(x)))
            weights.append(len(x))
        total = float(sum(weights))
        avg = {}
        for out, w in zip(outs, weights):
            for k, v in out.items():
                avg[k] = v * (w / total) if k not in avg else avg[k] + v * (w / total)
        return Layout(self.plan).requantize(avg), outs

    def assert_round_is_the_oracle(self, r, boards):
        want, _ = self.oracle(r, boards)
        got = self.checkpoint(r)
        for k in want:
            err = float(np.abs(got[k] - want[k]).max())
            assert err <= TOL * max(1.0, float(np.abs(want[k]).max())), \
                "round %d: %s is %g from the FedAvg of boards %s' replays" % (r, k, err, boards)

    def board_of(self, node_facts):
        return self.ports.index(node_facts["port"])


def hooked_fedavg(hooks, n, after=None, **kw):
    """A FedAvg that, when round r is configured, calls hooks[r]() after its delay in a thread
    (hooks = {r: (delay seconds, fn)}), and after[r]() once round r is aggregated."""
    from flwr.serverapp.strategy import FedAvg
    after = after or {}

    class Hooked(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            msgs = super().configure_train(server_round, arrays, config, grid)
            if server_round in hooks:
                delay, fn = hooks[server_round]
                t = threading.Timer(delay, fn)
                t.daemon = True
                t.start()
            return msgs

        def aggregate_train(self, server_round, replies):
            out = super().aggregate_train(server_round, replies)
            if server_round in after:
                after[server_round]()
            return out

    args = dict(fraction_evaluate=0.0, min_available_nodes=n, min_train_nodes=n)
    args.update(kw)
    return Hooked(**args)


@pytest.fixture
def fleet_factory(tmp_path):
    made = []

    def make(plan, kinds, shard_xy):
        f = Fleet(tmp_path, plan, kinds, shard_xy)
        made.append(f)
        return f
    yield make
    for f in made:
        f.close()
