"""Only for the optional C extension; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and hpcrl.optim uses its
numpy path (the same update rules, about 2x slower on a ps rank).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hpcrl._kernels", ["hpcrl/_kernels.c"], optional=True,
                             extra_compile_args=["-O3", "-fno-math-errno"])])
