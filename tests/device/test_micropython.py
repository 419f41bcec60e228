"""The microtrain module on MicroPython and CircuitPython themselves, on every target that
runs here (tests/support/mptargets.py): the unix port, the qemu boards MPS2_AN385 (Cortex-M3, soft
float), MPS2_AN386 (Cortex-M4F) and MPS2_AN500 (Cortex-M7), each with the module built into
the firmware and again with the native module _microtrain.mpy loaded at run time, the qemu
RISC-V board VIRT_RV32 (RV32IMAC, soft float: the ESP32-C3/C6's instruction set) with the
module built in and, as stock MicroPython without microtrain, loading the rv32imc .mpy, PyPI's
prebuilt MicroPython unix port with the x64 .mpy, the Raspberry Pi Pico firmware in the
rp2040js emulator (Cortex-M0+, soft float), and CircuitPython 10.2.1's unix port.

These are parity checks against the host simulator (the same C core, through cffi), not
an independent oracle: they show that the firmware build, the binding, the device package
and each CPU (with or without an FPU) reproduce the host's numbers.

The tests are MicroPython's own kind: tests/device/micropython/<name>.py with its expected output
<name>.py.exp. The .exp files are written by hand and hold no figure our own code computes,
only True/False verdicts, fixed facts and exception messages.

The boards have no filesystem: everything a test needs (plans, samples, and what the host
simulator computed from them: parameters after 20 steps, losses, predictions, report
figures) travels inside the script. This file compiles the plans, runs the host simulator,
and writes build/mptests/<target>/<name>.py = a data header, the shared _prelude.py and the
template, with the .exp next to it. tests/support/mprun.py runs every script of a target in
one boot (one process per script on the unix ports), each from a fresh interpreter state;
each (target, script) is a case here, its failure the diff against the .exp. `make test`
runs the unix port and MPS2_AN500, `make test-all` every target. Under CI (CI=true) a target
that cannot run fails.
"""
import binascii
import difflib
import glob
import json
import os
import shutil
import struct
import time
import zlib

import numpy as np
import pytest

import microtrain
from microtrain import format as F
from microtrain.native import Core

import models
import mprun
import mptargets
from microtrain import boards
from repo import skip

pytestmark = pytest.mark.device

ROOT = mptargets.ROOT
TEMPLATES = os.path.join(ROOT, "tests", "device", "micropython")
OUT = os.path.join(ROOT, "build", "mptests")
MICROPY_DIR = mptargets.MICROPY_DIR
MODULE_SOURCES = os.path.join(ROOT, "modules", "microtrain")
TARGETS = mptargets.targets()

STEPS = 20   # momentum, accumulation and epochs all come round; the soft-float boards pay for each step
INT8_STEPS = 50   # data_int8: its last-layer losses on raw pixels are spiky for the first 20
TOL = 1e-5   # |device - host| <= TOL * max(1, |host|), for every parameter, loss and output


def f32(a):
    """float32 bytes in the targets' byte order (both are little-endian): the
    exact bits travel, no decimal round trip."""
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def params_f32(sim):
    return {k: f32(v) for k, v in sim.params().items()}


def learnable(rng, n, n_in, n_out):
    """Samples and labels a linear model can learn: the label is the argmax of a fixed projection."""
    x = rng.normal(size=(n, n_in)).astype(np.float32)
    w = rng.normal(size=(n_in, n_out))
    return x, (x @ w).argmax(1)


def train_on_host(plan, x, y, steps=STEPS):
    sim = microtrain.Simulator(plan)
    losses = [sim.step(x[i % len(x)], y[i % len(y)]) for i in range(steps)]
    return sim, np.array(losses, np.float32)


def assert_learns(losses):
    """The device prints 'losses decrease True'; make sure the host agrees that they do."""
    assert np.mean(losses[-10:]) < np.mean(losses[:10]), losses


# ---- data for each test: {name: value} becomes `name = repr(value)` --------------------------


def data_train_mlp():
    """MLP, cross-entropy, momentum 0.9, batch 1, every parameter trained, 20 steps."""
    plan = microtrain.compile(models.mlp(n_in=8, hidden=6, n_out=3, seed=1), update="full",
                              loss="cross-entropy", lr=0.05, momentum=0.9)
    x, y = learnable(np.random.default_rng(1), 10, 8, 3)
    sim, losses = train_on_host(plan, x, y)
    assert_learns(losses)
    return dict(PLAN=plan.data, N=len(x), X=f32(x), Y=[int(v) for v in y], STEPS=STEPS,
                HOST_LOSSES=f32(losses), HOST_PARAMS=params_f32(sim))


def data_train_cnn():
    """conv, relu, depthwise conv, relu6, residual add, maxpool, 1x1 conv, global
    average pool, gemm; mse, momentum 0.9, batch 2, every parameter trained, 20 steps; the first
    conv's output made again in the backward (recompute.py) rather than kept."""
    plan = microtrain.compile(models.cnn(seed=2, hw=8, n_out=4), update="full", loss="mse",
                              lr=0.02, momentum=0.9, batch=2)
    assert any(o["phase"] == "TRAIN" and o["op"] == "CONV2D" for o in plan.ops), "no replayed conv"
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 2, 8, 8)).astype(np.float32)
    y = rng.normal(size=(4, 4)).astype(np.float32)
    sim, losses = train_on_host(plan, x, y)
    assert_learns(losses)
    assert sim.core.ctx.updates == STEPS // 2
    return dict(PLAN=plan.data, N=len(x), X=f32(x), Y=f32(y), STEPS=STEPS,
                HOST_LOSSES=f32(losses), HOST_PARAMS=params_f32(sim))


