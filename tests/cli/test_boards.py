"""Board profiles (boards/*.json), `microtrain boards`, the --board check of compile and
report, and `microtrain flash`'s choice of tool. What a Trainer really allocates against
what the check counts is measured on every device target by tests/device/micropython/board_fit.py."""
import json
import os
import re
import stat
import subprocess
import sys

import onnx
import pytest

import microtrain

from microtrain import boards

import models

from repo import ROOT
NATMOD_ARCHS = {"x64", "x86", "armv6m", "armv7m", "armv7emsp", "armv7emdp", "xtensa", "xtensawin", "rv32imc"}


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "microtrain"] + list(args), capture_output=True, text=True,
                          cwd=ROOT, env=env)


def model(tmp_path, name, **kw):
    path = str(tmp_path / (name + ".onnx"))
    onnx.save(models.mlp(**kw), path)
    return path


def kb(text):
    """'12.3 KB' or '456 B' -> bytes (as boards._kb prints them)."""
    m = re.fullmatch(r"(-?[\d.]+) (KB|B)", text)
    return float(m.group(1)) * (1024 if m.group(2) == "KB" else 1)


def test_profiles_are_complete_and_consistent():
    bs = boards.all_boards()
    for name in ("unix", "mps2_an385", "mps2_an386", "mps2_an500", "pybv11", "nucleo_f746zg", "rpi_pico",
                 "rpi_pico2", "esp32_generic", "esp32_generic_s3", "esp32_generic_c3", "esp32_generic_c6",
                 "virt_rv32"):
        assert name in bs, name
    for name, b in bs.items():
        assert b["mpy_arch"] in NATMOD_ARCHS, name
        assert b["build"] in ("make", "cmake") and b["word_bytes"] in (4, 8), name
        assert (b["fpu"] == "none") == (b["mpy_arch"] in ("armv6m", "armv7m", "rv32imc")), name
        for u in b["usb"]:
            assert re.fullmatch(r"0x[0-9A-F]{4}", u["vid"]) and re.fullmatch(r"0x[0-9A-F]{4}", u["pid"]), name
        h = b["heap"]
        assert h["how"], name
        if b["status"] == "tested":   # runs here: its heap was measured here
            assert h["measured"] and 0 < h["free_bytes"] <= h["total_bytes"], name
        if b["sram_bytes"] and h.get("free_bytes"):
            assert h["free_bytes"] < b["sram_bytes"], name
        if b["board_dir"]:
            assert os.path.isdir(os.path.join(ROOT, b["board_dir"])), name


