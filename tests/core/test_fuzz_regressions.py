"""Plans the fuzzer (fuzz/run.py, `make fuzz`) found, kept as regression cases.

tests/fuzz_cases/cases.json lists each file with what was wrong and what the core
does with it now ("expect": the MT_E_* name it is refused with, or "trains").
Each case runs twice:
- through the host's C core (cffi) with guard bytes around its RAM: refused with
  the recorded error, or trains and predicts without writing outside its RAM;
- through fuzz/fuzz_core.c built as a plain program with gcc's AddressSanitizer
  and UBSan (the fuzzer's own harness, every entry point of the core), together
  with the seed corpus, so the harness itself cannot rot.
A case saved under an older plan format version is re-stamped with this one (and
its CRC fixed) so that it still reaches the check it was found at; its expected
error is only asserted for the format version it was recorded with.
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from microtrain import format as F
from microtrain.native import Core, PlanError, lib

from repo import ROOT
CASES_DIR = os.path.join(ROOT, "tests", "fuzz_cases")
CASES_JSON = os.path.join(CASES_DIR, "cases.json")
CASES = json.load(open(CASES_JSON)) if os.path.exists(CASES_JSON) else {}
HO = F.header_offsets()
GUARD = 64
ERROR_NAMES = {i + 1: "MT_E_" + name for i, (name, _) in enumerate(F.ERRORS)}


def current(data):
    """The case as this runtime's format version, CRC fixed when it was valid before."""
    b = bytearray(data)
    if len(b) >= F.HEADER_BYTES and b[:4] == F.MAGIC and struct.unpack_from("<H", b, HO["version"])[0] != F.VERSION:
        crc_ok = zlib.crc32(bytes(b[F.CRC_START:])) == struct.unpack_from("<I", b, HO["crc32"])[0]
        struct.pack_into("<H", b, HO["version"], F.VERSION)
        if crc_ok:
            struct.pack_into("<I", b, HO["crc32"], zlib.crc32(bytes(b[F.CRC_START:])))
    return bytes(b)


def outcome(data):
    """'MT_E_<name>' the core refuses the plan with, or 'trains' (after 3 steps and a
    predict, each of which may refuse its sample), with the guards checked."""
    try:
        core = Core(data, guard=GUARD)
    except PlanError as e:
        code = next(c for c, n in ERROR_NAMES.items() if F.ERRORS[c - 1][1] in str(e))
        return ERROR_NAMES[code]
    x = np.linspace(-0.5, 0.5, lib.mt_input_len(core.ctx)).astype(np.float32)
    for i in range(3):
        try:
            if core.ctx.loss_kind == F.LOSSES["MSE"]:
                core.step_target(x, np.zeros(lib.mt_target_len(core.ctx), np.float32))
            else:
                core.step_label(x, i % lib.mt_output_len(core.ctx))
            core.predict(x)
        except ValueError:
            pass
    assert (core.raw[:GUARD] == 0xA5).all() and (core.raw[GUARD + core.ram_bytes:] == 0xA5).all(), \
        "the core wrote outside its RAM"
    return "trains"


def test_cases_json_lists_every_file():
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CASES_DIR, "*.mtp")))
    assert files == sorted(CASES), "tests/fuzz_cases/*.mtp and cases.json disagree"
    for name, case in CASES.items():
        assert case["expect"] == "trains" or case["expect"] in ERROR_NAMES.values(), name
        assert case["what"] and case["format_version"] >= 1, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_fuzz_case_through_the_host_core(name):
    case = CASES[name]
    data = open(os.path.join(CASES_DIR, name), "rb").read()
    got = outcome(current(data))
    if case["format_version"] == F.VERSION:
        assert got == case["expect"], "%s: %s (expected %s)" % (name, got, case["expect"])


@pytest.mark.sanitize
def test_fuzz_harness_under_gcc_sanitizers_runs_cases_and_seeds(tmp_path):
    """fuzz/fuzz_core.c as a plain program (-DMT_FUZZ_MAIN) with ASan and UBSan, every
    finding fatal, over the regression cases and a fresh seed corpus."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    exe = str(tmp_path / "fuzz_core")
    core = os.path.join(ROOT, "modules", "microtrain")
    sources = [os.path.join(ROOT, "fuzz", "fuzz_core.c")] + sorted(glob.glob(os.path.join(core, "mt_*.c")))
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    subprocess.run([gcc, "-std=c99", "-g", "-O1", "-DMT_FUZZ_MAIN", "-I", core] + san + sources + ["-o", exe, "-lm"],
                   check=True)
    seeds = tmp_path / "seeds"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "fuzz", "make_corpus.py"), str(seeds)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    inputs = sorted(glob.glob(str(seeds / "*.mtp")))
    cases = tmp_path / "cases"
    cases.mkdir()
    for name in CASES:
        (cases / name).write_bytes(current(open(os.path.join(CASES_DIR, name), "rb").read()))
        inputs.append(str(cases / name))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["ASAN_OPTIONS"] = "detect_leaks=1"
    r = subprocess.run([exe] + inputs, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