def full_training_data(case, x, y, ops):
    """A case of tests/support/oracle_models.py, default (dynamo) export, update full, STEPS steps on the
    host: the data of train_full_and_compare() (tests/device/micropython/_prelude.py). `ops`: op names
    the plan must hold."""
    import tempfile
    from oracle_models import case_onnx
    with tempfile.TemporaryDirectory() as d:
        path, _ = case_onnx(case, "dynamo", d)
        plan = microtrain.compile(path, update="full", lr=0.05, momentum=0.9)
    assert set(ops) <= {o["op"] for o in plan.ops}
    init = params_f32(microtrain.Simulator(plan))
    sim, losses = train_on_host(plan, x, y)
    assert_learns(losses)
    assert all(f32(v) != init[k] for k, v in sim.params().items())
    return dict(PLAN=plan.data, N=len(x), X=f32(x), Y=[int(v) for v in y], STEPS=STEPS,
                HOST_LOSSES=f32(losses), HOST_PARAMS=params_f32(sim), INIT=init)


def data_train_kws():
    """The keyword-spotting CNN of issue 5: a view feeding a parameterless op, which once cut
    the gradient to the convolution."""
    from oracle_models import VIEW_CASES
    rng = np.random.default_rng(5)
    return full_training_data(VIEW_CASES["keyword_spotting"], rng.normal(size=(4, 13, 49)).astype(np.float32),
                              rng.integers(0, 4, 4), ("CONV2D_BWD_WEIGHT", "GAP_BWD", "CLIP_BWD"))


def data_train_mobilenet():
    """A MobileNetV3-style block (HardSwish, depthwise conv, squeeze-and-excitation with HardSigmoid
    and a per-channel Mul, residual Add): the activation, product and broadcast-gradient kernels."""
    from oracle_models import MODEL_CASES
    rng = np.random.default_rng(6)
    return full_training_data(MODEL_CASES["mobilenetv3_block"], rng.normal(size=(4, 3, 6, 6)).astype(np.float32),
                              rng.integers(0, 3, 4), ("ACT_BWD", "MUL_BWD_CHANNEL", "MUL", "CONV2D_BWD_WEIGHT"))


def data_noalloc():
    ce = microtrain.compile(models.mlp(n_in=8, hidden=6, n_out=3), update="full", lr=0.01, momentum=0.9)
    mse = microtrain.compile(models.cnn(hw=6, n_out=3), update="full", loss="mse", lr=0.001,
                             momentum=0.9, batch=2)
    return dict(PLAN_CE=ce.data, PLAN_MSE=mse.data)


HO = F.header_offsets()
TO = F.tensor_offsets()


def xor_patches(good, bad):
    """[(position, xor mask)] that turn good into bad (same length)."""
    return [(i, a ^ b) for i, (a, b) in enumerate(zip(good, bad)) if a != b]


def apply_case(data, length, patches, tail):
    """The bad plan of one case; the template's make() is the same function."""
    b = bytearray(data[:length] if length >= 0 else data)
    for pos, mask in patches:
        b[pos] ^= mask
    return bytes(b) + tail


