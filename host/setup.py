# The C core is built into microtrain._native by cffi (see microtrain/_build_native.py).
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithBoards(build_py):
    """The repository's board profiles (boards/*.json) go into the built package as
    microtrain/board_profiles/, so that `microtrain boards` and --board work after
    `pip install ./host` (boards.boards_dir); an editable install reads boards/ itself."""

    def run(self):
        super().run()
        profiles = sorted(glob.glob(os.path.join(HERE, "..", "boards", "*.json")))
        if not profiles:
            raise SystemExit("microtrain: no board profiles in %s" % os.path.join(HERE, "..", "boards"))
        dst = os.path.join(self.build_lib, "microtrain", "board_profiles")
        os.makedirs(dst, exist_ok=True)
        for p in profiles:
            shutil.copy(p, dst)


setup(cffi_modules=["microtrain/_build_native.py:ffibuilder"], cmdclass={"build_py": BuildPyWithBoards})
