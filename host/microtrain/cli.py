"""The microtrain command: compile, report, simulate, export; deploy, train, eval, pull
(device/commands.py).

Every error a user can cause ends in one line on stderr, "microtrain CMD: error: ...",
naming the file, array or option, the offending value and what to do, and exit
status 2; never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from .datafiles import load_data, load_npz, writable as _writable


def _compile(args):
    from .compiler import compile
    from .options import CompileOptions
    _writable(args.output, "-o")
    calibration = _calibration(args.calibration) if args.calibration else None
    if args.quantize and calibration is None:
        raise ValueError("--quantize int8 needs --calibration CALIB.npz: typical inputs (array x, samples first) "
                         "to set the int8 scales from")
    if calibration is not None and not args.quantize:
        raise ValueError("--calibration %s is read only by --quantize int8 (it sets the int8 scales): add "
                         "--quantize int8, or leave --calibration out" % args.calibration)
    options = CompileOptions(
        update=args.update, scheme=args.scheme, loss=args.loss, lr=args.lr, momentum=args.momentum,
        weight_decay=args.weight_decay, batch=args.batch, planner=args.planner, clip_grad=args.clip_grad,
        quantize=args.quantize, calibration=calibration, input_dtype=args.input_dtype, int8_scope=args.int8_scope,
        saved=args.saved, int8_fuse=args.int8_fuse, frozen_weights=args.frozen_weights,
        trained_weights=args.trained_weights, recompute=args.recompute, input_in_place=args.input_in_place)
    board = None
    if args.board:
        from .boards import load_board
        board = load_board(args.board)
    if args.stream_window is not None and args.constants == "resident":
        raise ValueError("--stream-window sizes the windows of streamed constants: give it without --constants "
                         "resident")
    # where the constants go: a stream section for a board that reads them from the plan's file
    # (boards.wants_stream: no ROMFS and a plan not small beside its heap), or resident
    stream = args.constants == "stream" or (args.constants == "auto" and args.stream_window is not None)
    resident = None
    if args.constants == "auto" and board is not None and args.stream_window is None:
        from .boards import ram_needed, wants_stream
        if args.budget is not None:   # the search counts the plans as this board will hold them
            stream = not board["romfs"].get("available")
        else:   # streamed, unless the plan is small beside the heap or streaming needs more of it
            resident = compile(args.model, options)
            stream = wants_stream(resident.report(), board)
    options = CompileOptions.of(options, stream=stream, stream_window=args.stream_window)
    if args.budget is not None:
        if args.update != "last-layer" or args.scheme:
            raise ValueError("--budget chooses what trains: give it without --update/--scheme")
        from .budget import choose
        probe = None
        if args.budget_probe:
            d = load_data(args.budget_probe, "--budget-probe")
            probe = (d["x"], d["y"])
        rest = {k: v for k, v in options.asdict().items() if k not in ("update", "scheme")}
        scheme, plan = choose(args.model, args.budget, log=lambda line: print("budget: " + line, flush=True),
                              probe=probe, probe_epochs=args.probe_epochs, board=board, **rest)
        print("budget: scheme " + json.dumps(scheme))
    else:
        if args.budget_probe:
            raise ValueError("--budget-probe chooses among the schemes a budget fits: give it with --budget")
        plan = compile(args.model, options)
        if resident is not None and stream and \
                sum(ram_needed(resident.report(), board).values()) < sum(ram_needed(plan.report(), board).values()):
            plan = resident   # an op's constants too large for a window: whole in RAM needs less
    fit = _board_check(plan.report(), args.board)   # a plan that does not fit is not written
    plan.save(args.output)
    r = plan.report()
    print("wrote %s: %d bytes, %d ops, arena %d B (naive %d B), parameters and optimizer state %d B, "
          "constants %d B" % (args.output, r["plan_bytes"], r["ops"], r["arena_bytes"], r["naive_bytes"],
                              r["param_bytes"], r["const_bytes"]))
    if r["input_in_place"]:
        print("input: %d B read in place where the caller keeps it (not in the arena)" % r["input_bytes"])
    if r["streamed"]:
        print("stream: constants %d B in the stream section, %d groups, windows of up to %d B in the arena; "
              "a board opening the file keeps the %d B head in RAM and reads %d B a training step"
              % (r["stream_bytes"], r["groups"], r["window_bytes"], r["head_bytes"], r["read_per_step"]))
    for note in r["notes"]:
        print("note: " + note)
    for line in fit:
        print("board: " + line)


def _calibration(path):
    """The calibration samples of an .npz: its array x, or its only array."""
    d = load_npz(path, "--calibration")
    if "x" in d.files:
        return d["x"]
    if len(d.files) == 1:
        return d[d.files[0]]
    raise ValueError("--calibration %s holds %s; give the samples as array x (samples first)" % (path, d.files))


def _romfs(args):
    from .romfs import build_from_paths
    _writable(args.output, "-o")
    image = build_from_paths(args.files)
    with open(args.output, "wb") as f:
        f.write(image)
    print("wrote %s: %d bytes, every file 8-byte aligned; put it on the board with: mpremote romfs deploy %s"
          % (args.output, len(image), args.output))


def _board_check(report, board):
    if not board:
        return []
    from . import boards
    return boards.check(report, boards.load_board(board))


def _boards(args):
    from .boards import print_boards
    print_boards(as_json=args.json)


def _flash(args):
    from .boards import flash
    flash(args.board, port=args.port, image=args.image, dry_run=args.dry_run)


def _kb(n):
    return "%.1f KB" % (n / 1024) if n >= 1024 else "%d B" % n


def print_report(r, out=sys.stdout, tensors=True):
    w = out.write
    w("plan            %s\n" % _kb(r["plan_bytes"]))
    w("RAM (peak)      %s  = arena %s + parameters/optimizer %s + context %s\n"
      % (_kb(r["peak_ram_bytes"]), _kb(r["arena_bytes"]), _kb(r["param_bytes"]), _kb(r["context_ram_bytes"])))
    if r["context_in_plan"]:
        w("                (the context, %s, is read in place from the plan: flash on a board)\n"
          % _kb(r["context_bytes"]))
    w("flash           %s  = the plan read in place (constants %s%s), plus the module's code\n"
      % (_kb(r["flash_bytes"]), _kb(r["const_bytes"]),
         ", %s of them int8" % _kb(r["const_int8_bytes"]) if r["const_int8_bytes"] else ""))
    if r["input_dtype"] != "float32" or r["input_in_place"]:
        w("input           %s%s\n" % (r["input_dtype"], ", %s read in place where the caller keeps it (not in RAM above)"
                                     % _kb(r["input_bytes"]) if r["input_in_place"] else ""))
    if r["streamed"]:
        w("streamed        %s  = arena %s + parameters/optimizer %s + context %s + the plan's head %s: the RAM\n"
          "                of a board that opens the plan's file; its constants (stream section %s, %d groups,\n"
          "                windows of up to %s in the arena) read a group at a time, %s a training step\n"
          % (_kb(r["file_ram_bytes"]), _kb(r["arena_bytes"]), _kb(r["param_bytes"]), _kb(r["context_bytes"]),
             _kb(r["head_bytes"]), _kb(r["stream_bytes"]), r["groups"], _kb(r["window_bytes"]),
             _kb(r["read_per_step"])))
    else:
        w("read into RAM   %s  = RAM above + the whole plan (a board without ROMFS; compile --constants stream\n"
          "                to read its constants from the file instead)\n" % _kb(r["file_ram_bytes"]))
    w("arena           %s planned, %s naive (all tensors alive), %s peak live\n"
      % (_kb(r["arena_bytes"]), _kb(r["naive_bytes"]), _kb(r["peak_live_bytes"])))
    w("constants       %s (frozen, may stay in flash)\n" % _kb(r["const_bytes"]))
    w("MACs per step   %d\n" % r["macs_per_step"])
    w("ops             %d (%s)\n" % (r["ops"], ", ".join("%s %d" % kv for kv in r["ops_by_phase"].items())))
    w("training        update=%s loss=%s batch=%d lr=%g momentum=%g weight_decay=%g\n"
      % (r["update"], r["loss"], r["batch"], r["lr"], r["momentum"], r["weight_decay"]))
    w("trainable       %s\n" % (", ".join(r["trainable"]) or "nothing (an inference-only plan, --update none)"))
    for note in r["notes"]:
        w("note            %s\n" % note)
    if tensors:
        w("\n%-40s %-6s %9s %9s %11s\n" % ("tensor", "where", "bytes", "offset", "ops"))
        for t in r["tensors"]:
            span = "%d-%d" % (t["first"], t["last"]) if t["first"] >= 0 else "-"
            w("%-40s %-6s %9d %9d %11s\n" % (t["name"][:40], t["storage"], t["bytes"], t["offset"], span))


def _report(args):
    from .plan import load_plan
    if args.svg:
        _writable(args.svg, "--svg")
    from .peak import alive_at_peak
    plan = load_plan(args.plan)
    r = plan.report()
    fit = _board_check(r, args.board)
    if args.svg:
        from .svg import arena_svg
        with open(args.svg, "w") as f:
            f.write(arena_svg(r))
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print_report(r)
        a = alive_at_peak(plan)   # what bounds the arena: the op with the most live bytes, and those tensors
        print("arena peak      %s live at op %d %s (%s): %s" % (
            _kb(a["live_bytes"]), a["op"], a["op_name"], a["phase"].lower(),
            ", ".join("%s %s" % (n, _kb(b)) for n, b, _, _, _ in a["tensors"])))
        split = plan.meta.get("split", {})
        for name, c in sorted(plan.meta.get("channels", {}).items()):
            print("channels        %s: %d %s channels of %d%s" % (
                name, len(c["channels"]), "input" if c["axis"] == 1 else "output",
                plan.meta["params"][name]["shape"][c["axis"]],
                ", their own parameter %s (the rest constant)" % split[name]["slice"] if name in split else ""))
        if args.svg:
            print("\narena picture written to %s" % args.svg)
        for line in fit:
            print("board           %s" % line)


def _simulate(args):
    from .plan import load_plan
    from .simulator import Simulator, TrainingDiverged
    if args.save_params:
        _writable(args.save_params, "--save-params")   # before training, which would otherwise be lost
    from .curve import for_plot
    curve = for_plot(args.plot, "microtrain simulate %s" % os.path.basename(args.plan))
    reference = None
    if args.state_dict:
        if not args.save_params:
            raise ValueError("--state-dict %s is read only by --save-params (the state dict it writes starts from "
                             "it): add --save-params FILE.npz, or leave --state-dict out" % args.state_dict)
        from .unfold import load_reference
        reference = load_reference(args.state_dict)
    plan = load_plan(args.plan)
    sim = Simulator(plan)
    initial = sim.params()
    if reference is not None:   # the state dict maps onto the plan: checked before training, not after
        from .unfold import state_dict
        state_dict(plan, initial, reference, initial)
    if args.lr is not None:
        sim.lr = args.lr
    d = load_data(args.data)
    where = lambda e: ValueError("--data %s: %s" % (args.data, e))   # noqa: E731
    try:
        x, y = sim.check_data(d["x"], d["y"], ("x", "y"))
        test = sim.check_data(d["x_test"], d["y_test"], ("x_test", "y_test")) if "x_test" in d.files else None
    except ValueError as e:
        raise where(e) from None
    xt, yt = test if test is not None else (x, y)
    held = "held-out test set" if test is not None else "training data"
    metric = "accuracy" if plan.loss == "cross-entropy" else "mse"
    print_report(plan.report(), tensors=False)
    if args.lr is not None:
        print("lr              %g (--lr; the plan says %g)" % (sim.lr, plan.header["lr"]))
    print()
    before = sim.evaluate(xt, yt)
    print("%s before training (%s, %d samples): %.4f" % (metric, held, len(xt), before))
    if curve:
        curve.metric = "%s (%s)" % (metric, held)
        curve.add(0, value=before)

    if not plan.report()["trainable"]:   # --update none: nothing to train, the accuracy above is the answer
        print("nothing to train: the plan is inference-only (compiled with --update none); recompile with another "
              "--update to train it")
        return

    def epoch_done(e, loss):
        line = "epoch %d/%d: mean loss %.4f" % (e, args.epochs, loss)
        value = sim.evaluate(xt, yt) if test is not None else None
        if test is not None:
            line += ", held-out %s %.4f" % (metric, value)
        if curve:
            curve.add(e, loss, value)
        print(line, flush=True)

    try:
        sim.fit(x, y, epochs=args.epochs, seed=args.seed, on_epoch=epoch_done)
    except TrainingDiverged as e:
        raise TrainingDiverged(e.epoch, e.sample, e.k, e.lr, e.detail, "lower --lr (now %g)") from None
    after = sim.evaluate(xt, yt)
    print("%s after %d epochs (%d steps): %.4f" % (metric, args.epochs, sim.steps, after))
    if curve:
        if test is None:
            curve.add(args.epochs, value=after)
        curve.save(args.plot)
        print("loss and %s curve written to %s" % (metric, args.plot))
    if reference is not None:
        state = state_dict(plan, sim.params(), reference, initial)
        np.savez(args.save_params, **state)
        print("PyTorch state dict written to %s: %s with the trained parameters in place, BatchNorms un-folded "
              "(module.load_state_dict takes it)" % (args.save_params, args.state_dict))
    elif args.save_params:
        np.savez(args.save_params, **sim.params())
        print("trained parameters written to %s, by ONNX initializer name (for a model whose BatchNorm was folded "
              "into a conv, --state-dict writes PyTorch's state dict instead)" % args.save_params)


def _export(args):
    from .plan import load_plan
    _writable(args.output, "-o")
    plan = load_plan(args.plan)
    params = load_npz(args.params, "--params")
    plan.export({k: params[k] for k in params.files}, args.onnx, args.output)
    print("wrote %s: %s with the %d trained parameters of %s" % (args.output, args.onnx, len(params.files),
                                                                 args.params))


def _whole(lo):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
        if v < lo:
            raise argparse.ArgumentTypeError("%d is below %d" % (v, lo))
        return v
    parse.__name__ = "whole number"
    return parse


def _number(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not np.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError("%r: must be a finite number >= 0" % text)
    return v


_number.__name__ = "number"


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error."""

    def error(self, message):
        self.exit(2, "%s: error: %s (see %s --help)\n" % (self.prog, message, self.prog))


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown where there is one."""

    def _get_help_string(self, action):
        if action.required or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return action.help
        if "(default" in action.help or (action.nargs == 0 and action.default is True):
            return action.help   # it says its default in its own words, or it is a --no-X switch
        return super()._get_help_string(action)


def parser():
    from .version import __version__
    from . import format as F
    fmt = _Help
    p = _Parser(prog="microtrain", formatter_class=fmt,
                                description="Train neural networks on microcontrollers: compile an ONNX model "
                                "into a training plan, inspect it, train it on the host with the device's C core, "
                                "and export the trained model.")
    p.add_argument("--version", action="version",
                   version="microtrain %s (plan format version %d)" % (__version__, F.VERSION))
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)
    c = sub.add_parser("compile", help="compile an ONNX model into a training plan (.mtp)", formatter_class=fmt,
                       description="Compile an ONNX model into a training plan (.mtp).")
    c.add_argument("model", help="ONNX model file (torch.onnx.export, either exporter)")
    c.add_argument("-o", "--output", required=True, metavar="PLAN.mtp", help="plan file to write")
    c.add_argument("--update", default="last-layer",
                   help="what trains: last-layer, bias (every bias), last:K (the last K layers), full, none (an "
                   "inference-only plan), a JSON file listing initializer names, or a MIT sparse-update scheme "
                   "(JSON: one entry of a *.schemes.json `schemes` list, or the whole file with --scheme)")
    c.add_argument("--saved", choices=["float32", "int8", "bits"], default="float32",
                   help="int8: keep the ReLU6 outputs the backward reads as int8 (a quarter of the bytes; as an "
                   "int8 model, outputs within half a step of the clamp pass no gradient); bits: keep only the "
                   "ReLU/ReLU6 masks, 1 bit per element, gradients exact. docs/sparse.md")
    c.add_argument("--trained-weights", choices=["float32", "int8"], default="float32",
                   help="int8: keep the trainable conv/Gemm weights as int8 codes with a float scale per output "
                   "channel, updated with the float gradient and rounded to nearest (biases stay float32). "
                   "docs/sparse.md")
    c.add_argument("--budget", metavar="SIZE", default=None,
                   help="choose what trains so that peak RAM fits SIZE (e.g. 200KB): the classifier, the biases "
                   "of the last convs, then input-channel fractions of their weights (docs/sparse.md)")
    c.add_argument("--budget-probe", metavar="DATA.npz", default=None,
                   help="with --budget: labelled samples of a proxy task (x, y), not the user's own data; each "
                   "scheme that fits trains on 4/5 of them in the simulator and the lowest loss on the rest wins")
    c.add_argument("--probe-epochs", type=int, default=2, help="epochs of each --budget-probe training")
    c.add_argument("--scheme", metavar="NAME", default=None,
                   help="the scheme of a *.schemes.json --update file to use (for example 49kb); docs/sparse.md")
    c.add_argument("--loss", default="cross-entropy", choices=["cross-entropy", "mse"],
                   help="cross-entropy (softmax fused; integer labels) or mse (float targets shaped like the output)")
    c.add_argument("--lr", type=_number, default=0.01, help="learning rate of SGD")
    c.add_argument("--momentum", type=_number, default=0.0, help="SGD momentum, in [0, 1)")
    c.add_argument("--weight-decay", type=_number, default=0.0, help="L2 weight decay, as torch.optim.SGD")
    c.add_argument("--batch", type=_whole(1), default=1,
                   help="samples per update; 1 updates after every sample and stores no gradient")
    c.add_argument("--clip-grad", type=_number, default=None, metavar="NORM",
                   help="clip each batch's gradient to this L2 norm over all trainable parameters before the "
                   "update (torch.nn.utils.clip_grad_norm_); a batch with a non-finite gradient is skipped")
    c.add_argument("--planner", default="search", choices=["search", "greedy", "naive"],
                   help="arena memory: search (default) shares memory between tensors not alive together, "
                   "placed as TFLite Micro's greedy planner does or in a searched order where that leaves "
                   "gaps; greedy is TFLite Micro's placement alone; naive gives every tensor its own (for debugging)")
    c.add_argument("--board", metavar="NAME", help="check the plan fits this board (microtrain boards); "
                   "fail, writing nothing, if it does not. With --constants auto, it also decides where the "
                   "plan's constants live; with --budget, plans are counted as its heap would hold them")
    c.add_argument("--constants", choices=["auto", "resident", "stream"], default="auto",
                   help="stream: put the frozen constants in a stream section, in the order the ops read them, so "
                   "that a board opening the plan's file keeps only the rest in RAM and reads each op's "
                   "constants into a window in the arena just before the op (docs/plan-format.md, Streaming); "
                   "resident: no stream section (the plan read in place from ROMFS, or whole into RAM); "
                   "auto: stream for a --board without ROMFS whose heap the plan is not small beside, else resident")
    c.add_argument("--stream-window", type=_whole(256), default=None, metavar="BYTES",
                   help="with streamed constants: the most bytes an op reads into its window at once (an "
                   "expansion block's constants over it are read in blocks of channels); default: the size "
                   "that needs the least RAM")
    c.add_argument("--quantize", choices=["int8"], default=None,
                   help="quantize the frozen part to int8 after training (needs --calibration); a QDQ model "
                   "(onnxruntime quantize_static) runs int8 without it. docs/quantization.md")
    c.add_argument("--calibration", metavar="CALIB.npz", default=None,
                   help="typical inputs (array x, samples first) from which --quantize sets the int8 scales")
    c.add_argument("--input-dtype", default="float32", choices=["float32", "int8", "uint8"],
                   help="what the board passes as input: float32, or int8/uint8 values of an int8 model's input "
                   "quantization (4x less RAM for an image)")
    c.add_argument("--int8-scope", default="prefix", choices=["prefix", "frozen"],
                   help="prefix: int8 up to the first trainable layer; frozen: every frozen layer int8, gradients "
                   "pass through them")
    c.add_argument("--no-int8-fuse", dest="int8_fuse", action="store_false",
                   help="keep every frozen int8 conv an op of its own (by default a conv, depthwise conv and 1x1 "
                   "conv run as one CONV_DW_PW_Q8 op, a 1x1 conv and depthwise conv as one PWDW_Q8 op, which "
                   "never store the tensors between them: the same numbers, less RAM)")
    c.add_argument("--input-in-place", action="store_true",
                   help="read each sample where the caller keeps it (on a board, a file in flash or ROMFS read as "
                   "a memoryview) instead of copying it into the arena: peak RAM leaves the input out; float32 or "
                   "int8 input (a uint8 one needs a copy: give --input-dtype int8, pixel - 128)")
    c.add_argument("--no-recompute", dest="recompute", action="store_false",
                   help="keep every activation the backward reads from the forward to its backward (by default "
                   "forward ops run again in the backward where that lowers the arena: the same numbers, at most "
                   "one more forward's work a step)")
    c.add_argument("--frozen-weights", default="float32", choices=["float32", "int8"],
                   help="int8: store the frozen conv weights of float layers (a trained bias's layer, the frozen "
                   "part of a split weight) as int8 with per-output-channel scales, a quarter of their flash; "
                   "the layers compute in float on the dequantized weights (docs/quantization.md)")
    c.set_defaults(func=_compile)
    rf = sub.add_parser("romfs", help="a ROMFS image of plans for the board's flash (mpremote romfs deploy)",
                        formatter_class=fmt, description="A ROMFS image holding plans (and any other files) with "
                        "every file 8-byte aligned, so a Trainer reads its plan in place from flash.")
    rf.add_argument("files", nargs="+", help="plan files, or directories of files")
    rf.add_argument("-o", "--output", required=True, metavar="IMAGE.romfs", help="image file to write")
    rf.set_defaults(func=_romfs)
    r = sub.add_parser("report", help="memory and compute report of a plan", formatter_class=fmt,
                       description="Memory and compute report of a plan.")
    r.add_argument("plan", help="plan file (.mtp) from microtrain compile")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    r.add_argument("--svg", metavar="FILE.svg", help="also draw the arena over time as SVG into this file")
    r.add_argument("--board", metavar="NAME", help="check the plan fits this board (microtrain boards)")
    r.set_defaults(func=_report)
    s = sub.add_parser("simulate", help="train a plan on the host with the device's C core", formatter_class=fmt,
                       description="Train a plan on the host with the device's own C core, and measure it.")
    s.add_argument("plan", help="plan file (.mtp) from microtrain compile")
    s.add_argument("--data", required=True, metavar="DATA.npz",
                   help=".npz with x (float32, samples first) and y (class labels, or float targets for mse); "
                   "optional x_test, y_test to measure on after each epoch")
    s.add_argument("--epochs", type=_whole(1), default=1, help="passes over the data")
    s.add_argument("--lr", type=_number, default=None, help="learning rate for this run (default: the plan's)")
    s.add_argument("--seed", type=int, default=0, help="seed of the shuffle of each epoch")
    s.add_argument("--save-params", metavar="FILE.npz", default=None,
                   help="write the trained parameters, by ONNX initializer name (what microtrain export reads); "
                   "with --state-dict, the whole PyTorch state dict instead")
    s.add_argument("--state-dict", metavar="MODEL.pt", default=None,
                   help="with --save-params: the original state dict of the PyTorch module the ONNX came from "
                   "(torch.save(module.state_dict(), ...), or an .npz of it); --save-params then writes it with "
                   "the trained values in place and every BatchNorm folded into a conv un-folded, for "
                   "module.load_state_dict (strict)")
    s.add_argument("--plot", metavar="CURVE.png", default=None,
                   help="also draw the mean loss of each epoch and the accuracy (or mse) before training and "
                   "after each epoch as a PNG (needs matplotlib)")
    s.set_defaults(func=_simulate)
    e = sub.add_parser("export", help="write the ONNX model with trained parameters in place", formatter_class=fmt,
                       description="Write the ONNX model the plan came from with trained parameters in place.")
    e.add_argument("plan", help="plan file (.mtp) the parameters were trained with")
    e.add_argument("--params", required=True, metavar="PARAMS.npz", help="trained parameters (simulate --save-params)")
    e.add_argument("--onnx", required=True, metavar="MODEL.onnx", help="the model the plan was compiled from")
    e.add_argument("-o", "--output", required=True, metavar="TRAINED.onnx", help="ONNX file to write")
    e.set_defaults(func=_export)
    b = sub.add_parser("boards", help="list the supported boards and their memory budgets", formatter_class=fmt,
                       description="List the board profiles (core, FPU, SRAM, flash, free heap, .mpy architecture, "
                       "MicroPython port, ROMFS, status); give a name to compile --board, report --board and "
                       "flash --board.")
    b.add_argument("--json", action="store_true", help="print the profiles as JSON")
    b.set_defaults(func=_boards)
    f = sub.add_parser("flash", help="write a board's firmware (make firmware BOARD=NAME) with its family's tool",
                       formatter_class=fmt, description="Write the MicroPython firmware with microtrain built in "
                       "(make firmware BOARD=NAME) to a board with its family's tool: esptool, UF2 copy or "
                       "picotool, dfu-util or st-flash.")
    f.add_argument("--board", required=True, metavar="NAME", help="board profile to flash (microtrain boards)")
    f.add_argument("--port", help="serial port of the board (esptool needs it)")
    f.add_argument("--image", help="firmware image to write (default: build/firmware/NAME/<image>)")
    f.add_argument("--dry-run", action="store_true", help="print the flashing command, run nothing")
    f.set_defaults(func=_flash)
    from .device.commands import add_arguments as add_board_commands
    add_board_commands(sub, fmt)     # deploy, train, eval, pull: microtrain.device.commands
    from .fleet.commands import add_arguments as add_fleet_commands
    add_fleet_commands(sub, fmt)     # fleet: federated training on Flower, microtrain.fleet.commands
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    from .device.errors import DeviceError
    from .training import InternalError
    try:
        args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (microtrain report plan.mtp | head): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except InternalError as e:
        print("microtrain %s: %s" % (args.cmd, e), file=sys.stderr)
        return 3
    except (ValueError, TypeError, NotImplementedError, DeviceError) as e:
        print("microtrain %s: error: %s" % (args.cmd, e), file=sys.stderr)
        return 2
    except OSError as e:
        print("microtrain %s: error: %s" % (args.cmd, e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
