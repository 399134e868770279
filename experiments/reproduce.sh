#!/usr/bin/env bash
# Runs the experiments, checks each against its expect: section (fax-run run --check), and prints
# the result tables of experiments/README.md from the run logs. Usage, from the repository root:
#
#   experiments/reproduce.sh [-o DIR] [--sweeps]
#
# DIR (default reproduce.out) receives a run log and a .log per run. --sweeps also runs the two
# sweeps of the FedOpt comparison (about 15 minutes here) and prints their tables; the non-IID
# benchmark has its own commands (README). Exit status: 0 when every run met its expect: section,
# 1 when one missed (each miss is named), 2 when a run failed. FAX_RUN overrides the fax-run used
# (default build/bin/fax-run); the TorchScript experiment needs Debian's python3 with torch.
set -uo pipefail

out=reproduce.out
sweeps=0
while (($#)); do
  case $1 in
    -o) out=$2; shift 2 ;;
    --sweeps) sweeps=1; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "reproduce.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
fax_run=$(realpath "${FAX_RUN:-$here/../build/bin/fax-run}")
[[ -x $fax_run ]] || { echo "reproduce.sh: no fax-run at $fax_run (build first, or set FAX_RUN)" >&2; exit 2; }
mkdir -p "$out" && cd "$out" || exit 2
status=0

# run NAME EXPERIMENT [--set KEY=VALUE]...: one run, checked when it is the experiment as written.
run() {
  local name=$1 experiment=$here/$2
  shift 2
  local check=()
  (($# == 0)) && grep -q '^expect:' "$experiment" && check=(--check)
  printf '%-48s ' "$name"
  local start=$SECONDS
  "$fax_run" run "$experiment" -q -o "$name.h5" "${check[@]}" "$@" > "$name.log" 2>&1
  local rc=$?
  case $rc in
    0) echo "ok ($((SECONDS - start)) s)" ;;
    1) echo "MISSED its expect: section: $(grep 'check failed' "$name.log")"; ((status < 1)) && status=1 ;;
    *) echo "FAILED: $(tail -1 "$name.log")"; status=2 ;;
  esac
}

table() { echo; "$fax_run" table "$@" || status=2; }

if [[ ! -e fmnist_mlp.pt ]]; then
  /usr/bin/python3 "$here/fmnist_torchscript.py" fmnist_mlp.pt > fmnist_mlp.pt.log 2>&1 \
    || { echo "fmnist_torchscript.py failed: $(tail -1 fmnist_mlp.pt.log)"; status=2; }
fi
for e in synthetic_fedsgd synthetic_fedavg fmnist_fedavg fmnist_cnn_fedavg fmnist_torchscript lm_fedavg; do
  run "$e" "$e.yaml"
done
run synthetic_fedavg.paper_setting synthetic_fedavg.yaml --set algorithm.local_epochs=20 --set algorithm.client_lr=0.01 \
  --set rounds=100
for e in fedavg fedadam fedprox scaffold hypergrad dp dp_poisson secure_dp byzantine fedopt_sweep fedopt_seeds; do run "fmnist_dir01_$e" "fmnist_dir01_$e.yaml"; done
for lr in 0.3 3; do run "fmnist_dir01_fedavg.server_lr=$lr" fmnist_dir01_fedavg.yaml --set "algorithm.server_lr=$lr"; done
for lr in 0.003 0.03; do run "fmnist_dir01_fedadam.server_lr=$lr" fmnist_dir01_fedadam.yaml --set "algorithm.server_lr=$lr"; done
run fmnist_dir01_hypergrad.hyper_lr=0.2 fmnist_dir01_hypergrad.yaml --set algorithm.hyper_lr=0.2
run fmnist_dir01_dp.noise_multiplier=0.5 fmnist_dir01_dp.yaml --set algorithm.noise_multiplier=0.5
run fmnist_sync_deadline fmnist_sync_deadline.yaml
run fmnist_sync_deadline.wait_for_all fmnist_sync_deadline.yaml --set cohort.deadline_s=0
run fmnist_sync_deadline.over_selection fmnist_sync_deadline.yaml --set cohort.deadline_s=0 --set cohort.over_selection=0.3
run fmnist_fedbuff fmnist_fedbuff.yaml
run fmnist_fedbuff.fedasync fmnist_fedbuff.yaml --set algorithm.name=fedasync --set cohort.size=1 \
  --set execution.logical_shards=1 --set rounds=3000 --set logging.eval_every=50 --set logging.checkpoint_every=500

echo
echo "## Experiments"
table synthetic_fedsgd.h5 synthetic_fedavg.h5 synthetic_fedavg.paper_setting.h5 fmnist_fedavg.h5 fmnist_cnn_fedavg.h5 fmnist_torchscript.h5 lm_fedavg.h5 \
  --metric eval/accuracy% --metric eval/accuracy@25% --metric eval/accuracy@50% --metric eval/accuracy@75% \
  --metric eval/accuracy@200% --metric eval/loss
