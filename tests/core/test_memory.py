"""Memory: the plan's arena bounds, writes that stay inside tensors, and a C
core that cannot allocate and keeps no mutable static data."""
import glob
import os
import shutil
import subprocess

import numpy as np
import pytest

import microtrain
from microtrain import format as F

import models

from repo import ROOT
CORE = os.path.join(ROOT, "modules", "microtrain")
EXAMPLE = os.path.join(ROOT, "examples", "digits_cnn.onnx")

CASES = [("mlp", lambda: models.mlp(), "full"), ("cnn-full", lambda: models.cnn(), "full"),
         ("cnn-last2", lambda: models.cnn(), "last:2"), ("cnn-bias", lambda: models.cnn(), "bias"),
         ("digits", lambda: EXAMPLE, "last-layer"), ("digits-full", lambda: EXAMPLE, "full")]


def sample(sim, rng):
    return rng.normal(size=sim.input_shape).astype(np.float32)


def own_lifetimes(plan):
    """(first, last) op index of each tensor, worked out here from the op list alone (not with
    memory.lifetimes, report() or the planner): the ops that name it in a slot; the input and the
    target are written before op 0. A tensor that shares another's memory (a view, an op run in
    place: the plan's meta says which) keeps that memory busy for its own lifetime too. A pipe's
    reader (CONV_DW_PW_Q8_FROM_PIPE) runs its writer, the op before it: it names that op's tensors too."""
    n = len(plan.tensors)
    first, last = [None] * n, [None] * n
    for k, op in enumerate(plan.ops):
        named = op["slots"] + (plan.ops[k - 1]["slots"] if op["op"] == "CONV_DW_PW_Q8_FROM_PIPE" else [])
        for t in named:
            if t is not None:
                first[t] = k if first[t] is None else first[t]
                last[t] = k
    for t in (plan.header["input_tensor"], plan.header["target_tensor"]):
        first[t], last[t] = 0, max(last[t] or 0, 0)
    shares = {int(k): v for k, v in plan.meta["shares"].items()}
    owner = list(range(n))
    for i in range(n):
        while owner[i] in shares:
            owner[i] = shares[owner[i]]
    span = {}
    for i in range(n):
        if plan.tensors[i]["storage"] == "ARENA" and first[i] is not None:
            f, l = span.get(owner[i], (first[i], last[i]))
            span[owner[i]] = (min(f, first[i]), max(l, last[i]))
    return span


