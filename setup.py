"""Builds the optional compiled CPU counting kernel (all project metadata is in pyproject.toml).

pythia_probe/stats/_fastcount.c is plain C (no Python.h), loaded with ctypes by
pythia_probe/stats/fastcount.py. ``optional=True``: without a C compiler the install still
succeeds and the statistics engine uses its torch kernels.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "pythia_probe.stats._fastcount",
    sources=["pythia_probe/stats/_fastcount.c"],
    extra_compile_args=["-O3", "-std=c99", "-ffp-contract=off", "-fno-fast-math"],
    optional=True,
)])
