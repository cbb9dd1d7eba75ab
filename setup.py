# The C kernels are compiled here, by cffi in out-of-line API mode (see kernels/build.py).
from setuptools import setup

setup(cffi_modules=["kernels/build.py:ffibuilder"])
