"""The run's metrics file, `<run_dir>/metrics.h5`: one writer, readable while the job runs.

One rank (the one that gathers episode and training statistics) owns a `MetricsWriter`; every
other process, including `python -m hpcrl.analyze` on a login node while the job runs, reads
through `read_metrics`. The PyPI h5py wheel has no parallel HDF5, so there is exactly one writer
per file, and the file is kept readable during the run with HDF5 single-writer/multiple-reader
(SWMR) mode.

Schema (other modules and the analysis depend on it):

    /                      attrs: algo, game, seed, config (resolved TOML text), hpcrl_version,
                                  schema_version, created_unix, started_unix, num_starts
    /episodes/<column>     1-D, one row per finished training episode (COLUMNS["episodes"])
    /eval/<column>         1-D, one row per periodic evaluation episode (same columns)
    /final/<column>        1-D, one row per episode of the final evaluation of the final
                           weights (same columns; schema 2; empty until the run ends)
    /train/<column>        1-D, one row per progress report, counters cumulative, and the
                           network's health since the previous report (schema 3;
                           clip_kept: schema 4)
    /status/state          scalar S16: running | finished | failed | preempted
    /status/heartbeat_unix scalar float64: time.time() at the last flush
    /status/committed_rows int64[4]: rows of (episodes, eval, train, final) that are complete

Schema 1 files (no `final` group, three row counts) read with an empty `final` group, schema
1 and 2 files without the health columns of `train` (schema 3 files without `clip_kept`) with
those columns NaN; a resume rewrites them as schema 4.

Why the status lives in datasets, not attributes: HDF5's SWMR documentation lists creating or
modifying attributes among the operations a SWMR writer may not do (readers get no consistency
guarantee for object-header changes). HDF5 2.0.0 as shipped in h5py 3.16 does not refuse it
(measured here), so nothing would catch the mistake; writing into an existing fixed-size dataset
is allowed, so status, heartbeat and row counts are tiny datasets. Attributes are written only
while the file is not yet in SWMR mode (at creation and at every resume).

Why `committed_rows`: a flush resizes and writes one column after the other. A reader that opens
the file between two column writes could see a resized column whose new rows are still fill
values. The writer therefore writes all columns, flushes, and only then raises
`committed_rows` and flushes again; readers cut every column to `committed_rows`, so they see
whole rows only, on a live file and on a crashed one.

Why every (re)open writes a new file: an HDF5 file whose SWMR writer died (SIGKILL, node failure)
keeps its "open for write" consistency flag; it can still be read in SWMR mode, but it cannot be
reopened for writing without the `h5clear` tool, which h5py does not expose. A SWMR reader that
holds the file open also blocks a writer's `r+` open (measured: `BlockingIOError`, errno 11).
So a resume reads the old file (SWMR read works after a crash), writes a complete new file to
`metrics.h5.tmp`, switches it to SWMR mode, and `os.replace`s it over the old one: the path
always holds a complete file, and readers holding the old inode do not block the writer.
To inspect a crashed run's file, read it with `read_metrics`; for `h5dump`, run `h5clear -s
metrics.h5` first (a file whose writer died during a flush, shorter than its recorded end, is
then still refused as truncated: `read_metrics` reads it).

Reading: `read_metrics` opens a cleanly closed file in plain read mode and a live or crashed one
in SWMR-read mode, with HDF5's metadata read attempts cut from 100 to 12: with the default, one
read of a corrupt crashed file took more than a minute here (checksum retries with back-off).
A lock held by another process is retried for about 2.5 s. Any failure is a `MetricsError`
naming the file.

Measured here (2 shared cores, local disk): `flush()` with new rows in all three groups about
4 ms, a heartbeat-only `flush()` 0.3 ms, `read_metrics` of a 200 KB live file about 7 ms.

On network filesystems without working `flock` (some NFS / Lustre mounts), set
`HDF5_USE_FILE_LOCKING=FALSE` for writer and readers.
"""

from hpcrl.io.metrics.read import read_metrics
from hpcrl.io.metrics.schema import (
    COLUMNS, GROUPS, IDENTITY_ATTRS, REQUIRED_ATTRS, SCHEMA_VERSION, STATUSES, MetricsError)
from hpcrl.io.metrics.writer import MetricsWriter

__all__ = ["COLUMNS", "GROUPS", "IDENTITY_ATTRS", "REQUIRED_ATTRS", "SCHEMA_VERSION", "STATUSES",
           "MetricsError", "MetricsWriter", "read_metrics"]
