"""Deploy, train, evaluate and pull over serial, end to end through the CLI, against
the qemu MPS2_AN500 and VIRT_RV32 firmware on a pseudo-terminal (the code path of a real
USB serial port), the unix port and the Pico in rp2040js: the pulled parameters equal the host simulator's
after the same steps, and TRAINED.onnx in onnxruntime gives the simulator's
predictions. Plus the errors a person gets, one line each, exit status 2."""
import os
import re
import zlib

import numpy as np
import pytest

from microtrain import cli
from serial_support import (EPOCHS, SEED, TOL, assert_params_equal, compile_mlp, export_mlp, iris,
                            make_board, oracle)

# qemu with the default (dynamo) exporter (the serial run of `make test`); unix with the
# TorchScript one, the Pico and VIRT_RV32 (RISC-V) in test-all
TARGETS = [("qemu", "dynamo"), pytest.param("unix", "ts13", marks=pytest.mark.slow),
           pytest.param("pico", "dynamo", marks=pytest.mark.slow),
           pytest.param("virt", "dynamo", marks=pytest.mark.slow)]


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.device
@pytest.mark.parametrize("target,exporter", TARGETS)
def test_deploy_train_eval_pull(tmp_path, capsys, target, exporter):
    onnx_path = export_mlp(str(tmp_path / "mlp.onnx"), exporter)
    plan = compile_mlp(onnx_path)
    plan.save(str(tmp_path / "mlp.mtp"))
    x, y, xt, yt = iris()
    np.savez(tmp_path / "iris.npz", x=x, y=y, x_test=xt, y_test=yt)
    sim = oracle(plan, x, y)

    board = make_board(target)
    try:
        port = board.port
        code, out, err = run_cli(capsys, "deploy", tmp_path / "mlp.mtp", "--port", port)
        assert code == 0, err
        assert "deployed" in out
        # the board runs the plan's runtime context in place, as the host does: no RAM for it, no warning
        assert "runtime context" not in out and "warning" not in err, (out, err)
        code, out, err = run_cli(capsys, "train", "--port", port, "--data", tmp_path / "iris.npz",
                                 "--epochs", EPOCHS, "--seed", SEED, "--checkpoint-every", 50)
        assert code == 0, err
        assert len(re.findall(r"^epoch \d: mean loss", out, re.M)) == EPOCHS, out
        code, out, err = run_cli(capsys, "eval", "--port", port, "--data", tmp_path / "iris.npz")
        assert code == 0, err
        got_acc = float(out.split(":")[-1])
        assert abs(got_acc - sim.evaluate(xt, yt)) < 1e-9, (out, sim.evaluate(xt, yt))
        code, out, err = run_cli(capsys, "pull", "--port", port, "-o", tmp_path / "params.npz")
        assert code == 0, err
        code, out, err = run_cli(capsys, "pull", "--port", port, "--onnx", onnx_path, "-o", tmp_path / "trained.onnx")
        assert code == 0, err
    finally:
        board.close()

    pulled = dict(np.load(tmp_path / "params.npz"))
    assert_params_equal(pulled, sim)
    # the model learned something, so equality is not that of two untrained models
    assert sim.evaluate(xt, yt) > 0.8

    import onnxruntime as ort
    sess = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    got = np.concatenate([sess.run(None, {name: xt[i:i + 1]})[0] for i in range(len(xt))])
    want = sim.predict(xt).reshape(len(xt), -1)
    assert np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max())


