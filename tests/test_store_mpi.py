"""The RMA parameter store under real mpiexec, with 1 ps + 3 clients and 3 ps + 5 clients."""

import pytest

from tests.util import ROOT, run_mpi

pytestmark = pytest.mark.mpi
SCRIPT = str(ROOT / "tests" / "mpi" / "store_checks.py")
LAYOUTS = [(4, 1), (8, 3)]


@pytest.mark.parametrize("world, n_ps", LAYOUTS)
@pytest.mark.parametrize("check", ["exact_sums", "staleness", "optimizers", "target"])
def test_store(check, world, n_ps):
    proc, _ = run_mpi(world, [SCRIPT, check, str(n_ps)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"OK {check}" in proc.stdout


@pytest.mark.parametrize("world, n_ps", LAYOUTS)
def test_no_torn_reads_while_ps_updates(world, n_ps):
    proc, _ = run_mpi(world, [SCRIPT, "no_torn_reads", str(n_ps)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK no_torn_reads" in proc.stdout
    reads = int(proc.stdout.split("consistent reads: ")[1].split()[0])
    assert reads > 10, "the readers must have overlapped the writer"


@pytest.mark.parametrize("check", ["exact_sums", "staleness", "target"])
def test_store_in_the_separate_memory_model(check):
    """The ps's path for windows that are not unified (MPI atomics on its own header words
    instead of loads and stores), forced: every MPI here gives unified windows."""
    proc, _ = run_mpi(8, [SCRIPT, check, "3"], timeout=120, env={"HPCRL_SEPARATE_MODEL": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"OK {check}" in proc.stdout
