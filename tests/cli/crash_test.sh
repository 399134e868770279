#!/usr/bin/env bash
# kill -9 at seeded random moments of a run, then `fax-run resume`: the log must be readable right
# after every kill, and the resumed run must end with the same metrics and parameters, bit for
# bit, as a run that was never interrupted. Then the same after SIGTERM and SIGINT, which must
# checkpoint before exiting.
# Environment: FAX_RUN, FAX_SOURCE_DIR, WORK, PYTHON (with h5py; with torch for the TorchScript
# model). Arguments: number of trials; optionally `torchscript`: the model is an MLP exported from
# PyTorch (experiments/fmnist_torchscript.py), trained with client momentum; or `aggregation`: an
# adaptive clip (server state) before top-k with error feedback (client state); or `poisson`:
# Poisson-sampled cohorts of any size (per-client rows of varying width); or `clock`: the simulated
# clock with a deadline and clients that come and go (the simulated time is checkpointed); or
# `fedbuff`: asynchronous training on that clock (the model versions in flight are checkpointed).
set -uo pipefail
trials=${1:-10}
fail() { echo "FAIL: $*" >&2; exit 1; }
experiment="$FAX_SOURCE_DIR/experiments/synthetic_fedavg.yaml"
settings=(--set rounds=60 --set logging.checkpoint_every=3 --set logging.eval_every=5 --set logging.per_client=true)
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
if [[ ${2:-} == torchscript ]]; then
  "$PYTHON" "$FAX_SOURCE_DIR/experiments/fmnist_torchscript.py" "$WORK/net.pt" --sizes 60,32,10 || fail "export failed"
  settings+=(--set model.name=torchscript --set model.path="$WORK/net.pt" --set algorithm.client_momentum=0.9)
elif [[ ${2:-} == poisson ]]; then
  # Cohorts of any size, some empty (2 of 100 clients on average over 4 logical shards).
  settings+=(--set seed=2 --set cohort.sampling=poisson --set cohort.size=2 --set execution.logical_shards=4)
elif [[ ${2:-} == clock ]]; then
  # The simulated clock: lognormal speeds, clients available half the time and lost when they
  # leave, a deadline; the simulated time is checkpointed with the state.
  settings+=(--set clients.speed.distribution=lognormal --set clients.speed.sigma=1 --set clients.speed.jitter=0.3
             --set clients.availability.kind=probability --set clients.availability.probability=0.5
             --set clients.availability.slot_s=2 --set clients.availability.drop_on_leave=true --set cohort.deadline_s=1.5)
elif [[ ${2:-} == fedbuff ]]; then
  # Asynchronous training: 30 clients in flight over lognormal speeds, a buffer of 4, a staleness
  # limit; the model versions clients in flight started from are checkpointed, the timeline replayed.
  settings+=(--set algorithm.name=fedbuff --set algorithm.local_epochs=20 --set cohort.size=4 --set cohort.concurrency=30
             --set cohort.max_staleness=3
             --set clients.speed.distribution=lognormal --set clients.speed.sigma=1 --set clients.speed.jitter=0.3
             --set clients.availability.kind=probability --set clients.availability.probability=0.5
             --set clients.availability.slot_s=2 --set clients.availability.drop_on_leave=true)
elif [[ ${2:-} == aggregation ]]; then
  settings+=(--set aggregation.stages=clip,top_k --set aggregation.clip.adaptive=true --set aggregation.clip.norm=0.1
             --set aggregation.clip.count_noise=1 --set aggregation.top_k.fraction=0.1 --set aggregation.top_k.error_feedback=true)
fi

started=$(date +%s.%N)
"$FAX_RUN" run "$experiment" -q -o reference.h5 "${settings[@]}" || fail "the reference run failed"
# How long a whole run takes here: the kills land anywhere in it, however fast the variant.
reference_s=$(echo "$(date +%s.%N) - $started" | bc -l)

