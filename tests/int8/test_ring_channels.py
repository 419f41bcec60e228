"""Streamed int8 blocks run a channel at a time where their ring sets the arena's peak
(ring_channels.py; CONV_DW_PW_Q8 and its pipe forms with a ring of one channel, mt_cdp_q8.c).

test_cdp_pipe.py's two blocks (a stem 3x3/2, depthwise 3x3, 1x1 projection, piped into a 1x1
expansion or a 3x3/2 conv, depthwise, projection; uint8 input; both exporters), int8 with the
head training:
* the rings are one channel (R x 1 x W1) and the pipe holds the rows of x that R rows of the
  first conv span; outputs and parameters after 30 steps are the all-channel plan's bit for bit;
  the arena is smaller, and the MACs per step count the first conv's rows made again;
* a one-channel ring a column short or long, and a pipe of one window's rows (or any but the
  span of R rows) under a one-channel reader, are refused at load;
* no ring is made one channel where that would not lower the arena;
* MCUNet-5fps's 124kb scheme (the MIT model) trains 2 steps bit for bit as with all-channel rings.
"""
from __future__ import annotations

import numpy as np
import pytest

import int8_models as M
import microtrain
from microtrain import format as F
from microtrain.native import Core, PlanError
from test_cdp_pipe import SHAPE, TwoBlocks, _patched
from tte_parity import assert_trains_alike, mcunet

STREAMED = ("CONV_DW_PW_Q8", "CONV_DW_PW_Q8_TO_PIPE", "CONV_DW_PW_Q8_FROM_PIPE")
RING = F.OPS_BY_NAME["CONV_DW_PW_Q8"].slot_index("ring")


def compile_both(path, **kw):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(microtrain.compiler, "one_channel_rings", lambda *a, **k: [])
        plain = microtrain.compile(path, **kw)
    return microtrain.compile(path, **kw), plain


def streamed(plan):
    return [(k, o) for k, o in enumerate(plan.ops) if o["op"] in STREAMED]


def two_blocks(tmp_path, second, exporter):
    src = M.export(TwoBlocks(second).eval(), str(tmp_path / ("two-%s.onnx" % second)), exporter, shape=SHAPE)
    rng = np.random.default_rng(1)
    return compile_both(src, update="last-layer", quantize="int8", input_dtype="uint8", input_quant=(1 / 255, 0),
                        calibration=rng.uniform(0, 1, (16,) + SHAPE[1:]).astype(np.float32), lr=0.05, momentum=0.9)


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize("second", ["expand", "conv3s2"])
def test_one_channel_rings_are_the_all_channel_plan(tmp_path, second, exporter):
    chan, plain = two_blocks(tmp_path, second, exporter)
    assert any(n.startswith("ring_channels: ") for n in chan.meta["notes"])
    rings = [(chan.tensors[o["slots"][RING]]["shape"], plain.tensors[plain.ops[k]["slots"][RING]]["shape"])
             for k, o in streamed(chan)]
    assert [o["op"] for _, o in streamed(chan)] == ["CONV_DW_PW_Q8_TO_PIPE", "CONV_DW_PW_Q8_FROM_PIPE"]
    # the stem's ring one channel; the second's too where that lowers the arena (the 1x1 expansion's
    # 24-wide ring of 12 channels; not the 3x3/2 conv's 12-wide one)
    assert [one == (every[0], 1, every[2]) and every[1] > 1 for one, every in rings] == [True, second == "expand"]
    assert all(one == every for one, every in rings[1:]) or second == "expand"
    # the pipe: one window's rows of x (1 for the 1x1 conv, 3 for the 3x3/2), or under a one-channel
    # reader the rows of x that three rows of its first conv span (1x1: 3)
    k = streamed(chan)[0][0]
    pipe = chan.tensors[chan.ops[k]["slots"][F.OPS_BY_NAME["CONV_DW_PW_Q8_TO_PIPE"].slot_index("y")]]
    assert pipe["shape"][0] == 3
    assert chan.report()["arena_bytes"] < plain.report()["arena_bytes"]
    assert chan.report()["macs_per_step"] > plain.report()["macs_per_step"]
    rng = np.random.default_rng(2)
    assert_trains_alike(chan, plain, xs=rng.integers(0, 256, (30,) + SHAPE[1:]).astype(np.uint8),
                        ys=rng.integers(0, 10, 30), predict=5)


@pytest.fixture(scope="module")
def chan_plan(tmp_path_factory):
    return two_blocks(tmp_path_factory.mktemp("rings"), "expand", "ts")[0]


@pytest.mark.parametrize("delta", [-1, +1])
def test_a_one_channel_ring_of_the_wrong_size_is_refused(chan_plan, delta):
    """A column short or long (moved to fresh memory at the arena's end)."""
    for k, o in streamed(chan_plan):
        i = o["slots"][RING]
        R, one, W = chan_plan.tensors[i]["shape"]
        assert one == 1
        end = chan_plan.header["arena_bytes"]
        grown = dict(arena_bytes=end + -(-R * (W + 1) // F.ALIGN) * F.ALIGN)
        Core(_patched(chan_plan.data, i, grown, offset=end))   # the right size there loads
        bad = _patched(chan_plan.data, i, grown, dim2=W + delta, bytes=R * (W + delta), offset=end)
        with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % k):
            Core(bad)


def test_a_pipe_of_one_window_under_a_one_channel_reader_is_refused(chan_plan):
    """The pipe as an all-channel reader would have it (the one row of x a 1x1 conv's window
    spans, not 3): the one-channel reader's rows of e would read rows it no longer holds."""
    k = streamed(chan_plan)[0][0]
    i = chan_plan.ops[k]["slots"][F.OPS_BY_NAME["CONV_DW_PW_Q8_TO_PIPE"].slot_index("y")]
    rows, C, W = chan_plan.tensors[i]["shape"]
    assert rows == 3
    end = chan_plan.header["arena_bytes"]
    grown = dict(arena_bytes=end + -(-4 * C * W // F.ALIGN) * F.ALIGN)   # fresh memory for a longer one
    Core(_patched(chan_plan.data, i, grown, offset=end))
    for bad in (1, 2, 4):
        with pytest.raises(PlanError, match=r"tensor shapes do not fit the op \(op %d\)" % (k + 1)):
            Core(_patched(chan_plan.data, i, grown, dim0=bad, bytes=bad * C * W, offset=end))


def test_no_one_channel_ring_without_gain(tmp_path):
    """The float part's peak (every layer trains) is far above the stem's: no ring changes."""
    src = M.export(TwoBlocks("expand").eval(), str(tmp_path / "two.onnx"), "ts", shape=SHAPE)
    chan, plain = compile_both(src, update="full", lr=0.05)
    assert not any(n.startswith("ring_channels: ") for n in chan.meta["notes"])
    assert chan.data == plain.data


def test_mcunet_124kb_one_channel_rings_train_as_all_channel_rings():
    path, opts = mcunet("124kb")
    chan, plain = compile_both(path, **opts)
    assert chan.report()["arena_bytes"] < plain.report()["arena_bytes"]
    assert_trains_alike(chan, plain)
