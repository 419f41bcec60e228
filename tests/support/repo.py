"""Where things are, for every test: the repository, its build folder, and the third-party
material outside it (microtrain.thirdparty: the vendored sources, MIT's networks), with the
skip, or under CI the failure, that names the variable to set when it is missing."""
import os

import pytest

from microtrain import thirdparty

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")
BUILD = os.path.join(ROOT, "build")


def in_ci():
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip(reason):
    """Skip, except under CI (CI=true), where .ci/run must have provided what a test needs:
    there a test that cannot run fails, so a pass is never reported for what did not run."""
    if in_ci():
        pytest.fail("CI=true and this test cannot run: " + reason, pytrace=False)
    pytest.skip(reason)


def _need(what, variable, found):
    if not found:
        skip("%s not found: set %s, or put it beside the checkout (microtrain/thirdparty.py)" % (what, variable))
    return found


def need_tte():
    """MIT's networks' folder (skips, or fails under CI, without it)."""
    return _need("MIT's networks (shared/models/tte)", "MICROTRAIN_TTE", thirdparty.tte_dir())


def need_vendor():
    """The vendored sources' folder (skips, or fails under CI, without it)."""
    return _need("the vendored sources (shared/vendor)", "MICROTRAIN_VENDOR", thirdparty.vendor_dir())
