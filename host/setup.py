# The C core is built into microtrain._native by cffi (see microtrain/_build_native.py).
from setuptools import setup

setup(cffi_modules=["microtrain/_build_native.py:ffibuilder"])
