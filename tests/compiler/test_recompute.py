"""Saved activations made again in the backward instead of kept (recompute.py).

A chain of residual blocks (3x3 conv, ReLU, 1x1 conv, + the block input; GAP, Linear), both
exporters, trained whole, biases only, and with batches of 4:
* the replaying plan is the plan that keeps its activations, bit for bit: predictions, losses
  and every parameter after 20 steps with momentum 0.9;
* its arena is smaller, and the replayed ops run in the TRAIN phase only (inference is the
  forward alone);
* against PyTorch autograd, 20 steps of the whole update match within 1e-4 and every trainable
  tensor moves;
* nothing is replayed with recompute=False, with the naive planner, or where a replay would save
  less than 1% of the arena; a weight written before its replay stops it;
* MCUNet-5fps's 148kb scheme (the MIT model), replayed and not, trains 2 steps bit for bit alike;
  the backward reads the masks its replays make again, the forward's masks of those blocks dying
  with the forward; a mask the backward writes is not read from a replay;
* MobileNetV2-w0.35's 138kb scheme reading its input in place: a block whose output bias the
  backward updates before it reaches the block's masks is replayed before that update, and a
  compound move (a replay that does not pay alone, then those it makes possible) lowers the arena
  of the 123kb scheme; both train as the plans that keep everything;
* there too, a block's masks that a replay made long before their reader are made again next to
  it, from a copy of the block's input alive there: the arena is below the plan's without that,
  and it trains as kept; not where an input the masks depend on is written in between, nor where
  no copy of the block's input is left (ops as the compiler holds them), but where only what the
  masks do not depend on is (the block's projection bias).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as TF

import microtrain
import microtrain.recompute as R
from microtrain import format as F
from oracle_models import Case, export
from test_torch_exactness import train_both
from tte_parity import assert_trains_alike, mcunet, tte

STEPS = 20
UPDATES = ("full", "bias")


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x + self.b(TF.relu(self.a(x)))


class ResChain(nn.Module):
    """3x3 stem, n blocks x + conv1x1(relu(conv3x3(x))), GAP, Linear (parameters registered in
    execution order, as oracle_models.layers wants them)."""

    def __init__(self, n=3, c=8):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*(Block(c) for _ in range(n)))
        self.fc = nn.Linear(c, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        x = self.blocks(TF.relu(self.stem(x)))
        return self.fc(torch.flatten(TF.adaptive_avg_pool2d(x, 1), 1))


SHAPE = (3, 16, 16)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("recompute")
    return {ex: export(ResChain().eval(), torch.zeros((1,) + SHAPE), ex, str(d / ("chain_%s.onnx" % ex)))
            for ex in ("ts13", "dynamo")}


def replayed(plan):
    """The plan's replayed forward ops: those writing a copy ("@replay")."""
    return [plan.ops[k] for k in replay_index(plan)]


def replay_index(plan):
    """The indices in plan.ops of its replayed forward ops: those writing a copy ("@replay")."""
    name = lambda s: plan.tensors[s]["name"] if s is not None and s < len(plan.tensors) else ""
    return [k for k, o in enumerate(plan.ops) if o["phase"] != "FORWARD" and any(
        "@replay" in name(s) for sl, s in zip(F.OPS_BY_NAME[o["op"]].slots, o["slots"]) if sl.role != "in")]


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n,) + SHAPE).astype(np.float32), rng.integers(0, 4, n)


def trained(plan, xs, ys):
    sim = microtrain.Simulator(plan)
    preds = [sim.predict(x) for x in xs[:3]]
    losses = [sim.step(x, y) for x, y in zip(xs, ys)]
    return preds, losses, sim.params()


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
@pytest.mark.parametrize("update", UPDATES)
@pytest.mark.parametrize("batch", [1, 4])
def test_replayed_plan_is_the_kept_plan(models, exporter, update, batch):
    opts = dict(update=update, lr=0.02, momentum=0.9, batch=batch)
    a = microtrain.compile(models[exporter], **opts)
    b = microtrain.compile(models[exporter], recompute=False, **opts)
    assert replayed(a) and not replayed(b)
    assert any(n.startswith("recompute: ") for n in a.meta["notes"])
    assert a.report()["arena_bytes"] < b.report()["arena_bytes"]
    # inference runs the same forward ops
    assert [o["op"] for o in a.ops if o["phase"] == "FORWARD"] == [o["op"] for o in b.ops if o["phase"] == "FORWARD"]
    xs, ys = data(STEPS * batch, seed=batch)
    pa, la, wa = trained(a, xs, ys)
    pb, lb, wb = trained(b, xs, ys)
    for x, y in zip(pa, pb):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(la, lb)
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