def bad_plan_cases(plan):
    """(name, keep the first n bytes or -1 for all, [(byte position, xor mask)], bytes appended).
    Mutations of fields behind the CRC come with the CRC fixed, so the check of the field is reached."""
    data = plan.data
    h = plan.header

    def set_bytes(pos, new, fix_crc=True):
        b = bytearray(data)
        b[pos:pos + len(new)] = new
        if fix_crc:
            b[HO["crc32"]:HO["crc32"] + 4] = struct.pack("<I", zlib.crc32(bytes(b[F.CRC_START:])))
        return xor_patches(data, b)

    u32 = lambda v: struct.pack("<I", v)   # noqa: E731
    rec = lambda i: h["tensors_off"] + i * F.TENSOR_BYTES   # noqa: E731
    w, b = plan.tensor_index("fc1.weight"), plan.tensor_index("fc1.bias")
    rows, cols = plan.tensors[w]["shape"]
    return [
        ("empty", 0, [], b""),
        ("4 bytes", 4, [], b""),
        ("header only", F.HEADER_BYTES, [], b""),
        ("half", len(data) // 2, [], b""),
        ("one byte short", len(data) - 1, [], b""),
        ("bad magic", -1, set_bytes(0, b"XXXX", False), b""),
        ("version 99", -1, set_bytes(HO["version"], b"\x63\x00", False), b""),
        ("bit 3 flipped in the tensor table", -1, [(rec(0) + 5, 8)], b""),
        ("bit 0 flipped in the op list", -1, [(h["ops_off"] + 1, 1)], b""),
        ("bit 7 flipped in the last byte", -1, [(len(data) - 1, 128)], b""),
        ("size field too big", -1, set_bytes(HO["file_bytes"], u32(len(data) + 4), False), b""),
        ("one trailing byte", -1, [], b"\x00"),
        ("1000 trailing bytes", -1, [], b"x" * 1000),
        ("lr NaN", -1, set_bytes(HO["lr"], struct.pack("<f", float("nan"))), b""),
        ("momentum 1", -1, set_bytes(HO["momentum"], struct.pack("<f", 1.0)), b""),
        ("arena 8 bytes", -1, set_bytes(HO["arena_bytes"], u32(8)), b""),
        ("section past the end", -1, set_bytes(HO["data_off"], u32(len(data) + 64)), b""),
        ("op code 200", -1, set_bytes(h["ops_off"], b"\xc8"), b""),
        ("tensor dtype 9", -1, set_bytes(rec(0) + TO["dtype"], b"\x09"), b""),
        ("input tensor 999", -1, set_bytes(HO["input_tensor"], struct.pack("<H", 999)), b""),
        ("fc1.weight dims swapped", -1, set_bytes(rec(w) + TO["dim0"], u32(cols) + u32(rows)), b""),
        ("fc1.weight name out of range", -1, set_bytes(rec(w) + TO["name"], u32(h["names_bytes"] + 8)), b""),
        ("two parameters in the same memory", -1,
         set_bytes(rec(b) + TO["offset"], u32(plan.tensors[w]["offset"])), b""),
    ], set_bytes(HO["arena_bytes"], u32(64 << 20))


def data_bad_plan():
    plan = microtrain.compile(models.mlp(n_in=8, hidden=6, n_out=3), update="full", lr=0.05, momentum=0.9)
    cases, huge_ram = bad_plan_cases(plan)
    host = []
    for name, length, patches, tail in cases:
        with pytest.raises(ValueError) as e:
            Core(apply_case(plan.data, length, patches, tail))
        msg = str(e.value)
        for prefix in ("invalid plan: ", "cannot attach RAM: "):
            msg = msg[len(prefix):] if msg.startswith(prefix) else msg
        host.append(msg)
    # a valid plan that asks for 64 MB of RAM: it loads on the host, and is more than either target's heap
    Core(apply_case(plan.data, -1, huge_ram, b""))
    return dict(PLAN=plan.data, CASES=cases, HOST_MESSAGES=host, HUGE_RAM=huge_ram)


def data_bad_args():
    ce = microtrain.compile(models.mlp(n_in=8, hidden=6, n_out=3), update="full", lr=0.05, momentum=0.9)
    mse = microtrain.compile(models.mlp(n_in=8, hidden=6, n_out=3, seed=3), update="full", loss="mse",
                             lr=0.05, momentum=0.9, batch=2)
    return dict(PLAN_CE=ce.data, PLAN_MSE=mse.data)


def data_api():
    plan = microtrain.compile(models.cnn(seed=4, hw=6, n_out=3), update="last:2", lr=0.05, momentum=0.9)
    r = plan.report()
    info = {k: r[k] for k in ("arena_bytes", "naive_bytes", "param_bytes", "const_bytes", "macs_per_step",
                              "ops", "ram_bytes", "plan_bytes", "batch", "loss", "context_bytes", "context_in_plan")}
    info.update(tensors=len(r["tensors"]), steps=0, updates=0)
    assert r["context_in_plan"]   # the board's core takes the host's prepared context: ram_bytes agree
    assert r["const_bytes"] > 0   # frozen layers: every figure is something
    x, y = learnable(np.random.default_rng(4), 2, 72, 3)
    x = x.reshape(2, 2, 6, 6)
    sim = microtrain.Simulator(plan)
    init = params_f32(sim)
    pred0 = sim.predict(x)
    for i in range(5):
        sim.step(x[i % 2], y[i % 2])
    pred5 = sim.predict(x)
    one = microtrain.compile(models.mlp(n_in=4, hidden=3, n_out=1), update="full", loss="mse", lr=0.1)
    return dict(PLAN=plan.data, HOST_INFO=info, HOST_LR=f32([r["lr"]]),
                HOST_LENS=[sim.n_in, int(np.prod(sim.output_shape)), 1], FORMAT_VERSION=F.VERSION,
                X=f32(x), Y=[int(v) for v in y], HOST_INIT=init, HOST_PRED0=f32(pred0), HOST_PRED5=f32(pred5),
                PLAN_ONE_TARGET=one.data)


def data_state():
    """MLP, momentum 0.9, batch 3; the checkpoint is taken mid-batch (STOP = 7 of TOTAL = 12 steps)."""
    mlp = lambda seed: models.mlp(n_in=8, hidden=6, n_out=3, seed=seed)   # noqa: E731
    plan = microtrain.compile(mlp(7), update="full", lr=0.05, momentum=0.9, batch=3)
    other = microtrain.compile(mlp(8), update="full", lr=0.05, momentum=0.9, batch=3)
    rng = np.random.default_rng(7)
    x, y = learnable(rng, 5, 8, 3)
    stop, total = 7, 12
    host = Core(plan.data)
    for i in range(stop):
        host.step_label(x[i % 5], y[i % 5])
    info, blob = host.info(), host.save_state()
    for i in range(stop, total):
        host.step_label(x[i % 5], y[i % 5])
    new = {k: rng.normal(size=host.param(k).shape).astype(np.float32) for k in host.param_names}
    fresh = Core(plan.data)
    fresh.set_params(new)
    return dict(PLAN=plan.data, PLAN_OTHER=other.data, N=5, X=f32(x), Y=[int(v) for v in y], STOP=stop,
                TOTAL=total, HOST_INFO=info, HOST_STATE_LEN=host.state_len, HOST_BLOB=blob,
                HOST_PARAMS={k: f32(host.param(k)) for k in host.param_names},
                NEW_PARAMS={k: f32(v) for k, v in new.items()}, HOST_PRED_NEW=f32(fresh.predict(x[0])))


def data_plan_buffer():
    """A fully trained MLP, a CNN with frozen layers, and another plan as long as the MLP's."""
    full = microtrain.compile(models.mlp(n_in=8, hidden=40, n_out=3, seed=9), update="full", lr=0.05, momentum=0.9)
    other = microtrain.compile(models.mlp(n_in=8, hidden=40, n_out=3, seed=10), update="full", lr=0.05, momentum=0.9)
    frozen = microtrain.compile(models.cnn(seed=9, hw=6, n_out=3), update="last-layer", lr=0.05)
    assert len(full.data) == len(other.data) and len(full.data) > 1200 and frozen.report()["const_bytes"] > 0
    rng = np.random.default_rng(9)
    return dict(PLAN_FULL=full.data, PLAN_FROZEN=frozen.data, PLAN_OTHER=other.data,
                X_FULL=f32(rng.normal(size=8)), Y_FULL=1, X_FROZEN=f32(rng.normal(size=72)), Y_FROZEN=2)


DATA = {"train_mlp": data_train_mlp, "train_cnn": data_train_cnn, "train_kws": data_train_kws,
        "train_mobilenet": data_train_mobilenet, "noalloc": data_noalloc,
        "bad_plan": data_bad_plan, "bad_args": data_bad_args, "error_location": data_bad_args, "api": data_api,
        "state": data_state, "plan_buffer": data_plan_buffer}


def data_board_fit():
    """What Trainer(plan) takes from the heap, as boards.ram_needed predicts it for a 32-bit
    and a 64-bit board (the plan itself is already in RAM: the script holds it)."""
    plan = microtrain.compile(models.cnn(seed=5, hw=6, n_out=3), update="full", lr=0.05, momentum=0.9, batch=2)
    r = plan.report()
    need = {}
    for word, name in ((4, "rpi_pico"), (8, "unix")):
        parts = boards.ram_needed(r, boards.load_board(name), "in place")
        need[word] = parts["ram_bytes"] + parts["trainer"]
    return dict(PLAN=plan.data, NEED=need, GC_BLOCK=boards.GC_BLOCK_BYTES)


DATA["board_fit"] = data_board_fit


def host_outcome(data):
    """What tests/device/micropython/mutated_plans.py's run() gives for a plan, from the host's core
    (with guard bytes around its RAM, which must stay intact; the context in RAM, as the board's
    binding decodes it for the bytearray that script passes)."""
    from microtrain.native import PlanError, lib
    try:
        core = Core(data, guard=64, context_in_ram=True)
    except PlanError as e:
        return "refused: " + str(e).split(": ", 1)[1]
    parts = ["trains %d" % core.ram_bytes]
    x = np.array([((i * 5) % 8) / 8 - 0.5 for i in range(lib.mt_input_len(core.ctx))], np.float32)
    for _ in range(2):
        try:
            if core.ctx.loss_kind == F.LOSSES["CROSS_ENTROPY"]:
                core.step_label(x, 0)
            else:
                core.step_target(x, np.full(lib.mt_target_len(core.ctx), 0.25, np.float32))
            parts.append("ok")
        except ValueError as e:
            parts.append(str(e))
    try:
        core.predict(x)
        parts.append("ok")
    except ValueError as e:
        parts.append(str(e))
    assert (core.raw[:64] == 0xA5).all() and (core.raw[64 + core.ram_bytes:] == 0xA5).all(), "wrote outside its RAM"
    return "|".join(parts)


def data_mutated_plans():
    """1,000 mutated plans of three base plans (MLP cross-entropy, CNN mse batch 2, MLP with
    gradient clipping) and the host's outcome for each; the counts go to
    build/mptests/mutated_plans_counts.json and stdout."""
    import collections
    import plan_mutations
    bases = [microtrain.compile(models.mlp(n_in=8, hidden=6, n_out=3), update="full", lr=0.05, momentum=0.9).data,
             microtrain.compile(models.cnn(seed=2, hw=6, n_out=3), update="full", loss="mse", lr=0.02,
                                momentum=0.9, batch=2).data,
             microtrain.compile(models.mlp(n_in=5, hidden=4, n_out=2, seed=3), update="full", lr=0.05,
                                clip_grad=0.5).data]
    cases = plan_mutations.cases(bases, 1000)
    outcomes = [host_outcome(plan_mutations.build(bases[b], n, fix, patches, tail))
                for _, b, n, fix, patches, tail in cases]
    table = sorted(set(outcomes))
    assert len(table) < 256
    counts = collections.Counter(o.split(" (")[0] if o.startswith("refused") else "trained (steps: %s)"
                                 % o.split("|", 1)[1] for o in outcomes)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "mutated_plans_counts.json"), "w") as f:
        json.dump(dict(counts.most_common()), f, indent=1)
    print("mutated plans on the host:", json.dumps(dict(counts.most_common()), indent=1))
    return dict(PLANS=bases, CASES=binascii.b2a_base64(plan_mutations.pack(cases), newline=False).decode(),
                OUTCOMES=table, OUTCOME_OF=bytes(table.index(o) for o in outcomes), N=len(cases))


