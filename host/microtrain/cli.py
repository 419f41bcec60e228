"""The microtrain command: compile, report, simulate; deploy, train, eval, pull (device/commands.py)."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def _compile(args):
    from .compiler import compile
    plan = compile(args.model, update=args.update, loss=args.loss, lr=args.lr, momentum=args.momentum,
                   weight_decay=args.weight_decay, batch=args.batch, planner=args.planner)
    plan.save(args.output)
    r = plan.report()
    print("wrote %s: %d bytes, %d ops, arena %d B (naive %d B), parameters and optimizer state %d B, "
          "constants %d B" % (args.output, r["plan_bytes"], r["ops"], r["arena_bytes"], r["naive_bytes"],
                              r["param_bytes"], r["const_bytes"]))
    for note in r["notes"]:
        print("note: " + note)


def _kb(n):
    return "%.1f KB" % (n / 1024) if n >= 1024 else "%d B" % n


def print_report(r, out=sys.stdout, tensors=True):
    w = out.write
    w("plan            %s\n" % _kb(r["plan_bytes"]))
    w("RAM needed      %s  = arena %s + parameters/optimizer %s\n"
      % (_kb(r["ram_bytes"]), _kb(r["arena_bytes"]), _kb(r["param_bytes"])))
    w("arena           %s planned, %s naive (all tensors alive), %s peak live\n"
      % (_kb(r["arena_bytes"]), _kb(r["naive_bytes"]), _kb(r["peak_live_bytes"])))
    w("constants       %s (frozen, may stay in flash)\n" % _kb(r["const_bytes"]))
    w("MACs per step   %d\n" % r["macs_per_step"])
    w("ops             %d (%s)\n" % (r["ops"], ", ".join("%s %d" % kv for kv in r["ops_by_phase"].items())))
    w("training        update=%s loss=%s batch=%d lr=%g momentum=%g weight_decay=%g\n"
      % (r["update"], r["loss"], r["batch"], r["lr"], r["momentum"], r["weight_decay"]))
    w("trainable       %s\n" % ", ".join(r["trainable"]))
    for note in r["notes"]:
        w("note            %s\n" % note)
    if tensors:
        w("\n%-40s %-6s %9s %9s %11s\n" % ("tensor", "where", "bytes", "offset", "ops"))
        for t in r["tensors"]:
            span = "%d-%d" % (t["first"], t["last"]) if t["first"] >= 0 else "-"
            w("%-40s %-6s %9d %9d %11s\n" % (t["name"][:40], t["storage"], t["bytes"], t["offset"], span))


def _report(args):
    from .plan import load_plan
    r = load_plan(args.plan).report()
    if args.svg:
        from .svg import arena_svg
        with open(args.svg, "w") as f:
            f.write(arena_svg(r))
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print_report(r)
        if args.svg:
            print("\narena picture written to %s" % args.svg)


def load_data(path):
    try:
        d = np.load(path)
    except (OSError, ValueError) as e:
        raise ValueError("cannot read data file %s: %s" % (path, e)) from e
    missing = [k for k in ("x", "y") if k not in d.files]
    if missing:
        raise ValueError("data file %s lacks array(s) %s; it must hold x (samples first) and y" % (path, missing))
    return d


def _simulate(args):
    from .plan import load_plan
    from .simulator import Simulator
    plan = load_plan(args.plan)
    sim = Simulator(plan)
    d = load_data(args.data)
    x, y = d["x"], d["y"]
    xt, yt = (d["x_test"], d["y_test"]) if "x_test" in d.files and "y_test" in d.files else (x, y)
    held = "held-out test set" if xt is not x else "training data"
    metric = "accuracy" if plan.loss == "cross-entropy" else "mse"
    print_report(plan.report(), tensors=False)
    print()
    before = sim.evaluate(xt, yt)
    print("%s before training (%s, %d samples): %.4f" % (metric, held, len(xt), before))
    sim.fit(x, y, epochs=args.epochs, seed=args.seed,
            on_epoch=lambda e, loss: print("epoch %d: mean loss %.4f" % (e, loss), flush=True))
    after = sim.evaluate(xt, yt)
    print("%s after %d epochs (%d steps): %.4f" % (metric, args.epochs, sim.steps, after))
    if args.save_params:
        np.savez(args.save_params, **sim.params())
        print("trained parameters written to %s" % args.save_params)


def main(argv=None):
    p = argparse.ArgumentParser(prog="microtrain", description="Train neural networks on microcontrollers.")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model into a training plan (.mtp)")
    c.add_argument("model", help="ONNX model file")
    c.add_argument("-o", "--output", required=True, help="plan file to write")
    c.add_argument("--update", default="last-layer",
                   help="what trains: last-layer, bias, last:K, full, or a JSON file of initializer names")
    c.add_argument("--loss", default="cross-entropy", choices=["cross-entropy", "mse"])
    c.add_argument("--lr", type=float, default=0.01)
    c.add_argument("--momentum", type=float, default=0.0)
    c.add_argument("--weight-decay", type=float, default=0.0)
    c.add_argument("--batch", type=int, default=1, help="samples per update (1: update after every sample)")
    c.add_argument("--planner", default="greedy", choices=["greedy", "naive"])
    c.set_defaults(func=_compile)
    r = sub.add_parser("report", help="memory and compute report of a plan")
    r.add_argument("plan")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--svg", metavar="FILE", help="also draw the arena timeline as SVG")
    r.set_defaults(func=_report)
    s = sub.add_parser("simulate", help="train a plan on the host with the device's C core")
    s.add_argument("plan")
    s.add_argument("--data", required=True, help=".npz with x (float32, samples first) and y; "
                   "optional x_test, y_test to measure on")
    s.add_argument("--epochs", type=int, default=1)
    s.add_argument("--seed", type=int, default=0, help="shuffle seed")
    s.add_argument("--save-params", metavar="FILE.npz", help="write the trained parameters")
    s.set_defaults(func=_simulate)
    from .device.commands import add_arguments as add_board_commands
    add_board_commands(sub)     # deploy, train, eval, pull: microtrain.device.commands
    args = p.parse_args(argv)
    from .device.errors import DeviceError
    try:
        args.func(args)
    except (ValueError, TypeError, NotImplementedError, DeviceError) as e:
        print("microtrain %s: error: %s" % (args.cmd, e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
