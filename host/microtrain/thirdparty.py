"""Third-party material kept outside the repository, for the tests, the benchmarks and the
emulated boards: the vendored sources (MicroPython's tarballs, the RP2040 boot ROM for
rp2040js; firmware/README.md) and MIT's MCU networks as ONNX.

Each is found from its variable first ($MICROTRAIN_VENDOR, $MICROTRAIN_TTE), then as
shared/vendor or shared/models/tte beside the checkout or beside a folder above it, then
where it was found last: a find is remembered as a link in ~/.cache/microtrain (the cache
that holds the MicroPython tree), so a clone made anywhere on the same machine later finds
it too. firmware/fetch-sources.sh looks the same way. No folder of one machine is named.
"""
from __future__ import annotations

import os

# the checkout this package runs from (an editable install: host/microtrain/ in it)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "microtrain")


def find(variable, parts, marker, cache_name, start=CHECKOUT):
    """The folder named by $variable (None if `marker` is not in it), else the nearest
    <folder above start>/<parts> holding `marker` (remembered as CACHE/cache_name), else
    the remembered one; None if nowhere."""
    if os.environ.get(variable):
        d = os.path.abspath(os.environ[variable])
        return d if os.path.exists(os.path.join(d, marker)) else None
    here = os.path.abspath(start)
    while os.path.dirname(here) != here:
        here = os.path.dirname(here)
        d = os.path.join(here, *parts)
        if os.path.exists(os.path.join(d, marker)):
            _remember(d, cache_name)
            return d
    link = os.path.join(CACHE, cache_name)
    return os.path.realpath(link) if os.path.exists(os.path.join(link, marker)) else None


def _remember(d, cache_name):
    link = os.path.join(CACHE, cache_name)
    try:
        if os.path.realpath(link) != os.path.realpath(d):
            os.makedirs(CACHE, exist_ok=True)
            tmp = "%s.%d" % (link, os.getpid())
            os.symlink(d, tmp)
            os.replace(tmp, link)
    except OSError:
        pass   # a read-only home: the find is just not remembered


def vendor_dir():
    """The vendored sources, or None."""
    return find("MICROTRAIN_VENDOR", ("shared", "vendor"), "micropython-v1.28.0.tar.gz", "vendor")


def tte_dir():
    """MIT's networks (mcunet-5fps.onnx, its .schemes.json ...), or None."""
    return find("MICROTRAIN_TTE", ("shared", "models", "tte"), "mcunet-5fps.onnx", "tte")