def test_make_variables_cover_every_profile():
    """The Makefile's view of the profiles (boards.py --make, run by any python3)."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "host", "microtrain", "boards.py"), "--make"],
                         capture_output=True, text=True, check=True).stdout
    names = re.search(r"^MT_BOARDS := (.*)$", out, re.M).group(1).split()
    assert names == list(boards.all_boards())
    assert "MT_PORT_rpi_pico := rp2" in out and "MT_BUILD_rpi_pico := cmake" in out
    assert "MT_BOARD_DIR_mps2_an386 := boards/qemu/MPS2_AN386" in out
    # $(PORT_DIR) reaches the generated manifest, not make's own expansion
    assert "MT_BASE_MANIFEST_pybv11 := $$(PORT_DIR)/boards/PYBV10/manifest.py" in out


def test_boards_command_lists_every_board_with_its_budget():
    r = cli("boards")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for name, b in boards.all_boards().items():
        row = next(line for line in lines if line.startswith(name + " "))
        free = b["heap"]["free_bytes"]
        if free:
            assert boards._kb(free) in row, row
        assert b["core"] in row and b["mpy_arch"] in row and b["status"] in row, row
    j = cli("boards", "--json")
    assert json.loads(j.stdout) == boards.all_boards()


def test_compile_for_rpi_pico_fits(tmp_path):
    onnx_path = model(tmp_path, "small", n_in=16, hidden=32, n_out=4)
    out = str(tmp_path / "small.mtp")
    r = cli("compile", onnx_path, "-o", out, "--update", "full", "--board", "rpi_pico")
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(out)
    line = next(line for line in r.stdout.splitlines() if "fits rpi_pico" in line)
    assert "no FPU" in r.stdout   # the RP2040 computes in software
    need = kb(re.search(r"needs (\S+ K?B) of heap", line).group(1))
    rep = json.loads(cli("report", out, "--json").stdout)
    assert need >= rep["ram_bytes"] + rep["plan_bytes"]


def test_compile_for_rpi_pico_does_not_fit(tmp_path):
    """256-256-10 with momentum and a batch: about 800 KB of parameters and optimizer state."""
    onnx_path = model(tmp_path, "big", n_in=256, hidden=256, n_out=10)
    out = str(tmp_path / "big.mtp")
    r = cli("compile", onnx_path, "-o", out, "--update", "full", "--momentum", "0.9", "--batch", "4",
            "--board", "RPI_PICO")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not os.path.exists(out)   # a plan that does not fit is not written
    msg = r.stderr
    assert "does not fit rpi_pico" in msg
    m = re.search(r"needs (\S+ K?B) of heap.*the board has (\S+ K?B) free.*: (\S+ K?B) short", msg)
    need, free, short = (kb(g) for g in m.groups())
    assert free == pytest.approx(boards.load_board("rpi_pico")["heap"]["free_bytes"], abs=52)
    assert short == pytest.approx(need - free, abs=103)
    for remedy in ("--batch 1", "--momentum 0", "sparser --update", "ROMFS"):
        assert remedy in msg, remedy
    # last layer only: the first layer's 256 KB of weights are constants, read into RAM with the plan
    # where they are resident (no stream section)...
    r = cli("compile", onnx_path, "-o", out, "--update", "last-layer", "--board", "rpi_pico", "--constants",
            "resident")
    assert r.returncode == 2 and "does not fit rpi_pico (plan read into RAM)" in r.stderr
    for remedy in ("ROMFS", "--quantize int8", "--constants stream"):
        assert remedy in r.stderr, remedy
    assert "sparser --update" not in r.stderr
    # ... or streamed from the plan's file: the one Gemm's 256 KB of weights are still read at once, into
    # a window as large (only expansion blocks read theirs in blocks of channels): int8 would help
    r = cli("compile", onnx_path, "-o", out, "--update", "last-layer", "--board", "rpi_pico", "--constants",
            "stream")
    assert r.returncode == 2 and "does not fit rpi_pico (constants streamed from the plan's file)" in r.stderr
    assert "of the windows they are read into" in r.stderr and "plan head" in r.stderr
    # the same plan, written without --board, fails `report --board` the same way, and fits a bigger board
    assert cli("compile", onnx_path, "-o", out, "--update", "full", "--momentum", "0.9", "--batch", "4").returncode == 0
    r = cli("report", out, "--board", "rpi_pico")
    assert r.returncode == 2 and "does not fit rpi_pico" in r.stderr
    assert "fits unix" in cli("report", out, "--board", "unix").stdout


def test_check_counts_what_each_remedy_saves(tmp_path):
    """The savings the message names are the sizes of the tensors they remove."""
    import microtrain
    plan = microtrain.compile(models.mlp(n_in=256, hidden=512, n_out=10), update="full", momentum=0.9, batch=4)
    r = plan.report()
    with pytest.raises(boards.DoesNotFit) as e:
        boards.check(r, boards.load_board("rpi_pico"))
    n_params = sum(t["bytes"] for t in r["tensors"] if t["storage"] == "state"
                   and not t["name"].startswith(("acc(", "mom(")))
    assert "--batch 1 (drops the gradient accumulators) saves %s" % boards._kb(n_params) in str(e.value)
    assert "--momentum 0 (drops the momentum buffers) saves %s" % boards._kb(n_params) in str(e.value)


def test_unknown_board_is_named_with_the_known_ones(tmp_path):
    r = cli("compile", model(tmp_path, "m"), "-o", str(tmp_path / "m.mtp"), "--board", "arduino_uno")
    assert r.returncode == 2 and "unknown board 'arduino_uno'" in r.stderr and "rpi_pico" in r.stderr


def fake_tool(tmp_path, name):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text("#!/bin/sh\nexit 0\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(d)


def test_flash_says_what_is_missing_and_uses_the_family_tool(tmp_path):
    image = tmp_path / "firmware.uf2"
    image.write_bytes(b"\0" * 512)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable))   # no picotool, esptool, dfu-util...
    r = cli("flash", "--board", "rpi_pico", "--image", str(image), env=env)
    assert r.returncode == 2 and "picotool" in r.stderr and "BOOTSEL" in r.stderr
    r = cli("flash", "--board", "esp32_generic", "--image", str(image), "--port", "/dev/ttyUSB0", env=env)
    assert r.returncode == 2 and "pip install esptool" in r.stderr
    r = cli("flash", "--board", "pybv11", "--image", str(image), env=env)
    assert r.returncode == 2 and "dfu-util" in r.stderr
    assert "nothing to flash" in cli("flash", "--board", "mps2_an385", env=env).stderr
    assert "make firmware BOARD=nucleo_f746zg" in cli("flash", "--board", "nucleo_f746zg", "--image",
                                                      str(tmp_path / "none.hex"), env=env).stderr
    env["PATH"] = fake_tool(tmp_path, "picotool") + os.pathsep + env["PATH"]
    r = cli("flash", "--board", "rpi_pico", "--image", str(image), env=env)
    assert r.returncode == 0 and "picotool load -x %s" % image in r.stdout
    # esptool: each chip by name, the image where its bootloader goes (0x1000 on the ESP32, 0x0 on the others)
    fake_tool(tmp_path, "esptool")
    for board, chip, offset in (("esp32_generic", "esp32", "0x1000"), ("esp32_generic_s3", "esp32s3", "0x0"),
                                ("esp32_generic_c3", "esp32c3", "0x0"), ("esp32_generic_c6", "esp32c6", "0x0")):
        r = cli("flash", "--board", board, "--image", str(image), "--port", "/dev/ttyACM0", env=env)
        assert r.returncode == 0 and "--chip %s " % chip in r.stdout and "write_flash %s %s" % (offset, image) \
            in r.stdout, (board, r.stdout, r.stderr)


class FakeBoard:
    """What mpremote's mip asks of a board's filesystem, kept in a dict."""

    def __init__(self):
        self.files, self.dirs = {}, set()

    def fs_exists(self, path):
        return path in self.files or path in self.dirs

    def fs_mkdir(self, path):
        self.dirs.add(path)

    def fs_writefile(self, path, data, progress_callback=None):
        self.files[path] = data

    def fs_hashfile(self, path, algo):
        if path not in self.files:
            raise FileNotFoundError(path)
        import hashlib
        return hashlib.new(algo, self.files[path]).digest()

    def exec(self, code):
        pass

    def eval(self, expr):
        assert expr == "getattr(sys.implementation, '_mpy', 0) & 0xFF", expr
        return 6    # MicroPython v1.28's .mpy version


@pytest.mark.slow
def test_mip_installs_the_native_module_with_the_device_package():
    """mpremote's own mip code, on package.json and the one `make natmods` writes next to each .mpy."""
    from mpremote import mip
    mpy_json = os.path.join(ROOT, "build", "natmod", "x64", "package.json")
    if not os.path.isfile(mpy_json):
        if os.environ.get("CI") == "true":
            pytest.fail("no %s: make natmods did not run" % mpy_json)
        pytest.skip("no %s; run `make natmods`" % mpy_json)
    board = FakeBoard()
    mip._install_package(board, mpy_json, "https://micropython.org/pi/v2", "/lib", None, True)
    with open(os.path.join(ROOT, "build", "natmod", "x64", "_microtrain.mpy"), "rb") as f:
        assert board.files["/lib/_microtrain.mpy"] == f.read()
    package = os.path.join(ROOT, "modules", "microtrain", "python", "microtrain")
    for name in os.listdir(package):
        if name.endswith(".py"):
            with open(os.path.join(package, name), "rb") as f:
                assert board.files["/lib/microtrain/" + name] == f.read(), "package.json lacks " + name


