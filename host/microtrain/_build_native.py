"""cffi builder: compiles the device C core (modules/microtrain/mt_*.c) into a
CPython extension, microtrain._native, when the package is installed
(pip install -e host; `make native` reruns that after a C change). The host
never reimplements a kernel: it runs this exact C.

The declarations cffi needs come from the core's public header, mt.h: the text
between its cdef markers, with comments dropped and MT_* integer constants
(from mt_format.h) replaced by their values. Nothing is copied by hand.
"""
import glob
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.normpath(os.path.join(HERE, "..", "..", "modules", "microtrain"))


def _sources():
    """The core's .c files, relative (setuptools refuses absolute paths) and reached through
    a link in host/build: setuptools puts each object at <build temp>/<source path>, so a
    path starting with ../ would put the objects outside the build directory, in one
    place shared by every checkout on the machine (a build could link another's)."""
    link = os.path.join(HERE, "..", "build", "core")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.realpath(link) != os.path.realpath(CORE):
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.relpath(CORE, os.path.dirname(link)), link)
    return sorted(os.path.relpath(os.path.join(link, os.path.basename(p)))
                  for p in glob.glob(os.path.join(CORE, "mt_*.c")))


SOURCES = _sources()


def cdef_from_header(core=CORE):
    """The cffi declarations of mt.h's public API."""
    with open(os.path.join(core, "mt_format.h")) as f:
        consts = dict(re.findall(r"^#define (MT_\w+) (\d+)\s*$", f.read(), re.M))
    with open(os.path.join(core, "mt.h")) as f:
        text = f.read()
    text = text[text.index("/* cdef-begin"):text.index("/* cdef-end */")]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"\bMT_\w+\b", lambda m: consts.get(m.group(0), m.group(0)), text)
    left = re.findall(r"\bMT_\w+\b", text)
    if left:
        raise ValueError("mt.h's cdef section uses constants that are not plain integers: %s" % sorted(set(left)))
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())


# MICROTRAIN_SANITIZE=1 (make native SANITIZE=1): the core built with AddressSanitizer and
# UndefinedBehaviorSanitizer, every finding fatal. CPython is not instrumented, so the process
# must start with the sanitizer runtimes preloaded (the Makefile's SANITIZE_ENV does that).
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"] \
    if os.environ.get("MICROTRAIN_SANITIZE") == "1" else []

ffibuilder = FFI()
ffibuilder.cdef(cdef_from_header())
# the host's mt_read_fn for a plan loaded by its head (native.Core(..., stream=...)): Python reads the file
ffibuilder.cdef('extern "Python" int mt_host_read(void *, uint32_t, void *, uint32_t);')
ffibuilder.set_source(
    "microtrain._native",
    '#include "mt.h"',
    sources=SOURCES,
    include_dirs=[CORE],
    extra_compile_args=["-std=c99", "-O2"] + SANITIZE,
    extra_link_args=SANITIZE,
)
