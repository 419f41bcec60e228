"""Training steps on a Raspberry Pi Pico (rp2040js) with the plan's constants in its flash (ROMFS).

Builds a ROMFS image of the plan, its inputs and labels (microtrain.romfs), boots the RPI_PICO
firmware with a ROMFS partition (`make firmware-pico-romfs`: 1280 KB at 0x10080000) in rp2040js
with the image written at the partition (tests/device/rp2040js/pico.py), opens the plan and the inputs
from /rom (read in place through XIP, not copied into the heap), runs N training steps and
prints: plan bytes and ROMFS partition bytes; gc.mem_free() before and after Trainer(); ram_bytes
from the plan; the heap in use after the steps (peak: a step allocates only its Python objects);
the emulated time of a step (time.ticks_us() on the device: the RP2040 timer, which rp2040js
advances by 8 ns per executed cycle, a 125 MHz clock; flash reads cost what RAM reads cost there:
rp2040js does not model the XIP cache); host wall time; and the losses and parameters against the
host simulator's (bit for bit, or the largest difference).

    python benchmarks/pico_romfs.py PLAN.mtp [--steps 2]
    python benchmarks/pico_romfs.py --model mcunet-5fps --scheme 49kb [--int8-scope frozen] [--steps 2]
    python benchmarks/pico_romfs.py --model mcunet-5fps --update last-layer
    python benchmarks/pico_romfs.py --model mcunet-5fps --scheme 49kb --board RP2040_4MB_ROMFS
    python benchmarks/pico_romfs.py --model mcunet-5fps --scheme 148kb --input-in-place

With --model, the plan is compiled as benchmarks/tte.py compiles it (MIT's network and scheme
from shared/models/tte, frozen part int8 calibrated on benchmarks/calibration.py's crops, uint8
pixel input, saved="bits", frozen and trained conv weights int8) and the inputs are further crops; with a plan file, the inputs are
seeded random values of the plan's input type. A plan too big for the partition is an error
that says by how many bytes.
"""
import argparse
import os
import sys
import time

import numpy as np

import microtrain

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "device", "rp2040js"))
import pico  # noqa: E402
sys.path.pop(0)


def compile_model(model, scheme, update, calibration, int8_scope, lr, momentum, frozen_weights="int8",
                  trained_weights="int8", input_in_place=False):
    from bench_models import tte_dir
    from calibration import int8_options, samples
    d = tte_dir()
    if d is None:
        raise SystemExit("shared/models/tte not found (set MICROTRAIN_TTE)")
    images = samples(calibration + 8, 128)
    how = dict(update=update) if update else dict(update=os.path.join(d, model + ".schemes.json"), scheme=scheme)
    # in place: int8 pixels read where they are, the ROMFS file, not in the arena
    q = int8_options(images[:calibration], "int8" if input_in_place else "uint8")
    plan = microtrain.compile(os.path.join(d, model + ".onnx"), **how, lr=lr, momentum=momentum, saved="bits",
                              int8_scope=int8_scope, frozen_weights=frozen_weights, trained_weights=trained_weights,
                              input_in_place=input_in_place, **q)
    return plan, images[calibration:]