echo
echo "## Algorithms on Fashion-MNIST, Dirichlet(0.1)"
table fmnist_dir01_fedavg.server_lr=0.3.h5 fmnist_dir01_fedavg.h5 fmnist_dir01_fedavg.server_lr=3.h5 fmnist_dir01_fedadam.h5 \
  fmnist_dir01_fedadam.server_lr=0.003.h5 fmnist_dir01_fedadam.server_lr=0.03.h5 fmnist_dir01_fedprox.h5 \
  fmnist_dir01_scaffold.h5 fmnist_dir01_hypergrad.h5 fmnist_dir01_hypergrad.hyper_lr=0.2.h5 \
  --metric eval/accuracy% --metric eval/accuracy@last4%
table fmnist_dir01_hypergrad.h5 fmnist_dir01_hypergrad.hyper_lr=0.2.h5 \
  --metric server/lr@1 --metric server/lr@50 --metric server/lr@150 --metric server/lr
table fmnist_dir01_dp.h5 fmnist_dir01_dp.noise_multiplier=0.5.h5 fmnist_dir01_dp_poisson.h5 fmnist_dir01_secure_dp.h5 \
  --metric eval/accuracy% --metric privacy/epsilon@1 --metric privacy/epsilon
echo
echo "## Simulated time"
table fmnist_sync_deadline.wait_for_all.h5 fmnist_sync_deadline.h5 fmnist_sync_deadline.over_selection.h5 \
  fmnist_fedbuff.h5 fmnist_fedbuff.fedasync.h5 \
  --metric eval/accuracy% --metric "round@eval/accuracy>=0.8" --metric "time/simulated_s@eval/accuracy>=0.8" \
  --metric time/simulated_s --metric time/round_simulated_s@last300 --metric clock/late@last300 --metric clock/unused@last300 \
  --metric async/staleness_mean@last300
"$fax_run" plot fmnist_sync_deadline.wait_for_all.h5 fmnist_sync_deadline.h5 fmnist_sync_deadline.over_selection.h5 \
  fmnist_fedbuff.h5 fmnist_fedbuff.fedasync.h5 \
  --x time -o fmnist_sync_time.svg --title "Synchronous and asynchronous training on the simulated clock: test accuracy" \
  > /dev/null || status=2

if ((sweeps)); then
  echo
  for s in fedopt_sweep fedopt_seeds; do
    printf '%-48s ' "fmnist_dir01_$s (sweep)"
    start=$SECONDS
    if "$fax_run" sweep "$here/fmnist_dir01_$s.yaml" -q -o "$s.sweep" > "$s.sweep.log" 2>&1; then
      echo "ok ($((SECONDS - start)) s)"
    else
      echo "FAILED: $(tail -1 "$s.sweep.log")"; status=2
    fi
  done
  echo
  echo "## FedAvg vs FedAdam vs FedYogi"
  for a in FedAvg FedAdam FedYogi; do
    where=(--where algorithm.name=fedavg)
    optimizer=${a#Fed}
    [[ $a != FedAvg ]] && where=(--where algorithm.name=fedopt --where "algorithm.server_optimizer=${optimizer,,}")
    echo
    echo "$a: last-4 accuracy (%), rows client lr, columns server lr"
    table fedopt_sweep.sweep --rows algorithm.client_lr --cols algorithm.server_lr --scale 100 "${where[@]}"
  done
  echo
  "$fax_run" inspect fedopt_seeds.sweep/sweep.h5 || status=2
  "$fax_run" plot fedopt_seeds.sweep/sweep.h5 -o fmnist_dir01_fedopt_seeds.svg || status=2
  # One trial is meant to fail: the plain mean under noise attackers diverges (every update NaN).
  echo
  printf '%-48s ' "fmnist_dir01_byzantine (sweep)"
  start=$SECONDS
  "$fax_run" sweep "$here/fmnist_dir01_byzantine.yaml" -q -o byzantine.sweep > byzantine.sweep.log 2>&1
  echo "done ($((SECONDS - start)) s); $(grep -c '^failed:' byzantine.sweep.log) failed: $(grep '^failed:' byzantine.sweep.log | cut -c1-160)"
  echo
  echo "## Byzantine clients (20% of the population), accuracy (%) after 200 rounds"
  table byzantine.sweep --rows clients.byzantine.kind --cols aggregation.stages --scale 100 --where clients.byzantine.fraction=0.2
  table byzantine.sweep --rows clients.byzantine.fraction --cols aggregation.stages --scale 100 --where clients.byzantine.kind=sign_flip
fi
exit $status