@pytest.mark.device
def test_deploy_a_streamed_plan_trains_from_its_file(tmp_path, capsys):
    """A plan with a stream section (compile --constants stream), deployed as a file to the qemu
    board's filesystem: the server opens it by its path, keeps only its head and reads the frozen
    layer's constants from the file at every step; the pulled parameters are the simulator's."""
    import microtrain
    onnx_path = export_mlp(str(tmp_path / "mlp.onnx"), "dynamo")
    plan = microtrain.compile(onnx_path, update="last-layer", loss="cross-entropy", lr=0.05, momentum=0.9,
                              stream=True)
    assert plan.report()["read_per_step"] > 0
    plan.save(str(tmp_path / "mlp.mtp"))
    x, y, xt, yt = iris()
    np.savez(tmp_path / "iris.npz", x=x, y=y, x_test=xt, y_test=yt)
    sim = oracle(plan, x, y)
    board = make_board("qemu")
    try:
        port = board.port
        code, out, err = run_cli(capsys, "deploy", tmp_path / "mlp.mtp", "--port", port)
        assert code == 0 and "deployed" in out, err
        code, out, err = run_cli(capsys, "train", "--port", port, "--data", tmp_path / "iris.npz",
                                 "--epochs", EPOCHS, "--seed", SEED)
        assert code == 0, err
        code, out, err = run_cli(capsys, "pull", "--port", port, "-o", tmp_path / "params.npz")
        assert code == 0, err
        from microtrain.device.board import Board
        with Board(port) as b:
            info = b.info()["trainer"]
    finally:
        board.close()
    # only the head in RAM; the Board's connection restarted the server, which opened the plan again and
    # restored its checkpoint: since then it read each group once (attach's checks, reset's initial values)
    assert info["streamed"] and info["head_bytes"] == plan.header["stream_off"] < len(plan.data), info
    assert info["steps"] == EPOCHS * len(x) and info["stream_read_bytes"] == sum(g["bytes"] for g in plan.groups), info
    assert_params_equal(dict(np.load(tmp_path / "params.npz")), sim)


def one_line_error(code, err):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_no_device_lists_ports(capsys, tmp_path):
    code, out, err = run_cli(capsys, "pull", "--port", "/dev/no-such-port", "-o", tmp_path / "x.npz")
    line = one_line_error(code, err)
    assert "no device at /dev/no-such-port" in line and ("ports here" in line or "no serial ports" in line)


@pytest.fixture(scope="module")
def unix_board():
    b = make_board("unix")
    yield b
    b.close()


@pytest.fixture(scope="module")
def deployed(unix_board, tmp_path_factory):
    d = tmp_path_factory.mktemp("deployed")
    plan = compile_mlp(export_mlp(str(d / "mlp.onnx"), "ts13"))
    plan.save(str(d / "mlp.mtp"))
    assert cli.main(["deploy", str(d / "mlp.mtp"), "--port", unix_board.port]) == 0
    return unix_board, d


@pytest.mark.device
def test_data_that_does_not_fit_the_plan(capsys, deployed):
    board, d = deployed
    x, y, _, _ = iris()
    np.savez(d / "wide.npz", x=np.hstack([x, x]), y=y)
    code, out, err = run_cli(capsys, "train", "--port", board.port, "--data", d / "wide.npz")
    line = one_line_error(code, err)
    assert "(8 values)" in line and "(4 values)" in line, line
    np.savez(d / "labels.npz", x=x, y=y + 5)
    code, out, err = run_cli(capsys, "train", "--port", board.port, "--data", d / "labels.npz")
    line = one_line_error(code, err)
    assert "the plan has 3 classes" in line, line


@pytest.mark.device
def test_plan_too_big_for_the_heap(capsys, tmp_path):
    """qemu's 140 KB heap cannot hold a 64-512-10 MLP trained in full with momentum."""
    import models
    import microtrain
    plan = microtrain.compile(models.mlp(n_in=64, hidden=512, n_out=10), update="full", momentum=0.9)
    plan.save(str(tmp_path / "big.mtp"))
    board = make_board("qemu")
    try:
        code, out, err = run_cli(capsys, "deploy", tmp_path / "big.mtp", "--port", board.port)
    finally:
        board.close()
    line = one_line_error(code, err)
    m = re.search(r"needs (\d+) bytes of RAM .* has (\d+) free: (\d+) bytes short", line)
    assert m, line
    need, free, short = map(int, m.groups())
    assert need - free == short > 0
    assert need >= plan.report()["ram_bytes"] + len(plan.data)


