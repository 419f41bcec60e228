"""What bounds a plan's arena: the op where the most arena bytes are alive, and those tensors.

The same lifetimes as Plan.report()'s peak_live_bytes (memory.lifetimes over the op slots, a
view or an op run in place counted once, in its owner's memory), swept op by op.
"""
from __future__ import annotations

from . import format as F
from .memory import lifetimes, op_slots


def alive_at_peak(plan, without=(), phase=None):
    """{"op": index, "op_name": ..., "source": ONNX node, "phase": ..., "live_bytes": n,
    "tensors": [(name, bytes, dtype, first op, last op), ...] largest first} at the first op
    where the live arena bytes are largest (of the ops of `phase` only, FORWARD or TRAIN, if
    given); the memory of the tensors in `without` (ids) not counted (what the peak would be
    without them)."""
    hd = plan.header
    first, last = lifetimes(len(plan.tensors), op_slots(plan.ops, lambda o: o["op"], lambda o: o["slots"]),
                            [hd["input_tensor"], hd["target_tensor"]])
    owner = plan.memory_owners()
    spans = {}
    for i, t in enumerate(plan.tensors):
        if t["storage"] == "ARENA" and first[i] >= 0:
            f, l = spans.get(owner[i], (first[i], last[i]))
            spans[owner[i]] = (min(f, first[i]), max(l, last[i]))
    for t in without:
        spans.pop(owner[t], None)
    size = {o: -(-plan.tensors[o]["bytes"] // F.ALIGN) * F.ALIGN for o in spans}
    live = [0] * len(plan.ops)
    for o, (f, l) in spans.items():
        for k in range(f, l + 1):
            live[k] += size[o]
    ks = [j for j, o in enumerate(plan.ops) if phase is None or o.get("phase") == phase]
    k = max(ks, key=lambda j: (live[j], -j))
    op = plan.ops[k]
    tensors = sorted(((plan.tensors[o]["name"], size[o], plan.tensors[o]["dtype"], f, l)
                      for o, (f, l) in spans.items() if f <= k <= l), key=lambda r: -r[1])
    return {"op": k, "op_name": op["op"], "source": op.get("source", ""), "phase": op.get("phase", ""),
            "live_bytes": live[k], "tensors": tensors}
