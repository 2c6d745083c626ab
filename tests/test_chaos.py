"""Short chaos run for CI (the full 20-kill version: python scripts/chaos.py --kills 20)."""

import subprocess
import sys

import pytest

from tests.util import ROOT

pytestmark = pytest.mark.mpi


def test_sigkill_restarts_lose_nothing(tmp_path):
    # The first of 2 kills, 5-8 s after a cold start (about 4 s of it start-up), cannot spend
    # 25,000 frames (chaos.py fails if the budget is reached before the last kill: the later
    # kills would hit a finished run)
    proc = subprocess.run([sys.executable, "scripts/chaos.py", "--kills", "2", "--total-frames",
                           "25000", "--min-s", "5", "--max-s", "8", "--run-dir",
                           str(tmp_path / "run"),
                           "--seed", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "chaos: 2 kills" in proc.stdout and "every check held" in proc.stdout
