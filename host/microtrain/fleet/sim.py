"""A fleet without hardware: N emulated boards (the unix port, qemu's MPS2_AN500 on a
serial pty: the path a USB serial port takes) in Flower's simulation engine, each with a
non-IID shard of a data set in its own sample store, and the same board ClientApp and
ServerApp a deployment runs (client.py, server.py). `make fleet-demo` and
`microtrain fleet simulate` run this; tests/fleet/ test with it.

    with EmulatedFleet(["unix", "unix", "unix", "qemu"]) as boards:
        setup(boards, plan, shards)                 # deploy, and each board's samples onto it
        fleet = simulate(boards.ports, {"plan": ..., "test-data": ..., "num-rounds": 5})

The emulators run in this process's children (microtrain.device.emulated: each dies with
the process that started it); Flower's workers only open their ports."""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from ..device.emulated import REPO

FIRMWARE = {
    "unix": os.path.join(REPO, "build", "firmware", "unix", "micropython"),
    "qemu": os.path.join(REPO, "build", "firmware", "mps2_an500", "firmware.elf"),
}


def label_skew(y, n_boards, alpha=0.5, seed=0, min_size=8):
    """Index arrays of n_boards shards of labels y, each class spread over the boards by
    Dirichlet(alpha) proportions (small alpha: each board sees few classes), as in the
    federated-learning literature's non-IID splits. Redrawn until every shard has min_size."""
    rng = np.random.default_rng(seed)
    y = np.asarray(y)
    for _ in range(1000):
        parts = [[] for _ in range(n_boards)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cut = (np.cumsum(rng.dirichlet([alpha] * n_boards)) * len(idx)).astype(int)[:-1]
            for b, piece in enumerate(np.split(idx, cut)):
                parts[b].extend(piece.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, int)) for p in parts]
    raise ValueError("no split with %d samples on each of %d boards: use a larger alpha or fewer boards"
                     % (min_size, n_boards))


def describe_shards(y, shards, n_classes):
    """One line per board: its samples and how many of each class."""
    return ["board %d: %3d samples, per class %s" % (b, len(s), np.bincount(np.asarray(y)[s], minlength=n_classes).tolist())
            for b, s in enumerate(shards)]


class EmulatedFleet:
    """Emulated boards of the given kinds ("unix", "qemu"), started together, stopped together.
    A unix-port board soft-resets on a Ctrl-D at its REPL as a board does (it would exit)."""

    def __init__(self, kinds, firmware=None, micropypath=None):
        from ..device.emulated import QemuBoard, UnixBoard
        self.kinds = list(kinds)
        fw = dict(FIRMWARE, **(firmware or {}))
        for k in set(self.kinds):
            if k not in fw:
                raise ValueError("board kind %r: the emulated fleet has %s" % (k, ", ".join(sorted(FIRMWARE))))
            if not os.path.exists(fw[k]):
                raise FileNotFoundError("no %s firmware at %s: build it with `make firmware-test`" % (k, fw[k]))
        self.boards = [UnixBoard(fw[k], micropypath=micropypath, soft_reset=True) if k == "unix" else QemuBoard(fw[k])
                       for k in self.kinds]

    def __enter__(self):
        try:
            for b in self.boards:
                b.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for b in self.boards:
            b.close()

    @property
    def ports(self):
        return [b.port for b in self.boards]


def setup(ports, plan, shards_xy, say=print):
    """Deploy the plan to each board and put its shard (x, y) in its sample store."""
    from ..device.board import Board
    from .board import provision
    for k, (port, (x, y)) in enumerate(zip(ports, shards_xy)):
        t0 = time.monotonic()
        b = Board(port)
        try:
            b.connect()
            if b.facts["plan"] is None or b.facts["plan"]["crc"] != _crc(plan):
                b.deploy(plan)
            nbytes, _ = provision(b, plan, x, y)
        finally:
            b.close(quit=False)
        say("board %d (%s): plan deployed, %d samples in its store (%d bytes), %.1f s"
            % (k, port, len(x), nbytes, time.monotonic() - t0))


def _crc(plan):
    import zlib
    return zlib.crc32(plan.data)