DATA["mutated_plans"] = data_mutated_plans
def data_int8():
    """int8 plans of the digits CNN (examples/), quantized by the compiler: inference only with
    uint8 input (int8 from input to output: bit-exact everywhere), with float input (QUANTIZE at the
    start), last-layer training on uint8 input, and training through frozen int8 layers."""
    from sklearn.datasets import load_digits
    ex = os.path.join(ROOT, "examples")
    model, d = os.path.join(ex, "digits_cnn.onnx"), np.load(os.path.join(ex, "digits_user.npz"))
    calib = (load_digits().images[:200] / 16.0).astype(np.float32)[:, None]
    q = dict(quantize="int8", calibration=calib)
    pixels = dict(q, input_dtype="uint8", input_quant=(1 / 255, 0))
    infer = microtrain.compile(model, update="none", **pixels)
    infer_f = microtrain.compile(model, update="none", **q)
    train = microtrain.compile(model, update="last-layer", lr=0.05, momentum=0.9, **pixels)
    through = microtrain.compile(model, update=["onnx::Conv_41", "onnx::Conv_42", "fc.weight", "fc.bias"],
                                 lr=0.02, momentum=0.9, batch=2, int8_scope="frozen", **q)
    assert {"CONV2D_BWD_INPUT_Q8", "CLIP_BWD_Q8"} <= {o["op"] for o in through.ops}
    n = 10
    x = d["x"][:n]
    sim = microtrain.Simulator(infer)
    xq = sim.quantize_input(x)
    pred = np.stack([sim.predict(v) for v in xq])
    pred_f = np.stack([microtrain.Simulator(infer_f).predict(v) for v in x])
    host_train, losses = train_on_host(train, xq, d["y"][:n], steps=INT8_STEPS)
    host_through, losses_through = train_on_host(through, x, d["y"][:n], steps=INT8_STEPS)
    assert_learns(losses)
    # a MobileNetV2-style block whose 1x1 expansion is streamed into its 5x5 stride-2 depthwise conv
    # (and on into its projection)
    import tempfile
    import torch
    import int8_models
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        block = int8_models.export(int8_models.Block(5, 2, 2).eval(), os.path.join(tmp, "block.onnx"), "ts")
        pwdw = microtrain.compile(block, update="none", **q)
        pwdw_train = microtrain.compile(block, update="last:2", lr=0.05, momentum=0.9, **q)
    # inference streams expansion, depthwise and projection (CONV_DW_PW_Q8); with the projection
    # training, the expansion into the depthwise conv (PWDW_Q8)
    assert "CONV_DW_PW_Q8" in [o["op"] for o in pwdw.ops] and "PWDW_Q8" in [o["op"] for o in pwdw_train.ops]
    pred_pwdw = np.stack([microtrain.Simulator(pwdw).predict(v) for v in x])
    host_pwdw, losses_pwdw = train_on_host(pwdw_train, x, d["y"][:n], steps=INT8_STEPS)
    return dict(PLAN_INFER=infer.data, PLAN_INFER_F=infer_f.data, PLAN_TRAIN=train.data, PLAN_THROUGH=through.data,
                N=n, XQ=xq.tobytes(), X=f32(x), Y=[int(v) for v in d["y"][:n]], STEPS=INT8_STEPS,
                HOST_PRED=f32(pred), HOST_PRED_F=f32(pred_f), HOST_LOSSES=f32(losses),
                HOST_PARAMS=params_f32(host_train), HOST_LOSSES_THROUGH=f32(losses_through),
                HOST_PARAMS_THROUGH=params_f32(host_through), PLAN_PWDW=pwdw.data, PLAN_PWDW_TRAIN=pwdw_train.data,
                HOST_PRED_PWDW=f32(pred_pwdw), HOST_LOSSES_PWDW=f32(losses_pwdw),
                HOST_PARAMS_PWDW=params_f32(host_pwdw))


