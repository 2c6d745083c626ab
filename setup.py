"""Only for the optional C extensions; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds; hpcrl.runtime.params.optim
then uses its numpy path (the same update rules, about 2x slower on a ps rank) and
hpcrl.envs.atari resizes frames with PIL (the same pixels).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hpcrl.runtime.params._kernels", ["hpcrl/runtime/params/_kernels.c"],
                             optional=True, extra_compile_args=["-O3", "-fno-math-errno"]),
                   Extension("hpcrl.envs._frames", ["hpcrl/envs/_frames.c"], optional=True,
                             extra_compile_args=["-O3"])])
