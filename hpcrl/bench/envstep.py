"""``python -m hpcrl.bench env``: the Atari environment step with each frame preprocessing, in
one process on one core: the C pass (``hpcrl.envs._frames``, the default where it is built:
the max of each frame pair and the resize in one pass) against numpy's max and PIL's resize
(:func:`hpcrl.envs.atari.pool_resize_84x84_pil`), the same pixels either way.

Both are timed on the same environments in alternating blocks (medians): the max and resize
alone on the batch of real frame pairs they get in a step, and the whole step of ``envs``
Pong environments with random actions, in milliseconds per agent step (one environment's
step of 4 emulator frames) and as ratios, C over PIL. In the same alternating blocks, the
emulator alone on as many Pong emulators (the step's 4 frames of ``act`` and ``game_over`` per
environment, nothing else, as the raw bound of :mod:`hpcrl.bench.raw` runs it):
``step_c_over_emulator`` is what the step costs beyond emulation, the part of an agent step
that preprocessing and the Python driver add.
"""

from __future__ import annotations

import numpy as np

from hpcrl.bench.components import rate


def _ms_per_call(fn, calls: int) -> float:
    return 1e3 / rate(fn, calls)


def bench_env_step(envs: int, steps: int, blocks: int) -> dict:
    """See the module docstring; ``steps`` batched steps per block, ``blocks`` blocks each."""
    from hpcrl.envs import atari

    if atari._frames is None:
        raise SystemExit("bench env: hpcrl.envs._frames is not built (pip install -e . with a "
                         "C compiler)")
    env = atari.AtariEnv("pong", envs, 0, training=True)
    env.reset()
    rng = np.random.default_rng(0)
    ales = atari.AtariEnv("pong", envs, 1, training=True)._ales
    minimal = ales[0].getMinimalActionSet()
    resizes = {"c": atari.pool_resize_84x84, "pil": atari.pool_resize_84x84_pil}
    ms = {f"{what}_{k}": [] for what in ("resize", "step") for k in resizes}

    def step():
        env.step(rng.integers(env.num_actions, size=envs))

    def emulate():
        for ale, a in zip(ales, rng.integers(len(minimal), size=envs).tolist()):
            for _ in range(env.frames_per_step):
                ale.act(minimal[a])
                if ale.game_over():
                    ale.reset_game()

    step()
    for _ in range(blocks):
        ms.setdefault("emulator", []).append(_ms_per_call(emulate, steps) / envs)
        for k, resize in resizes.items():
            env._pool_resize = resize
            pairs, grabbed = env._screens.copy(), env._grabbed.copy()
            ms[f"resize_{k}"].append(_ms_per_call(lambda: resize(pairs, grabbed), steps))
            ms[f"step_{k}"].append(_ms_per_call(step, steps) / envs)
    med = {k: float(np.median(v)) for k, v in ms.items()}
    return {"bench": "env", "game": "pong", "envs": envs, "steps_per_block": steps,
            "blocks": blocks,
            "resize_c_ms": med["resize_c"], "resize_pil_ms": med["resize_pil"],
            "resize_c_over_pil": med["resize_c"] / med["resize_pil"],
            "step_c_ms_per_agent_step": med["step_c"],
            "step_pil_ms_per_agent_step": med["step_pil"],
            "step_c_over_pil": med["step_c"] / med["step_pil"],
            "emulator_ms_per_agent_step": med["emulator"],
            "step_c_over_emulator": med["step_c"] / med["emulator"]}