DATA["int8"] = data_int8


def data_int8_kernels():
    """Single-op int8 conv plans (tests/support/q8_cases.py) in the shapes the SIMD kernels of
    Cortex-M4/M7 take (1x1 convs two pixels and two outputs at a time, depthwise 3x3/5x5/7x7 rows of
    stride 1 and 2 in registers) and the edges they hand back to the portable C (odd counts, channels
    past the column buffer, padding, dilation, shifts that the fast requantization does not take):
    the host's output for each, which the numpy reference agrees with."""
    import q8_cases as Q
    rng = np.random.default_rng(27)
    dw = lambda C, H, W, k, s=1, p=0, **kw: dict(C=C, H=H, W=W, O=kw.pop("O", C), k=(k, k), stride=(s, s),  # noqa: E731
                                                 pads=(p,) * 4, groups=C, **kw)
    convs = {
        "pw 16->48 6x6": dict(C=16, H=6, W=6, O=48, k=(1, 1)),
        "pw 24->7 5x5": dict(C=24, H=5, W=5, O=7, k=(1, 1)),
        "pw 3->5 5x7": dict(C=3, H=5, W=7, O=5, k=(1, 1)),
        "pw 8->1": dict(C=8, H=3, W=3, O=1, k=(1, 1)),
        "pw 520->3 (past the column buffer)": dict(C=520, H=2, W=3, O=3, k=(1, 1)),
        "pw left shifts": dict(C=8, H=4, W=4, O=6, k=(1, 1), shifts=(0, 30)),
        "pw right shifts to -31": dict(C=8, H=4, W=4, O=6, k=(1, 1), shifts=(-31, -20)),
        "pw relu6 clamp": dict(C=12, H=3, W=5, O=4, k=(1, 1), act_range=(-128, 20)),
        "dw 3x3 s1 p1": dw(6, 8, 9, 3, 1, 1),
        "dw 3x3 s2 p1": dw(5, 9, 11, 3, 2, 1),
        "dw 3x3 s1 p0": dw(4, 6, 12, 3),
        "dw 3x3 s2 p0": dw(4, 7, 13, 3, 2),
        "dw 5x5 s1 p2": dw(3, 9, 13, 5, 1, 2),
        "dw 5x5 s2 p2": dw(3, 11, 10, 5, 2, 2),
        "dw 7x7 s1 p3": dw(3, 10, 15, 7, 1, 3),
        "dw 7x7 s2 p3": dw(3, 12, 17, 7, 2, 3),
        "dw 7x7 multiplier 2": dw(3, 10, 10, 7, 1, 3, O=6),
        "dw 3x3 dilation 2": dw(3, 9, 9, 3, 1, 2, dil=(2, 2)),
        "dw 3x3 wide row": dw(2, 3, 70, 3, 1, 1),
        "dw 5x5 s2 wide row": dw(2, 5, 71, 5, 2, 2),
        "dw 3x3 left shifts": dw(3, 5, 8, 3, 1, 1, shifts=(0, 30)),
        "dw 3x3 right shifts to -31": dw(3, 5, 8, 3, 1, 1, shifts=(-31, -20)),
        "dw 3x3 asymmetric": dict(C=3, H=7, W=9, O=3, k=(3, 3), stride=(1, 2), pads=(0, 1, 1, 0), groups=3),
        "dw 1x5": dw(3, 1, 20, 1, 1, 0) | dict(k=(1, 5), pads=(0, 2, 0, 2)),
        "stem 3x3 s2 p1": dict(C=3, H=16, W=16, O=8, k=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1)),
        "5x5 s2 p2": dict(C=3, H=11, W=10, O=5, k=(5, 5), stride=(2, 2), pads=(2, 2, 2, 2)),
        "3x3 valid": dict(C=2, H=6, W=6, O=3, k=(3, 3)),
    }
    made = {n: Q.conv_q8(rng, **c) for n, c in convs.items()}
    for name, (k, s, p) in {"pwdw 3x3 same": (3, 1, 1), "pwdw 5x5 s2": (5, 2, 2), "pwdw 7x7 s1": (7, 1, 3)}.items():
        made[name] = Q.pwdw_q8(rng, 8, 24, 9, 11, (k, k), (s, s), (p,) * 4)
    for name, (k1, s1, p1) in {"cdp stem s2, dw 3x3": (3, 1, 1), "cdp stem s2, dw 5x5 s2": (5, 2, 2),
                               "cdp stem s2, dw 7x7": (7, 1, 3)}.items():
        made[name] = Q.cdp_q8(rng, 3, 16, 8, 20, 18, (3, 2, (1, 1, 1, 1)), (k1, s1, (p1,) * 4, 1))
    made["cdp 1x1, dw 3x3 s2"] = Q.cdp_q8(rng, 8, 24, 8, 9, 13, (1, 1, (0,) * 4), (3, 2, (1,) * 4, 1))
    cases = []
    for name, (plan, (x,), (want,)) in made.items():
        core = Core(plan.data)
        out = core.predict(x)
        assert np.array_equal(core.array(plan.tensor_index("y")).reshape(want.shape), want), name
        cases.append((name, plan.data, x.tobytes(), f32(out)))
    return dict(CASES=cases)