@pytest.mark.device
def test_firmware_without_the_module(capsys, tmp_path):
    """A board whose `import microtrain` fails (a module file shadowing the frozen package
    in the board's working directory stands in for firmware built without it)."""
    from microtrain.device.emulated import UnixBoard
    from serial_support import need
    work = tmp_path / "board"
    work.mkdir()
    (work / "microtrain.py").write_text("raise ImportError(\"no module named '_microtrain'\")\n")
    board = UnixBoard(need("unix"), workdir=str(work))
    board.start()
    try:
        code, out, err = run_cli(capsys, "deploy", tmp_path / "none.mtp", "--port", board.port)
        assert code == 2 and "cannot read plan" in err     # the plan is checked first
        plan = compile_mlp(export_mlp(str(tmp_path / "m.onnx"), "ts13"))
        plan.save(str(tmp_path / "m.mtp"))
        code, out, err = run_cli(capsys, "deploy", tmp_path / "m.mtp", "--port", board.port)
    finally:
        board.close()
    line = one_line_error(code, err)
    assert "has no microtrain module" in line, line


@pytest.mark.device
def test_plan_format_the_firmware_does_not_read(deployed):
    """The board says which plan format it reads; deploy refuses another, naming both."""
    from microtrain.device.board import Board
    from microtrain.device.errors import FirmwareError
    from microtrain.plan import load_plan
    board, d = deployed
    plan = load_plan(str(d / "mlp.mtp"))
    with Board(board.port) as b:
        b.facts["format_version"] = plan.header["version"] + 1
        with pytest.raises(FirmwareError, match=r"reads plan format %d, this plan is format %d: update"
                           % (plan.header["version"] + 1, plan.header["version"])):
            b.deploy(plan)


@pytest.mark.device
def test_checksum_mismatch_after_retries(deployed):
    """A line that corrupts one byte in ten: no answer survives its checksum, and the link
    gives up after its retries with a one-line error."""
    from microtrain.device.board import Board
    from microtrain.device.emulated import Proxy
    from microtrain.device.errors import LinkError
    board, d = deployed
    proxy = Proxy(board.port, drop=0.0)
    proxy.start()
    try:
        b = Board(proxy.port, retries=3)
        b.connect()
        proxy.rate = 0.1
        with pytest.raises(LinkError, match=r"no intact answer to INFO after 3 tries \(([1-9]\d*) frames failed "
                                            r"their checksum") as e:
            b.info()
        assert "\n" not in str(e.value)
        b.transport.close()
    finally:
        proxy.close()


def test_port_autodetection(monkeypatch):
    """With no --port: the one MicroPython board on USB, by its USB ids; none or two: an error."""
    import serial.tools.list_ports
    from microtrain.device import ports
    from microtrain.device.errors import NoDevice

    class P:
        def __init__(self, device, vid, pid, description="x"):
            self.device, self.vid, self.pid, self.description = device, vid, pid, description

    found = [P("/dev/ttyS0", None, None), P("/dev/ttyUSB0", 0x046D, 0xC52B), P("/dev/ttyACM0", 0x2E8A, 0x0005)]
    monkeypatch.setattr(serial.tools.list_ports, "comports", lambda: found)
    assert ports.find_board() == "/dev/ttyACM0"
    found.append(P("/dev/ttyACM1", 0xF055, 0x9800))
    with pytest.raises(NoDevice, match="2 MicroPython boards connected"):
        ports.find_board()
    del found[2:]
    found.append(P("/dev/ttyACM2", 0x2E8A, 0x0003))     # a Pico in BOOTSEL mode: no REPL
    with pytest.raises(NoDevice, match="no MicroPython board found"):
        ports.find_board()


