"""The benchmark harness's plumbing (benchmarks/): how timer readings become
instruction counts, the plain-MicroPython baseline against PyTorch autograd, the
PyTorch copy of an ONNX model against onnx.reference, and that two qemu runs
count the same. No timing and no instruction count decides anything here."""
import os
import shutil
import sys

import numpy as np
import pytest
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from repo import ROOT
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_models  # noqa: E402
import plain_mlp  # noqa: E402
import qemu_count  # noqa: E402
import torch_eager  # noqa: E402
import tte  # noqa: E402

BOARD = "MPS2_AN500"


def timer_reading(t0, t1, offset):
    """What the board's two timers read at virtual times t0 and t1 (ns), from the
    CMSDK timers' definition: 25 MHz down-counters reloaded at MASK, the coarse
    one advancing every 256 ticks of the same clock from an arbitrary phase."""
    period = qemu_count.FINE_MASK + 1
    fine = lambda t: (qemu_count.FINE_MASK - t // 40) % period   # noqa: E731
    coarse = lambda t: (qemu_count.FINE_MASK - (t + offset) // (40 * 256)) % period   # noqa: E731
    return fine(t0), coarse(t0), fine(t1), coarse(t1)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 316, 98_345, 335_544_319, 335_544_320, 335_544_321, 1_280_676_240,
                               5_000_000_003])
def test_instructions_from_timer_readings(n):
    """Exact at every phase, across fine-timer wraps (335 M instructions each)."""
    rng = np.random.default_rng(n)
    ns = 1 << qemu_count.SHIFT
    for _ in range(50):
        t0 = int(rng.integers(0, 1 << 40)) * ns + int(rng.integers(0, ns))
        r = timer_reading(t0, t0 + n * ns, int(rng.integers(0, 40 * 256)))
        assert qemu_count.instructions(r, BOARD) == n


@pytest.mark.parametrize("n", [0, 1, 780, (1 << 32) - 1, 1 << 32, (1 << 32) + 5, 3_883_880_810, 9_000_000_000])
def test_instructions_from_instret_readings(n):
    """VIRT_RV32's windows: instret's low and high words at both ends, the low word wrapping."""
    rng = np.random.default_rng(n)
    for _ in range(50):
        t0 = int(rng.integers(0, 1 << 50))
        t1 = t0 + n
        r = (t0 & 0xFFFFFFFF, t0 >> 32, t1 & 0xFFFFFFFF, t1 >> 32)
        assert qemu_count.instructions(r, "VIRT_RV32") == n


def test_parse_reads_windows_and_values():
    t = 12_345 * (1 << qemu_count.SHIFT)
    r = timer_reading(t, t + 4_511 * (1 << qemu_count.SHIFT), 77)
    out = "noise\nW mlp-full step %d %d %d %d\nV mlp-full loss 1.5\nW mlp-full step 1 2\ndone\n" % r
    counts, values = qemu_count.parse(out, BOARD)
    assert counts == {("mlp-full", "step"): [4_511]}
    assert values == {("mlp-full", "loss"): 1.5}


def test_unknown_board_is_named():
    with pytest.raises(ValueError, match="NETDUINO2.*MPS2_AN500.*VIRT_RV32"):
        qemu_count.board("NETDUINO2")


