"""int8 on real networks and real data: MIT's MCU networks (../shared/models/tte) quantized by
the compiler for last-layer training, and the digits example retrained on an int8 backbone
(scikit-learn's digits, the user's mirrored sensor), against the float32 backbone."""
import os
import sys

import numpy as np
import pytest

import microtrain

from repo import ROOT, need_tte
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from bench_models import tte_dir  # noqa: E402
from calibration import samples  # noqa: E402
import int8_digits  # noqa: E402
import int8_memory  # noqa: E402

TTE = tte_dir()


@pytest.mark.parametrize("model", ["mcunet-5fps", "mbv2-w0.35"])
def test_mcu_networks_quantize_for_last_layer_training(model):
    if TTE is None:
        need_tte()
    path = os.path.join(TTE, model + ".onnx")
    r = int8_memory.figures(path, "last-layer", samples(16), int8_fuse=False)   # the same tensors, a quarter the bytes
    f, q = r["float32"], r["int8"]
    assert q["peak_ram_bytes"] == q["arena_bytes"] + q["param_bytes"] + q["context_ram_bytes"]
    assert q["param_bytes"] == f["param_bytes"]             # the classifier trains in float32 in both
    assert 3.5 <= f["arena_bytes"] / q["arena_bytes"] <= 4.5, (f, q)
    assert 2.9 <= f["const_bytes"] / q["const_bytes"] <= 4.1, (f, q)
    # int8 weights take a quarter of float's bytes; flash also holds each int8 layer's per-channel
    # requantization tables (mult, shift: 8 B per output channel) and scales: 2.6x on MbV2-w0.35,
    # whose thin layers have many channels per weight byte
    assert q["flash_bytes"] < f["flash_bytes"] / 2.5


def test_int8_backbone_recovers_the_float_backbones_gain():
    """Last layer retrained on the mirrored digits: the int8 backbone recovers at least 95% of what the
    float32 backbone gains (mean over 3 data orders)."""
    fb, fa, _, _ = int8_digits.run(False, epochs=5, orders=3)
    qb, qa, _, r = int8_digits.run(True, epochs=5, orders=3)
    assert fa - fb > 0.4                        # the float run learns (about 0.32 -> 0.88)
    assert qa - qb >= 0.95 * (fa - fb), (fb, fa, qb, qa)
    assert abs(qb - fb) < 0.05                  # int8 changes little before training
    assert r["const_int8_bytes"] > 0