DATA["int8_kernels"] = data_int8_kernels


def sparse_block_plan(scheme, **options):
    """tests/sparse/test_sparse.py's CNN (ts13 export) compiled with a sparse-update scheme."""
    import tempfile
    import torch
    from oracle_models import export
    from test_sparse import Block
    with tempfile.TemporaryDirectory() as d:
        path = export(Block().eval(), torch.zeros(1, 3, 6, 6), "ts13", os.path.join(d, "block.onnx"))
        return microtrain.compile(path, update=scheme, lr=0.05, momentum=0.9, **options)


def trained_on_host(plan, x, y):
    """The data header of a train_full_and_compare() test: the plan trained STEPS steps here."""
    init = params_f32(microtrain.Simulator(plan))
    sim, losses = train_on_host(plan, x, y)
    assert_learns(losses)
    return dict(PLAN=plan.data, N=len(x), X=f32(x), Y=[int(v) for v in y], STEPS=STEPS,
                HOST_LOSSES=f32(losses), HOST_PARAMS=params_f32(sim), INIT=init)


def data_train_sparse():
    """A MIT-style sparse update (docs/sparse.md) of tests/sparse/test_sparse.py's CNN: int8 frozen
    prefix, some input channels of two 1x1 convs and two channels of the depthwise conv (those
    channels a parameter of their own, read through GATHER_CH; the input gradient added back into
    the frozen part's through SCATTER_ACC_CH), three biases, the head, ReLU6 outputs saved as int8
    for the backward (CLIP_BWD_Q8)."""
    scheme = {"classifier": "full", "bias_updates": [{"conv_index": k} for k in (1, 2, 3)],
              "weight_updates": [{"conv_index": 1, "channel_axis": 1, "selected_channels": [0, 2, 3, 7]},
                                 {"conv_index": 2, "channel_axis": 0, "selected_channels": [1, 4]},
                                 {"conv_index": 3, "ratio": 0.5, "select": "magnitude+"}]}
    rng = np.random.default_rng(7)
    plan = sparse_block_plan(scheme, saved="int8", quantize="int8",
                             calibration=rng.normal(size=(32, 3, 6, 6)).astype(np.float32) * 2)
    assert {"CONV2D_Q8", "CLIP_BWD_Q8", "CONV2D_BWD_WEIGHT", "GATHER_CH", "SCATTER_ACC_CH"} <= {o["op"] for o in plan.ops} \
        and len(plan.meta["split"]) == 3
    x = (rng.normal(size=(4, 3, 6, 6)) * 2).astype(np.float32)
    return trained_on_host(plan, x, rng.integers(0, 4, 4))


DATA["train_sparse"] = data_train_sparse


def data_train_masks():
    """tests/sparse/test_sparse.py's CNN in float with saved="bits": the ReLU6 outputs after the 1x1
    expansion and the depthwise conv (read only by frozen weights) keep 1-bit masks for the
    backward (MASK_PACK, MASK_BWD); some input channels of the expansion, three biases, the head
    train. 6x6x12 = 432 bits per mask; the inputs are scaled so both ends of ReLU6 clamp."""
    scheme = {"classifier": "full", "bias_updates": [{"conv_index": k} for k in (1, 2, 3)],
              "weight_updates": [{"conv_index": 1, "channel_axis": 1, "selected_channels": [0, 2, 3, 7]}]}
    rng = np.random.default_rng(8)
    plan = sparse_block_plan(scheme, saved="bits")
    ops = [o["op"] for o in plan.ops]
    assert ops.count("MASK_PACK") == 2 and ops.count("MASK_BWD") == 2 and plan.meta["channels"]
    x = (rng.normal(size=(4, 3, 6, 6)) * 3).astype(np.float32)
    return trained_on_host(plan, x, rng.integers(0, 4, 4))


DATA["train_masks"] = data_train_masks


def data_train_w8():
    """tests/sparse/test_sparse.py's CNN in float with its frozen conv weights int8 (frozen_weights="int8",
    w8.py): the first conv and the depthwise conv (in place) train their biases only, the 1x1
    expansion some input channels (its frozen part W@frozen int8), the head; the gradient goes
    back through every W8 form (CONV2D_W8, CONV2D_DW_INPLACE_W8, CONV2D_BWD_INPUT_DW_INPLACE_W8,
    CONV2D_BWD_INPUT_W8; saved="int8" keeps the block from being streamed, train_pwdw below)."""
    rng = np.random.default_rng(9)
    plan = sparse_block_plan(W8_SCHEME, saved="int8", frozen_weights="int8")
    assert {"CONV2D_W8", "CONV2D_DW_INPLACE_W8", "CONV2D_BWD_INPUT_DW_INPLACE_W8", "CONV2D_BWD_INPUT_W8"} \
        <= {o["op"] for o in plan.ops} and len(plan.meta["w8"]) == 4
    x = (rng.normal(size=(4, 3, 6, 6)) * 3).astype(np.float32)
    return trained_on_host(plan, x, rng.integers(0, 4, 4))


W8_SCHEME = {"classifier": "full", "bias_updates": [{"conv_index": k} for k in (0, 1, 2, 3)],
             "weight_updates": [{"conv_index": 1, "channel_axis": 1, "selected_channels": [0, 2, 3, 7]}]}
DATA["train_w8"] = data_train_w8


def data_train_pwdw(trained_weights="float32"):
    """The same with the ReLU6 outputs kept as 1-bit masks: the block runs a channel at a time
    (dw_stream.py: PWDW_W8 and PWDW_W8_BWD), its trained slice float32 (train_pwdw) or int8
    (train_pwdw_q8)."""
    rng = np.random.default_rng(9)
    plan = sparse_block_plan(W8_SCHEME, saved="bits", frozen_weights="int8", trained_weights=trained_weights)
    assert {"PWDW_W8", "PWDW_W8_BWD"} <= {o["op"] for o in plan.ops}
    x = (rng.normal(size=(4, 3, 6, 6)) * 3).astype(np.float32)
    return trained_on_host(plan, x, rng.integers(0, 4, 4))


