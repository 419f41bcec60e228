"""Bad input never crashes anything: each gives a clear exception naming the problem."""
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import onnx
import pytest
from onnx import helper

import microtrain
from microtrain import format as F
from microtrain.native import Core

import models

HO = F.header_offsets()


@pytest.fixture(scope="module")
def plan_bytes():
    return microtrain.compile(models.cnn(), update="full", lr=0.05, momentum=0.9).data


def with_crc(data):
    b = bytearray(data)
    b[HO["crc32"]:HO["crc32"] + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


def test_every_truncation_is_refused(plan_bytes):
    for n in range(len(plan_bytes)):
        with pytest.raises(ValueError, match="truncated|bad magic"):
            Core(plan_bytes[:n])


def test_trailing_bytes_are_refused(plan_bytes):
    with pytest.raises(ValueError, match="trailing bytes"):
        Core(plan_bytes + b"\0")
    with pytest.raises(ValueError, match="trailing bytes"):
        microtrain.Plan(plan_bytes + b"x" * 1000)


def test_every_single_bit_flip_is_caught_by_the_crc(plan_bytes):
    rng = np.random.default_rng(0)
    for pos in rng.choice(np.arange(F.CRC_START, len(plan_bytes)), 400, replace=False):
        b = bytearray(plan_bytes)
        b[pos] ^= 1 << int(rng.integers(8))
        with pytest.raises(ValueError, match="CRC"):
            Core(bytes(b))


def test_header_fields_are_named(plan_bytes):
    b = bytearray(plan_bytes)
    b[0:4] = b"XXXX"
    with pytest.raises(ValueError, match="bad magic"):
        Core(bytes(b))
    b = bytearray(plan_bytes)
    b[HO["version"]] = 99
    with pytest.raises(ValueError, match="version"):
        Core(bytes(b))
    b = bytearray(plan_bytes)
    b[HO["lr"]:HO["lr"] + 4] = struct.pack("<f", float("nan"))
    with pytest.raises(ValueError, match="optimizer"):
        Core(with_crc(b))
    b = bytearray(plan_bytes)
    b[HO["arena_bytes"]:HO["arena_bytes"] + 4] = struct.pack("<I", 8)
    with pytest.raises(ValueError, match="tensor"):
        Core(with_crc(b))


FUZZ = textwrap.dedent("""
    import struct, sys, zlib
    import numpy as np
    from microtrain import format as F
    from microtrain.native import Core
    data = open(sys.argv[1], "rb").read()
    start, end, seed = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(seed)
    crc_at = F.header_offsets()["crc32"]
    refused = ran = 0
    for pos in range(start, end):
        for _ in range(3):
            b = bytearray(data)
            b[pos] ^= 1 << int(rng.integers(8)) if rng.random() < 0.5 else int(rng.integers(1, 256))
            b[crc_at:crc_at + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
            try:
                core = Core(bytes(b), guard=64)
            except ValueError:
                refused += 1
                continue
            ran += 1
            x = np.ones(core.ctx.n_tensors and 1, np.float32)
            from microtrain.native import lib
            x = rng.normal(size=lib.mt_input_len(core.ctx)).astype(np.float32)
            for k in range(2):
                try:
                    core.step_label(x, 0)
                    core.predict(x)
                except ValueError:
                    pass
            assert (core.raw[:64] == 0xA5).all() and (core.raw[64 + core.ram_bytes:] == 0xA5).all(), pos
    print(refused, ran)
""")


def test_structural_mutations_with_a_valid_crc_never_crash(plan_bytes, tmp_path):
    """Mutate the header, tensor table and op list byte by byte, fix the CRC, and
    load and run each: the validator refuses it, or it runs without writing
    outside its RAM. Runs in a subprocess so a crash fails the test instead of pytest."""
    path = tmp_path / "plan.mtp"
    path.write_bytes(plan_bytes)
    h = microtrain.Plan(plan_bytes).header
    end = h["ops_off"] + h["ops_bytes"]
    r = subprocess.run([sys.executable, "-c", FUZZ, str(path), "16", str(end), "1"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, "crash or guard violation (rc %d): %s" % (r.returncode, r.stderr[-2000:])
    refused, ran = map(int, r.stdout.split())
    assert refused > 0.5 * (refused + ran)


def test_wrong_input_length_and_type():
    sim = microtrain.Simulator(microtrain.compile(models.mlp(), update="full"))
    with pytest.raises(ValueError, match="x has 5 elements.*takes 6"):
        sim.step(np.zeros(5, np.float32), 0)
    with pytest.raises(ValueError, match=r"x has shape \(7,\); expected \(6,\)"):
        sim.predict(np.zeros(7, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        sim.step(np.array(["a"] * 6), 0)
    with pytest.raises(TypeError, match="integer class label"):
        sim.step(np.zeros(6, np.float32), 1.5)
    with pytest.raises(ValueError, match="class label out of range"):
        sim.step(np.zeros(6, np.float32), 3)
    with pytest.raises(ValueError, match="class label out of range"):
        sim.step(np.zeros(6, np.float32), -1)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs(bad):
    sim = microtrain.Simulator(microtrain.compile(models.mlp(), update="full"))
    before = sim.params()
    x = np.zeros(6, np.float32)
    x[2] = bad
    with pytest.raises(ValueError, match="NaN or infinity"):
        sim.step(x, 0)
    with pytest.raises(ValueError, match="NaN or infinity"):
        sim.predict(x)
    mse = microtrain.Simulator(microtrain.compile(models.mlp(), update="full", loss="mse"))
    t = np.zeros(3, np.float32)
    t[0] = bad
    with pytest.raises(ValueError, match="target contains NaN or infinity"):
        mse.step(np.zeros(6, np.float32), t)
    for k, v in sim.params().items():
        assert np.array_equal(v, before[k])


def test_diverging_loss_stops_before_any_update():
    sim = microtrain.Simulator(microtrain.compile(models.mlp(), update="full", lr=1e30))
    x = np.full(6, 1e3, np.float32)
    with pytest.raises(ValueError, match="loss is not finite"):
        for _ in range(10):
            before = sim.params()
            sim.step(x, 0)
    for k, v in sim.params().items():
        assert np.array_equal(v, before[k]), "a failed step changed %s" % k


def test_an_error_names_its_own_location_not_an_earlier_ones():
    sim = microtrain.Simulator(microtrain.compile(models.mlp(), update="full"))
    with pytest.raises(ValueError, match=r"loss is not finite.*\(op \d+\)"):
        sim.step(np.full(6, 3e38, np.float32), 0)
    for call in (lambda: sim.step(np.zeros(6, np.float32), 3), lambda: sim.predict(np.full(6, np.nan, np.float32))):
        with pytest.raises(ValueError) as e:
            call()
        assert "(op" not in str(e.value)


def test_target_kind_must_match_the_loss():
    ce = microtrain.Simulator(microtrain.compile(models.mlp(), update="full"))
    mse = microtrain.Simulator(microtrain.compile(models.mlp(), update="full", loss="mse"))
    with pytest.raises(ValueError, match="y has 2 elements"):
        mse.step(np.zeros(6, np.float32), np.zeros(2, np.float32))
    with pytest.raises(TypeError):
        ce.step(np.zeros(6, np.float32), np.zeros(3, np.float32))


@pytest.mark.parametrize("op", ["Exp", "Erf", "Elu", "Softplus"])
def test_unsupported_onnx_op_is_named(op):
    m = models.with_node(models.mlp(), helper.make_node(op, ["in"], ["out"], name="my_%s_node" % op.lower()))
    with pytest.raises(NotImplementedError) as e:
        microtrain.compile(m, update="full")
    msg = str(e.value)
    assert "my_%s_node" % op.lower() in msg and op in msg and "supports" in msg


def test_broadcast_add_and_weights_from_inputs_are_refused():
    m = models.mlp()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((1, 97), np.float32), "one"))
    m = models.with_node(m, helper.make_node("Add", ["in", "one"], ["out"], name="bias_like"))
    with pytest.raises(NotImplementedError, match="bias_like.*does not broadcast"):
        microtrain.compile(m, update="full")
    m = models.mlp()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((2, 1), np.float32), "per_sample"))
    m = models.with_node(m, helper.make_node("Mul", ["in", "per_sample"], ["out"], name="batch_scale"))
    with pytest.raises(NotImplementedError, match="batch_scale.*has a batch axis.*one sample at a time"):
        microtrain.compile(m, update="full")


def test_bad_compile_arguments(tmp_path):
    m = models.mlp()
    for kwargs, pattern in [(dict(loss="hinge"), "unknown loss"), (dict(update="everything"), "unknown update"),
                            (dict(update="last:0"), "at least 1"), (dict(update="last:x"), "whole number"),
                            (dict(update="last:9"), "only 2 layers"), (dict(lr=-1), "lr"),
                            (dict(lr=float("nan")), "lr"), (dict(momentum=1.0), "momentum"),
                            (dict(batch=0), "batch"), (dict(batch=2.5), "batch"), (dict(planner="best"), "planner"),
                            (dict(update=["fc1.weight", "nope"]), "nope.*Trainable initializers are")]:
        with pytest.raises(ValueError, match=pattern):
            microtrain.compile(m, **kwargs)
    bad = tmp_path / "u.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        microtrain.compile(m, update=str(bad))
    bad.write_text(json.dumps({"trainable": "fc1.weight"}))
    with pytest.raises(ValueError, match="list of initializer names"):
        microtrain.compile(m, update=str(bad))
    with pytest.raises(ValueError, match="cannot read update file"):
        microtrain.compile(m, update=str(tmp_path / "missing.json"))


def test_unreadable_files(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01not a model")
    with pytest.raises(ValueError, match="cannot read ONNX model"):
        microtrain.compile(str(junk))
    with pytest.raises(ValueError, match="cannot read ONNX model"):
        microtrain.compile(str(tmp_path / "missing.onnx"))
    with pytest.raises(ValueError, match="cannot read plan"):
        microtrain.load_plan(str(tmp_path / "missing.mtp"))
    with pytest.raises(TypeError):
        microtrain.compile(42)


def test_cli_reports_errors_without_a_traceback(tmp_path, plan_bytes):
    bad = tmp_path / "bad.mtp"
    bad.write_bytes(plan_bytes[:100])
    env = dict(os.environ)
    for args, pattern in [(["report", str(bad)], "truncated"),
                          (["compile", str(tmp_path / "none.onnx"), "-o", str(tmp_path / "o.mtp")], "cannot read"),
                          (["simulate", str(bad), "--data", "x.npz"], "truncated")]:
        r = subprocess.run([sys.executable, "-m", "microtrain"] + args, capture_output=True, text=True, env=env)
        assert r.returncode == 2
        assert "error:" in r.stderr and pattern in r.stderr and "Traceback" not in r.stderr



def test_cross_entropy_needs_one_score_per_class():
    """A (1, 3, 8, 8) output is not 192 classes: refused, naming the shape and the two ways out."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.normal(size=(3, 2, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")], "seg",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 8, 8])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 8, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ValueError, match=r"cross-entropy needs a model output of shape \(1, C\).*'y' has shape "
                                         r"\(1, 3, 8, 8\).*GlobalAveragePool \+ Flatten.*--loss mse"):
        microtrain.compile(m, update="full")
    sim = microtrain.Simulator(microtrain.compile(m, update="full", loss="mse"))
    assert sim.output_shape == (3, 8, 8)


def test_every_unsupported_node_is_listed_at_once_grouped_by_op_type():
    m = models.mlp()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((1,), np.float32), "one"))
    for k, op in enumerate(["Exp", "Erf", "Exp", "Transpose", "Exp"]):
        m = models.with_node(m, helper.make_node(op, ["in"], ["out"], name="n%d_%s" % (k, op)))
    with pytest.raises(NotImplementedError) as e:
        microtrain.compile(m, update="full")
    lines = str(e.value).splitlines()
    assert lines[0] == "the model has 5 nodes microtrain does not support:"
    assert lines[1].startswith("  Exp x3: 'n0_Exp', 'n2_Exp', 'n4_Exp'")
    assert lines[2] == "  Erf x1: 'n1_Erf'"
    assert lines[3].startswith("  Transpose x1: 'n3_Transpose' (only weights may be transposed")
    assert lines[4].startswith("microtrain supports: Conv, Gemm") and len(lines) == 5
