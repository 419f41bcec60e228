"""`microtrain fleet simulate | provision | bytes | app`: the fleet's commands (cli.py only
registers them). Flower (flwr) is needed by simulate and by the apps, not by provision or
bytes; without it they say how to install it."""
from __future__ import annotations

import argparse
import os
import sys

from ..device.errors import DeviceError


class NeedsFlower(DeviceError):
    """flwr is not installed."""


def need_flwr():
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise NeedsFlower("microtrain fleet needs Flower: pip install -r requirements-fleet.txt "
                          "(or pip install './host[fleet]')") from None


def add_arguments(sub, formatter_class):
    f = sub.add_parser("fleet", formatter_class=formatter_class,
                       help="federated training of a fleet of boards on Flower (docs/fleet.md)",
                       description="Federated training on Flower: each board trains on the samples on its own "
                       "filesystem, only the plan's trainable values cross its link (docs/fleet.md).")
    fs = f.add_subparsers(dest="fleet_cmd", metavar="COMMAND", required=True,
                         help="simulate an emulated fleet, provision a board's samples, count a round's bytes, "
                         "or write a Flower App")

    s = fs.add_parser("simulate", formatter_class=formatter_class,
                      help="a fleet of emulated boards in Flower's simulation engine, non-IID shards of a data set",
                      description="Run a fleet of emulated boards in Flower's simulation engine, each board "
                      "training on a non-IID shard of a data set.")
    s.add_argument("plan", help="plan file (.mtp) the boards run")
    s.add_argument("--data", required=True, help=".npz with x, y (split over the boards) and x_test, y_test (held out, "
                   "evaluated on this host)")
    s.add_argument("--boards", default="unix,unix,unix,qemu",
                   help="the emulated boards, comma-separated: unix (MicroPython's unix port on a pty) or qemu "
                   "(MPS2_AN500 on a serial pty)")
    s.add_argument("--rounds", type=int, default=5, help="how many federated rounds")
    s.add_argument("--local-epochs", type=int, default=1, help="passes over its own samples per board per round")
    s.add_argument("--strategy", default="fedavg", help="flwr strategy (server.py lists them)")
    s.add_argument("--alpha", type=float, default=0.5, help="label skew: Dirichlet alpha of the split (smaller: "
                   "fewer classes per board)")
    s.add_argument("--split-seed", type=int, default=0, help="the seed of the split")
    s.add_argument("--seed", type=int, default=0, help="seed of the boards' shuffles")
    s.add_argument("--round-timeout", type=float, default=600.0, help="seconds a round waits for its boards")
    s.add_argument("--onnx", help="the model the plan was compiled from: OUT/trained.onnx gets the global model")
    s.add_argument("-o", "--out", default="build/fleet", help="checkpoints, history.json, accuracy.svg")
    s.add_argument("--verbose", action="store_true", help="Flower's own log too")
    s.set_defaults(func=_simulate)

    p = fs.add_parser("provision", formatter_class=formatter_class,
                      help="put a labelled set on a board's filesystem as its samples (mt/samples.bin)",
                      description="Put a labelled set on a board's filesystem as the samples it trains on in a "
                      "fleet round (mt/samples.bin).")
    p.add_argument("--data", required=True, help=".npz with x and y")
    p.add_argument("--port", help="serial port of the board (default: the one MicroPython board on USB)")
    p.add_argument("--baud", type=int, default=115200, help="baud rate for UART-attached boards")
    p.set_defaults(func=_provision)

    b = fs.add_parser("bytes", formatter_class=formatter_class,
                      help="what a round moves over each board's link for a plan",
                      description="What one federated round moves over each board's link for a plan: its "
                      "trainable values down and up.")
    b.add_argument("plan", nargs="+", help="plan files (.mtp)")
    b.set_defaults(func=_bytes)

    a = fs.add_parser("app", formatter_class=formatter_class,
                      help="write a Flower App (pyproject.toml) for `flwr run` on SuperLink and SuperNodes",
                      description="Write a Flower App (pyproject.toml) for `flwr run` on a SuperLink and "
                      "SuperNodes.")
    a.add_argument("dir", help="directory to write it in")
    a.add_argument("--plan", required=True, help="the plan the boards run (read by the ServerApp on the SuperLink's host)")
    a.add_argument("--test-data", default="", help=".npz held out on the server's host for the global accuracy")
    a.add_argument("--onnx", default="", help="the model the plan was compiled from (trained.onnx at the end)")
    a.add_argument("--rounds", type=int, default=5, help="how many federated rounds")
    a.add_argument("--local-epochs", type=int, default=1, help="passes over its own samples per board per round")
    a.add_argument("--min-boards", type=int, default=2, help="min-available-nodes: boards a round waits for")
    a.add_argument("-o", "--out", default="fleet-out", help="the server's checkpoint directory")
    a.set_defaults(func=_app)


