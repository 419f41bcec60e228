"""`microtrain deploy | train | eval | pull`: the board commands of the CLI (cli.py only
wires their arguments). Each prints what it did; failures raise DeviceError (or
ValueError), which the CLI prints on one line with exit status 2."""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

from .errors import DataError


def add_arguments(sub, formatter_class):
    """Add the board commands to the CLI's subparsers (formatter_class shows defaults)."""
    def port_args(p):
        p.add_argument("--port", help="serial port of the board (default: the one MicroPython board on USB)")
        p.add_argument("--baud", type=int, default=115200, help="baud rate for UART-attached boards")

    d = sub.add_parser("deploy", formatter_class=formatter_class, help="put a plan on a board over serial",
                       description="Put a plan on a board over serial (USB, or a UART with --baud) and start a "
                       "Trainer on it; the board runs MicroPython with microtrain (microtrain flash).")
    d.add_argument("plan", help="plan file (.mtp)")
    d.add_argument("--romfs", action=argparse.BooleanOptionalAction, default=None,
                   help="put the plan on the board's ROMFS partition, read in place from flash (default: where "
                   "the board has one and the plan is int8 or too big for the heap as a file)")
    port_args(d)
    d.set_defaults(func=deploy)

    t = sub.add_parser("train", formatter_class=formatter_class, help="train the board's plan on data streamed over serial",
                       description="Train the plan deployed on the board (microtrain deploy) on the samples of an "
                       ".npz streamed over serial, checkpointing on the board; --resume carries on an interrupted run.")
    t.add_argument("--data", required=True, help=".npz with x (samples first) and y")
    t.add_argument("--epochs", type=int, default=1, help="passes over the data")
    t.add_argument("--seed", type=int, default=0, help="shuffle seed (the same as `simulate`'s)")
    t.add_argument("--resume", action="store_true", help="carry on with the board's run on this data and seed")
    t.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="checkpoint on the board every N samples (default: 0, at the end only)")
    t.add_argument("--no-accuracy", action="store_true",
                   help="do not measure the running accuracy (saves a forward pass per sample)")
    t.add_argument("--plot", metavar="CURVE.png", default=None,
                   help="also draw the mean loss and running accuracy of each epoch as a PNG (needs matplotlib)")
    port_args(t)
    t.set_defaults(func=train)

    e = sub.add_parser("eval", formatter_class=formatter_class, help="accuracy (or mse) of the board's model on data",
                       description="Accuracy (or mse) of the model on the board, measured by the board on the "
                       "samples of an .npz (x_test, y_test if present, else x, y).")
    e.add_argument("--data", required=True, help=".npz with x and y (x_test, y_test if present)")
    port_args(e)
    e.set_defaults(func=evaluate)

    p = sub.add_parser("pull", formatter_class=formatter_class, help="read the trained parameters back from a board",
                       description="Read the trained parameters back from the board: into an .npz, or with --onnx "
                       "into the ONNX model the plan was compiled from.")
    p.add_argument("-o", "--output", required=True, help="TRAINED.onnx (with --onnx) or params.npz")
    p.add_argument("--onnx", metavar="MODEL.onnx", help="the model the plan was compiled from")
    p.add_argument("--state-dict", metavar="MODEL.pt", default=None,
                   help="with -o params.npz: the original state dict of the PyTorch module (as simulate "
                   "--state-dict); writes it with the trained values in place, BatchNorms un-folded, for "
                   "module.load_state_dict (strict)")
    port_args(p)
    p.set_defaults(func=pull)


def _board(args):
    from .board import Board
    from .ports import find_board
    return Board(args.port or find_board(), baud=args.baud)


def _data(path, test=False):
    from ..datafiles import load_data
    d = load_data(path)
    if test and "x_test" in d.files and "y_test" in d.files:
        return d["x_test"], d["y_test"], "x_test/y_test"
    return d["x"], d["y"], "x/y"


def deploy(args):
    from ..plan import load_plan
    plan = load_plan(args.plan)
    with _board(args) as b, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        info = b.deploy(plan, romfs=args.romfs)
        t = info["trainer"]
        print("deployed %s to %s: plan %d bytes %s, RAM %d bytes (arena %d + parameters %d%s); board heap %d bytes "
              "free; plan format %d" % (args.plan, b.port, len(plan.data),
                                          "on ROMFS (in flash)" if info["plan"]["rom"] else "in a file",
                                          t["ram_bytes"], t["arena_bytes"], t["param_bytes"],
                                          "" if t.get("context_in_plan") else " + runtime context %d" % t["context_bytes"],
                                          info["mem_free"], info["format_version"]))
        for w in caught:
            print("warning: %s" % w.message, file=sys.stderr)


def train(args):
    from .training import Progress, train as run
    from ..curve import for_plot
    curve = for_plot(args.plot, "microtrain train %s" % os.path.basename(args.data))
    x, y, _ = _data(args.data)
    with _board(args) as b:
        plan = b.plan()
        ce = plan.loss == "cross-entropy"
        if curve:
            curve.metric = "running accuracy"

        def on_epoch(epoch, loss, acc):
            if curve:
                curve.add(epoch, loss, acc)
            line = "epoch %d: mean loss %.4f" % (epoch, loss)
            if acc is not None:
                line += ", running accuracy %.2f%% (each sample before training on it)" % (100 * acc)
            bar.write(line) if bar else print(line, flush=True)

        bar = None

        def progress(*a):
            nonlocal bar
            bar = Progress(*a)
            return bar

        out = run(b, x, y, epochs=args.epochs, seed=args.seed, resume=args.resume,
                  checkpoint_every=args.checkpoint_every, accuracy=not args.no_accuracy and ce,
                  progress=progress, on_epoch=on_epoch, log=lambda line: print(line, file=sys.stderr))
        print("trained %d samples (%d in this session, %.1f samples/s); the run is at sample %d of %d, "
              "checkpointed on the board; frames resent: %d"
              % (out["trained"], out["trained"], out["samples_per_s"], out["samples"], args.epochs * len(x),
                 out["stats"].resent))
    if curve:
        curve.save(args.plot)
        print("loss and running accuracy curve written to %s" % args.plot)


def evaluate(args):
    x, y, which = _data(args.data, test=True)
    with _board(args) as b:
        metric = b.evaluate(x, y)
        name = "accuracy" if b.plan().loss == "cross-entropy" else "mse"
        print("%s on %s %s (%d samples), on the board: %.4f" % (name, args.data, which, len(x), metric))


def pull(args):
    out = args.output
    if out.endswith(".onnx") and not args.onnx:
        raise DataError("writing %s needs the model the plan was compiled from: add --onnx MODEL.onnx "
                        "(or write the parameters to a .npz)" % out)
    if not out.endswith((".onnx", ".npz")):
        raise DataError("-o must name a .onnx or a .npz file, not %s" % out)
    reference = None
    if args.state_dict:
        if not out.endswith(".npz"):
            raise DataError("--state-dict writes a PyTorch state dict: give it with -o params.npz, not %s" % out)
        from ..unfold import load_reference
        reference = load_reference(args.state_dict)
    with _board(args) as b:
        params = b.params()
        plan = b.plan()
    if reference is not None:
        from ..unfold import state_dict
        np.savez(out, **state_dict(plan, params, reference))
        print("wrote the state dict of %s with the %d trained parameters in place, BatchNorms un-folded, to %s"
              % (args.state_dict, len(params), out))
        return
    if out.endswith(".npz"):
        np.savez(out, **params)
    else:
        plan.export(params, args.onnx, out)
    print("wrote %d trained parameters (%s) to %s" % (len(params), ", ".join(sorted(params)), out))