@pytest.mark.device
def test_deploy_to_romfs_reads_the_plan_in_place(tmp_path, monkeypatch):
    """deploy with romfs=True: the server takes /rom/plan.mtp (microtrain.romfs's image,
    read in place, not copied to the heap) over a file plan it had, and trains on it to
    the simulator's parameters. qemu's MPS2_AN500 has vfs.VfsRom but no ROMFS partition
    to write (no vfs.rom_ioctl), so here the image is mounted from RAM at /rom where
    mpremote's `romfs deploy` would write the partition; that writing is not run here."""
    from microtrain.device import board as board_mod
    from microtrain.device.board import Board

    def mount_image(transport, image, partition=0):
        transport.exec("import vfs\nrom_image = bytes.fromhex('%s')\nvfs.mount(vfs.VfsRom(rom_image), '/rom')"
                       % image.hex())
    monkeypatch.setattr(board_mod, "_romfs_deploy", mount_image)
    plan = compile_mlp(export_mlp(str(tmp_path / "mlp.onnx"), "dynamo"))
    x, y, _, _ = iris()
    board = make_board("qemu")
    try:
        with Board(board.port) as b:
            b.deploy(plan, romfs=False)                 # a file plan first: the ROM one must win
            b.facts["romfs"] = 1 << 16                  # as a board with a 64 KB partition says
            info = b.deploy(plan, romfs=True)
            assert info["plan"]["rom"] and info["plan"]["crc"] == zlib.crc32(plan.data), info["plan"]
            from microtrain.device.training import train
            train(b, x, y, epochs=1, seed=SEED)
            got = b.params()
    finally:
        board.close()
    assert_params_equal(got, oracle(plan, x, y, epochs=1))


@pytest.mark.device
def test_romfs_deploy_on_a_board_without_a_partition(capsys, tmp_path):
    """--romfs on qemu's MPS2_AN500 (no vfs.rom_ioctl): one line saying so, exit status 2."""
    plan = compile_mlp(export_mlp(str(tmp_path / "mlp.onnx"), "dynamo"))
    plan.save(str(tmp_path / "mlp.mtp"))
    board = make_board("qemu")
    try:
        code, out, err = run_cli(capsys, "deploy", tmp_path / "mlp.mtp", "--port", board.port, "--romfs")
    finally:
        board.close()
    line = one_line_error(code, err)
    assert "has no ROMFS partition" in line, line


@pytest.mark.device
def test_samples_bigger_than_a_frame_train_through_the_cli(capsys, tmp_path):
    """Through the CLI, samples of 1,100 inputs (4,412 bytes with the label and head: more than a
    frame carries, staged) train and evaluate as samples of 1,021 (one frame exactly) do: to the
    simulator's parameters and accuracy (test_serial_staged.py has the large samples)."""
    import models
    import microtrain
    board = make_board("unix")
    try:
        for n_in in (1100, 1021):
            plan = microtrain.compile(models.mlp(n_in=n_in, hidden=4, n_out=3), lr=0.01)
            plan.save(str(tmp_path / "w.mtp"))
            x = np.random.default_rng(0).normal(size=(6, n_in)).astype(np.float32)
            y = np.arange(6) % 3
            np.savez(tmp_path / "w.npz", x=x, y=y)
            code, out, err = run_cli(capsys, "deploy", tmp_path / "w.mtp", "--port", board.port)
            assert code == 0, err
            code, out, err = run_cli(capsys, "train", "--port", board.port, "--data", tmp_path / "w.npz",
                                     "--epochs", 1, "--seed", SEED)
            assert code == 0, err
            code, out, err = run_cli(capsys, "pull", "--port", board.port, "-o", tmp_path / "p.npz")
            assert code == 0, err
            sim = oracle(plan, x, y, epochs=1)
            assert_params_equal(dict(np.load(tmp_path / "p.npz")), sim)
            code, out, err = run_cli(capsys, "eval", "--port", board.port, "--data", tmp_path / "w.npz")
            assert code == 0, err
            assert abs(float(out.split(":")[-1]) - sim.evaluate(x, y)) < 5e-5, out     # printed to 4 places
    finally:
        board.close()