def simulate(ports, run_config, strategy=None, say=print, verbose=False):
    """Run the fleet's ServerApp and one board ClientApp per port in Flower's simulation
    engine (Ray: a worker per board); returns the server's Fleet (history, checkpoints).
    ports: a list, or a JSON file of one that the ClientApps read at each message."""
    import logging
    import warnings
    from flwr.simulation import run_simulation
    from .client import client_app
    from .server import server_app
    done = {}
    app = server_app(run_config, strategy=strategy, say=say, on_done=lambda f: done.setdefault("fleet", f))
    if isinstance(ports, str):
        with open(ports) as f:
            n = len(json.load(f))
    else:
        n = len(ports)
    if not verbose:
        # a board left out of a round is one line of the fleet's own; Flower would add its traceback
        logging.getLogger("flwr").setLevel(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(server_app=app, client_app=client_app(ports if isinstance(ports, str) else list(ports)),
                       num_supernodes=n,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": n, "logging_level": "ERROR",
                                                     "log_to_driver": bool(verbose)}})
    if "fleet" not in done:
        raise RuntimeError("the fleet's ServerApp did not finish (Flower's log above says why)")
    return done["fleet"]


def solo(plan, shards_xy, test, epochs, seed=0):
    """Each board trained alone on its own shard for `epochs` epochs (the host simulator: the
    boards train bit for bit as it does), scored on the common test set."""
    from ..simulator import Simulator
    out = []
    for x, y in shards_xy:
        sim = Simulator(plan)
        sim.fit(x, y, epochs=epochs, seed=seed, progress=False)
        out.append(float(sim.evaluate(*test)))
    return out


def main(args):
    """`microtrain fleet simulate`: the emulated fleet, its rounds, and the comparison."""
    from ..plan import load_plan
    from ..simulator import Simulator
    plan = load_plan(args.plan)
    d = np.load(args.data)
    x, y = d["x"], d["y"]
    test = (d["x_test"], d["y_test"]) if "x_test" in d.files else None
    kinds = [k.strip() for k in args.boards.split(",") if k.strip()]
    shards = label_skew(y, len(kinds), alpha=args.alpha, seed=args.split_seed)
    n_classes = int(np.prod(plan.meta["output"]["shape"][1:]))
    print("%d boards (%s), label skew Dirichlet(alpha=%g):" % (len(kinds), ", ".join(kinds), args.alpha))
    for line in describe_shards(y, shards, n_classes):
        print("  " + line)
    shards_xy = [(x[s], y[s]) for s in shards]
    cfg = {"plan": args.plan, "test-data": args.data if test is not None else "", "out-dir": args.out,
           "num-rounds": args.rounds, "local-epochs": args.local_epochs, "seed": args.seed,
           "strategy": args.strategy, "min-train-nodes": min(2, len(kinds)),
           "min-available-nodes": len(kinds), "round-timeout": args.round_timeout}
    if args.onnx:
        cfg["onnx"] = args.onnx
    t0 = time.monotonic()
    with EmulatedFleet(kinds) as boards:
        print("boards on %s" % ", ".join(boards.ports))
        setup(boards.ports, plan, shards_xy)
        fleet = simulate(boards.ports, cfg, verbose=args.verbose)
    print("fleet: %d rounds in %.1f s" % (args.rounds, time.monotonic() - t0))
    if test is not None:
        alone = solo(plan, shards_xy, test, epochs=args.rounds * args.local_epochs, seed=args.seed)
        before = Simulator(plan).evaluate(*test)
        final = fleet.history[-1]["accuracy"]
        print("test accuracy (%d samples): the plan before training %.4f; each board alone on its shard for %d epochs: %s; "
              "the fleet after %d rounds: %.4f (%s the best single board by %+.4f)"
              % (len(test[1]), before, args.rounds * args.local_epochs, ", ".join("%.4f" % a for a in alone),
                 args.rounds, final, "beats" if final > max(alone) else "does NOT beat", final - max(alone)))
        from .plot import accuracy_svg
        accuracy_svg(fleet.history, os.path.join(args.out, "accuracy.svg"),
                     lines=[("board %d alone" % k, a) for k, a in enumerate(alone)] + [("before", before)])
        print("per-round accuracy: %s" % os.path.join(args.out, "accuracy.svg"))
    return 0


if __name__ == "__main__":      # pragma: no cover
    sys.exit("use `microtrain fleet simulate`")