@pytest.mark.parametrize("exporter", ["ts13", "dynamo"])
def test_replayed_plan_against_pytorch(models, exporter):
    case = Case("reschain", ResChain, SHAPE, n_out=4)
    plan, sim, _ = train_both(models[exporter], case, ResChain().eval(), "full", "cross-entropy", 1)
    assert replayed(plan)


def test_nothing_replayed_without_gain(models):
    assert not replayed(microtrain.compile(models["ts13"], update="full", planner="naive"))
    assert not replayed(microtrain.compile(models["ts13"], update="last:3"))   # would save 8 bytes
    assert not replayed(microtrain.compile(models["ts13"], update="none"))
    with pytest.raises(ValueError, match="recompute must be True or False"):
        microtrain.compile(models["ts13"], recompute="yes")


def test_a_weight_written_before_the_replay_stops_it(models, monkeypatch):
    """A replayed op reading a tensor some op writes between it and the replay would not give the
    forward's values: such a replay is refused. Made here by having every TRAIN op claim to write
    every parameter as well."""
    real, params = R._writes, set()

    def spy(tensors, ops, a, keep=None):
        params.update(i for i, t in enumerate(tensors) if t.storage == "STATE")
        return replay(tensors, ops, a, keep)

    replay = R._replay
    monkeypatch.setattr(R, "_replay", spy)
    assert replayed(microtrain.compile(models["ts13"], update="full"))
    monkeypatch.setattr(R, "_writes", lambda o: real(o) + (sorted(params) if o.phase == "TRAIN" else []))
    assert not replayed(microtrain.compile(models["ts13"], update="full"))


def test_shared_weight_replayed_plan_is_the_kept_plan(tmp_path):
    """The first block used again as the third: its weight is read by the replayed forward ops
    and updated once its two gradients are summed."""
    m = ResChain().eval()
    m.blocks[2] = m.blocks[0]
    path = export(m, torch.zeros((1,) + SHAPE), "ts13", str(tmp_path / "shared.onnx"))
    opts = dict(update="full", lr=0.02, momentum=0.9)
    a = microtrain.compile(path, **opts)
    b = microtrain.compile(path, recompute=False, **opts)
    xs, ys = data(STEPS)
    for x, y in zip(trained(a, xs, ys), trained(b, xs, ys)):
        if isinstance(x, dict):
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
        else:
            np.testing.assert_array_equal(x, y)


def test_mcunet_148kb_replayed_trains_as_kept():
    path, opts = mcunet("148kb")
    a = microtrain.compile(path, **opts)
    b = microtrain.compile(path, recompute=False, **opts)
    assert replayed(a) and a.report()["arena_bytes"] < b.report()["arena_bytes"]
    # a replayed block makes its ReLU masks again, and the backward reads those copies: the forward's
    # masks of a replayed block die with the forward instead of living through the backward
    n_fwd = next(k for k, o in enumerate(a.ops) if o["phase"] != "FORWARD")
    name = {i: t["name"] for i, t in enumerate(a.tensors)}
    last = {}
    for k, o in enumerate(a.ops):
        for s in o["slots"]:
            if s is not None and s in name:
                last[name[s]] = k
    copies = [n for n in last if "@mask@replay" in n]
    assert copies, "no replay made a mask again"
    assert all(last[n.split("@replay")[0]] < n_fwd for n in copies), "a forward mask lives on beside its copy"
    assert_trains_alike(a, b)