def inputs(sim, steps, images=None, seed=0):
    """(x as the plan takes it, back to back, bytes per sample, labels)."""
    rng = np.random.default_rng(seed)
    n = min(steps, 8)
    if images is not None:
        x = sim.quantize_input(images[:n])
    elif sim.input_dtype == "float32":
        x = rng.standard_normal((n,) + sim.input_shape).astype(np.float32)
    else:
        lo, hi = (-128, 127) if sim.input_dtype == "int8" else (0, 255)
        x = rng.integers(lo, hi + 1, (n,) + sim.input_shape).astype(sim.input_dtype)
    classes = int(np.prod(sim.output_shape))
    return x, x[0].nbytes, [int(v) for v in rng.integers(0, classes, n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plan", nargs="?", help="a plan (.mtp); or --model and --scheme")
    ap.add_argument("--model", help="a network of shared/models/tte, e.g. mcunet-5fps")
    ap.add_argument("--scheme", default="49kb", help="a scheme of the model's .schemes.json (default 49kb)")
    ap.add_argument("--update", help="compile(update=...) instead of a scheme: last-layer, bias, last:K, names")
    ap.add_argument("--int8-scope", choices=("prefix", "frozen"), default="prefix",
                    help="compile(int8_scope=...): int8 only before the first trained layer, or every frozen layer")
    ap.add_argument("--calibration", type=int, default=32, help="calibration images (--model)")
    ap.add_argument("--frozen-weights", choices=("float32", "int8"), default="int8",
                    help="frozen conv weights of float layers (--model; compile(frozen_weights=...), as tte.py)")
    ap.add_argument("--trained-weights", choices=("float32", "int8"), default="int8",
                    help="trained conv/Gemm weights (--model; compile(trained_weights=...), as tte.py)")
    ap.add_argument("--input-in-place", action="store_true",
                    help="--model: int8 pixels read in place from the ROMFS file (compile(input_in_place=True)), "
                    "not copied into the arena")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--board", default=pico.BOARD,
                    help="the firmware's board definition in firmware/rp2/ (default RPI_PICO_ROMFS, the Pico; "
                    "RP2040_4MB_ROMFS: an RP2040 with 4 MB of flash)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds of host time to wait for a step's output")
    ap.add_argument("--save", metavar="PLAN.mtp", help="also write the compiled plan here (--model)")
    args = ap.parse_args()
    if bool(args.plan) == bool(args.model):
        ap.error("give a plan file or --model (not both)")
    why = pico.missing(args.board)
    if why:
        print("cannot run the Pico here: %s" % why, file=sys.stderr)
        return 2

    t = time.time()
    if args.model:
        plan, images = compile_model(args.model, args.scheme, args.update, args.calibration, args.int8_scope, args.lr,
                                     args.momentum, args.frozen_weights, args.trained_weights, args.input_in_place)
        print("plan: %s %s (int8_scope %s), compiled in %.0f s" % (args.model, args.update or "scheme " + args.scheme,
                                                                 args.int8_scope, time.time() - t))
        if args.save:
            plan.save(args.save)
    else:
        plan, images = microtrain.load_plan(args.plan), None
        print("plan: %s" % args.plan)
    r = plan.report()
    sim = microtrain.Simulator(plan)
    x, stride, ys = inputs(sim, args.steps, images)
    image = pico.image(plan.data, x.tobytes(), ys)
    lay = pico.pico_romfs.layout(args.board)
    print("plan %d bytes (constants %d, of them int8 %s); ROMFS image %d bytes (the plan, %d inputs of %d bytes, "
          "labels); %s's partition %d bytes at 0x%08x: %s"
          % (len(plan.data), r["const_bytes"], r.get("const_int8_bytes", "?"), len(image), len(ys), stride, args.board,
             lay["romfs_bytes"], lay["romfs_addr"], "fits, %d bytes to spare" % (lay["romfs_bytes"] - len(image))
             if len(image) <= lay["romfs_bytes"] else "%d bytes too big" % (len(image) - lay["romfs_bytes"])))
    try:
        pico.fits(len(image), args.board)
    except ValueError as e:
        over = len(plan.data) - lay["romfs_bytes"]
        print("error: %s%s" % (e, "; the plan alone is %d bytes more than the partition" % over if over > 0 else ""),
              file=sys.stderr)
        return 1

    host_losses = [np.float32(sim.step(x[s % len(ys)], ys[s % len(ys)])) for s in range(args.steps)]
    host_params = {k: np.ascontiguousarray(v, "<f4").reshape(-1) for k, v in sim.params().items()}

    import tempfile
    with tempfile.TemporaryDirectory() as work:
        t = time.time()
        got, _ = pico.train(plan.data, x.tobytes(), ys, args.steps, work, stride=stride,
                            floats=sim.input_dtype == "float32", board=args.board, timeout=args.timeout)
        wall = time.time() - t

    print("heap: %d bytes; gc.mem_free() %d before Trainer(), %d after (grew %d); ram_bytes %d (arena %d, "
          "trainable state %d, context %d%s)" % (got["heap_total"], got["free_before"], got["free_after"],
                                                got["grew"], got["ram_bytes"], r["arena_bytes"], r["param_bytes"],
                                                r["context_ram_bytes"],
                                                "; its %d B read from the plan in flash" % r["context_bytes"]
                                                if r["context_in_plan"] else ""))
    print("peak heap in use: %d of %d bytes (%d free at the least)" % (got["peak_alloc"], got["heap_total"],
                                                                     got["heap_total"] - got["peak_alloc"]))
    us = [s["us"] for s in got["steps"]]
    print("emulated time per step (125 MHz): %s ms; host wall time %.1f s for boot and %d steps"
          % (", ".join("%.1f" % (u / 1000) for u in us), wall, args.steps))
    losses = [np.frombuffer(s["loss"], np.float32)[0] for s in got["steps"]]
    same = [a.tobytes() == b.tobytes() for a, b in zip(losses, host_losses)]
    print("losses: Pico %s, host %s: %s" % ([float(v) for v in losses], [float(v) for v in host_losses],
                                           "bit-identical" if all(same) else "differ"))
    host_out = np.ascontiguousarray(sim.predict(x[0]), "<f4").reshape(-1)
    out = np.frombuffer(got["predict"], np.float32)
    print("outputs for the first input after the steps: %s" % (
        "bit-identical to the host simulator's" if out.tobytes() == host_out.tobytes()
        else "largest difference %.3g" % float(np.abs(out - host_out).max())))
    if got["params"] is None:
        print("parameters: not read back: t.params() copies all %d bytes of them, %d bytes of heap were free"
              % got["params_short"])
        return 0
    worst, identical = 0.0, True
    for k, v in host_params.items():
        p = np.frombuffer(got["params"][k], np.float32)
        identical &= p.tobytes() == v.tobytes()
        worst = max(worst, float(np.abs(p - v).max() / max(1.0, float(np.abs(v).max()))))
    print("parameters (%d tensors): %s" % (len(host_params), "bit-identical to the host simulator's" if identical
                                         else "largest relative difference %.3g" % worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