DATA["train_pwdw"] = data_train_pwdw
DATA["train_pwdw_q8"] = lambda: data_train_pwdw("int8")


def data_train_in_place():
    """train_pwdw_q8's plan reading its input where the caller keeps it (input_in_place=True):
    the input tensor not in the arena (storage INPUT), the RAM the host reports without it."""
    rng = np.random.default_rng(9)
    plan = sparse_block_plan(W8_SCHEME, saved="bits", frozen_weights="int8", trained_weights="int8",
                             input_in_place=True)
    r = plan.report()
    assert r["input_in_place"] and plan.tensors[plan.header["input_tensor"]]["storage"] == "INPUT"
    x = (rng.normal(size=(4, 3, 6, 6)) * 3).astype(np.float32)
    return dict(trained_on_host(plan, x, rng.integers(0, 4, 4)), RAM=r["peak_ram_bytes"])


DATA["train_in_place"] = data_train_in_place


def data_train_stream():
    """train_pwdw_q8's plan with its constants in a stream section (compile(stream=True)), its
    expansion block's constants read in blocks of output channels (a 256-byte window): the device
    opens it from a file (unix: its filesystem; a board without one: an io.BytesIO, through the same
    stream protocol) and reads each group into its window as the ops need it. The host trains the
    plan whole in memory; the device must match it bit for bit, read exactly what the host core
    reads by the plan's head, and allocate no more than boards.ram_needed counts for a streamed plan
    (less the open file, made before the count). Then a byte of a group changed in the file fails
    the step with the CRC message and updates nothing."""
    rng = np.random.default_rng(9)
    plan = sparse_block_plan(W8_SCHEME, saved="bits", frozen_weights="int8", trained_weights="int8",
                             stream=True, stream_window=256)
    r = plan.report()
    assert r["streamed"] and any("blocks of output channels" in n for n in r["notes"]), r["notes"]
    x = (rng.normal(size=(4, 3, 6, 6)) * 3).astype(np.float32)
    y = rng.integers(0, 4, 4)
    data = trained_on_host(plan, x, y)
    host = Core(plan.data, stream=True)   # what the core reads from the file over the steps
    read0 = host.info()["stream_read_bytes"]
    for i in range(STEPS):
        host.step_label(x[i % len(x)], int(y[i % len(y)]))
    assert {k: f32(host.param_values(k)) for k in host.param_names} == data["HOST_PARAMS"]   # by its head: the same
    need = {}
    for word, name in ((4, "rpi_pico"), (8, "unix")):
        parts = boards.ram_needed(r, boards.load_board(name), "streamed")
        need[word] = parts["ram_bytes"] + parts["trainer"] + parts["head"]
    g = next(g for g in plan.groups if g["first_op"] != F.RESET_GROUP)
    return dict(data, HEAD=plan.header["stream_off"], READ=host.info()["stream_read_bytes"] - read0,
                NEED=need, GC_BLOCK=boards.GC_BLOCK_BYTES, GROUP_AT=plan.header["stream_off"] + g["lo"] + g["bytes"] // 2)


DATA["train_stream"] = data_train_stream


def data_train_dq():
    """int8_models.Block (stem, 1x1 expansion, depthwise 3x3, 1x1 projection, the stem's output
    added) int8 up to the depthwise output, the projection's bias and the head trained: the
    expansion streamed into the float projection a row at a time and the int8 residual added
    undequantized (dq_conv.py: PWDW_DQ_W8 and ADD_DQ); the same with float32 frozen weights
    (PWDW_DQ) as PLAN_F32 and its results."""
    import tempfile
    import int8_models
    rng = np.random.default_rng(13)
    cal = rng.uniform(0, 1, (16, 3, 12, 12)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        src = int8_models.export(int8_models.Block(cin=3, width=8, expand=24).eval(), os.path.join(tmp, "b.onnx"),
                                 "ts", shape=(1, 3, 12, 12))
        layers = microtrain.compile(src, update="last-layer").meta["layers"]
        kw = dict(update=[layers[-2]["bias"], layers[-1]["weight"], layers[-1]["bias"]], quantize="int8",
                  calibration=cal, lr=0.05, momentum=0.9)
        plans = [microtrain.compile(src, frozen_weights=w, **kw) for w in ("int8", "float32")]
    for plan, ops in zip(plans, ({"PWDW_DQ_W8", "ADD_DQ"}, {"PWDW_DQ", "ADD_DQ"})):
        assert ops <= {o["op"] for o in plan.ops}
    x = rng.uniform(0, 1, (4, 3, 12, 12)).astype(np.float32)
    y = rng.integers(0, 10, 4)
    data, f32_data = (trained_on_host(p, x, y) for p in plans)
    data.update({k + "_F32": f32_data[k] for k in ("PLAN", "HOST_LOSSES", "HOST_PARAMS", "INIT")})
    return data


DATA["train_dq"] = data_train_dq


def data_train_q8_state():
    """tests/sparse/test_sparse.py's CNN with its trained weights int8 (trained_weights="int8",
    docs/sparse.md): some input channels of the expansion (an int8 slice), some channels of the
    depthwise conv (a whole int8 weight, ranged updates), three biases, the int8 head; momentum."""
    scheme = {"classifier": "full", "bias_updates": [{"conv_index": k} for k in (1, 2, 3)],
              "weight_updates": [{"conv_index": 1, "channel_axis": 1, "selected_channels": [0, 2, 3, 7]},
                                 {"conv_index": 2, "channel_axis": 0, "selected_channels": [1, 2, 9]}]}
    rng = np.random.default_rng(9)
    plan = sparse_block_plan(scheme, trained_weights="int8")
    assert "DEQUANTIZE_W" in [o["op"] for o in plan.ops]
    assert sum(t["dtype"] == "I8" and t["storage"] == "STATE" for t in plan.tensors) == 3
    x = (rng.normal(size=(4, 3, 6, 6)) * 2).astype(np.float32)
    return trained_on_host(plan, x, rng.integers(0, 4, 4))


DATA["train_q8_state"] = data_train_q8_state


def header(name, values):
    lines = ["# Generated by tests/device/test_micropython.py: data for tests/device/micropython/%s.py, computed on the host." % name,
             "# Do not edit; the test body starts after the data."]
    lines += ["%s = %r" % (k, v) for k, v in values.items()]
    return "\n".join(lines) + "\n\n"


# ---- running ---------------------------------------------------------------------------------


def test_every_template_has_expected_output_and_data():
    """Runs without MicroPython: the templates, their .exp files and DATA agree."""
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(TEMPLATES, "[!_]*.py")))
    assert names == sorted(DATA)
    for n in names:
        exp = open(os.path.join(TEMPLATES, n + ".py.exp")).read()
        assert exp.endswith("\n") and "Traceback" not in exp, n


