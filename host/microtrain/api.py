"""microtrain.compile: the compiler (compiler.py), and above it the budget search (budget.py),
which compiles candidate plans and keeps the one a RAM budget fits."""
from __future__ import annotations

from . import compiler


def compile(model, budget=None, budget_probe=None, **options):  # noqa: A001  (microtrain.compile, on purpose)
    """Compile an ONNX model into a Plan; options as compiler.compile (below). budget (bytes, or
    "200KB"): choose the scheme by the rule of budget.py so that peak RAM fits (the plan's
    meta["update"] holds the scheme chosen); budget_probe ((x, y), labelled samples of a proxy
    task) chooses among the schemes that fit by their held-out loss after a short training in the
    simulator (budget.py).
    """
    if budget is None:
        if budget_probe is not None:
            raise ValueError("budget_probe chooses among the schemes a budget fits: give it with budget")
        return compiler.compile(model, **options)
    if options.get("update", "last-layer") != "last-layer" or options.get("scheme") is not None:
        raise ValueError("budget chooses what trains: give it without update/scheme")
    options.pop("update", None)
    options.pop("scheme", None)
    from .budget import choose
    return choose(model, budget, probe=budget_probe, **options)[1]


compile.__doc__ += "\n    compiler.compile:\n" + (compiler.compile.__doc__ or "")
