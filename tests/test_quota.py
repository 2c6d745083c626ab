"""Quota headroom: the tools' output parsed by hand-checked numbers, and the query path run
against a stand-in ``quota`` executable. This machine's kernel is built without
CONFIG_QUOTA and has neither quota-tools nor Lustre, so the real tools cannot run here; the
stand-in prints what quota-tools prints."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpcrl.io import quota

LFS_QUIET = """\
      /lustre/scratch 1048576  2000000  2097152       -   10234       0       0       -
"""
LFS_OVER_AND_WRAPPED = """\
Disk quotas for grp 5001 (gid 5001):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
/lustre/a-very-long-file-system-name/project
                3000000* 2000000 2500000 6d23h59m  10       0       0       -
"""
LFS_INEXACT = """\
      /lustre/scratch [4096]  0  8192       -   [12]       0       0       -
"""
QUOTA_TOOLS = """\
Disk quotas for user alice (uid 1000): 
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
nfs.example.org:/export/home  500000  900000 1000000       0    4000       0       0       0
"""
QUOTA_NONE = "Disk quotas for user bob (uid 1001): none\n"
QUOTA_GROUPS = """\
Disk quotas for group users (gid 100): 
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
      /dev/sdb1      10       0       0       0       1       0       0       0
Disk quotas for group ml (gid 2000): 
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
      /dev/sdb1    7000    8000       0       0       3       0       0       0
"""


def test_lfs_rows():
    assert quota.parse_quota_lines(LFS_QUIET) == [(1048576, 2000000, 2097152)]
    assert quota.parse_quota_lines(LFS_OVER_AND_WRAPPED) == [(3000000, 2000000, 2500000)]
    assert quota.parse_quota_lines(LFS_INEXACT) == [(4096, 0, 8192)]


def test_quota_tools_rows():
    assert quota.parse_quota_lines(QUOTA_TOOLS) == [(500000, 900000, 1000000)]
    assert quota.parse_quota_lines(QUOTA_NONE) == []
    assert quota.parse_quota_lines(QUOTA_GROUPS) == [(10, 0, 0), (7000, 8000, 0)]


def test_headroom_is_the_hard_limit_else_the_soft_one():
    assert quota.headroom_kib(1048576, 2000000, 2097152) == 1048576      # hard - used
    assert quota.headroom_kib(3000000, 2000000, 2500000) == -500000      # over it
    assert quota.headroom_kib(7000, 8000, 0) == 1000                     # soft only
    assert quota.headroom_kib(10, 0, 0) is None                          # no limit


def test_project_id_and_mount():
    assert quota.parse_project_id("   1234 P /lustre/scratch/run\n") == 1234
    assert quota.parse_project_id("      0 - /lustre/scratch/run\n") is None
    mounts = ("/dev/sda1 / ext4 rw 0 0\n"
              "10.0.0.1@o2ib:/scratch /lustre/scratch lustre rw,flock 0 0\n"
              "srv:/home /home nfs4 rw 0 0\n"
              "tmpfs /lustre/scratch/shm tmpfs rw 0 0\n")
    assert quota.mount_of(Path("/lustre/scratch/u/run"), mounts) == ("/lustre/scratch", "lustre")
    assert quota.mount_of(Path("/lustre/scratchy"), mounts) == ("/", "ext4")
    assert quota.mount_of(Path("/home"), mounts) == ("/home", "nfs4")


def stand_in_quota(bin_dir: Path, limit_kib_file: Path, usage_dir: Path) -> None:
    """A ``quota`` executable that prints quota-tools' rows: the real usage of
    ``usage_dir`` (du) against the hard limit in ``limit_kib_file`` for the user, no group
    limit. It checks it was asked for one file system, without wrapping, raw grace times."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "quota"
    script.write_text(f"""#!/bin/bash
[ "$1 $2" = "-w -p" ] && [ "$4" = "-f" ] && [ -n "$5" ] || {{ echo "bad args: $*" >&2; exit 2; }}
used=$(du -sk "{usage_dir}" | cut -f1)
if [ "$3" = "-u" ]; then
  echo "Disk quotas for user u (uid $(id -u)): "
  echo "     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace"
  echo "      $5  $used  0  $(cat "{limit_kib_file}")  0  1  0  0  0"
else
  echo "Disk quotas for group g (gid $(id -g)): none"
fi
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_quota_headroom_asks_the_tool(tmp_path, monkeypatch):
    usage, limit = tmp_path / "data", tmp_path / "limit"
    usage.mkdir()
    (usage / "f").write_bytes(b"\1" * 200_000)
    limit.write_text("1000")
    stand_in_quota(tmp_path / "bin", limit, usage)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    room, which = quota.quota_headroom(usage)
    used_kib = int(os.popen(f"du -sk {usage}").read().split()[0])
    assert room == (1000 - used_kib) * 1024 and 190 < used_kib < 260
    assert which == f"the user quota of uid {os.getuid()} (quota)"
    limit.write_text("10")                       # over the limit: no room at all
    assert quota.quota_headroom(usage)[0] == 0.0


def test_no_tool_no_quota(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                  # neither quota nor lfs
    assert quota.quota_headroom(tmp_path) is None


@pytest.mark.skipif(not os.path.exists("/proc/mounts"), reason="no /proc/mounts")
def test_a_failing_tool_is_no_answer(tmp_path, monkeypatch):
    (tmp_path / "quota").write_text("#!/bin/bash\necho 'quota: Cannot connect' >&2\nexit 3\n")
    (tmp_path / "quota").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert quota.quota_headroom(tmp_path) is None
