"""Builds the optional compiled CPU counting kernels (all project metadata is in pyproject.toml).

pythia_probe/stats/native/_fastcount.c (dense engine, pass 1) and _sparsecount.c (sparse engine)
are plain C (no Python.h), loaded with ctypes by pythia_probe/stats/native/ (one loader).
``optional=True``: without a C compiler the install still succeeds; the dense engine then uses
its torch kernels, and the sparse engine (which needs its C kernels) is refused in one line.
"""

from setuptools import Extension, setup

FLAGS = ["-O3", "-std=c99", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[
    Extension("pythia_probe.stats.native._fastcount",
              sources=["pythia_probe/stats/native/_fastcount.c"], extra_compile_args=FLAGS,
              optional=True),
    Extension("pythia_probe.stats.native._sparsecount",
              sources=["pythia_probe/stats/native/_sparsecount.c"], extra_compile_args=FLAGS,
              optional=True),
])