def _simulate(args):
    need_flwr()
    from .sim import main
    main(args)


def _provision(args):
    from ..datafiles import load_data
    from ..device.board import Board
    from ..device.ports import find_board
    from .board import provision
    d = load_data(args.data)
    x, y = d["x"], d["y"]
    with Board(args.port or find_board(), baud=args.baud) as b:
        plan = b.plan()
        b.check_data(x, y)
        n, _ = provision(b, plan, x, y)
    print("wrote %d samples (%d bytes) to the board on %s as its sample store (mt/samples.bin)" % (len(x), n, b.port))


def bytes_rows(plans):
    """(name, trainable values, f4/i8 params, down bytes, up bytes) of each plan."""
    from ..plan import load_plan
    from .layout import Layout
    rows = []
    for path in plans:
        lay = Layout(load_plan(path) if isinstance(path, str) else path)
        rows.append((path if isinstance(path, str) else "plan", sum(p.n for p in lay.params),
                     "%d f4 + %d i8" % (sum(p.enc == "f4" for p in lay.params), sum(p.enc == "i8" for p in lay.params)),
                     lay.down_bytes, lay.up_bytes))
    return rows


def _bytes(args):
    print("%-40s %10s %14s %12s %12s" % ("plan", "values", "parameters", "down B", "up B"))
    for name, n, kinds, down, up in bytes_rows(args.plan):
        print("%-40s %10d %14s %12d %12d" % (os.path.basename(name), n, kinds, down, up))
    print("(the values' bytes each way per board per round; the protocol adds 16 bytes per frame of at most "
          "4,096 and a few short commands: `make fleet-demo` and docs/fleet.md give measured totals)")


APP_TOML = """# A Flower App for a fleet of microtrain boards (docs/fleet.md). `flwr run . FEDERATION`
# runs microtrain.fleet.server:app on the SuperLink's host and microtrain.fleet.client:app on
# every SuperNode (one per board: flower-supernode --node-config 'port="/dev/ttyACM0"').
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "microtrain-fleet"
version = "1.0.0"
dependencies = ["flwr>=1.42"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "microtrain"

[tool.flwr.app.components]
serverapp = "microtrain.fleet.server:app"
clientapp = "microtrain.fleet.client:app"

[tool.flwr.app.config]
plan = %(plan)s
test-data = %(test)s
onnx = %(onnx)s
out-dir = %(out)s
num-rounds = %(rounds)d
local-epochs = %(epochs)d
min-available-nodes = %(min)d
min-train-nodes = %(min)d
strategy = "fedavg"
round-timeout = 600.0
"""


def _app(args):
    import json
    os.makedirs(args.dir, exist_ok=True)
    q = lambda p: json.dumps(os.path.abspath(p) if p else "")      # noqa: E731  (TOML takes JSON strings)
    path = os.path.join(args.dir, "pyproject.toml")
    with open(path, "w") as f:
        f.write(APP_TOML % {"plan": q(args.plan), "test": q(args.test_data), "onnx": q(args.onnx), "out": q(args.out),
                            "rounds": args.rounds, "epochs": args.local_epochs, "min": args.min_boards})
    print("wrote %s: `flwr run %s FEDERATION` starts the fleet (docs/fleet.md)" % (path, args.dir))


if __name__ == "__main__":      # pragma: no cover
    sys.exit("use `microtrain fleet`")