@pytest.mark.parametrize("full", [True, False])
def test_plain_micropython_mlp_against_torch(full):
    """The baseline computes the step it claims: losses and parameters after 5 SGD-momentum
    steps match PyTorch autograd's on the same weights."""
    model = bench_models.mlp(n_in=12, hidden=7, n_out=4, seed=3)
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    net = plain_mlp.make(w["fc1.weight"].reshape(-1), w["fc1.bias"], w["fc2.weight"].reshape(-1), w["fc2.bias"], 12,
                         0.1, 0.9, full)
    ref = {k: torch.tensor(v, requires_grad=full or k.startswith("fc2")) for k, v in w.items()}
    opt = torch.optim.SGD([p for p in ref.values() if p.requires_grad], lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    for i in range(5):
        x = rng.normal(size=12).astype(np.float32)
        y = int(rng.integers(4))
        loss = plain_mlp.step(net, [float(v) for v in x], y)
        opt.zero_grad()
        h = torch.relu(torch.from_numpy(x) @ ref["fc1.weight"].T + ref["fc1.bias"])
        want = torch.nn.functional.cross_entropy((h @ ref["fc2.weight"].T + ref["fc2.bias"])[None], torch.tensor([y]))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    for name, rows in (("fc1.weight", net["w1"]), ("fc2.weight", net["w2"])):
        np.testing.assert_allclose(np.array([list(r) for r in rows]), ref[name].detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(list(net["b1"]), ref["fc1.bias"].detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(list(net["b2"]), ref["fc2.bias"].detach().numpy(), rtol=1e-5, atol=1e-6)
    if not full:
        np.testing.assert_array_equal(np.array([list(r) for r in net["w1"]]), w["fc1.weight"])


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "digits"])
def test_torch_copy_of_onnx_model_against_onnx_reference(name):
    """The PyTorch side of the host comparison runs the same function as the ONNX model."""
    model = bench_models.load(os.path.join(ROOT, "examples", "digits_cnn.onnx")) if name == "digits" else \
        getattr(bench_models, name)()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x})[0]
    got = torch_eager.OnnxModule(model, [])(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_torch_copy_trains_only_the_named_parameters():
    model = bench_models.mlp()
    net, step = torch_eager.trainer(model, ["fc2.weight", "fc2.bias"], 0.1, 0.9)
    before = {k: p.detach().clone() for k, p in net.params.items()}
    step(torch.ones(1, 64), torch.tensor([2]))
    changed = sorted(k for k, p in net.params.items() if not torch.equal(p, before[k]))
    assert changed == sorted(net.keys[n] for n in ("fc2.weight", "fc2.bias"))
    with pytest.raises(ValueError, match="fc9.weight"):
        torch_eager.trainer(model, ["fc9.weight"], 0.1, 0.9)


def test_doc_lists_every_entry():
    import perfdoc
    results = [dict(model="MLP 64-32-10", update="full", board="MPS2_AN500", instr_per_step=1000,
                    instr_per_predict=400, macs_per_step=100, instr_per_mac=10.0, baseline_instr_per_step=50_000,
                    host_us_per_step=1.0, torch_us_per_step=2.0),
               dict(model="MCUNet-5fps 128x128", update="last-layer", board="MPS2_AN385", instr_per_step=None,
                    instr_per_predict=None, macs_per_step=5, instr_per_mac=None, baseline_instr_per_step=None,
                    host_us_per_step=3.0, torch_us_per_step=4.0)]
    doc = perfdoc.render(results, [dict(results[0], instr_per_step=2000)], {"boards": ["MPS2_AN500", "MPS2_AN385"]})
    assert "| MLP 64-32-10 | full | MPS2_AN500 | 2.00k | 1.00k | 400 | 100 | 10.0 | 50.0k | 50 | 0.005 |" in doc
    assert "| MCUNet-5fps 128x128 | last-layer | MPS2_AN385 | - | - | - |" in doc
    assert "estimate" in doc


def test_doc_puts_int8_mcunet_estimates_beside_mit():
    """The int8 MCUNet rows of the Cortex-M7 board reach the MIT table as labelled estimates, with
    what the plan computes in; the soft-float board's do not (its core is not MIT's)."""
    import perfdoc
    row = dict(model="MCUNet-5fps 128x128 int8", update="sparse 49kb (MIT)", board="MPS2_AN500",
               instr_per_step=108_000_000, instr_per_predict=1, macs_per_step=1, instr_per_mac=1.0,
               baseline_instr_per_step=None, host_us_per_step=1.0, torch_us_per_step=None)
    doc = perfdoc.render([row, dict(row, board="MPS2_AN385", instr_per_step=999_000_000)], [], {})
    mit = doc.split("## Beside MIT's measured figures")[1].split("## Method")[0]
    assert "| 546 |" in mit
    assert ("| MCUNet-5fps 128x128 int8 | microtrain, int8 frozen part, float32 training, sparse 49kb (MIT) "
            "(**estimate** from 108,000,000 instructions on qemu MPS2_AN500) | 500 (350-750) |") in mit
    assert "MPS2_AN385" not in mit
    assert "not written yet" not in doc


def test_doc_has_the_streamed_constants_section_from_stream_json():
    """bench/stream.json's rows (benchmarks/stream_count.py) become a table with the instructions a
    step costs more streamed, per byte read, and the flash time at the assumed rate; none without."""
    import perfdoc
    base = dict(model="MCUNet-5fps 128x128 int8", update="sparse 49kb (MIT)", board="MPS2_AN500", plan_bytes=600_000,
                head_bytes=30_000, ram_bytes=1, instr_per_predict=5, read_per_predict=0)
    rows = [dict(base, where="resident", what="in RAM", instr_per_step=400_000_000, read_per_step=0),
            dict(base, where="in-place", what="in place", instr_per_step=400_000_100, read_per_step=0),
            dict(base, where="streamed", what="streamed", instr_per_step=412_000_000, read_per_step=1_000_000)]
    doc = perfdoc.render([], [], {}, rows)
    part = doc.split("## Constants streamed from the plan's file")[1].split("## v0")[0]
    assert "| streamed | 412,000,000 | +3.0 % | 5 | 1,000,000 | 0 |" in part
    assert "12,000,000 instructions a step more (12.0 per byte read" in part
    assert "**assumed** 15 MB/s" in part and "that is 67 ms a step" in part
    assert "## Constants streamed" not in perfdoc.render([], [], {})


def _int8_case():
    """An int8 plan taking uint8 pixels, compiled as bench.py compiles the int8 MCUNet rows
    (bench_models.cases()' options), on a small RGB CNN so that it costs a second."""
    import bench
    return bench.Case("cnn-int8", "small CNN 16x16 int8", "last-layer", bench_models.small_cnn(c_in=3), False,
                      dict(int8=8))


def test_tte_summary_counts_rows_and_says_why_each_other_is_over():
    """tte.py's last lines: rows under MIT's figure copied and in place; each row over in place
    named, as unreachable where MIT's own count of its trained weights is over the figure."""
    def row(scheme, copied_kb, in_place_kb, trained_kb, mit_kb=173):
        return dict(model="m", scheme=scheme, peak_ram_bytes=copied_kb * 1024,
                    in_place_peak_ram_bytes=in_place_kb * 1024, mit_trained_kb=trained_kb, mit_peak_kb=mit_kb)
    text = tte.summary([row("a", 100, 90, 40), row("b", 180, 170, 100), row("c", 190, 180, 120),
                        row("d", 400, 400, 300), row("e", 173, 173, 50)]).splitlines()
    assert text[0].endswith("1 of 5 with the image copied into RAM, 2 of 5 with it read in place")
    assert [t.split(": ")[1].split(",")[0] for t in text[1:]] == ["m c", "m d", "m e"]
    assert "over by 7.0 KB" in text[1] and "over by 0.0 KB" in text[3]
    assert "trained weights and biases alone (MIT's count, 300.0 KB) are over 173 KB" in text[2]


def test_uint8_plan_gets_its_sample_as_bytes():
    """A uint8-input plan's sample goes to the board as one byte per input element, quantized as
    ONNX QuantizeLinear (onnx.reference) quantizes the float sample with the plan's input scale
    and zero point; it has no PyTorch figure (not the float model), the simulator's time only."""
    import bench
    from onnx import TensorProto, helper
    case = _int8_case()
    inp = case.plan.meta["input"]
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("q", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(np.array(inp["scale"], np.float32), "s"),
                               numpy_helper.from_array(np.array(inp["zero_point"], np.uint8), "z")])
    x = np.random.default_rng(7).normal(size=case.in_shape).astype(np.float32)   # bench.Case's seeded sample
    want = ReferenceEvaluator(helper.make_model(graph)).run(None, {"x": x})[0]
    blob = qemu_count.Blob()
    off, n = case.device_input(blob)
    assert n == 3 * 16 * 16
    np.testing.assert_array_equal(np.frombuffer(bytes(blob.data[off:off + n]), np.uint8).reshape(x.shape), want)
    assert len(set(want.reshape(-1))) > 100   # a real spread of pixel values, not a saturated sample
    host_us, torch_us = bench.host_speed(case)
    assert host_us > 0 and torch_us is None


