"""Keep a plan the fuzzer found as a regression case.

    python fuzz/add_case.py NAME FILE "what was wrong or what it checks"

copies FILE to tests/fuzz_cases/NAME.mtp and records in tests/fuzz_cases/cases.json
what the host's core does with it now (refused with which MT_E_* error, or trains
within its RAM), which tests/core/test_fuzz_regressions.py then asserts on every run.
Add a case once the bug it found is fixed.
"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests", "support"), os.path.join(ROOT, "tests", "core")]

from microtrain import format as F  # noqa: E402
from test_fuzz_regressions import CASES_DIR, outcome  # noqa: E402


def main(name, path, what):
    dest = os.path.join(CASES_DIR, name + ".mtp")
    shutil.copyfile(path, dest)
    index = os.path.join(CASES_DIR, "cases.json")
    cases = json.load(open(index)) if os.path.exists(index) else {}
    cases[os.path.basename(dest)] = dict(what=what, expect=outcome(open(dest, "rb").read()), format_version=F.VERSION)
    with open(index, "w") as f:
        json.dump(dict(sorted(cases.items())), f, indent=1)
        f.write("\n")
    print("%s: %s" % (os.path.relpath(dest, ROOT), cases[os.path.basename(dest)]["expect"]))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
