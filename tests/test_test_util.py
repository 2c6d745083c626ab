"""The MPI launch helper of the tests (tests/util.py): a launch that Open MPI's launcher failed
to start is retried, a job that failed is not."""

import subprocess

from tests import util


def _fake_runs(monkeypatch, results):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return results[len(calls) - 1]

    monkeypatch.setattr(util.subprocess, "run", fake_run)
    return calls


def _done(code, out="", err=""):
    return subprocess.CompletedProcess([], code, out, err)


def test_a_launch_the_launcher_failed_to_start_is_retried(monkeypatch):
    pmix = "-----\nThe PMIx server's listener thread failed to start. We cannot\ncontinue.\n"
    calls = _fake_runs(monkeypatch, [_done(213, err=pmix), _done(0, out="ok")])
    proc, _ = util.run_mpi(2, ["-c", "pass"])
    assert proc.returncode == 0 and proc.stdout == "ok" and len(calls) == 2


def test_a_failed_job_is_not_retried_and_retries_end(monkeypatch):
    calls = _fake_runs(monkeypatch, [_done(1, err="Traceback ... ValueError")])
    proc, _ = util.run_mpi(2, ["-c", "pass"])
    assert proc.returncode == 1 and len(calls) == 1
    pmix = "The PMIx server's listener thread failed to start."
    calls = _fake_runs(monkeypatch, [_done(213, err=pmix)] * util.LAUNCH_ATTEMPTS)
    proc, _ = util.run_mpi(2, ["-c", "pass"])
    assert proc.returncode == 213 and len(calls) == util.LAUNCH_ATTEMPTS