@pytest.mark.parametrize("name,model,update", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("batch", [1, 3])
def test_arena_between_peak_live_and_naive(name, model, update, batch):
    """Every two memory owners alive at the same op occupy disjoint bytes, inside the arena; and
    the arena lies between the largest set alive at one op and the sum of all. The lifetimes and
    the overlap test are computed here, by brute force, from the plan's op list."""
    plan = microtrain.compile(model(), update=update, momentum=0.9, batch=batch)
    span = own_lifetimes(plan)
    t = plan.tensors
    arena = plan.header["arena_bytes"]
    for o in span:
        assert t[o]["offset"] + t[o]["bytes"] <= arena, t[o]["name"]
    peak = 0
    for k in range(len(plan.ops)):
        live = sorted((t[o]["offset"], t[o]["offset"] + t[o]["bytes"], t[o]["name"]) for o, (f, l) in span.items()
                      if f <= k <= l)
        for (a0, a1, an), (b0, b1, bn) in zip(live, live[1:]):
            assert a1 <= b0, "op %d: %s [%d, %d) and %s [%d, %d) are alive together and overlap" % (
                k, an, a0, a1, bn, b0, b1)
        peak = max(peak, sum(-(-(e - s) // 8) * 8 for s, e, _ in live))
    naive = sum(-(-t[o]["bytes"] // 8) * 8 for o in span)
    assert peak <= arena <= naive
    r = plan.report()
    assert (r["peak_live_bytes"], r["naive_bytes"], r["arena_bytes"]) == (peak, naive, arena)


@pytest.mark.parametrize("name,model,update", CASES, ids=[c[0] for c in CASES])
def test_planned_and_naive_memory_train_identically(name, model, update):
    """Sharing memory must not change a single bit of the results."""
    rng = np.random.default_rng(0)
    sims = [microtrain.Simulator(microtrain.compile(model(), update=update, lr=0.05, momentum=0.9, planner=p))
            for p in ("greedy", "naive")]
    n_out = int(np.prod(sims[0].output_shape))
    for _ in range(5):
        x, y = sample(sims[0], rng), int(rng.integers(n_out))
        losses = [s.step(x, y) for s in sims]
        assert losses[0] == losses[1]
    p0, p1 = sims[0].params(), sims[1].params()
    for k in p0:
        assert np.array_equal(p0[k], p1[k]), k


def writable_ranges(plan, core, op):
    """(start, end) byte ranges in RAM that an op may write: its out, param and state slots."""
    spec = F.OPS_BY_NAME[op["op"]]
    state_bytes = plan.header["state_bytes"]
    out = []
    for slot, tid in zip(spec.slots, op["slots"]):
        if tid is None or slot.role == "in":
            continue
        t = plan.tensors[tid]
        base = t["offset"] + (0 if t["storage"] == "STATE" else state_bytes)
        out.append((base, base + t["bytes"]))
    return out


@pytest.mark.parametrize("name,model,update", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("batch", [1, 2])
def test_each_op_writes_only_its_own_tensors(name, model, update, batch):
    """Run the step op by op; after each op, every changed RAM byte lies in a
    tensor the op declares as written, and the guard bytes around RAM are intact."""
    plan = microtrain.compile(model(), update=update, lr=0.05, momentum=0.9, batch=batch)
    sim = microtrain.Simulator(plan, guard=64)
    core = sim.core
    rng = np.random.default_rng(3)
    for _ in range(batch):
        core.set_input(sample(sim, rng))
        core.array(plan.header["target_tensor"])[...] = 1
        ram = core.ram_view()
        for i, op in enumerate(plan.ops):
            before = ram.copy()
            core.run_op(i)
            changed = np.flatnonzero(ram != before)
            allowed = np.zeros(ram.size, bool)
            for a, b in writable_ranges(plan, core, op):
                allowed[a:b] = True
            bad = changed[~allowed[changed]]
            assert bad.size == 0, "op %d %s wrote outside its tensors at RAM bytes %s" % (i, op["op"], bad[:8])
    assert (core.raw[:64] == 0xA5).all() and (core.raw[64 + core.ram_bytes:] == 0xA5).all()


@pytest.mark.parametrize("name,model,update", CASES, ids=[c[0] for c in CASES])
def test_guard_bytes_between_tensors_survive_training(name, model, update):
    """With a gap after every tensor and nothing shared, the gaps and the
    guards around RAM must still hold their pattern after whole training steps."""
    plan = microtrain.compile(model(), update=update, lr=0.05, momentum=0.9, planner="naive", guard=32)
    sim = microtrain.Simulator(plan, guard=64)
    rng = np.random.default_rng(4)
    n_out = int(np.prod(sim.output_shape))
    for _ in range(4):
        sim.step(sample(sim, rng), int(rng.integers(n_out)))
        sim.predict(sample(sim, rng))
    core = sim.core
    state, arena_bytes = plan.header["state_bytes"], plan.header["arena_bytes"]
    arena = core.ram_view()[state:state + arena_bytes]   # the runtime context follows the arena
    covered = np.zeros(arena.size, bool)
    for t in plan.tensors:
        if t["storage"] == "ARENA":
            covered[t["offset"]:t["offset"] + t["bytes"]] = True
    assert (~covered).sum() >= 32 * sum(1 for t in plan.tensors if t["storage"] == "ARENA") // 2
    assert (arena[~covered] == 0xA5).all(), "a kernel wrote into a guard gap"
    assert (core.raw[:64] == 0xA5).all() and (core.raw[64 + core.ram_bytes:] == 0xA5).all()


def compiled_core_objects(tmp_path):
    objs = []
    for src in sorted(glob.glob(os.path.join(CORE, "mt_*.c"))):
        obj = tmp_path / (os.path.basename(src) + ".o")
        # -fno-pic as for a board: position-independent code would put constant tables of
        # pointers (the op table) in .data.rel.ro, which nm shows as data although it is read-only
        subprocess.run(["gcc", "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-O2", "-fno-pic", "-c", src,
                        "-o", str(obj)], check=True)
        objs.append(obj)
    return objs


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None, reason="needs gcc and nm")
def test_core_is_strict_c99_without_malloc_or_mutable_statics(tmp_path):
    allowed = {"memcpy", "memset", "memcmp", "strlen"}   # not even libm
    for obj in compiled_core_objects(tmp_path):
        undef = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout.split()
        names = {u for u in undef if u not in ("U", "w") and not u.startswith("mt_")}
        assert names <= allowed, "%s calls %s" % (obj.name, sorted(names - allowed))
        syms = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
        mutable = [line for line in syms.splitlines() if line.split()[-2:-1] and line.split()[-2] in "dDbBcC"]
        assert not mutable, "%s has mutable static data: %s" % (obj.name, mutable)
