"""hpcrl.runtime.exits.abort_job: every rank's abort path waits the grace, then Aborts."""

import time

from hpcrl.runtime.exits import ABORT_GRACE_S, EXIT_BUSY, abort_job


class RecordingComm:
    """Stands in for MPI.COMM_WORLD: records when Abort was called and with what."""

    def __init__(self):
        self.calls = []

    def Abort(self, status):  # noqa: N802 - mpi4py's name
        self.calls.append((time.monotonic(), status))


def test_abort_job_waits_the_grace_then_aborts_with_the_status():
    comm = RecordingComm()
    t0 = time.monotonic()
    abort_job(comm, EXIT_BUSY)
    assert len(comm.calls) == 1
    when, status = comm.calls[0]
    assert status == EXIT_BUSY
    assert when - t0 >= ABORT_GRACE_S


def test_an_interrupt_during_the_grace_still_aborts(monkeypatch):
    def interrupted(_seconds):
        raise KeyboardInterrupt            # a second Ctrl-C during the wait

    monkeypatch.setattr(time, "sleep", interrupted)
    comm = RecordingComm()
    abort_job(comm, 1)
    assert [status for _, status in comm.calls] == [1]
