"""--budget: a sparse-update scheme chosen so that the plan's peak RAM fits a byte budget.

The rule (docs/sparse.md), in the order of MIT's schemes, every step measured on the compiled
plan (peak_ram_bytes: arena + trainable state, + the runtime context where it is not read in place
from the plan) with the compile options given:

1. the classifier (the last Gemm) trains whole; if that alone does not fit, the budget is refused
   with what the smallest plan needs;
2. biases of the last N convs: the largest N that fits (binary search; a bias reaches one layer
   deeper into the backward, so the cost grows with N);
3. weights of the non-depthwise convs among those N, from the last one back: each gets the largest
   fraction of its input channels among 1/8, 1/4, 1/2 and 1 (MIT's magnitude+ channels) that
   still fits, or nothing.

With probe data (probe=(x, y), labelled samples of a task like the user's: a proxy the host has,
not the user's own data, which stays on the board), the choice is by learning instead of by fit:
every N whose biases fit (step 2) gives a candidate, its weights filled as in step 3; each
candidate's plan trains probe_epochs epochs on the first 4/5 of the probe samples (shuffled with
seed 0) in the simulator, and the candidate with the lowest mean loss on the last fifth wins (the
smaller peak on a tie). MIT's paper measures each layer's contribution on a proxy task the same
way, then searches accuracy per byte.

Calibration ranges do not depend on what trains, so with quantize="int8" the search calibrates
once.

With a board (a boards.py profile; `--board` on the command line), each plan's RAM is counted as that
board's heap would hold it (boards.ram_needed: where its constants live there, in place, streamed from
the plan's file with its head in RAM, or the whole plan in RAM, and the Trainer object) instead of peak
RAM alone.
"""
from __future__ import annotations

import contextlib
import re

import numpy as np

RATIOS = (0.125, 0.25, 0.5, 1.0)
UNITS = {"": 1, "b": 1, "kb": 1024, "k": 1024, "kib": 1024, "mb": 1 << 20, "m": 1 << 20, "mib": 1 << 20}