def _moved_replays(plan):
    """Runs of replayed ops (first, last index) placed before an op that reads none of their copies
    but updates a parameter they read. A replay made for its first reader runs right before it."""
    name = lambda s: plan.tensors[s]["name"] if s is not None and s < len(plan.tensors) else ""
    spec = lambda o: F.OPS_BY_NAME[o["op"]].slots
    written = lambda o: {s for sl, s in zip(spec(o), o["slots"]) if s is not None and sl.role != "in"}
    replays, moved, runs = replay_index(plan), [], []
    for k in replays:   # maximal runs of consecutive replayed ops
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    for run in runs:
        made = {s for k in run for s in written(plan.ops[k]) if "@replay" in name(s)}
        read = {s for k in run for s in plan.ops[k]["slots"] if s is not None and plan.tensors[s]["storage"] == "STATE"}
        after = plan.ops[run[-1] + 1]
        if not made & set(after["slots"]) and read & written(after):
            moved.append((run[0], run[-1]))
    return moved


def test_replay_runs_before_the_update_of_a_bias_it_reads():
    """MobileNetV2 138kb (input in place): block 9's masks are read by its backward after the bias
    of its last conv is updated; the block is replayed before that update, and trains as kept."""
    path, opts = tte("mbv2-w0.35", "138kb", "int8")
    a = microtrain.compile(path, input_in_place=True, **opts)
    b = microtrain.compile(path, input_in_place=True, recompute=False, **opts)
    assert _moved_replays(a), "no replay runs before a parameter it reads is updated"
    assert a.report()["arena_bytes"] < b.report()["arena_bytes"]
    xs = np.random.default_rng(3).integers(-128, 128, (2, 1, 3, 128, 128)).astype(np.int8)
    assert_trains_alike(a, b, xs=xs, ys=[3, 7])


def test_compound_replays_lower_the_arena(monkeypatch):
    """MobileNetV2 123kb (input in place): compound moves take the arena below what one replay at a
    time reaches, and the plan trains as kept."""
    path, opts = tte("mbv2-w0.35", "123kb", "int8")
    a = microtrain.compile(path, input_in_place=True, **opts)
    b = microtrain.compile(path, input_in_place=True, recompute=False, **opts)
    monkeypatch.setattr(R, "KEEPS", ())
    single = microtrain.compile(path, input_in_place=True, **opts)
    assert a.report()["arena_bytes"] < single.report()["arena_bytes"] < b.report()["arena_bytes"]
    xs = np.random.default_rng(4).integers(-128, 128, (2, 1, 3, 128, 128)).astype(np.int8)
    assert_trains_alike(a, b, xs=xs, ys=[1, 8])


def test_masks_made_again_next_to_their_reader(monkeypatch):
    """MobileNetV2 138kb (input in place)."""
    path, opts = tte("mbv2-w0.35", "138kb", "int8")
    a = microtrain.compile(path, input_in_place=True, **opts)
    b = microtrain.compile(path, input_in_place=True, recompute=False, **opts)
    monkeypatch.setattr(R, "_late_sides", lambda tensors, ops, *args: (ops, []))
    c = microtrain.compile(path, input_in_place=True, **opts)
    name = lambda s: a.tensors[s]["name"]   # noqa: E731
    again = [k for k, o in enumerate(a.ops) if any("@again" in name(s) for s in o["slots"] if s is not None)
             and o["op"] == "PWDW_W8"]
    assert again
    for k in again:   # the next op reads the masks made again, and nothing before it
        made = {s for s in a.ops[k]["slots"] if s is not None and "@mask@again" in name(s)}
        assert made and made & set(a.ops[k + 1]["slots"])
    assert a.report()["arena_bytes"] < c.report()["arena_bytes"] < b.report()["arena_bytes"]
    xs = np.random.default_rng(5).integers(-128, 128, (2, 1, 3, 128, 128)).astype(np.int8)
    assert_trains_alike(a, b, xs=xs, ys=[2, 9])


