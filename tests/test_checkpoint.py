"""Checkpoint generations: complete-or-absent, fallback past damaged files, pruning."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from hpcrl.io import checkpoint as ck


def make_gen(root, gen, ranks=2, value=0.0):
    files = [ck.write_state(ck.rank_file(root, gen, r),
                            {"params": np.full(1000, value + r, np.float32), "step": np.int64(gen),
                             "opt/G": np.arange(3.0)})
             for r in range(ranks)]
    ck.write_manifest(root, gen, files, {"frames": 100 * gen})
    return files


def test_round_trip_and_latest(tmp_path):
    make_gen(tmp_path, 1, value=1.0)
    make_gen(tmp_path, 2, value=2.0)
    gen, manifest = ck.latest_complete(tmp_path)
    assert gen == 2 and manifest["frames"] == 200 and len(manifest["files"]) == 2
    state = ck.read_state(ck.rank_file(tmp_path, 2, 1))
    np.testing.assert_array_equal(state["params"], np.full(1000, 3.0, np.float32))
    assert state["step"] == 2 and list(state["opt/G"]) == [0, 1, 2]
    assert not list(tmp_path.rglob("*.tmp"))


def test_generation_without_manifest_never_counts(tmp_path):
    make_gen(tmp_path, 1)
    ck.write_state(ck.rank_file(tmp_path, 2, 0), {"x": np.zeros(3)})   # crashed before manifest
    assert ck.latest_complete(tmp_path)[0] == 1


@pytest.mark.parametrize("damage, reason", [("truncate", "truncated"), ("flip", "corrupted"),
                                            ("delete", "missing")])
def test_damaged_file_falls_back_with_warning(tmp_path, damage, reason):
    make_gen(tmp_path, 1)
    make_gen(tmp_path, 2)
    path = ck.rank_file(tmp_path, 2, 1)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.unlink()
    warnings = []
    gen, _ = ck.latest_complete(tmp_path, warn=warnings.append)
    assert gen == 1
    assert len(warnings) == 1 and "generation 2" in warnings[0] and reason in warnings[0]


def test_none_complete(tmp_path):
    assert ck.latest_complete(tmp_path / "nothing") is None
    make_gen(tmp_path, 1)
    ck.rank_file(tmp_path, 1, 0).write_bytes(b"garbage")
    assert ck.latest_complete(tmp_path, warn=lambda m: None) is None


def test_prune_keeps_newest_complete(tmp_path):
    for g in (1, 2, 3, 4):
        make_gen(tmp_path, g)
    ck.write_state(ck.rank_file(tmp_path, 5, 0), {"x": np.zeros(1)})   # in progress: kept
    ck.prune(tmp_path, keep=2)
    assert ck.generations(tmp_path) == [3, 4, 5]


def test_prune_killed_half_way_leaves_no_damaged_generation(tmp_path, monkeypatch):
    """A SIGKILL inside prune's delete (simulated: rmtree removes one file, then the process
    'dies') must leave every generation that has a manifest whole; the next prune cleans up."""
    for g in (1, 2, 3):
        make_gen(tmp_path, g, ranks=2)
    real_rmtree = shutil.rmtree

    def killed_rmtree(path, ignore_errors=False):
        next(p for p in Path(path).iterdir() if p.suffix == ".h5").unlink()
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        ck.prune(tmp_path, keep=1)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    for g in ck.generations(tmp_path):
        if (ck.gen_dir(tmp_path, g) / ck.MANIFEST).exists():
            ck.verify(tmp_path, g)                     # raises on a missing or damaged file
    assert ck.latest_complete(tmp_path)[0] == 3
    ck.prune(tmp_path, keep=1)
    assert ck.generations(tmp_path) == [3] and sorted(p.name for p in tmp_path.iterdir()) == [
        "gen-000003"]


def test_unreadable_file_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.h5"
    p.write_bytes(b"not hdf5")
    with pytest.raises(ck.CheckpointError, match="bad.h5: unreadable checkpoint file"):
        ck.read_state(p)


def test_object_arrays_are_refused(tmp_path):
    with pytest.raises(TypeError, match="not a plain array"):
        ck.write_state(tmp_path / "x.h5", {"bad": np.array([{"a": 1}], dtype=object)})


_CRASHING_WRITER = """
import sys
from pathlib import Path
import numpy as np
from hpcrl.io import checkpoint as ck
from hpcrl.runtime import hooks
root, gen = Path(sys.argv[1]), int(sys.argv[2])
files = [ck.write_state(ck.rank_file(root, gen, r), {"params": np.full(50000, gen + r, np.float32)},
                        crash=lambda step, r=r: hooks.checkpoint_crash(r, step))
         for r in range(2)]
ck.write_manifest(root, gen, files, {"frames": 100 * gen})
hooks.checkpoint_crash(0, "manifest")
ck.prune(root, 1)
"""


@pytest.mark.parametrize("rank, step", [(1, "closed"), (1, "synced"), (1, "renamed"),
                                        (1, "dir-synced"), (0, "manifest")])
def test_a_crash_at_any_step_of_a_write_leaves_a_generation_that_verifies(tmp_path, rank, step):
    """The writer is SIGKILLed at each step of generation 2 (the hooks of the production write
    path): the newest complete generation always verifies, with its recorded hashes; it is
    generation 2 only once its manifest was written."""
    import os
    import subprocess
    import sys

    from tests.util import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(tmp_path), "1"], env=env,
                   check=True, timeout=60)
    env["HPCRL_CKPT_CRASH_AT"] = f"{rank}:{step}"
    proc = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(tmp_path), "2"], env=env,
                          timeout=60)
    assert proc.returncode == -9                       # killed where asked
    gen, manifest = ck.latest_complete(tmp_path, warn=pytest.fail)
    assert gen == (2 if step == "manifest" else 1)
    state = ck.read_state(ck.rank_file(tmp_path, gen, 1))
    assert state["params"][0] == gen + 1
    if step in ("renamed", "dir-synced"):              # the renamed file is whole and hashed
        assert ck.sha256(ck.rank_file(tmp_path, 2, 1)) == ck._sync_and_hash(
            ck.rank_file(tmp_path, 2, 1))


def test_hdf5_write_errors_are_os_errors_with_their_errno():
    """HDF5 reports ENOSPC from a real disk as RuntimeError; the checkpoint path needs OSError."""
    exc = RuntimeError("Can't write data (file write failed: time = Wed Dec  2 10:00:00 2026, "
                       "filename = 'x.h5.tmp', file descriptor = 7, errno = 28, error message = "
                       "'No space left on device', buf = 0x55, total write size = 4096)")
    from hpcrl.io.files import h5_os_error

    err = h5_os_error(exc)
    assert isinstance(err, OSError) and err.errno == 28
    assert err.strerror.startswith("No space left on device")
    assert h5_os_error(RuntimeError("something else")).errno == 5


def test_an_unreadable_file_skips_its_generation(tmp_path, monkeypatch):
    """An I/O error while hashing (EIO, ESTALE) falls back to the older generation with a
    warning, instead of stopping every start."""
    make_gen(tmp_path, 1)
    make_gen(tmp_path, 2)
    bad, orig = ck.rank_file(tmp_path, 2, 1), ck.sha256

    def sha256(path):
        if Path(path) == bad:
            raise OSError(5, "Input/output error")
        return orig(path)

    monkeypatch.setattr(ck, "sha256", sha256)
    warnings = []
    assert ck.latest_complete(tmp_path, warn=warnings.append)[0] == 1
    assert warnings == [f"hpcrl: warning: skipping checkpoint generation 2: {bad}: unreadable "
                        "(Input/output error)"]