def parse_bytes(text):
    """'96KB', '96K', '98304', '1.5MB' -> bytes (KB = 1024 bytes)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError("budget %r: give bytes, e.g. 96KB, 96K, 98304 or 1.5MB (KB = 1024 bytes)" % (text,))
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


@contextlib.contextmanager
def _calibrate_once():
    from . import quantize
    original, cache = quantize.calibrate, {}

    def cached(graph, samples, build_plan):
        key = (graph.fingerprint, id(samples))
        if key not in cache:
            cache[key] = original(graph, samples, build_plan)
        return dict(cache[key])
    quantize.calibrate = cached
    try:
        yield
    finally:
        quantize.calibrate = original


def choose(model, budget, log=None, probe=None, probe_epochs=2, board=None, **options):
    """(scheme dict, Plan) of the rule above for `model`; options go to microtrain.compile.
    probe: (x, y) labelled samples to choose by learning (module docstring). board: a board profile
    whose heap the plans are counted in (module docstring)."""
    from .compiler import compile as compile_plan
    from .onnx_frontend import import_onnx
    from .schemes import conv_layers
    budget = parse_bytes(budget)
    say = log or (lambda line: None)
    if probe is not None and (isinstance(probe_epochs, bool) or not isinstance(probe_epochs, int) or probe_epochs < 1):
        raise ValueError("probe_epochs must be a whole number >= 1, got %r" % (probe_epochs,))
    if probe is not None and (not isinstance(probe, (tuple, list)) or len(probe) != 2):
        raise ValueError("probe must be (x, y): labelled samples, got %s" % type(probe).__name__)
    what = "peak RAM" if board is None else "heap on %s" % board["name"]   # what the budget counts
    if board is None:
        def measure(r):
            return r["peak_ram_bytes"]
    else:
        from .boards import ram_needed

        def measure(r):
            return sum(ram_needed(r, board).values())
    graph = import_onnx(model, options.get("loss", "cross-entropy"))
    convs = conv_layers(graph)
    if not any(n.op == "gemm" for n in graph.layers()):
        raise ValueError("--budget needs a model whose last layer is a Gemm/MatMul classifier (it always trains)")
    tried = {}

    def cost(scheme):
        """(peak RAM, plan); (inf, None) for a scheme these options cannot compile (with uint8 input,
        a scheme that trains the first conv's bias leaves no int8 part to take it), which then
        counts as not fitting. The first scheme, the classifier alone, raises instead: then no
        scheme compiles and the options are at fault."""
        key = repr(scheme)
        if key not in tried:
            try:
                plan = compile_plan(model, update=scheme, **options)
            except ValueError as e:
                if not tried:
                    raise
                say("cannot compile biases of %d convs, weights %s with these options: %s"
                    % (len(scheme["bias_updates"]), [(w["conv_index"], w["ratio"]) for w in scheme["weight_updates"]],
                       e))
                tried[key] = (float("inf"), None)
            else:
                tried[key] = (measure(plan.report()), plan)
        return tried[key]

    def scheme_of(n_bias, weights):
        return {"scheme": "budget-%d" % budget, "classifier": "full",
                "bias_updates": [{"conv_index": k} for k in range(len(convs) - n_bias, len(convs))],
                "weight_updates": [{"conv_index": k, "ratio": r, "select": "magnitude+"} for k, r in weights]}

    with _calibrate_once():
        best = scheme_of(0, [])
        peak, plan = cost(best)
        say("classifier only: %s %d B" % (what, peak))
        if peak > budget:
            r = plan.report()
            raise ValueError("budget %d B is too small: the classifier alone needs %d B of %s (arena %d, "
                             "trainable state %d, context %d%s). Give at least that, or reduce the arena: an int8 "
                             "frozen part (--quantize int8 --calibration CALIB.npz), ReLU masks as bits (--saved "
                             "bits)"
                             % (budget, peak, "peak RAM" if board is None else "heap on " + board["name"],
                                r["arena_bytes"], r["param_bytes"], r["context_ram_bytes"],
                                "" if board is None else ", the plan's part: %s" % _placement_text(r, board)))
        def fill(n_bias):
            """Step 3 for the biases of the last n_bias convs: the weights, from the last conv back."""
            weights = []
            for k in reversed(range(len(convs) - n_bias, len(convs))):
                n = convs[k]
                if n.attrs.get("groups", 1) > 1:
                    continue
                fit = None
                for r in RATIOS:
                    p, _ = cost(scheme_of(n_bias, weights + [(k, r)]))
                    say("conv %d '%s' weight, ratio %g: %s" % (k, n.onnx_name, r, _fits(p, budget, what)))
                    if p > budget:
                        break
                    fit = r
                if fit is not None:
                    weights.append((k, fit))
            return weights

        if probe is None:
            lo, hi = 0, len(convs)   # largest N whose biases fit: lo fits, anything above hi does not
            while lo < hi:
                mid = (lo + hi + 1) // 2
                p, _ = cost(scheme_of(mid, []))
                say("biases of the last %d convs: %s" % (mid, _fits(p, budget, what)))
                lo, hi = (mid, hi) if p <= budget else (lo, mid - 1)
            n_bias = lo
            weights = fill(n_bias)
        else:
            scored = []
            for n in range(len(convs) + 1):
                p, _ = cost(scheme_of(n, []))
                say("biases of the last %d convs: %s" % (n, _fits(p, budget, what)))
                if p > budget:
                    continue
                w = fill(n)
                peak, plan = cost(scheme_of(n, w))
                loss = probe_loss(plan, probe, probe_epochs)
                say("candidate: biases of the last %d convs, weights %s: %s %d B, probe loss %.4f"
                    % (n, ", ".join("conv %d x%g" % c for c in w) or "none", what, peak, loss))
                scored.append((loss, peak, n, w))
            _, _, n_bias, weights = min(scored, key=lambda c: c[:2])
        best = scheme_of(n_bias, weights)
        peak, plan = cost(best)
    say("chosen: classifier, biases of the last %d convs, weights %s: %s %d B of %d B%s"
        % (n_bias, ", ".join("conv %d x%g" % w for w in weights) or "none", what, peak, budget,
           "" if board is None else " (%s)" % _placement_text(plan.report(), board)))
    return best, plan


def _placement_text(r, board):
    from .boards import placement, ram_needed
    where = placement(r, board)
    parts = ram_needed(r, board, where)
    return "the plan %s, %d B of it" % (where, parts.get("plan", 0) + parts.get("head", 0) + parts.get("file", 0))


def _fits(peak, budget, what="peak RAM"):
    if peak == float("inf"):
        return "no plan"
    return "%s %d B%s" % (what, peak, "" if peak <= budget else " (over)")


def probe_loss(plan, probe, epochs):
    """The mean loss on the last fifth of the probe samples (shuffled with seed 0) after `epochs`
    epochs of training on the rest, in the simulator; inf where training diverges."""
    from .simulator import Simulator, TrainingDiverged
    sim = Simulator(plan)
    x, y = sim.check_data(*probe, names=("probe x", "probe y"))
    if len(x) < 5:
        raise ValueError("probe: %d samples; give at least 5 (4/5 train, 1/5 held out)" % len(x))
    order = np.random.default_rng(0).permutation(len(x))
    cut = len(x) - len(x) // 5
    train, held = order[:cut], order[cut:]
    try:
        sim.fit(x[train], y[train], epochs=epochs, progress=False)
    except TrainingDiverged:
        return float("inf")
    out = sim.predict(x[held]).reshape(len(held), -1).astype(np.float64)
    if plan.loss != "cross-entropy":
        return float(np.mean((out - y[held].reshape(len(held), -1)) ** 2))
    out -= out.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(out).sum(axis=1)) - out[np.arange(len(held)), y[held].astype(np.int64)]))