_scripts = {}


def scripts():
    """{name: data header + prelude + template}, computed once per session (the host side of
    every test), and only when some target runs."""
    if not _scripts:
        prelude = open(os.path.join(TEMPLATES, "_prelude.py")).read()
        for name, make in DATA.items():
            body = open(os.path.join(TEMPLATES, name + ".py")).read()
            try:
                _scripts[name] = header(name, make()) + prelude + "\n\n" + body
            except Exception as e:   # that script's case fails with it (test_micropython), not the others
                _scripts[name] = e
    return _scripts


def need_target(target):
    why = target.missing()
    if why:
        skip(why)
    # a build older than the module's sources (what its make rule depends on, the frozen
    # device package included) tests old code; a native-module target runs the .mpy (and the
    # package from the source tree), not the firmware's module
    built = target.mpy or target.firmware
    if built.startswith(mptargets.BUILD):
        sources = [p for pattern in ("*.c", "*.h", "micropython.mk", "manifest.py", "python/*/*.py")
                   for p in glob.glob(os.path.join(MODULE_SOURCES, pattern))]
        newer = sorted(os.path.relpath(p, MODULE_SOURCES) for p in sources
                       if os.path.getmtime(p) > os.path.getmtime(built))
        if newer:
            pytest.fail("%s is older than modules/microtrain/%s; run `make firmware`"
                        % (os.path.relpath(built, ROOT), ", ".join(newer)), pytrace=False)


# Targets held to the host simulator bit for bit: every loss, output and parameter the scripts
# compare is equal, not within TOL (the prelude's TOL set to 0). On the RISC-V board float32
# arithmetic is libgcc's soft float, correctly rounded as the host's SSE is, and the core does
# the same operations in the same order.
EXACT_TARGETS = ("virt_rv32", "virt_rv32-natmod")


def exact(script):
    assert "\nTOL = 1e-5\n" in script, "the prelude's TOL line changed; EXACT_TARGETS sets it to 0"
    return script.replace("\nTOL = 1e-5\n", "\nTOL = 0.0\n", 1)


_batches = {}
# targets slow enough that their scripts are split over several boots, which xdist can run at once
SHARDS = {"rpi_pico": 2}


def shard_of(target, script):
    n = SHARDS.get(target, 1)
    return sorted(DATA).index(script) % n if n > 1 else None


def batch(name, shard):
    """{script: mprun.Result} of the scripts of target `name` (those of `shard`, where the target
    is split: SHARDS): one boot runs them all, on the first of their cases to run (xdist keeps
    them on one worker: cases())."""
    key = name if shard is None else "%s.%d" % (name, shard)
    if key not in _batches:
        target = TARGETS[name]
        need_target(target)
        out = os.path.join(OUT, key)
        shutil.rmtree(out, ignore_errors=True)
        mine = {s: exact(v) if name in EXACT_TARGETS else v for s, v in scripts().items()
                if shard_of(name, s) == shard and not isinstance(v, Exception)}
        t0 = time.monotonic()
        _batches[key] = mprun.run_batch(target, mine, out)
        for script in mine:   # beside each script (build/mptests/<target>/), what it must print
            shutil.copyfile(os.path.join(TEMPLATES, script + ".py.exp"), os.path.join(out, script + ".py.exp"))
        with open(os.path.join(out, "seconds.json"), "w") as f:   # where a slow target's time goes
            json.dump({s: round(r.seconds, 2) for s, r in sorted(_batches[key].items())}, f, indent=1)
        print("%s: %d scripts in %.1f s" % (key, len(mine), time.monotonic() - t0))
    return _batches[key]


# `make test` runs the unix port and MPS2_AN500; every other target is in `make test-all`
FAST_TARGETS = ("unix", "mps2_an500")


def cases():
    """(target, script) pairs, with the id script@target (script@target.shard where SHARDS splits
    the target): the cases of one boot on one xdist worker (tests/conftest.py, --dist loadgroup)."""
    out = []
    for t in TARGETS:
        for s in sorted(DATA):
            shard = shard_of(t, s)
            out.append(pytest.param(t, s, id="%s@%s" % (s, t if shard is None else "%s.%d" % (t, shard)),
                                    marks=([] if t in FAST_TARGETS else [pytest.mark.slow])
                                    + ([pytest.mark.long] if t in SHARDS else [])))
    return out


@pytest.mark.parametrize("target,script", cases())
def test_micropython(target, script):
    if isinstance(scripts()[script], Exception):
        raise scripts()[script]   # its data function failed on the host
    shard = shard_of(target, script)
    r = batch(target, shard)[script]
    exp = open(os.path.join(TEMPLATES, script + ".py.exp")).read()
    if r.problem or r.output != exp:
        where = target if shard is None else "%s.%d" % (target, shard)
        pytest.fail("\n".join(["%s on %s: %s after %.1f s (build/mptests/%s/%s.py)" % (
            script, target, r.problem or "output differs from %s.py.exp" % script, r.seconds, where, script)]
            + list(difflib.unified_diff(exp.splitlines(), r.output.splitlines(), "expected", target, lineterm=""))),
            pytrace=False)