def _firmware(board="mps2_an500"):
    """A board's test firmware (`make firmware`) and the MicroPython checkout, or a skip."""
    fw = os.path.join(ROOT, "build", "firmware", board, "firmware.elf")
    micropy = os.environ.get("MICROPY_DIR") or os.path.expanduser("~/.cache/microtrain/micropython")
    exe = qemu_count.qemu_exe(board.upper())
    if not os.path.exists(fw) or shutil.which(exe) is None:
        pytest.skip("needs %s (apt-get install %s) and `make firmware` (%s)"
                    % (exe, qemu_count.QEMU_APT[exe], os.path.relpath(fw, ROOT)))
    if not os.path.exists(os.path.join(micropy, "tools", "pyboard.py")):
        pytest.skip("needs the MicroPython checkout's tools/pyboard.py (set MICROPY_DIR)")
    return fw, micropy


LOOP = """
@micropython.asm_rv32
def loop(a0):
    label(again)
    addi(a0, a0, -1)
    bne(a0, zero, again)


def w_loop(n, r=instret, b0=B0, b1=B1):
    r(b0)
    loop(n)
    r(b1)
    return b0[0], b0[1], b1[0], b1[1]


for n in (0, 1, 1, 10, 1000, 100000):   # the first window (0: one iteration, not shown) fills
    r = w_loop(n or 1)                   # MicroPython's lookup caches at this call site
    if n:
        show("loop", str(n), r)
"""