@pytest.mark.slow
def test_dist_index_and_package_json_install_the_module_and_the_package():
    """`make dist`'s folder, read by mpremote's own mip code: for each architecture, the index
    (`--index DIR/<arch> microtrain`, the board's .mpy version 6; and --no-mpy's "py") and
    <arch>/package.json install the same files: that architecture's _microtrain.mpy as built,
    and every module of the device package, compiled to .mpy (as source for "py")."""
    from mpremote import mip
    dist = os.path.join(ROOT, "build", "dist", "mip")
    if not os.path.isfile(os.path.join(dist, "index.json")):
        if os.environ.get("CI") == "true":
            pytest.fail("no build/dist/mip/index.json: make dist did not run")
        pytest.skip("no build/dist/mip/index.json; run `make dist`")
    with open(os.path.join(dist, "index.json")) as f:
        archs = json.load(f)["architectures"]
    assert {"x64", "armv6m", "armv7m", "armv7emsp", "armv7emdp", "rv32imc"} <= set(archs)
    package = os.path.join(ROOT, "modules", "microtrain", "python", "microtrain")
    sources = sorted(n for n in os.listdir(package) if n.endswith(".py"))
    for arch, facts in archs.items():
        with open(os.path.join(ROOT, "build", "natmod", arch, "_microtrain.mpy"), "rb") as f:
            mpy = f.read()
        assert facts["mpy_bytes"] == len(mpy)
        by_index, by_url, by_source = FakeBoard(), FakeBoard(), FakeBoard()
        mip._install_package(by_index, "microtrain", os.path.join(dist, arch), "/lib", None, True)
        mip._install_package(by_url, os.path.join(dist, arch, "package.json"), "unused", "/lib", None, True)
        mip._install_package(by_source, "microtrain", os.path.join(dist, arch), "/lib", None, False)
        assert by_index.files == by_url.files, arch
        assert sorted(by_index.files) == ["/lib/_microtrain.mpy"] + ["/lib/microtrain/%s.mpy" % n[:-3] for n in sources]
        assert by_index.files["/lib/_microtrain.mpy"] == mpy == by_source.files["/lib/_microtrain.mpy"]
        assert all(v[:2] == b"M\x06" for v in by_index.files.values()), arch
        for n in sources:
            with open(os.path.join(package, n), "rb") as f:
                assert by_source.files["/lib/microtrain/" + n] == f.read(), (arch, n)


