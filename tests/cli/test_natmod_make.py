"""How `make natmod` builds each architecture's native module (firmware/micropython.mk,
firmware/natmod.mk on MicroPython's py/dynruntime.mk), read from make itself, without compiling:
libgcc's soft float and 64-bit integer helpers are linked on every cross architecture (the
xtensawin link failed on __divsf3, __floatundidf, __divdi3 without them: issue 30), rv32imc is
built with float, and a missing cross compiler stops the build on one line naming it."""
import os
import shutil
import stat
import subprocess

import pytest

from repo import ROOT
import mptargets

MAKE = shutil.which("make")


def need_micropython():
    if not os.path.isfile(os.path.join(mptargets.MICROPY_DIR, "py", "dynruntime.mk")):
        if os.environ.get("CI") == "true":
            pytest.fail("no MicroPython checkout at %s: make micropython did not run" % mptargets.MICROPY_DIR)
        pytest.skip("no MicroPython checkout at %s; run `make micropython`" % mptargets.MICROPY_DIR)


def natmod_vars(tmp_path, arch, path=None):
    """{CFLAGS, MPY_LD_FLAGS} as firmware/natmod.mk sets them for ARCH."""
    need_micropython()
    with open(tmp_path / "print.mk", "w") as f:
        f.write("include %s/firmware/natmod.mk\n"
                "mt-print:\n\t$(info CFLAGS=$(CFLAGS))$(info MPY_LD_FLAGS=$(MPY_LD_FLAGS))@:\n" % ROOT)
    env = dict(os.environ, PATH=path or os.environ["PATH"])
    r = subprocess.run([MAKE, "-s", "-f", "print.mk", "mt-print", "MPY_DIR=" + mptargets.MICROPY_DIR, "ARCH=" + arch],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def fake_xtensa_gcc(tmp_path):
    """A stand-in for ESP-IDF's xtensa-esp32-elf-gcc that answers what make asks at parse time."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    libgcc = tmp_path / "esp32-libgcc.a"
    libgcc.write_bytes(b"!<arch>\n")
    gcc = bindir / "xtensa-esp32-elf-gcc"
    gcc.write_text('#!/bin/sh\nfor a; do case "$a" in\n'
                   '  --print-libgcc-file-name) echo %s; exit 0;;\n'
                   '  -dumpmachine) echo xtensa-esp32-elf; exit 0;;\n'
                   'esac; done\nexit 0\n' % libgcc)
    gcc.chmod(gcc.stat().st_mode | stat.S_IXUSR)
    return str(bindir), str(libgcc)


def test_xtensawin_links_the_toolchains_libgcc(tmp_path):
    bindir, libgcc = fake_xtensa_gcc(tmp_path)
    v = natmod_vars(tmp_path, "xtensawin", path=bindir + os.pathsep + os.environ["PATH"])
    assert "-l" + libgcc in v["MPY_LD_FLAGS"].split(), v
    assert "-DMICROPY_FLOAT_IMPL=MICROPY_FLOAT_IMPL_FLOAT" in v["CFLAGS"].split(), v


@pytest.mark.skipif(not shutil.which("riscv64-unknown-elf-gcc"), reason="no riscv64-unknown-elf-gcc")
def test_rv32imc_builds_with_float_and_the_32_bit_libgcc(tmp_path):
    v = natmod_vars(tmp_path, "rv32imc")
    assert "-DMICROPY_FLOAT_IMPL=MICROPY_FLOAT_IMPL_FLOAT" in v["CFLAGS"].split(), v
    libs = [f[2:] for f in v["MPY_LD_FLAGS"].split() if f.startswith("-l")]
    # the multilib of -march=rv32imac -mabi=ilp32, not the toolchain's default (64-bit) libgcc
    assert len(libs) == 1 and libs[0].endswith("/rv32imac/ilp32/libgcc.a") and os.path.isfile(libs[0]), v


def test_x64_links_no_libgcc(tmp_path):
    assert "-l" not in natmod_vars(tmp_path, "x64").get("MPY_LD_FLAGS", "")


def test_missing_cross_compiler_stops_on_one_line_naming_it(tmp_path):
    """`make natmod ARCH=xtensawin` on a machine without ESP-IDF (every machine here)."""
    need_micropython()
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if not os.path.exists(os.path.join(d, "xtensa-esp32-elf-gcc")))
    # MICROTRAIN_FIRMWARE_PY_DEPS empty: no pip install of requirements-firmware.txt first (the
    # compiler is checked before pyelftools)
    r = subprocess.run([MAKE, "-s", "natmod", "ARCH=xtensawin", "NATMOD_BUILD=%s" % tmp_path,
                        "MICROTRAIN_FIRMWARE_PY_DEPS="],
                       cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PATH=path))
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if not l.startswith("make")]
    assert len(lines) == 1, r.stderr
    assert "xtensa-esp32-elf-gcc" in lines[0] and "ESP-IDF" in lines[0], lines
    assert not os.path.exists(tmp_path / "xtensawin"), "it went on to build"
