"""Builds the optional compiled CPU counting kernels (all project metadata is in pyproject.toml).

pythia_probe/stats/_fastcount.c (dense engine) and _sparsecount.c (sparse / out-of-core engine)
are plain C (no Python.h), loaded with ctypes by pythia_probe/stats/fastcount.py and
sparsefast.py. ``optional=True``: without a C compiler the install still succeeds and the
statistics engines use their torch / numpy / scipy kernels.
"""

from setuptools import Extension, setup

FLAGS = ["-O3", "-std=c99", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[
    Extension("pythia_probe.stats._fastcount", sources=["pythia_probe/stats/_fastcount.c"],
              extra_compile_args=FLAGS, optional=True),
    Extension("pythia_probe.stats._sparsecount", sources=["pythia_probe/stats/_sparsecount.c"],
              extra_compile_args=FLAGS, optional=True),
])
