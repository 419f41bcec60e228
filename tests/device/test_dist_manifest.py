"""`make dist`'s prebuilt artefacts (firmware/dist.py): the real boards' firmware images built
here and the .mpy of every architecture, each listed in build/dist/manifest.json with its
board(s), the MicroPython release, its size and sha256, and how it goes on the board. The
manifest is checked against the files themselves and the board profiles, not against itself."""
import hashlib
import json
import os
import re

import pytest

from repo import BUILD, ROOT, skip

pytestmark = pytest.mark.device       # CI builds it (make firmware runs make dist): a skip there fails

DIST = os.path.join(BUILD, "dist")


@pytest.fixture(scope="module")
def manifest():
    path = os.path.join(DIST, "manifest.json")
    if not os.path.exists(path):
        skip("no %s: `make dist` writes it" % path)
    with open(path) as f:
        return json.load(f)


def profile(name):
    with open(os.path.join(ROOT, "boards", name + ".json")) as f:
        return json.load(f)


def test_every_file_is_there_with_its_size_and_sha256(manifest):
    for e in manifest["files"]:
        path = os.path.join(DIST, e["file"])
        if e["kind"] == "mpy":      # the package's entry names its index; the .mpy is in file/
            with open(path) as f:
                urls = dict(json.load(f)["urls"])
            path = os.path.join(os.path.dirname(path), urls["_microtrain.mpy"])
        with open(path, "rb") as f:
            data = f.read()
        assert len(data) == e["bytes"] and hashlib.sha256(data).hexdigest() == e["sha256"], e


def test_the_versions_are_the_builds(manifest):
    with open(os.path.join(ROOT, "firmware", "micropython.mk")) as f:
        tag = re.search(r"^MICROPY_TAG := (\S+)", f.read(), re.M).group(1)
    import microtrain
    assert manifest["micropython"] == tag and manifest["microtrain"] == microtrain.__version__
    assert all(e["micropython"] == tag and e["microtrain"] == microtrain.__version__ for e in manifest["files"])


def test_the_real_boards_built_here_are_in_it(manifest):
    """Each board profile with a flash tool whose image is in build/firmware/NAME/ has its entry,
    named by the image the profile says, with the way to install it; no emulated board has one."""
    firmware = {e["variant"]: e for e in manifest["files"] if e["kind"] == "firmware"}
    built = []
    for name in sorted(os.listdir(os.path.join(ROOT, "boards"))):
        if not name.endswith(".json"):
            continue
        p = profile(name[:-5])
        if not p.get("flash_tool"):
            assert p["name"] not in firmware, p["name"]
        elif os.path.isfile(os.path.join(BUILD, "firmware", p["name"], p["image"])):
            built.append(p["name"])
            e = firmware[p["name"]]
            assert e["file"] == "firmware/%s/%s" % (p["name"], p["image"]) and e["board"] == p["name"]
            assert "microtrain flash --board %s" % p["name"] in e["install"]
    assert "rpi_pico" in built, "the Pico's firmware (built for rp2040js) is not in the manifest"


def test_every_architecture_of_the_mip_index_is_in_it(manifest):
    with open(os.path.join(DIST, "mip", "index.json")) as f:
        index = json.load(f)["architectures"]
    mpy = {e["arch"]: e for e in manifest["files"] if e["kind"] == "mpy"}
    assert set(mpy) == set(index) and len(mpy) >= 5, sorted(mpy)
    for arch, e in mpy.items():
        assert e["sha256"] == index[arch]["mpy_sha256"] and e["boards"] == index[arch]["boards"]
        assert all(profile(b)["mpy_arch"] == arch for b in e["boards"])
