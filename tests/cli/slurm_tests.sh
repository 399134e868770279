#!/usr/bin/env bash
# fax-run under a real Slurm: each case brings up a single-node cluster from Debian's packages
# (munged, slurmctld, slurmd; this host as the one node, 2 CPUs) as root in $WORK/slurm, runs
# against it and tears it down. slurm_tests.sh <case>; exits 77 with the reason printed where the
# cluster cannot start (not root, packages missing).
# Environment: FAX_RUN, FAX_SOURCE_DIR, WORK, PYTHON (with h5py); FAX_SANITIZED=1 under the
# sanitizers (shorter rounds where a case only needs them to last some seconds).
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
  sweep)
    # A 2 x 2 grid as one job array: every trial log bit-identical to the same sweep run locally,
    # the same best trial. Then scancel mid-way and the same command again: it resubmits what
    # stopped (resuming a checkpointed trial) and ends identical to the local sweep; a killed sweep
    # process follows its queued tasks again instead of submitting them twice.
    # The grid on the command line (sweep options then differ from run to run only in -o). Trials
    # of some seconds, so that scancel lands in one.
    rounds=$(lasting 150)
    grid=("$experiment" --grid algorithm.client_lr=0.01,0.05 --grid seed=0,1 --set rounds=$rounds
      --set logging.checkpoint_every=5 --set logging.eval_every=25)
    same_sweeps() {  # same_sweeps <dir> <dir>: the same best trial, every trial log bit-identical
      local t
      for t in "$1"/trial-*.h5; do
        "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$t" "$2/$(basename "$t")" "$rounds" > /dev/null \
          || fail "$2/$(basename "$t") differs from $t"
      done
      [[ $(grep "^best trial" "$1.out" | sed 's/; log.*//') == $(grep "^best trial" "$2.out" | sed 's/; log.*//') ]] \
        || fail "another best trial: $(grep "^best trial" "$1.out") vs $(grep "^best trial" "$2.out")"
    }
    "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/local" --executors 2 > "$WORK/local.out" 2>&1 \
      || fail "local sweep: $(tail -3 "$WORK/local.out")"
    timeout 300 "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/array" --launcher slurm > "$WORK/array.out" 2>&1 \
      || fail "slurm sweep: $(tail -3 "$WORK/array.out")"
    grep -q "submitted 4 trials as Slurm array job" "$WORK/array.out" || fail "no array: $(cat "$WORK/array.out")"
    [[ $(ls "$WORK"/array/trial-*.h5 | wc -l) -eq 4 ]] || fail "not 4 trial logs: $(ls "$WORK/array")"
    same_sweeps "$WORK/local" "$WORK/array"

    # One task at a time (--executors 1: %1); scancel once the first trial is done.
    "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/cancel" --launcher slurm --executors 1 > "$WORK/cancel.out" 2>&1 &
    follower=$!
    wait_for_line "$WORK/cancel.out" "\[1/4 done\]" 120
    for _ in $(seq 600); do (( $(ls "$WORK"/cancel/trial-*.h5 | wc -l) >= 2 )) && break; sleep 0.1; done
    sleep 1  # the second trial is past its first checkpoint
    scancel "$(grep -o "array job [0-9]*" "$WORK/cancel.out" | cut -d' ' -f3)"
    wait "$follower"; rc=$?
    [[ $rc -eq 2 ]] || fail "the follower of a cancelled array exited $rc: $(tail -3 "$WORK/cancel.out")"
    grep -q "trials stopped before they finished" "$WORK/cancel.out" || fail "no word of the stopped trials: $(tail -3 "$WORK/cancel.out")"
    stopped=$(grep -o "trial-[0-9]* .*: stopped (by a signal" "$WORK/cancel.out" | cut -d' ' -f1)
    [[ -n $stopped ]] || fail "no trial stopped by the signal: $(cat "$WORK/cancel.out")"
    mv "$WORK/cancel.out" "$WORK/cancel-first.out"
    timeout 300 "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/cancel" --launcher slurm > "$WORK/cancel.out" 2>&1 \
      || fail "resubmitting: $(tail -3 "$WORK/cancel.out")"
    grep -q "resuming: 1 done, 3 to run" "$WORK/cancel.out" || fail "not resumed: $(head -3 "$WORK/cancel.out")"
    grep -q "Slurm job [0-9]* task [0-9]* on .*: fax-run resume" "$WORK/cancel/$stopped.log" \
      || fail "$stopped started over: $(cat "$WORK/cancel/$stopped.log")"
    same_sweeps "$WORK/local" "$WORK/cancel"

    # kill -9 of the sweep process while sbatch runs (made slow here): the job it submitted is found
    # by its name next time, not submitted again.
    mkdir -p "$WORK/slow"
    printf '#!/bin/sh\n%s "$@"; rc=$?\nsleep 30\nexit $rc\n' "$(command -v sbatch)" > "$WORK/slow/sbatch"
    chmod +x "$WORK/slow/sbatch"
    PATH="$WORK/slow:$PATH" "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/race" --launcher slurm --executors 1 \
      > "$WORK/race-first.out" 2>&1 &
    follower=$!
    for _ in $(seq 600); do squeue -h | grep -q . && break; sleep 0.1; done
    kill -9 "$follower"; wait "$follower" 2>/dev/null
    timeout 300 "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/race" --launcher slurm > "$WORK/race.out" 2>&1 \
      || fail "following the job of a killed submission: $(tail -3 "$WORK/race.out")"
    grep -q "submitted" "$WORK/race.out" && fail "trials submitted twice: $(cat "$WORK/race.out")"
    same_sweeps "$WORK/local" "$WORK/race"

    # kill -9 of the sweep process: its array runs on, and the same command follows it again.
    "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/orphan" --launcher slurm --executors 1 > "$WORK/orphan-first.out" 2>&1 &
    follower=$!
    wait_for_line "$WORK/orphan-first.out" "submitted 4 trials" 60
    kill -9 "$follower"; wait "$follower" 2>/dev/null
    run_expect 2 "trials of this sweep are still queued in Slurm \\(job [0-9]+\\): follow them with --launcher slurm" -- \
      "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/orphan"
    timeout 300 "$FAX_RUN" sweep "${grid[@]}" -o "$WORK/orphan" --launcher slurm > "$WORK/orphan.out" 2>&1 \
      || fail "following again: $(tail -3 "$WORK/orphan.out")"
    grep -q "submitted" "$WORK/orphan.out" && fail "trials submitted twice: $(cat "$WORK/orphan.out")"
    same_sweeps "$WORK/local" "$WORK/orphan"
    ;;
  sweep_errors)
    # No Slurm on PATH, a partition that does not exist, an sbatch that rejects its arguments: one
    # line, exit 2, the sweep directory as it was. Then what else goes wrong around an array.
    args=(sweep "$FAX_SOURCE_DIR/experiments/synthetic_fedavg.yaml" --grid seed=0,1 --set rounds=3)
    run_expect 0 "" -- "$FAX_RUN" "${args[@]}" -o "$WORK/done" --executors 2
    before=$(cd "$WORK/done" && sha256sum sweep.h5 trial-*.h5)
    run_expect 2 "--launcher slurm: sbatch is not on PATH" -- env PATH="$WORK/nothing" "$FAX_RUN" "${args[@]}" \
      -o "$WORK/done" --launcher slurm
    run_expect 2 "sbatch refused the array of 2 trials: sbatch: error: .*[Ii]nvalid partition" -- \
      "$FAX_RUN" "${args[@]}" -o "$WORK/fresh" --launcher slurm --slurm-partition nope
    run_expect 2 "sbatch refused the array of 2 trials: .*--no-such-flag" -- \
      "$FAX_RUN" "${args[@]}" -o "$WORK/fresh" --launcher slurm --slurm-extra "--no-such-flag"
    run_expect 2 "sbatch refused the array of 2 trials: .*[Ii]nvalid --time" -- \
      "$FAX_RUN" "${args[@]}" -o "$WORK/fresh" --launcher slurm --slurm-time soon
    [[ $(cd "$WORK/done" && sha256sum sweep.h5 trial-*.h5) == "$before" ]] || fail "a finished sweep changed"
    [[ ! -e $WORK/fresh/slurm/tasks ]] || fail "a refused array was recorded: $(cat "$WORK/fresh/slurm/tasks")"
    ls "$WORK"/fresh/trial-* > /dev/null 2>&1 && fail "a refused array left trial files: $(ls "$WORK/fresh")"
    "$PYTHON" - "$WORK/fresh/sweep.h5" <<'PY' || fail "the refused sweep's index is not all pending"
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    assert all(s == b"pending" for s in f["trials/status"][()]), f["trials/status"][()]
PY
    # The same directory then runs.
    run_expect 0 "" -- "$FAX_RUN" "${args[@]}" -o "$WORK/fresh" --launcher slurm
    grep -q "2 done" "$WORK/stdout" || fail "the resubmitted sweep did not finish: $(cat "$WORK/stdout")"

    # A record naming trials the sweep does not have (another sweep's, or edited) is refused.
    cp -r "$WORK/done" "$WORK/tampered"
    mkdir -p "$WORK/tampered/slurm" && echo "1 0 99999 trial-0001" > "$WORK/tampered/slurm/tasks"
    run_expect 2 "tasks:1: names trial 99999 \\(trial-0001\\), which this sweep does not have" -- \
      "$FAX_RUN" "${args[@]}" -o "$WORK/tampered" --launcher slurm
    echo "1 0 1 trial-0001" > "$WORK/tampered/slurm/tasks"
    run_expect 2 "names trial 1 \\(trial-0001\\), which this sweep does not have" -- \
      "$FAX_RUN" "${args[@]}" -o "$WORK/tampered" --launcher slurm

    # A directory with % in its path (a pattern character in sbatch --output) runs.
    run_expect 0 "" -- "$FAX_RUN" "${args[@]}" -o "$WORK/100%done" --launcher slurm
    grep -q "2 done" "$WORK/stdout" || fail "a sweep in 100%done did not finish: $(cat "$WORK/stdout")"

    # A task that can never start says why in the progress lines; Ctrl-C stops the following only.
    "$FAX_RUN" "${args[@]}" -o "$WORK/huge" --launcher slurm --slurm-cpus 64 > "$WORK/huge.out" 2>&1 &
    follower=$!
    wait_for_line "$WORK/huge.out" "queue: 0 running, 2 pending \\(reason: [A-Za-z]+" 60
    kill -INT "$follower"; wait "$follower"; rc=$?
    [[ $rc -eq 130 ]] || fail "the follower stopped by SIGINT exited $rc"
    grep -q "its Slurm tasks run on (scancel [0-9]* stops them)" "$WORK/huge.out" || fail "no word of the array: $(cat "$WORK/huge.out")"
    scancel "$(grep -o "array job [0-9]*" "$WORK/huge.out" | cut -d' ' -f3)"

    # A task whose fax-run is killed (the out-of-memory killer's SIGKILL) fails with that reason.
    "$FAX_RUN" "${args[@]}" -o "$WORK/oom" --launcher slurm --set rounds=100000 > "$WORK/oom.out" 2>&1 &
    follower=$!
    for _ in $(seq 600); do (( $(pgrep -fc "fax-run run .*$WORK/oom/trial-") >= 2 )) && break; sleep 0.1; done
    sleep 1
    pkill -9 -f "fax-run run .*$WORK/oom/trial-"
    wait "$follower"; rc=$?
    [[ $rc -eq 2 ]] || fail "the sweep of killed trials exited $rc: $(tail -3 "$WORK/oom.out")"
    grep -q "trial-0001 seed=0: failed: killed by signal 9" "$WORK/oom.out" || fail "not killed by 9: $(cat "$WORK/oom.out")"

    # squeue failing (slurmctld down) for a minute ends the follower, one line, the array left queued.
    mkdir -p "$WORK/bin"
    printf '#!/bin/sh\necho "squeue: error: Unable to contact slurm controller (connect failure)" >&2\nexit 1\n' > "$WORK/bin/squeue"
    chmod +x "$WORK/bin/squeue"
    cp -r "$WORK/done" "$WORK/queued" && mkdir -p "$WORK/queued/slurm"
    echo "424242 0 0 trial-0001" > "$WORK/queued/slurm/tasks"
    SECONDS=0
    run_expect 2 "squeue has failed for 6[0-9] s \\(job 424242: squeue: error: Unable to contact slurm controller" -- \
      env PATH="$WORK/bin:$PATH" "$FAX_RUN" "${args[@]}" -o "$WORK/queued" --launcher slurm
    (( SECONDS < 120 )) || fail "gave up after $SECONDS s"
    ;;
  *)
    fail "unknown case '$1'"
    ;;
esac
echo "PASS: $1"
