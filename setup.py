"""Build hook for the optional C accelerator `cec._native` (recovery's hot loops; see cec/native.py).

Everything else is declared in pyproject.toml. The extension is optional: without a C compiler the
install still succeeds and cec runs the same code paths in pure Python, only slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cec._native", ["cec/_native.c"], optional=True, extra_compile_args=["-O2"])])