@pytest.mark.device
@pytest.mark.slow
def test_rv32_counts_instructions_exactly_and_repeats():
    """VIRT_RV32's counter (count_csr.py): a loop of n iterations of two instructions (addi, bne)
    counts exactly 2 more per iteration, the same n the same count; and two qemu runs of the bench
    script count every window alike, the board's loss and output matching the host's."""
    fw, micropy = _firmware("virt_rv32")
    import bench
    script = "\n".join([qemu_count.device_prelude("VIRT_RV32"), qemu_count.counter_source("VIRT_RV32"),
                        "def show(case, what, r):\n    print('W', case, what, r[0], r[1], r[2], r[3])\n", LOOP])
    counts, _ = qemu_count.parse(qemu_count.run("VIRT_RV32", fw, qemu_count.Blob(), script, micropy), "VIRT_RV32")
    c = {int(what): v for (_, what), v in counts.items()}
    assert len(set(c[1])) == 1 and len(c[1]) == 2
    for n in (10, 1000, 100000):
        assert c[n][0] - c[1][0] == 2 * (n - 1), (n, c)
    case = bench.Case("fixed", "Linear 1-2", "full", bench_models.linear(), False)
    runs = [bench.count_on("VIRT_RV32", fw, [case], [], False)[1] for _ in range(2)]
    assert runs[0] == runs[1]
    assert set(runs[0]) == {"- empty", "fixed step", "fixed predict"}


@pytest.mark.device
def test_two_qemu_runs_count_the_same():
    """Determinism, the property the harness is built on: the same script counts the same
    instructions in every window, run after run (and the board's loss matches the host's,
    or count_on raises)."""
    fw, _ = _firmware()
    import bench
    case = bench.Case("fixed", "Linear 1-2", "full", bench_models.linear(), False)
    runs = [bench.count_on(BOARD, fw, [case], [], False)[1] for _ in range(2)]
    assert runs[0] == runs[1]
    assert set(runs[0]) == {"- empty", "fixed step", "fixed predict"}


@pytest.mark.device
def test_uint8_plan_on_qemu_matches_the_host():
    """The board takes the uint8 sample from the blob in place (a bytearray): its loss after the
    counted steps and its first output match the host simulator's (count_on raises otherwise)."""
    fw, _ = _firmware()
    import bench
    res, counts = bench.count_on(BOARD, fw, [_int8_case()], [], False)
    assert set(res["cnn-int8"]) == {"step", "predict"}