compare() {
  "$PYTHON" - reference.h5 "$1" <<'PY'
import sys, h5py
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
names = []
a["metrics"].visit(lambda n: names.append(n) if isinstance(a["metrics"][n], h5py.Dataset) else None)
for n in names:
    if n != "time/round_s":
        assert a["metrics"][n][()].tobytes() == b["metrics"][n][()].tobytes(), f"metric {n} differs"
for n in ("clients/id", "clients/train_loss"):
    assert a[n][()].tobytes() == b[n][()].tobytes(), f"{n} differs"
params = a["checkpoints/60/params"]
assert len(params) > 0
for leaf in params:
    assert params[leaf][()].tobytes() == b["checkpoints/60/params"][leaf][()].tobytes(), leaf
PY
}

RANDOM=20261202
for trial in $(seq 1 "$trials"); do
  log="run$trial.h5"
  # Anywhere from the start to near the end of a run as long as the reference run.
  delay=$(printf '0.%02d' $((RANDOM % 100)))
  delay=$(echo "$delay * $reference_s * 0.9 + 0.05" | bc -l)
  "$FAX_RUN" run "$experiment" -q -o "$log" "${settings[@]}" &
  pid=$!
  sleep "$delay"
  # Only if it is still this script's child: a run that already ended has given its pid back, and
  # another test's process may have it by now (pids wrap at 32768).
  [[ $(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ') == "$$" ]] && kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [[ -e $log ]]; then
    "$PYTHON" -c "import h5py, sys; f = h5py.File(sys.argv[1]); f['metrics/round'][()]; f['config'][()]" "$log" \
      || fail "trial $trial: the log is not readable after kill -9 at ${delay}s"
    rounds=$("$PYTHON" -c "import h5py, sys; print(len(h5py.File(sys.argv[1])['metrics/round']))" "$log")
    "$FAX_RUN" resume "$log" -q || fail "trial $trial: resume failed"
  else
    # Killed before the log existed: nothing to resume, run again.
    rounds=none
    "$FAX_RUN" run "$experiment" -q -o "$log" "${settings[@]}" || fail "trial $trial: rerun failed"
  fi
  compare "$log" || fail "trial $trial (killed at ${delay}s, $rounds rounds logged): differs from the uninterrupted run"
  echo "trial $trial: killed at ${delay}s with $rounds rounds logged; resumed run identical"
done

# SIGTERM and SIGINT: the run checkpoints the round in flight, names it, exits 128 + signal.
for sig in TERM INT; do
  log="signal_$sig.h5"
  "$FAX_RUN" run "$experiment" -o "$log" "${settings[@]}" --set logging.checkpoint_every=0 \
    --set logging.progress_every=1 > "$sig.out" 2> "$sig.err" &
  pid=$!
  # Signal once the first round's progress line is out: the handlers are in place by then, however
  # loaded the machine. (A variant's whole run may take under a second: poll often, cheaply.)
  for _ in $(seq 1 1500); do
    grep -q "^round [0-9]*/60" "$sig.out" 2>/dev/null && break
    sleep 0.02
  done
  kill -s "$sig" "$pid"
  wait "$pid"
  status=$?
  want=$((128 + $(kill -l "$sig")))
  [[ $status -eq $want ]] || fail "SIG$sig: exit status $status, expected $want: $(cat "$sig.err")"
  grep -Eq "^fax-run: stopped by signal [0-9]+ after round [0-9]+ of 60; the state is checkpointed: continue with 'fax-run resume $log'$" "$sig.err" \
    || fail "SIG$sig: unexpected message: $(cat "$sig.err")"
  "$FAX_RUN" resume "$log" -q || fail "SIG$sig: resume failed"
  compare "$log" || fail "SIG$sig: the resumed run differs from the uninterrupted run"
  echo "SIG$sig: $(cat "$sig.err"); resumed run identical"
done
echo "ok: $trials kill -9 trials, SIGTERM and SIGINT"
