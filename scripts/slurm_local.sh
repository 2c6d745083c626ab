#!/usr/bin/env bash
# Start a single-node SLURM on this machine (as root), for tests and CI: Debian's slurmctld,
# slurmd and munge packages, one node named after this host with all its CPUs, one default
# partition "debug". A job with more tasks than CPUs (the tests: 130 ranks on 2 cores) must be
# submitted with --overcommit (or SBATCH_OVERCOMMIT=1), else it pends with PartitionConfig;
# the partition also lets jobs that ask (--oversubscribe) share cores.
#
# Idempotent: packages are installed only when missing, slurm.conf is rewritten only when its
# content changes (and then the running daemons are told to reread it), daemons are started only
# when not running. Waits (bounded) until the node is idle; exits non-zero with a one-line
# reason otherwise. Facts behind the config: docs/cluster.md ("A local SLURM for testing").
#
# Usage: bash scripts/slurm_local.sh          (env: SLURM_LOCAL_WAIT_S, default 60)
set -euo pipefail

wait_s=${SLURM_LOCAL_WAIT_S:-60}
conf_dir=/etc/slurm
conf=$conf_dir/slurm.conf
node=$(hostname -s)
cpus=$(nproc)

die() { echo "slurm_local: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (starts munged, slurmctld, slurmd)"

# --- packages ----------------------------------------------------------------------------------
missing=()
command -v slurmctld >/dev/null || missing+=(slurmctld)
command -v slurmd >/dev/null || missing+=(slurmd)
command -v sbatch >/dev/null || missing+=(slurm-client)
command -v munged >/dev/null || missing+=(munge)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    echo "slurm_local: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || die "apt-get install ${missing[*]} failed"
fi

# --- munge -------------------------------------------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile=/etc/munge/munge.key
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
fi
chmod 0400 /etc/munge/munge.key
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    # munged refuses to run as root without --force (which also clears a stale socket from a
    # dead daemon); it wants its directories owned by the user it runs as.
    chown -R root:root /etc/munge /var/lib/munge /var/log/munge /run/munge
    munged --force || die "munged did not start"
    for _ in $(seq 1 20); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.25
    done
    munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munge credentials do not verify"
fi

# --- slurm.conf --------------------------------------------------------------------------------
mkdir -p "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
new_conf=$(cat <<EOF
# Written by hpcrl scripts/slurm_local.sh: single-node SLURM for tests.
ClusterName=hpcrl
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/backfill
JobRequeue=1
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=10
MinJobAge=300
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
)
conf_changed=0
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$new_conf" ]; then
    printf '%s\n' "$new_conf" >"$conf"
    conf_changed=1
fi

running() { pgrep -x "$1" >/dev/null; }

if ! running slurmctld; then
    slurmctld || die "slurmctld did not start; see /var/log/slurm/slurmctld.log"
elif [ "$conf_changed" -eq 1 ] && ! scontrol reconfigure; then
    # Node changes need a daemon restart, not a reconfigure.
    pkill -x slurmctld; pkill -x slurmd; sleep 2
    slurmctld || die "slurmctld did not restart; see /var/log/slurm/slurmctld.log"
fi
if ! running slurmd; then
    slurmd || die "slurmd did not start; see /var/log/slurm/slurmd.log"
fi

# --- wait until the node is idle ---------------------------------------------------------------
deadline=$((SECONDS + wait_s))
state=""
while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null | head -n1 || true)
    case "$state" in
        idle|mix|alloc) break ;;   # mix/alloc: a second run while jobs are in flight
        down*|drain*|drng*)
            scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
case "$state" in
    idle|mix|alloc) echo "slurm_local: node $node ($cpus CPUs) is $state, partition debug" >&2 ;;
    *) die "node $node not idle after ${wait_s}s (state '${state:-no answer}'); see /var/log/slurm/" ;;
esac
