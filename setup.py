"""Only for the optional C extension; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and hpcrl.runtime.params.optim uses its
numpy path (the same update rules, about 2x slower on a ps rank).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hpcrl.runtime.params._kernels", ["hpcrl/runtime/params/_kernels.c"],
                             optional=True, extra_compile_args=["-O3", "-fno-math-errno"])])