def _late_case(written=None, overwritten=False):
    """A forward tensor X (0) and its replay copy (7) read by a replayed block op (PWDW_W8, op 3)
    whose masks (8, 11) the op at 6 reads; the projection's output z (12) read at once; `written`:
    the parameter an op between writes (2 the block's first bias, 6 the projection's); overwritten:
    ops between write over both X and its copy (in place: views of them, 16 and 17)."""
    from microtrain.lowered import TOp, TTensor
    t = [TTensor("X", (1, 2, 4, 4)), TTensor("w", (6, 2, 1, 1), "I8", "CONST"), TTensor("b", (6,), storage="STATE"),
         TTensor("dw", (6, 1, 3, 3), "I8", "CONST"), TTensor("db", (6,), storage="STATE"),
         TTensor("w2", (2, 6, 1, 1), "I8", "CONST"), TTensor("b2", (2,), storage="STATE"),
         TTensor("X@replay7", (1, 2, 4, 4), replay_of=0)]
    t += [TTensor(n + "@replay%d" % (8 + i), (16,), replay_of=90 + i)
          for i, n in enumerate(("m", "s", "y", "m2", "z"))]
    t += [TTensor("d", (1, 2, 4, 4)), TTensor("e", (1, 2, 4, 4)), TTensor("q", (1, 2, 4, 4), "I8"),
          TTensor("X'", (1, 2, 4, 4), view_of=0), TTensor("X@replay7'", (1, 2, 4, 4), view_of=7)]
    ops = [TOp("DEQUANTIZE", "FORWARD", [15, 0]), TOp("SOFTMAX_CE", "TRAIN", [None] * 4),
           TOp("DEQUANTIZE", "TRAIN", [15, 7]),
           TOp("PWDW_W8", "TRAIN", [7, 1, 2, None, None, None, 8, 3, 4, 9, 10, 11, 5, 6, 12]),
           TOp("ADD", "TRAIN", [12, 12, 13])]
    if written is not None:
        ops.append(TOp("BIAS_BWD", "TRAIN", [13, written, None, None], [0, 2]))
    if overwritten:
        ops += [TOp("DEQUANTIZE", "TRAIN", [15, 16]), TOp("DEQUANTIZE", "TRAIN", [15, 17])]
    ops += [TOp("MASK_BWD", "TRAIN", [8, 13, 14]), TOp("MASK_BWD", "TRAIN", [11, 14, 14])]
    return t, ops


def test_masks_made_again_only_where_what_they_need_is_there():
    for case, ok in ((dict(), True), (dict(written=6), True), (dict(written=2), False),
                     (dict(overwritten=True), False)):
        t, ops = _late_case(**case)
        cands = [c for c in R._side_candidates(t, ops) if c[0] == 3]
        assert cands and cands[0][2] == [8, 11], case
        p, q, sides = cands[0]
        found = R._make_again(t, ops, p, q, sides)
        assert (found is not None) == ok, case
        if ok:
            clones, new = found
            op = new[q]
            assert op.name == "PWDW_W8" and op.slots[0] in (0, 7) and new[q + 1].slots[0] == len(t) + 0, case


def test_a_mask_the_backward_writes_is_not_read_from_the_replay(monkeypatch):
    """A replayed op's other outputs are read from the replay only if nothing in the backward writes
    them; made here by having every TRAIN op claim to write every mask."""
    path, opts = mcunet("148kb")
    real, masks = R._writes, set()

    def spy(tensors, ops, a, keep=None):
        masks.update(i for i, t in enumerate(tensors) if t.name.endswith("@mask"))
        return replay(tensors, ops, a, keep)

    replay = R._replay
    monkeypatch.setattr(R, "_replay", spy)
    monkeypatch.setattr(R, "_writes", lambda o: real(o) + (sorted(masks) if o.phase == "TRAIN" else []))
    a = microtrain.compile(path, **opts)
    assert replayed(a)
    name = {i: t["name"] for i, t in enumerate(a.tensors)}
    replays = set(replay_index(a))
    readers = [name.get(s, "") for k, o in enumerate(a.ops) if k not in replays for s in o["slots"]]
    assert not [n for n in readers if "@mask@replay" in n], "a mask read from a replay"


def test_cli_no_recompute(models, tmp_path):
    """`microtrain compile` replays by default; --no-recompute writes compile(recompute=False)'s plan."""
    from test_plan_report import cli
    for flag, name in (((), "on.mtp"), (("--no-recompute",), "off.mtp")):
        cli("compile", models["ts13"], "-o", tmp_path / name, "--update", "full", *flag)
    on, off = (microtrain.load_plan(str(tmp_path / n)) for n in ("on.mtp", "off.mtp"))
    assert replayed(on) and not replayed(off)
    assert off.data == microtrain.compile(models["ts13"], update="full", recompute=False).data
