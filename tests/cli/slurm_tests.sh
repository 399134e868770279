#!/usr/bin/env bash
# fax-run under a real Slurm: each case brings up a single-node cluster from Debian's packages
# (munged, slurmctld, slurmd; this host as the one node, 2 CPUs) as root in $WORK/slurm, runs
# against it and tears it down. slurm_tests.sh <case>; exits 77 with the reason printed where the
# cluster cannot start (not root, packages missing).
# Environment: FAX_RUN, FAX_SOURCE_DIR, WORK, PYTHON (with h5py).
set -uo pipefail

source "$(dirname "$0")/common.sh"
rm -rf "${WORK:?}"/* 2>/dev/null

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "the test cluster needs root (slurmd starts jobs as their users)"
for tool in munged slurmctld slurmd sbatch srun squeue scancel sinfo; do
  command -v "$tool" > /dev/null || skip "$tool is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
done
# A test run inside a Slurm job must not hand that job's variables to this cluster's commands.
for v in $(compgen -v SLURM_); do unset "$v"; done

cluster=$WORK/slurm
export SLURM_CONF=$cluster/slurm.conf
stop_cluster() {
  for daemon in slurmd slurmctld munged; do
    [[ -s $cluster/$daemon.pid ]] && kill "$(cat "$cluster/$daemon.pid")" 2>/dev/null
  done
  sleep 0.5
  for daemon in slurmd slurmctld munged; do
    [[ -s $cluster/$daemon.pid ]] && kill -9 "$(cat "$cluster/$daemon.pid")" 2>/dev/null
  done
  return 0
}
trap 'cleanup; stop_cluster' EXIT

start_cluster() {
  local node
  node=$(hostname -s)
  mkdir -p "$cluster"/{munge,state,spool,log}
  chmod 700 "$cluster/munge"
  head -c 1024 /dev/urandom > "$cluster/munge/munge.key"
  chmod 600 "$cluster/munge/munge.key"
  munged -f --key-file="$cluster/munge/munge.key" --socket="$cluster/munge/munge.sock" \
    --pid-file="$cluster/munged.pid" --log-file="$cluster/log/munged.log" --seed-file="$cluster/munge/seed" \
    || skip "munged does not start: $(tail -2 "$cluster/log/munged.log" 2>/dev/null)"
  cat > "$SLURM_CONF" <<EOF
ClusterName=faxtest
SlurmctldHost=$node
SlurmUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$cluster/munge/munge.sock
StateSaveLocation=$cluster/state
SlurmdSpoolDir=$cluster/spool
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
SlurmctldLogFile=$cluster/log/slurmctld.log
SlurmdLogFile=$cluster/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=20
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$node CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  slurmctld -c -f "$SLURM_CONF" || skip "slurmctld does not start: $(tail -2 "$cluster/log/slurmctld.log")"
  slurmd -f "$SLURM_CONF" || skip "slurmd does not start: $(tail -2 "$cluster/log/slurmd.log")"
  local deadline=$((SECONDS + 30))
  until [[ $(sinfo -h -o %t 2>/dev/null) == idle ]]; do
    ((SECONDS < deadline)) || skip "the node did not come up within 30 s: $(sinfo 2>&1 | tail -2); $(tail -2 "$cluster/log/slurmd.log")"
    sleep 0.2
  done
}

# wait_for_job <job id> <seconds>: until the job has left the queue.
wait_for_job() {
  local deadline=$((SECONDS + $2))
  while squeue -h -j "$1" 2>/dev/null | grep -q .; do
    ((SECONDS < deadline)) || fail "job $1 still queued after $2 s: $(squeue -j "$1")"
    sleep 0.5
  done
}

start_cluster
case "$1" in
  launch)
    # `srun -n 3 fax-run launch` (rank 0 coordinates, ranks 1 and 2 are its workers), from the
    # login shell and inside a batch job, bit-identical to a local run. --overcommit: 3 tasks on
    # the node's 2 CPUs.
    echo "fax-test-token" > "$WORK/token"
    common=(--set rounds=10 --set execution.logical_shards=2 --set logging.eval_every=5 --set logging.checkpoint_every=5)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/local.h5" "${common[@]}" --set execution.executors=1
    MASTER_PORT=$(free_port) timeout 300 srun -n 3 --overcommit "$FAX_RUN" launch "$experiment" -o "$WORK/srun.h5" \
      "${common[@]}" --token-file "$WORK/token" > "$WORK/srun.log" 2>&1 || fail "srun: $(tail -5 "$WORK/srun.log")"
    grep -q "mesh: 2 remote executors" "$WORK/srun.log" || fail "srun: not 2 workers: $(cat "$WORK/srun.log")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/srun.h5" 10 || fail "srun differs from local"
    job=$(MASTER_PORT=$(free_port) sbatch --parsable -n 3 --overcommit -o "$WORK/batch.log" \
      --wrap "srun '$FAX_RUN' launch '$experiment' -o '$WORK/batch.h5' ${common[*]} --token-file '$WORK/token'") \
      || fail "sbatch refused the launch: $job"
    wait_for_job "$job" 300
    grep -q "mesh: 2 remote executors" "$WORK/batch.log" || fail "sbatch + srun: not 2 workers: $(cat "$WORK/batch.log")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/batch.h5" 10 \
      || fail "sbatch + srun differs from local: $(tail -5 "$WORK/batch.log")"
    ;;
  *)
    fail "unknown case '$1'"
    ;;
esac
echo "PASS: $1"
