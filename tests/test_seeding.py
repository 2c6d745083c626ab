"""A run's initial weights follow from its recorded seed: one seed, one theta0."""

import numpy as np
import pytest
import torch

from hpcrl.config import load_config
from hpcrl.io import checkpoint as ck
from hpcrl.runtime.program import initial_parameters
from tests.util import run_mpi


@pytest.mark.parametrize("config", ["a3c_cartpole", "gorila_cartpole", "n_step_q_cartpole"])
def test_initial_parameters_depend_on_the_seed_only(config):
    cfg = load_config(f"configs/{config}.toml", ["seed=11"])
    first = initial_parameters(cfg)
    torch.rand(1000)                                    # whatever the process drew before
    again = initial_parameters(cfg)
    other = initial_parameters(cfg.replace(seed=12))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.mpi
def test_two_jobs_with_one_seed_start_from_the_same_weights(tmp_path):
    """Learning rate 0: the parameters a job checkpoints at its end are its theta0."""
    def final_params(seed, name):
        run_dir = tmp_path / name
        proc, _ = run_mpi(2, ["-m", "hpcrl.run", "--config", "configs/a3c_cartpole.toml",
                              "--set", f"seed={seed}", "--set", "learning_rate=0",
                              "--set", "total_frames=200", "--set", f"run_dir={run_dir}"],
                          timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        root = run_dir / "checkpoints"
        gen, _ = ck.latest_complete(root)
        return ck.read_state(ck.rank_file(root, gen, 0))["params"]

    a, b, c = final_params(11, "a"), final_params(11, "b"), final_params(12, "c")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    cfg = load_config("configs/a3c_cartpole.toml", ["seed=11"])
    np.testing.assert_array_equal(a, initial_parameters(cfg))