def test_fit_boundary_is_exact():
    """A board with exactly the heap the plan needs fits; one byte less does not, by 1 B."""
    import copy
    import microtrain
    r = microtrain.compile(models.mlp(n_in=16, hidden=32, n_out=4), update="full").report()
    board = copy.deepcopy(boards.load_board("rpi_pico"))
    need = sum(boards.ram_needed(r, board).values())
    assert need >= r["ram_bytes"] + r["plan_bytes"] + boards.TRAINER_OBJECT_BYTES[4]
    board["heap"]["free_bytes"] = need
    assert any("0 B to spare" in n for n in boards.check(r, board))
    board["heap"]["free_bytes"] = need - 1
    with pytest.raises(boards.DoesNotFit, match="1 B short"):
        boards.check(r, board)


def cnn_model(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(models.cnn(seed=3), path)
    return path


def heap_line(text, board):
    line = next(line for line in text.splitlines() if "fits %s" % board in line)
    return line, kb(re.search(r"needs (\S+ K?B) of heap", line).group(1))


def test_report_board_says_where_the_constants_live_and_counts_them(tmp_path):
    """On the Pico's stock firmware (no ROMFS) a plan with a stream section keeps its head, the open
    file and its windows (in the arena) in the heap; one without reads the whole plan into RAM.
    `compile --board` with --constants auto streams here since that needs less."""
    onnx_path = cnn_model(tmp_path)
    pico = boards.load_board("rpi_pico")
    got = {}
    for constants in ("resident", "stream", "auto"):
        out = str(tmp_path / ("%s.mtp" % constants))
        r = cli("compile", onnx_path, "-o", out, "--update", "last-layer", "--constants", constants,
                "--board", "rpi_pico")
        assert r.returncode == 0, r.stderr
        rep = json.loads(cli("report", out, "--json").stdout)
        text = cli("report", out, "--board", "rpi_pico").stdout
        line, need = heap_line(text, "rpi_pico")
        parts = boards.ram_needed(rep, pico)
        assert need == pytest.approx(sum(parts.values()), abs=52), line
        got[constants] = (rep, line, sum(parts.values()))
    rep, line, need = got["resident"]
    assert not rep["streamed"] and "(plan read into RAM)" in line and "plan read into RAM" in line
    assert need >= rep["ram_bytes"] + rep["plan_bytes"]
    rep, line, need_s = got["stream"]
    assert rep["streamed"] and "(constants streamed from the plan's file)" in line
    assert "plan head %s" % boards._kb(boards._round(rep["head_bytes"], 4)) in line and "open file" in line
    # the plan's constants are no longer in the heap whole: what streaming saves is the stream section,
    # less the windows and the context, now in RAM
    rnd = lambda n: boards._round(n, 4)   # noqa: E731  (GC blocks)
    assert boards.ram_needed(rep, pico) == {
        "ram_bytes": rnd(rep["arena_bytes"] + rep["param_bytes"] + rep["context_bytes"]),
        "trainer": rnd(boards.TRAINER_OBJECT_BYTES[4]), "head": rnd(rep["head_bytes"]),
        "file": rnd(boards.open_file_bytes(pico))}
    assert need_s < need
    assert got["auto"][0]["streamed"] is False or got["auto"][2] <= need


def test_budget_with_a_board_counts_the_heap_there(tmp_path):
    """--budget with --board: every candidate is counted as that board's heap holds it (the plan's
    head and file where its constants stream), and the chosen plan's heap is within the budget."""
    # the classifier alone needs 6,064 B of the Pico's heap with the plan streamed, 1,152 B of it
    # the open littlefs file (measured on the Pico: boards/rpi_pico.json's open_file_bytes)
    BUDGET = 7000
    onnx_path = cnn_model(tmp_path)
    out = str(tmp_path / "b.mtp")
    r = cli("compile", onnx_path, "-o", out, "--budget", str(BUDGET), "--board", "rpi_pico")
    assert r.returncode == 0, r.stderr
    chosen = next(line for line in (r.stdout + r.stderr).splitlines() if "budget: chosen" in line)
    m = re.search(r"heap on rpi_pico (\d+) B of %d B \(the plan streamed, (\d+) B of it\)" % BUDGET, chosen)
    assert m, chosen
    rep = json.loads(cli("report", out, "--json").stdout)
    parts = boards.ram_needed(rep, boards.load_board("rpi_pico"))
    assert int(m.group(1)) == sum(parts.values()) <= BUDGET
    assert int(m.group(2)) == parts["head"] + parts["file"]
    # without a board the same budget counts peak RAM alone, which leaves the plan out: more trains
    r = cli("compile", onnx_path, "-o", out, "--budget", str(BUDGET))
    plain = next(line for line in (r.stdout + r.stderr).splitlines() if "budget: chosen" in line)
    assert "peak RAM" in plain and plain != chosen
