"""microtrain.compile: the compiler (compiler.py), and above it the budget search (budget.py),
which compiles candidate plans and keeps the one a RAM budget fits."""
from __future__ import annotations

from . import compiler
from .options import CompileOptions


def compile(model, options=None, budget=None, budget_probe=None, **overrides):  # noqa: A001  (microtrain.compile)
    """Compile an ONNX model (path, bytes or onnx.ModelProto) into a Plan. options: a
    microtrain.CompileOptions (each field documented there; None: the defaults); keywords
    replace its fields. budget (bytes, or "200KB"): choose the scheme by the rule of budget.py
    so that peak RAM fits (the plan's meta["update"] holds the scheme chosen); budget_probe
    ((x, y), labelled samples of a proxy task) chooses among the schemes that fit by their
    held-out loss after a short training in the simulator (budget.py)."""
    o = CompileOptions.of(options, **overrides)
    if budget is None:
        if budget_probe is not None:
            raise ValueError("budget_probe chooses among the schemes a budget fits: give it with budget")
        return compiler.compile(model, o)
    if o.update != "last-layer" or o.scheme is not None:
        raise ValueError("budget chooses what trains: give it without update/scheme")
    from .budget import choose
    rest = {k: v for k, v in o.asdict().items() if k not in ("update", "scheme")}
    return choose(model, budget, probe=budget_probe, **rest)[1]
