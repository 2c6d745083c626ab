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


def test_a_background_launch_the_launcher_failed_to_start_is_retried(tmp_path):
    """start_mpi with a stand-in launcher that fails as Open MPI's does on its first launch
    (the PMIx line, status 213, within a second) and runs on the second."""
    count = tmp_path / "launches"
    fake = tmp_path / "fake_mpiexec.sh"
    fake.write_text(
        "#!/bin/bash\necho x >> " + str(count) + "\n"
        "if [ $(wc -l < " + str(count) + ") -eq 1 ]; then\n"
        "  echo \"The PMIx server's listener thread failed to start. We cannot\" >&2; exit 213\n"
        "fi\necho running; sleep 30\n")
    fake.chmod(0o755)
    job = util.start_mpi([str(fake)], {}, tmp_path / "err.log", tmp_path / "out.log")
    try:
        assert job.poll() is None                          # the second launch runs
        assert count.read_text().count("x") == 2
    finally:
        job.kill()
        job.wait()
    count.unlink()
    fake.write_text("#!/bin/bash\necho x >> " + str(count) + "\necho boom >&2; exit 1\n")
    job = util.start_mpi([str(fake)], {}, tmp_path / "err.log")
    assert job.returncode == 1 and count.read_text().count("x") == 1   # a failure: no retry
