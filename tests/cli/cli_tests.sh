#!/usr/bin/env bash
# End-to-end checks of fax-run, one case per ctest test: cli_tests.sh <case>.
# Environment: FAX_RUN (the binary), FAX_SOURCE_DIR, WORK (a scratch directory), BAD_PLUGIN_DIR,
# PYTHON (with h5py).
set -uo pipefail

source "$(dirname "$0")/common.sh"

# same_on_executors_and_workers NAME ROUNDS SETTINGS...: the experiment on 1 and 2 executors
# ($WORK/NAME1.h5, NAME2.h5) and on 2 worker processes ($WORK/remote.h5), all the same bits.
same_on_executors_and_workers() {
  local name=$1 rounds=$2
  shift 2
  echo "fax-test-token" > "$WORK/token"
  for e in 1 2; do
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/$name$e.h5" "$@" --set execution.executors=$e
  done
  "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/${name}1.h5" "$WORK/${name}2.h5" "$rounds" \
    || fail "1 and 2 executors differ"
  port=$(free_port)
  workers=()
  for i in 0 1; do start_worker "w$i.log" -q; done
  run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/remote.h5" "$@" --workers 2 \
    --listen "127.0.0.1:$port" --token-file "$WORK/token" "${collectives[@]}"
  for pid in "${workers[@]}"; do wait "$pid" || fail "a worker exited $? after the run"; done
  "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/${name}1.h5" "$WORK/remote.h5" "$rounds" \
    || fail "local and remote differ"
}

case "$1" in
  run_h5py)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -o "$WORK/run.h5" --set rounds=20 --set logging.per_client=true \
      --set logging.checkpoint_every=10 --set logging.eval_every=5
    grep -q "round 20/20" "$WORK/stdout" || fail "no final progress line: $(cat "$WORK/stdout")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/check_run_log.py" "$WORK/run.h5" 20 10 10,20 || fail "h5py check"
    run_expect 0 "" -- "$FAX_RUN" inspect "$WORK/run.h5" --last 2
    grep -q "eval/accuracy" "$WORK/stdout" && grep -q "algorithm fedavg" "$WORK/stdout" || fail "inspect: $(cat "$WORK/stdout")"
    ;;
  fedsgd)
    run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/synthetic_fedsgd.yaml" -o "$WORK/fedsgd.h5" -q \
      --set rounds=30
    "$PYTHON" - "$WORK/fedsgd.h5" <<'PY' || fail "fedsgd did not learn"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    loss = f["metrics/train/loss"][()]
    acc = f["metrics/eval/accuracy"][()]
    assert loss[-5:].mean() < loss[:5].mean(), (loss[:5], loss[-5:])
    assert np.nanmax(acc) > 0.2, acc
PY
    ;;
  executors_bitwise)
    # Same experiment on 1 and 2 executors at 2 logical shards: identical metrics and parameters.
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/e$e.h5" --set rounds=15 --set execution.executors=$e \
        --set execution.logical_shards=2 --set logging.eval_every=5
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/e1.h5" "$WORK/e2.h5" 15 || fail "1 and 2 executors differ"
    "$PYTHON" -c 'import sys, h5py; assert [h5py.File(f)["env"].attrs["executors"] for f in sys.argv[1:]] == ["1", "2"]' \
      "$WORK/e1.h5" "$WORK/e2.h5" || fail "executors not recorded"
    ;;
  auto_threads)
    # execution.threads 0 becomes max(1, hardware threads / logical_shards) when the experiment is
    # loaded, and the run log records the number: the same bits as that number written out, on a
    # local executor and on a worker process (sent the number, not the 0).
    threads=$(getconf _NPROCESSORS_ONLN)
    common=(--set rounds=6 --set execution.logical_shards=1 --set cohort.size=4 --set logging.eval_every=3)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/auto.h5" "${common[@]}" --set execution.threads=0
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/fixed.h5" "${common[@]}" --set execution.threads="$threads"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/auto.h5" "$WORK/fixed.h5" 6 || fail "threads 0 and $threads differ"
    echo "fax-test-token" > "$WORK/token"
    port=$(free_port)
    workers=()
    start_worker "w0.log" -q
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/remote.h5" "${common[@]}" --set execution.threads=0 \
      --workers 1 --listen "127.0.0.1:$port" --token-file "$WORK/token"
    for pid in "${workers[@]}"; do wait "$pid" || fail "the worker exited $? after the run"; done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/auto.h5" "$WORK/remote.h5" 6 || fail "local and remote differ"
    "$PYTHON" - "$WORK/auto.h5" "$threads" <<'PY' || fail "the resolved threads are not recorded"
import sys, h5py
f = h5py.File(sys.argv[1])
assert f["env"].attrs["threads_per_executor"] == sys.argv[2], f["env"].attrs["threads_per_executor"]
assert f"\n  threads: {sys.argv[2]}\n" in f["config"][()].decode(), f["config"][()].decode()
PY
    ;;
  poisson)
    # Poisson sampling, 2 of 100 clients a round on average over 4 logical shards: rounds of 0 to
    # 5 clients, shards left empty. 1 and 2 executors and 2 worker processes give the same bits; an
    # empty round keeps the parameters; per-client rows are padded to the widest cohort.
    common=(--set rounds=30 --set seed=2 --set cohort.size=2 --set cohort.sampling=poisson --set execution.logical_shards=4
            --set logging.eval_every=10 --set logging.checkpoint_every=1 --set logging.keep_checkpoints=0
            --set logging.per_client=true)
    same_on_executors_and_workers p 30 "${common[@]}"
    "$PYTHON" - "$WORK/p1.h5" <<'PY' || fail "the Poisson run's log"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
sizes = f["metrics/cohort/size"][()]
assert len(sizes) == 30 and (sizes == 0).any() and (sizes >= 4).any(), sizes
ids = f["clients/id"][()]
assert ids.shape == (30, sizes.max()), ids.shape
assert ((ids >= 0).sum(1) == sizes).all(), "padding"
assert np.isnan(f["clients/train_loss"][()][ids < 0]).all()
assert "poisson" in f["env"].attrs["cohort_sampling"]
for r in np.flatnonzero(sizes == 0):
    if r == 0:
        continue
    a, b = f[f"checkpoints/{r}/params"], f[f"checkpoints/{r + 1}/params"]
    assert all(a[n][()].tobytes() == b[n][()].tobytes() for n in a), f"round {r + 1} had no clients but moved"
PY
    # With DP noise an empty round still releases (and spends) its noise: the parameters move and
    # epsilon grows every round, at the Poisson rate 2 / 100.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/dp.h5" "${common[@]}" \
      --set aggregation.stages=clip,gaussian --set aggregation.clip.norm=0.1 --set aggregation.gaussian.noise_multiplier=1
    run_expect 0 "" -- "$FAX_RUN" privacy --sampling-rate 0.02 --rounds 30 -z 1 --accountant rdp
    "$PYTHON" - "$WORK/dp.h5" "$WORK/stdout" <<'PY' || fail "the private Poisson run's log"
import re, sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
sizes, eps = f["metrics/cohort/size"][()], f["metrics/privacy/epsilon"][()]
assert (sizes == 0).any() and np.all(np.diff(eps) > 0), (sizes, eps)
quoted = float(re.search(r"rdp\D*([0-9.]+)", open(sys.argv[2]).read()).group(1))
assert abs(eps[-1] - quoted) <= 1e-3 * quoted, (eps[-1], quoted)
assert np.isnan(f["metrics/aggregation/clipped_fraction"][()][sizes == 0]).all(), "a statistic of nobody"
for r in np.flatnonzero(sizes == 0):
    if r > 0:
        a, b = f[f"checkpoints/{r}/params"], f[f"checkpoints/{r + 1}/params"]
        assert any(a[n][()].tobytes() != b[n][()].tobytes() for n in a), f"round {r + 1}: no noise"
PY
    # dp_fedavg is that round (its plugin says it adds noise): the same parameters every round.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/dp_fedavg.h5" "${common[@]}" \
      --set algorithm.name=dp_fedavg --set algorithm.clip_norm=0.1 --set algorithm.noise_multiplier=1
    # Without noise (a gaussian stage at z = 0) a round without clients keeps the state, server
    # momentum included.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/z0.h5" "${common[@]}" --set algorithm.server_momentum=0.9 \
      --set aggregation.stages=clip,gaussian --set aggregation.clip.norm=0.1 --set aggregation.gaussian.noise_multiplier=0
    "$PYTHON" - "$WORK" <<'PY' || fail "dp_fedavg or the noiseless pipeline under Poisson sampling"
import sys, h5py, numpy as np
work = sys.argv[1]
a, b, z = h5py.File(f"{work}/dp.h5"), h5py.File(f"{work}/dp_fedavg.h5"), h5py.File(f"{work}/z0.h5")
for r in range(1, 31):
    pa, pb = a[f"checkpoints/{r}/params"], b[f"checkpoints/{r}/params"]
    assert all(pa[n][()].tobytes() == pb[n][()].tobytes() for n in pa), f"round {r}: dp_fedavg differs"
sizes = z["metrics/cohort/size"][()]
for r in np.flatnonzero(sizes == 0):
    if r > 0:
        p, q = z[f"checkpoints/{r}/params"], z[f"checkpoints/{r + 1}/params"]
        assert all(p[n][()].tobytes() == q[n][()].tobytes() for n in p), f"z = 0: round {r + 1} had no clients but moved"
PY
    ;;
  fedbuff)
    # Asynchronous training on the clock (FedBuff): 20 clients in flight, a buffer of 4, stale
    # updates dropped after 3 steps, clients lost when they leave. 1 and 2 executors and 2 worker
    # processes: the same bits, simulated times, staleness and checkpointed versions included.
    common=(--set rounds=20 --set logging.per_client=true --set logging.checkpoint_every=5
            --set algorithm.name=fedbuff --set algorithm.local_epochs=5 --set cohort.size=4 --set cohort.concurrency=20
            --set cohort.max_staleness=3 --set clients.speed.distribution=lognormal --set clients.speed.sigma=1
            --set clients.speed.jitter=0.3 --set clients.availability.kind=probability
            --set clients.availability.probability=0.5 --set clients.availability.slot_s=5
            --set clients.availability.drop_on_leave=true)
    same_on_executors_and_workers fb 20 "${common[@]}"
    "$PYTHON" - "$WORK/fb1.h5" <<'PY' || fail "the asynchronous run's log"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
m = f["metrics"]
now, took = m["time/simulated_s"][()], m["time/round_simulated_s"][()]
assert np.allclose(np.cumsum(took), now, rtol=0, atol=1e-5) and np.all(took >= 0), (now, took)
ids, tau, seconds = f["clients/id"][()], f["clients/staleness"][()], f["clients/simulated_s"][()]
assert ids.shape == (20, 4) and all(len(set(r)) == 4 for r in ids), ids
assert np.array_equal(tau.mean(1), m["async/staleness_mean"][()]) and np.array_equal(tau.max(1), m["async/staleness_max"][()])
assert tau.max() == 3 and tau.min() == 0, tau
assert m["async/stale_dropped"][()].sum() > 0 and m["clock/lost"][()].sum() > 0
assert np.all(seconds > 0) and np.all(np.diff(m["async/dispatched"][()]) >= 4)
assert np.all(m["async/concurrency"][()] <= 20) and np.all(m["async/concurrency"][()] > 0)
# A checkpoint keeps the older versions clients in flight started from, at most 3 steps back
# (older ones could only give dropped updates, but a client still in flight keeps its version).
for r in (10, 15, 20):
    kept = sorted(int(k[1:]) for k in f[f"checkpoints/{r}/async"]) if "async" in f[f"checkpoints/{r}"] else []
    assert all(v < r for v in kept) and len(kept) == m["async/versions_kept"][r - 1] - 1, (r, kept)
assert "asynchronous: 20 in flight, max staleness 3" in f["env"].attrs["clock"]
PY
    # FedAsync runs on the same timeline.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -o "$WORK/fa.h5" "${common[@]}" --set algorithm.name=fedasync \
      --set rounds=5 --set cohort.max_staleness=-1
    grep -q "async/staleness_mean" "$WORK/stdout" || fail "no staleness in the progress: $(cat "$WORK/stdout")"
    # Refusals, one line each.
    clock=(--set clients.speed.distribution=constant)
    run_expect 2 "algorithm fedbuff trains asynchronously, on the simulated clock" -- "$FAX_RUN" run "$experiment" \
      -o "$WORK/x.h5" --set algorithm.name=fedbuff
    run_expect 2 "algorithm fedbuff trains asynchronously: set cohort.concurrency" -- "$FAX_RUN" run "$experiment" \
      -o "$WORK/x.h5" --set algorithm.name=fedbuff "${clock[@]}"
    run_expect 2 "cohort.concurrency is for asynchronous algorithms \(fedbuff, fedasync\); fedavg runs synchronous" -- \
      "$FAX_RUN" run "$experiment" -o "$WORK/x.h5" "${clock[@]}" --set cohort.concurrency=5
    run_expect 2 "cohort.concurrency \(101\) is larger than the population" -- "$FAX_RUN" run "$experiment" \
      -o "$WORK/x.h5" --set algorithm.name=fedbuff "${clock[@]}" --set cohort.concurrency=101
    run_expect 2 "cohort.deadline_s applies to synchronous rounds" -- "$FAX_RUN" run "$experiment" -o "$WORK/x.h5" \
      --set algorithm.name=fedbuff "${clock[@]}" --set cohort.concurrency=5 --set cohort.deadline_s=2
    run_expect 2 "cohort.max_staleness applies to asynchronous training" -- "$FAX_RUN" run "$experiment" \
      -o "$WORK/x.h5" "${clock[@]}" --set cohort.max_staleness=2
    run_expect 2 "cohort.sampling poisson draws whole rounds" -- "$FAX_RUN" run "$experiment" -o "$WORK/x.h5" \
      --set algorithm.name=fedbuff "${clock[@]}" --set cohort.concurrency=5 --set cohort.sampling=poisson
    [[ ! -e $WORK/x.h5 ]] || fail "a refused run wrote a log"
    ;;
  clock)
    # The simulated clock: lognormal speeds with per-round jitter, clients available half the time
    # in 2 s slots and lost when they leave, a deadline. 1 and 2 executors and 2 worker processes:
    # the same bits, simulated times included.
    common=(--set rounds=20 --set logging.per_client=true --set logging.checkpoint_every=5
            --set clients.speed.distribution=lognormal --set clients.speed.sigma=1 --set clients.speed.jitter=0.3
            --set clients.availability.kind=probability --set clients.availability.probability=0.5
            --set clients.availability.slot_s=2 --set clients.availability.drop_on_leave=true --set cohort.deadline_s=1.5)
    same_on_executors_and_workers c 20 "${common[@]}"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -o "$WORK/shown.h5" "${common[@]}" --set rounds=10
    grep -q "clock: speed lognormal" "$WORK/stdout" || fail "no clock line: $(cat "$WORK/stdout")"
    grep -q "time/simulated_s" "$WORK/stdout" || fail "no simulated time in the progress: $(cat "$WORK/stdout")"
    "$PYTHON" - "$WORK/c1.h5" <<'PY' || fail "the clock's log"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
m = f["metrics"]
now, took = m["time/simulated_s"][()], m["time/round_simulated_s"][()]
assert np.allclose(np.cumsum(took), now, rtol=0, atol=1e-5) and np.all(took > 0), (now, took)
selected, late, lost = m["clock/selected"][()], m["clock/late"][()], m["clock/lost"][()]
ids, seconds = f["clients/id"][()], f["clients/simulated_s"][()]
kept = (ids >= 0).sum(1)
assert np.array_equal(kept, selected - late - lost - m["clock/unused"][()]), (kept, selected, late, lost)
assert late.sum() > 0 and lost.sum() > 0 and np.all(selected == 10), (selected, late, lost)
assert np.all(seconds[ids >= 0] <= 1.5) and np.all(seconds[ids >= 0] > 0)
# A round that dropped someone ends at the deadline; one that kept everyone with its slowest.
for r in range(len(took)):
    mine = seconds[r][ids[r] >= 0]
    if late[r] > 0:
        assert abs(took[r] - 1.5) < 1e-6, (r, took[r])
    elif lost[r] == 0:
        assert abs(took[r] - (max(mine) if selected[r] > 0 else 60)) < 1e-6, (r, took[r], mine)
assert "deadline 1.5 s" in f["env"].attrs["clock"]
PY
    # Plotted against the simulated time; a run without a clock has none.
    run_expect 0 "" -- "$FAX_RUN" plot "$WORK/c1.h5" --x time --metric train/loss -o "$WORK/time.svg"
    "$PYTHON" - "$WORK/time.svg" <<'PY' || fail "the chart against simulated time"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
axes = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if (t.get("class") or "").startswith("axis-label")]
assert axes == ["simulated time (s)", "train/loss"], axes
lines = root.findall(".//{http://www.w3.org/2000/svg}polyline")
assert len(lines) == 1 and len(lines[0].get("points").split()) == 20
PY
    # The simulated time at which a metric first reaches a value, as a table column.
    run_expect 0 "" -- "$FAX_RUN" table "$WORK/c1.h5" --metric "time/simulated_s@eval/accuracy>=0.1" \
      --metric "round@train/loss<=0.5"
    "$PYTHON" - "$WORK/c1.h5" "$WORK/stdout" <<'PY' || fail "time to accuracy: $(cat "$WORK/stdout")"
import sys, h5py, numpy as np
m = h5py.File(sys.argv[1])["metrics"]
acc, now, loss = m["eval/accuracy"][()], m["time/simulated_s"][()], m["train/loss"][()]
first = np.flatnonzero(acc >= 0.1)[0]
reached = np.flatnonzero(loss <= 0.5)
cells = [c.strip() for c in open(sys.argv[2]).read().splitlines()[2].strip("|").split("|")]
assert cells[2] == f"{now[first]:.4g}", (cells, now[first])
assert cells[3] == (f"{reached[0] + 1}" if len(reached) else "-"), cells
PY
    run_expect 2 "table column 'round@eval/accuracy>=x'" -- "$FAX_RUN" table "$WORK/c1.h5" --metric "round@eval/accuracy>=x"
    run_expect 0 "" -- "$FAX_RUN" table "$WORK/c1.h5" --metric "time/simulated_s@round>=10"
    "$PYTHON" - "$WORK/c1.h5" "$WORK/stdout" <<'PY' || fail "time at round 10: $(cat "$WORK/stdout")"
import sys, h5py
now = h5py.File(sys.argv[1])["metrics/time/simulated_s"][()]
cells = [c.strip() for c in open(sys.argv[2]).read().splitlines()[2].strip("|").split("|")]
assert cells[2] == f"{now[9]:.4g}", (cells, now[9])
PY
    # A clock that drops nobody trains the cohorts of a run without one: the same parameters.
    # With constant speeds and top-k, a client's simulated seconds are latency + download + local
    # examples x s_per_example + the bits it sent / upload rate (fmnist iid: 100 examples, B = 20).
    fm=(--set rounds=3 --set data.partition=iid --set algorithm.batch_size=20 --set logging.per_client=true
        --set logging.eval_every=0 --set aggregation.stages=top_k --set aggregation.top_k.fraction=0.01)
    run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_fedavg.yaml" -q -o "$WORK/plain.h5" "${fm[@]}"
    run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_fedavg.yaml" -q -o "$WORK/timed.h5" "${fm[@]}" \
      --set clients.speed.distribution=constant --set clients.speed.s_per_example=0.01
    "$PYTHON" - "$WORK/plain.h5" "$WORK/timed.h5" <<'PY' || fail "the constant clock"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
for n in a["checkpoints/3/params"]:
    assert a["checkpoints/3/params"][n][()].tobytes() == b["checkpoints/3/params"][n][()].tobytes(), n
params = sum(b["checkpoints/3/params"][n].size for n in b["checkpoints/3/params"])
sent = b["clients/bits_sent"][()]
assert np.all(sent == np.ceil(0.01 * params) * (32 + np.ceil(np.log2(params)))), sent
expect = 0.05 + params * 32 / 2e7 + 100 * 0.01 + sent / 5e6
assert np.allclose(b["clients/simulated_s"][()], expect, rtol=0, atol=1e-6), (b["clients/simulated_s"][()], expect)
assert np.allclose(b["metrics/time/round_simulated_s"][()], expect.max(1), rtol=0, atol=1e-6)
PY
    # Device and availability traces (experiments/traces): at time 0 only rows 0, 2 and 3 of the
    # diurnal trace are available; a client's seconds follow its device row. A changed trace is
    # another run: its resume is refused.
    cp "$FAX_SOURCE_DIR"/experiments/traces/*.csv "$WORK/"
    traced=(--set rounds=4 --set logging.per_client=true --set logging.checkpoint_every=2 --set clients.speed.distribution=trace
            --set clients.network.distribution=trace --set clients.availability.kind=trace
            --set clients.trace.device="$WORK/device.csv" --set clients.trace.availability="$WORK/availability.csv")
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/traced.h5" "${traced[@]}"
    "$PYTHON" - "$WORK/traced.h5" <<'PY' || fail "the traced run"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
ids, seconds = f["clients/id"][()], f["clients/simulated_s"][()]
assert set(ids[0] % 6) <= {0, 2, 3} and (ids[0] >= 0).all(), ids[0]
device = [(0.004, 5e7, 2e7), (0.006, 3e7, 1e7), (0.009, 2e7, 5e6), (0.012, 1.5e7, 5e6), (0.018, 1e7, 3e6),
          (0.025, 6e6, 2e6), (0.040, 3e6, 1e6), (0.080, 1.5e6, 5e5)]
assert "device trace" in f["env"].attrs["identity"] and "availability trace" in f["env"].attrs["clock"]
# Every client's seconds: latency + bits / rates + examples x its row's s_per_example, the
# examples a multiple of B = 10: the compute part, rounded to microseconds, divides by 10 x s.
bits = 32 * sum(f["checkpoints/4/params"][n].size for n in f["checkpoints/4/params"])
for c, s in zip(ids[0], seconds[0]):
    speed, down, up = device[c % 8]
    compute = s - 0.05 - bits / down - bits / up
    steps = compute / (10 * speed)
    assert compute > 0 and abs(steps - round(steps)) < 1e-3, (c, s, compute, steps)
PY
    # The coordinator alone reads the traces: workers started where the (relative) trace paths
    # lead nowhere give the same bits.
    pushd / > /dev/null || fail "pushd"
    port=$(free_port)
    workers=()
    for i in 0 1; do start_worker "tw$i.log" -q; done
    popd > /dev/null || fail "popd"
    cd "$WORK" || fail "cd"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/traced_remote.h5" "${traced[@]}" \
      --set clients.trace.device=device.csv --set clients.trace.availability=availability.csv --workers 2 \
      --listen "127.0.0.1:$port" --token-file "$WORK/token" "${collectives[@]}"
    for pid in "${workers[@]}"; do wait "$pid" || fail "a worker exited $? after the run"; done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/traced.h5" "$WORK/traced_remote.h5" 4 \
      || fail "traced: local and remote differ"
    sed -i 's/^7,0.080/7,0.090/' "$WORK/device.csv"
    run_expect 2 "traced.h5: the experiment resolves differently than when the run started" -- \
      "$FAX_RUN" resume "$WORK/traced.h5" -q
    # Settings the clock needs, without it; a trace that is not there: one line, exit 2.
    run_expect 2 "cohort.deadline_s needs the simulated clock" -- "$FAX_RUN" run "$experiment" -o "$WORK/x.h5" \
      --set cohort.deadline_s=3
    run_expect 2 "missing.csv: cannot open device trace" -- "$FAX_RUN" run "$experiment" -o "$WORK/x.h5" \
      --set clients.speed.distribution=trace --set clients.trace.device="$WORK/missing.csv"
    [[ ! -e "$WORK/x.h5" ]] || fail "a refused run wrote a log"
    run_expect 2 "plain.h5: --x time needs the metric time/simulated_s" -- "$FAX_RUN" plot "$WORK/plain.h5" --x time \
      -o "$WORK/x.svg"
    ;;
  aggregation)
    # The pipeline as a YAML list: clip, then Gaussian noise. 1 and 2 executors give the same bits,
    # the log holds the ledger and the clip's share, and the resolved config runs the same again.
    { sed '/^# Written by/,$d' "$experiment"; echo "aggregation: [{clip: {norm: 0.05}}, {gaussian: {noise_multiplier: 0.8}}]"; } \
      > "$WORK/dp.yaml"
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$WORK/dp.yaml" -q -o "$WORK/dp$e.h5" --set rounds=6 --set execution.executors=$e \
        --set logging.checkpoint_every=3
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/dp1.h5" "$WORK/dp2.h5" 6 || fail "1 and 2 executors differ"
    "$PYTHON" - "$WORK/dp1.h5" <<'PY' || fail "the pipeline's metrics"
import sys, h5py, numpy as np
m = h5py.File(sys.argv[1])["metrics"]
eps, clipped = m["privacy/epsilon"][()], m["aggregation/clipped_fraction"][()]
assert len(eps) == 6 and np.all(np.diff(eps) > 0), eps
assert np.all((clipped > 0) & (clipped <= 1)), clipped
assert np.all(m["aggregation/update_norm"][()] > 0)
PY
    "$FAX_RUN" run "$WORK/dp.yaml" --set rounds=6 --set logging.checkpoint_every=3 --dry-run > "$WORK/resolved.yaml" \
      || fail "--dry-run"
    grep -q "stages: clip,gaussian" "$WORK/resolved.yaml" || fail "resolved: $(cat "$WORK/resolved.yaml")"
    run_expect 0 "" -- "$FAX_RUN" run "$WORK/resolved.yaml" -q -o "$WORK/again.h5"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/dp1.h5" "$WORK/again.h5" 6 || fail "the resolved config differs"
    # A robust aggregator against byzantine clients sending noise: gathered updates, the same bits
    # on 1 and 2 executors; the attackers' share is logged.
    { sed '/^# Written by/,$d' "$experiment"; echo "aggregation: [{trimmed_mean: {trim: 0.3}}]"; } > "$WORK/robust.yaml"
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$WORK/robust.yaml" -q -o "$WORK/r$e.h5" --set rounds=4 --set execution.executors=$e \
        --set clients.byzantine.fraction=0.3 --set clients.byzantine.kind=random --set clients.byzantine.scale=5
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/r1.h5" "$WORK/r2.h5" 4 || fail "1 and 2 executors differ"
    "$PYTHON" -c 'import sys, h5py; s = h5py.File(sys.argv[1])["metrics/aggregation/byzantine_share"][()]; assert (s > 0).any() and (s < 1).all(), s' \
      "$WORK/r1.h5" || fail "no byzantine share logged"
    # Quantized updates through a pair-masked secure sum: what each client sent is logged per client
    # (b bits per value), with the share of its values the grid clipped; the sum's overflows per round.
    { sed '/^# Written by/,$d' "$experiment"
      echo "aggregation: [{clip: {norm: 0.5}}, {quantize: {bits: 4}}, {secure_sum: {bits: 16, range: 0.5, masks: true}}]"; } \
      > "$WORK/secure.yaml"
    run_expect 0 "" -- "$FAX_RUN" run "$WORK/secure.yaml" -q -o "$WORK/secure.h5" --set rounds=3 --set logging.per_client=true
    "$PYTHON" - "$WORK/secure.h5" <<'PY' || fail "secure_sum's metrics"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
bits, clipped = f["clients/bits_sent"][()], f["clients/secure_clipped"][()]
assert bits.shape == f["clients/id"].shape and bits.shape[0] == 3, bits.shape
assert np.all(bits == bits[0, 0]) and bits[0, 0] > 0 and bits[0, 0] % 16 == 0, bits
assert np.all(f["metrics/aggregation/bits_sent"][()] == bits[0, 0])
assert np.all((clipped >= 0) & (clipped <= 1)), clipped
assert len(f["metrics/aggregation/secure_overflows"][()]) == 3
PY
    # The PLD accountant: the same model, a smaller epsilon every round.
    run_expect 0 "" -- "$FAX_RUN" run "$WORK/dp.yaml" -q -o "$WORK/pld.h5" --set rounds=6 --set logging.checkpoint_every=3 \
      --set aggregation.gaussian.accountant=pld
    "$PYTHON" - "$WORK/dp1.h5" "$WORK/pld.h5" <<'PY' || fail "the PLD ledger"
import sys, h5py, numpy as np
rdp, pld = (h5py.File(f) for f in sys.argv[1:])
assert np.all(pld["metrics/privacy/epsilon"][()] < rdp["metrics/privacy/epsilon"][()])
assert np.all(np.diff(pld["metrics/privacy/epsilon"][()]) > 0)
for name, t in rdp["checkpoints/6/params"].items():
    assert t[()].tobytes() == pld["checkpoints/6/params"][name][()].tobytes(), name
PY
    # fax-run privacy says beforehand what the ledgers log: cohort 10 of 100 clients, z 0.8, 6 rounds.
    run_expect 0 "" -- "$FAX_RUN" privacy --cohort 10 --population 100 -z 0.8 --rounds 6
    "$PYTHON" - "$WORK/dp1.h5" "$WORK/pld.h5" "$WORK/stdout" <<'PY' || fail "fax-run privacy: $(cat "$WORK/stdout")"
import sys, h5py
rdp, pld = (h5py.File(f)["metrics/privacy/epsilon"][()][-1] for f in sys.argv[1:3])
printed = {l.split()[0]: float(l.split()[2]) for l in open(sys.argv[3]) if l.startswith("  ")}
assert abs(printed["rdp"] - rdp) < 1e-6 and abs(printed["pld"] - pld) < 1e-6, (printed, rdp, pld)
PY
    # With an adaptive clip the ledger charges the noised count too; fax-run privacy --count-noise agrees.
    run_expect 0 "" -- "$FAX_RUN" run "$WORK/dp.yaml" -q -o "$WORK/adaptive.h5" --set rounds=2 \
      --set aggregation.clip.adaptive=true --set aggregation.clip.count_noise=2
    run_expect 0 "" -- "$FAX_RUN" privacy --cohort 10 --population 100 -z 0.8 --rounds 2 --count-noise 2
    "$PYTHON" - "$WORK/adaptive.h5" "$WORK/stdout" <<'PY' || fail "fax-run privacy --count-noise: $(cat "$WORK/stdout")"
import sys, h5py
m = h5py.File(sys.argv[1])["metrics"]
printed = {l.split()[0]: float(l.split()[2]) for l in open(sys.argv[2]) if l.startswith("  ")}
assert abs(printed["rdp"] - m["privacy/epsilon"][()][-1]) < 1e-6, (printed, m["privacy/epsilon"][()])
assert m["aggregation/clip_norm"][()][1] != m["aggregation/clip_norm"][()][0]
PY
    run_expect 2 "give either --sampling-rate or --cohort and --population" -- "$FAX_RUN" privacy --rounds 6
    run_expect 2 "--cohort \(10\) must be positive and at most --population \(5\)" -- \
      "$FAX_RUN" privacy --cohort 10 --population 5 --rounds 6
    run_expect 2 "--pld-interval: Value 1e-6 not in range" -- "$FAX_RUN" privacy --sampling-rate 0.1 --rounds 6 --pld-interval 1e-6
    run_expect 2 "delta 1e-30 is below what the PLD accountant resolves after 6 rounds" -- \
      "$FAX_RUN" privacy --sampling-rate 0.1 --rounds 6 --delta 1e-30 --accountant pld
    # Refused: keys out of their range, naming where the value came from.
    run_expect 2 "--set aggregation\.secure_sum\.bits=40: aggregation\.secure_sum\.bits: 40 is out of range \(must be in \[2, 32\]\)" -- \
      "$FAX_RUN" run "$WORK/secure.yaml" -q -o "$WORK/bits.h5" --set aggregation.secure_sum.bits=40
    run_expect 2 "aggregation\.gaussian\.accountant: 'prv' is not one of: rdp, pld" -- \
      "$FAX_RUN" run "$WORK/dp.yaml" -q -o "$WORK/prv.h5" --set aggregation.gaussian.accountant=prv
    [[ -e $WORK/bits.h5 || -e $WORK/prv.h5 ]] && fail "a refused run left a log"
    # Refused: an algorithm that combines updates itself, stages that do not compose, a bad entry.
    run_expect 2 "algorithm scaffold combines its clients' updates itself, not through mean_client_update" -- \
      "$FAX_RUN" run "$WORK/dp.yaml" -q -o "$WORK/scaffold.h5" --set rounds=2 --set algorithm.name=scaffold
    { sed '/^# Written by/,$d' "$experiment"; echo "aggregation: [median, {clip: {norm: 1}}]"; } > "$WORK/order.yaml"
    run_expect 2 "order\.yaml:[0-9]+:[0-9]+: 'clip' transforms each client's update, so it comes before 'median'" -- \
      "$FAX_RUN" run "$WORK/order.yaml" -q -o "$WORK/order.h5"
    { sed '/^# Written by/,$d' "$experiment"; echo "aggregation: [{clip: 1}]"; } > "$WORK/entry.yaml"
    run_expect 2 "entry\.yaml:[0-9]+:[0-9]+: the settings of aggregation stage 'clip' are a mapping" -- \
      "$FAX_RUN" run "$WORK/entry.yaml" -q -o "$WORK/entry.h5"
    run_expect 2 "unknown key 'aggregation.clip.nrom'" -- "$FAX_RUN" run "$WORK/dp.yaml" -q -o "$WORK/typo.h5" \
      --set aggregation.clip.nrom=1
    # (The algorithm is found out in round 1, as any round-1 failure: its log holds no round.)
    [[ -e $WORK/order.h5 || -e $WORK/entry.h5 || -e $WORK/typo.h5 ]] && fail "a refused run left a log"
    # fax-run plugins lists the stages with their keys.
    run_expect 0 "" -- "$FAX_RUN" plugins
    grep -q "^gaussian  (server stage)" "$WORK/stdout" && grep -q "aggregation.krum.select" "$WORK/stdout" \
      && grep -q "^secure_sum  (sum stage)" "$WORK/stdout" && grep -q "aggregation.secure_sum.masks" "$WORK/stdout" \
      || fail "plugins does not list the stages: $(cat "$WORK/stdout")"
    ;;
  factored_bitwise)
    # An MLP whose input layer steps in factored form, in blocks of 8 steps (64 outputs, B = 4):
    # 1 and 2 executors give identical bits; plain autograd steps give the same run up to rounding.
    mlp=(--set model.name=mlp --set model.hidden=64,32 --set algorithm.batch_size=4 --set rounds=8
         --set execution.logical_shards=2 --set logging.eval_every=4 --set logging.checkpoint_every=4)
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/e$e.h5" "${mlp[@]}" --set execution.executors=$e
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/e1.h5" "$WORK/e2.h5" 8 || fail "1 and 2 executors differ"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/plain.h5" "${mlp[@]}" \
      --set execution.factor_input_layer=false
    "$PYTHON" - "$WORK/e1.h5" "$WORK/plain.h5" <<'PY' || fail "factored and plain steps disagree"
import sys, h5py, numpy as np
factored, plain = (h5py.File(f)["checkpoints/8/params/l0.w"][()] for f in sys.argv[1:])
start = h5py.File(sys.argv[1])["checkpoints/4/params/l0.w"][()]
assert factored.tobytes() != plain.tobytes(), "factor_input_layer changed nothing"
assert np.abs(factored - start).max() > 1e-3, "the model did not move"
assert np.allclose(factored, plain, rtol=1e-4, atol=1e-5), np.abs(factored - plain).max()
PY
    # The CNN, whose factored dense layer takes its input from the convolutions: the same bits on
    # 1 and 2 executors.
    cnn=(--set rounds=2 --set cohort.size=6 --set logging.eval_every=0
         --set logging.checkpoint_every=2)
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_cnn_fedavg.yaml" -q -o "$WORK/cnn$e.h5" \
        "${cnn[@]}" --set execution.executors=$e
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/cnn1.h5" "$WORK/cnn2.h5" 2 || fail "CNN: 1 and 2 executors differ"
    ;;
  remote_bitwise)
    # Local (1 executor) vs 2 and 3 worker processes at 3 logical shards: identical bits, for FedAvg
    # and for SCAFFOLD, whose per-client control variates travel to the workers and back.
    echo "fax-test-token" > "$WORK/token"
    common=(--set rounds=12 --set cohort.size=12 --set execution.logical_shards=3 --set logging.eval_every=4
            --set logging.checkpoint_every=6 --set logging.per_client=true)
    for algorithm in fedavg scaffold; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/$algorithm-local.h5" "${common[@]}" \
        --set algorithm.name=$algorithm --set execution.executors=1
      for n in 2 3; do
        port=$(free_port)
        workers=()
        for ((i = 0; i < n; i++)); do start_worker "$algorithm-$n-$i.log" -q; done
        run_expect 0 "" -- "$FAX_RUN" run "$experiment" -o "$WORK/$algorithm-$n.h5" "${common[@]}" \
          --set algorithm.name=$algorithm --workers $n --listen "127.0.0.1:$port" --token-file "$WORK/token" \
          "${collectives[@]}"
        grep -q "mesh: $n remote executors" "$WORK/stdout" || fail "not on $n workers: $(cat "$WORK/stdout")"
        grep -q "allreduces: ${FAX_COLLECTIVES:-tensorpipe}" "$WORK/stdout" || fail "collectives: $(cat "$WORK/stdout")"
        for pid in "${workers[@]}"; do wait "$pid" || fail "a worker exited $? after the run"; done
        "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/$algorithm-local.h5" "$WORK/$algorithm-$n.h5" 12 \
          || fail "$algorithm: local and $n workers differ"
      done
    done
    ;;
  remote_failures)
    # 3 workers at 3 logical shards. kill -9 of one; a new worker joins; another one hangs
    # (SIGSTOP) and is dropped after the timeout, its round re-run on the others. The run ends
    # bit-identical to a local one.
    echo "fax-test-token" > "$WORK/token"
    common=(--set rounds=150 --set execution.logical_shards=3 --set logging.eval_every=10
            --set logging.checkpoint_every=50)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/local.h5" "${common[@]}" --set execution.executors=1
    port=$(free_port)
    for i in 0 1 2; do start_worker "w$i.log"; done
    "$FAX_RUN" run "$experiment" -o "$WORK/remote.h5" "${common[@]}" --set logging.progress_every=1 --workers 3 \
      --listen "127.0.0.1:$port" --token-file "$WORK/token" --worker-timeout 2 "${collectives[@]}" \
      > "$WORK/coordinator.log" 2>&1 &
    coordinator=$!
    workers+=("$coordinator")  # killed by cleanup if a check fails
    wait_for_line "$WORK/coordinator.log" "^round 20/" 60
    kill -9 "${workers[0]}"
    wait_for_line "$WORK/coordinator.log" "dropped worker .*connection lost" 30
    start_worker "w3.log"
    wait_for_line "$WORK/coordinator.log" "ready \(3 ready\)" 30
    # A few rounds on the new worker before the next failure.
    rounds_done=$(grep -c "^round" "$WORK/coordinator.log")
    wait_for_line "$WORK/coordinator.log" "^round $((rounds_done + 3))/" 30
    kill -STOP "${workers[1]}"
    wait_for_line "$WORK/coordinator.log" "dropped worker .*silent for" 30
    wait "$coordinator" || fail "the coordinator exited $?: $(tail -5 "$WORK/coordinator.log")"
    grep -q "^round 150/150" "$WORK/coordinator.log" || fail "the run did not finish: $(tail -5 "$WORK/coordinator.log")"
    grep -Eq "running it again without worker" "$WORK/coordinator.log" || fail "no round was re-run: $(cat "$WORK/coordinator.log")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/remote.h5" 150 \
      || fail "the run that lost workers differs from the local run"
    ;;
  remote_netns)
    # Two hosts: network namespaces A and B joined by a veth pair (10.77.0.1 and 10.77.0.2). The
    # coordinator and one worker in A, one worker in B; bit-identical to a local run.
    ns_a="fax-a-$$" ns_b="fax-b-$$" veth_a="fxa$$" veth_b="fxb$$"
    if ! ip netns add "$ns_a" 2>"$WORK/netns.err"; then
      echo "SKIP: network namespaces are not permitted here (ip netns add: $(cat "$WORK/netns.err")); needs root or CAP_SYS_ADMIN"
      exit 77
    fi
    namespaces+=("$ns_a")
    ip netns add "$ns_b" && namespaces+=("$ns_b") || fail "ip netns add $ns_b"
    ip link add "$veth_a" type veth peer name "$veth_b" || fail "ip link add veth"
    ip link set "$veth_a" netns "$ns_a" && ip link set "$veth_b" netns "$ns_b" || fail "moving the veth ends"
    ip -n "$ns_a" addr add 10.77.0.1/24 dev "$veth_a" && ip -n "$ns_b" addr add 10.77.0.2/24 dev "$veth_b" || fail "addresses"
    for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
    ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up || fail "links up"
    echo "fax-test-token" > "$WORK/token"
    common=(--set rounds=10 --set execution.logical_shards=2 --set logging.eval_every=5 --set logging.checkpoint_every=5)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/local.h5" "${common[@]}" --set execution.executors=1
    # The default address is loopback: a worker on the other host cannot reach it.
    ip netns exec "$ns_a" "$FAX_RUN" run "$experiment" -q -o "$WORK/loopback.h5" "${common[@]}" --workers 1 \
      --token-file "$WORK/token" > "$WORK/loopback.log" 2>&1 &
    workers+=($!)
    run_expect 2 "cannot reach the coordinator at 10\.77\.0\.1:29500 within 2 s" -- \
      ip netns exec "$ns_b" "$FAX_RUN" worker --connect 10.77.0.1:29500 --token-file "$WORK/token" --connect-timeout 2
    kill -9 "${workers[-1]}"
    ip netns exec "$ns_a" "$FAX_RUN" run "$experiment" -o "$WORK/remote.h5" "${common[@]}" --workers 2 \
      --listen 10.77.0.1:29500 --token-file "$WORK/token" "${collectives[@]}" > "$WORK/coordinator.log" 2>&1 &
    coordinator=$!
    for ns in "$ns_a" "$ns_b"; do
      ip netns exec "$ns" "$FAX_RUN" worker --connect 10.77.0.1:29500 --token-file "$WORK/token" --name "$ns" \
        > "$WORK/$ns.log" 2>&1 &
      workers+=($!)
    done
    wait "$coordinator" || fail "the coordinator exited $?: $(cat "$WORK/coordinator.log")"
    grep -q "worker $ns_b ready" "$WORK/coordinator.log" || fail "no worker from host B: $(cat "$WORK/coordinator.log")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/remote.h5" 10 \
      || fail "two hosts and local differ"
    ;;
  remote_resume)
    # The coordinator stopped by SIGTERM (it checkpoints), resumed on new workers: bit-identical to
    # a local run that never stopped.
    echo "fax-test-token" > "$WORK/token"
    common=(--set rounds=150 --set execution.logical_shards=2 --set logging.eval_every=10 --set logging.checkpoint_every=50)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/local.h5" "${common[@]}" --set execution.executors=1
    port=$(free_port)
    for i in 0 1; do start_worker "w$i.log"; done
    "$FAX_RUN" run "$experiment" -o "$WORK/remote.h5" "${common[@]}" --set logging.progress_every=1 --workers 2 \
      --listen "127.0.0.1:$port" --token-file "$WORK/token" "${collectives[@]}" > "$WORK/coordinator.log" 2>&1 &
    coordinator=$!
    wait_for_line "$WORK/coordinator.log" "^round 30/" 60
    kill -TERM "$coordinator"
    wait "$coordinator"; rc=$?
    [[ $rc -eq 143 ]] || fail "the stopped coordinator exited $rc: $(tail -3 "$WORK/coordinator.log")"
    for pid in "${workers[@]}"; do wait "$pid" || fail "a worker exited $? when the coordinator stopped"; done
    port=$(free_port)
    for i in 2 3; do start_worker "w$i.log"; done
    run_expect 0 "" -- "$FAX_RUN" resume "$WORK/remote.h5" --workers 2 --listen "127.0.0.1:$port" --token-file "$WORK/token" \
      "${collectives[@]}"
    grep -q "resuming after round" "$WORK/stdout" || fail "not resumed: $(cat "$WORK/stdout")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/remote.h5" 150 \
      || fail "the resumed remote run differs from the local run"
    ;;
  remote_launch)
    # One command line for every rank, as torchrun --no-python or srun would start it: rank 0
    # coordinates, the others are its workers; bit-identical to a local run.
    echo "fax-test-token" > "$WORK/token"
    common=(--set rounds=10 --set execution.logical_shards=2 --set logging.eval_every=5 --set logging.checkpoint_every=5)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/local.h5" "${common[@]}" --set execution.executors=1
    launch() {  # launch <name> <env assignments of all ranks...>: each rank's environment as VAR=V,VAR=V
      local name=$1 pids=() rank=0; shift
      for vars in "$@"; do
        env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u SLURM_PROCID -u SLURM_NTASKS \
          -u SLURM_LAUNCH_NODE_IPADDR ${vars//,/ } "$FAX_RUN" launch "$experiment" -o "$WORK/$name.h5" "${common[@]}" \
          --token-file "$WORK/token" "${collectives[@]}" > "$WORK/$name-$rank.log" 2>&1 &
        pids+=($!) workers+=($!)
        rank=$((rank + 1))
      done
      for i in "${!pids[@]}"; do wait "${pids[$i]}" || fail "$name: rank $i exited $?: $(tail -3 "$WORK/$name-$i.log")"; done
      grep -q "worker rank 1 on .* ready" "$WORK/$name-0.log" || fail "$name: rank 1 did not serve rank 0: $(cat "$WORK/$name-0.log")"
      "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/$name.h5" 10 || fail "$name differs from local"
    }
    port=$(free_port)
    launch torchrun "RANK=0,WORLD_SIZE=3,MASTER_ADDR=127.0.0.1,MASTER_PORT=$port" \
      "RANK=1,WORLD_SIZE=3,MASTER_ADDR=127.0.0.1,MASTER_PORT=$port" "RANK=2,WORLD_SIZE=3,MASTER_ADDR=127.0.0.1,MASTER_PORT=$port"
    grep -q "mesh: 2 remote executors" "$WORK/torchrun-0.log" || fail "torchrun: not 2 workers: $(cat "$WORK/torchrun-0.log")"
    port=$(free_port)
    launch slurm "SLURM_PROCID=0,SLURM_NTASKS=2,SLURM_LAUNCH_NODE_IPADDR=127.0.0.1,MASTER_PORT=$port" \
      "SLURM_PROCID=1,SLURM_NTASKS=2,SLURM_LAUNCH_NODE_IPADDR=127.0.0.1,MASTER_PORT=$port"
    # The real torchrun, whose agent holds MASTER_PORT for its store: rank 0 listens on a free port
    # and says which there. Debian's torchrun (PyTorch 1.13 on Python 3.11) fails on its default
    # --redirects and --tee, hence the explicit ones.
    timeout 300 env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$PYTHON" -m torch.distributed.run \
      --redirects 2 --tee 2 --no_python --nproc_per_node 3 --master_addr 127.0.0.1 --master_port "$(free_port)" \
      "$FAX_RUN" launch "$experiment" -o "$WORK/torchrun-real.h5" "${common[@]}" --token-file "$WORK/token" \
      "${collectives[@]}" > "$WORK/torchrun-real.log" 2>&1 || fail "torchrun: $(tail -5 "$WORK/torchrun-real.log")"
    grep -q "mesh: 2 remote executors" "$WORK/torchrun-real.log" || fail "torchrun: not 2 workers: $(cat "$WORK/torchrun-real.log")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/torchrun-real.h5" 10 \
      || fail "the run under torchrun differs from local"
    # Its c10d rendezvous (what multi-node jobs use): MASTER_PORT is a free port then, not the store's.
    timeout 300 env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$PYTHON" -m torch.distributed.run \
      --redirects 2 --tee 2 --no_python --nnodes 1 --nproc_per_node 3 --rdzv_backend c10d \
      --rdzv_endpoint "127.0.0.1:$(free_port)" "$FAX_RUN" launch "$experiment" -o "$WORK/torchrun-c10d.h5" \
      "${common[@]}" --token-file "$WORK/token" "${collectives[@]}" > "$WORK/torchrun-c10d.log" 2>&1 \
      || fail "torchrun (c10d): $(tail -5 "$WORK/torchrun-c10d.log")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/local.h5" "$WORK/torchrun-c10d.h5" 10 \
      || fail "the run under torchrun's c10d rendezvous differs from local"
    run_expect 2 "fax-run launch needs a launcher's environment: RANK and WORLD_SIZE \(torchrun\)" -- \
      env -u RANK -u SLURM_PROCID "$FAX_RUN" launch "$experiment"
    run_expect 2 "MASTER_ADDR is not set" -- env -u MASTER_ADDR -u SLURM_LAUNCH_NODE_IPADDR RANK=1 WORLD_SIZE=2 \
      "$FAX_RUN" launch "$experiment"
    run_expect 2 "WORLD_SIZE='two' is not an integer >= 1" -- env RANK=0 WORLD_SIZE=two "$FAX_RUN" launch "$experiment"
    # A rank that never joins (it died, or was refused) ends rank 0 after --connect-timeout.
    run_expect 2 "not every rank joined within 2 s \\(stopped while waiting for workers \\(0 of 1 ready\\)\\)" -- \
      env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" "$FAX_RUN" launch "$experiment" \
      --token-file "$WORK/token" --connect-timeout 2 -q
    ;;
  remote_token)
    echo "fax-test-token" > "$WORK/token"
    echo "not-the-token" > "$WORK/wrong"
    run_expect 2 "remote workers need a shared token: pass --token-file FILE or set FAX_TOKEN" -- \
      "$FAX_RUN" run "$experiment" --workers 1
    port=$(free_port)
    run_expect 2 "cannot reach the coordinator at 127\.0\.0\.1:$port within 1 s: connect: Connection refused$" -- \
      "$FAX_RUN" worker --connect "127.0.0.1:$port" --token-file "$WORK/token" --connect-timeout 1
    run_expect 2 "'nonsense' is not HOST:PORT" -- "$FAX_RUN" worker --connect nonsense --token-file "$WORK/token"
    run_expect 0 "" -- "$FAX_RUN" worker --help
    grep -q -- "--connect" "$WORK/stdout" && grep -q -- "--token-file" "$WORK/stdout" || fail "worker --help"
    port=$(free_port)
    "$FAX_RUN" run "$experiment" -o "$WORK/run.h5" --set rounds=3 --workers 1 --listen "127.0.0.1:$port" \
      --token-file "$WORK/token" > "$WORK/coordinator.log" 2>&1 &
    coordinator=$!
    wait_for_line "$WORK/coordinator.log" "listening on 127.0.0.1:$port" 30
    run_expect 2 "cannot listen on 127\.0\.0\.1:$port: Address already in use" -- \
      "$FAX_RUN" run "$experiment" -o "$WORK/second.h5" --workers 1 --listen "127.0.0.1:$port" --token-file "$WORK/token"
    run_expect 2 "the coordinator at 127\.0\.0\.1:$port refused this worker: wrong token" -- \
      "$FAX_RUN" worker --connect "127.0.0.1:$port" --token-file "$WORK/wrong"
    FAX_TOKEN=fax-test-token run_expect 0 "" -- "$FAX_RUN" worker --connect "127.0.0.1:$port"
    wait "$coordinator" || fail "the coordinator exited $?: $(cat "$WORK/coordinator.log")"
    grep -q "refused a worker (.*): wrong token" "$WORK/coordinator.log" || fail "refusal not logged: $(cat "$WORK/coordinator.log")"
    # A worker whose plugin is another build (here: one byte more) would compute other bits.
    mkdir -p "$WORK/other"
    cp "$(dirname "$FAX_RUN")/../lib/fax/plugins/fax_fedavg.so" "$WORK/other/" && printf 'x' >> "$WORK/other/fax_fedavg.so"
    port=$(free_port)
    start_worker other.log --plugin-dir "$WORK/other"
    run_expect 2 "worker .* resolved the experiment differently: it has algorithm fedavg \([0-9]+ bytes, FNV-1a [0-9a-f]{16}\), data .*, the coordinator has algorithm fedavg \([0-9]+ bytes, FNV-1a [0-9a-f]{16}\)" -- \
      "$FAX_RUN" run "$experiment" -o "$WORK/other.h5" --set rounds=2 --workers 1 --listen "127.0.0.1:$port" \
      --token-file "$WORK/token"
    ;;
  dry_run)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" --dry-run --set algorithm.client_lr=0.07
    grep -q "client_lr: 0.07" "$WORK/stdout" && grep -q "server_momentum: 0.0" "$WORK/stdout" || fail "dry run: $(cat "$WORK/stdout")"
    grep -q "^# clients: 100; examples per client (min / median / max): [0-9]* / [0-9]* / [0-9]*; labels per client: " \
      "$WORK/stdout" || fail "no partition summary: $(cat "$WORK/stdout")"
    grep -q "^# clients: 100; examples per client (min / median / max): [0-9]* / [0-9]* / [0-9]*; labels per client: " \
      "$WORK/stdout" || fail "no partition summary: $(cat "$WORK/stdout")"
    [[ ! -e synthetic_fedavg.h5 ]] || fail "a dry run wrote a run log"
    ;;
  plugins)
    run_expect 0 "" -- "$FAX_RUN" plugins
    for needle in "^fedavg " "^fedsgd " "^fedopt " "^fedprox " "^scaffold " "^hypergrad_fedavg " "^dp_fedavg " \
                  "algorithm.client_lr" "algorithm.server_momentum" "algorithm.server_optimizer" "algorithm.mu " \
                  "algorithm.hyper_lr" "algorithm.noise_multiplier" "algorithm.target_quantile"; do
      grep -q "$needle" "$WORK/stdout" || fail "fax-run plugins lacks $needle"
    done
    ;;
  unknown_key)
    printf 'rounds: 3\nalgorithm:\n  name: fedavg\n  client_lrr: 0.1\n' | write bad.yaml
    run_expect 2 "bad\.yaml:4:3: unknown key 'algorithm\.client_lrr' \(did you mean 'algorithm\.client_lr'\?\)" -- \
      "$FAX_RUN" run "$WORK/bad.yaml"
    ;;
  wrong_type)
    printf 'rounds: many\n' | write bad.yaml
    run_expect 2 "bad\.yaml:1:9: rounds: expected an integer, got 'many'" -- "$FAX_RUN" run "$WORK/bad.yaml"
    ;;
  syntax_error)
    printf 'rounds: 3\ncohort:\n  size: [1, 2\n' | write bad.yaml
    run_expect 2 "bad\.yaml:[0-9]+:[0-9]+: YAML syntax error" -- "$FAX_RUN" run "$WORK/bad.yaml"
    ;;
  out_of_range)
    run_expect 2 "--set algorithm\.client_lr=-1: algorithm\.client_lr: -1 is out of range \(must be > 0\)" -- \
      "$FAX_RUN" run "$experiment" --set algorithm.client_lr=-1
    ;;
  unknown_data_set)
    printf 'data:\n  name: mnist\n' | write bad.yaml
    run_expect 2 "bad\.yaml:2:9: unknown data set 'mnist' \(built in: synthetic, fmnist, cifar10, cifar100, leaf, tff_hdf5, text, synthetic_tokens; nor is there a data set plugin fax_mnist\.so in " -- "$FAX_RUN" run "$WORK/bad.yaml"
    run_expect 2 "^fax-run: --set data\.name=mnist: unknown data set 'mnist'" -- \
      "$FAX_RUN" run "$experiment" --set data.name=mnist --dry-run
    ;;
  stale_keys)
    # Keys of one algorithm are unknown to another; no misleading suggestion from another section.
    run_expect 2 "synthetic_fedavg\.yaml:[0-9]+:3: unknown key 'algorithm\.client_lr'$" -- \
      "$FAX_RUN" run "$experiment" --set algorithm.name=fedsgd
    ;;
  missing_plugin)
    run_expect 2 "algorithm plugin 'nope' not found: no fax_nope\.so in .*available: .*fedavg" -- \
      "$FAX_RUN" run "$experiment" --set algorithm.name=nope
    ;;
  model_plugin)
    # The template model plugin trains through fax-run, with the same bits on 1 and 2 executors;
    # its keys are checked and listed; plugins of the wrong kind and unknown models are refused.
    model=(--set model.name=example_model --set model.hidden=16 --set rounds=4 --set execution.logical_shards=2)
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/e$e.h5" "${model[@]}" --set execution.executors=$e
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/e1.h5" "$WORK/e2.h5" 4 || fail "1 and 2 executors differ"
    "$PYTHON" - "$WORK/e1.h5" <<'PY' || fail "the run log does not name the model plugin"
import sys, h5py
env = h5py.File(sys.argv[1])["env"].attrs
assert env["model"].startswith("example_model("), env["model"]
assert env["model_plugin"].endswith("fax_example_model.so"), env["model_plugin"]
assert "from plugin (" in env["identity"], env["identity"]
PY
    run_expect 0 "" -- "$FAX_RUN" plugins
    grep -q "^example_model  (model;" "$WORK/stdout" && grep -q "model.hidden " "$WORK/stdout" || fail "not listed"
    run_expect 2 "unknown key 'model\.hiden' \(did you mean 'model\.hidden'\?\)" -- \
      "$FAX_RUN" run "$experiment" --set model.name=example_model --set model.hiden=3
    run_expect 2 "fax_fedavg\.so holds an algorithm, not a model: name it in algorithm\.name" -- \
      "$FAX_RUN" run "$experiment" --set model.name=fedavg
    run_expect 2 "fax_example_model\.so holds a model, not an algorithm: name it in model\.name" -- \
      "$FAX_RUN" run "$experiment" --set algorithm.name=example_model
    run_expect 2 "unknown model 'nope' \(built in: softmax_regression, mlp, cnn, lenet, resnet18_gn, transformer, torchscript; nor is there a model plugin fax_nope\.so in " -- \
      "$FAX_RUN" run "$experiment" --set model.name=nope
    ;;
  dataset_plugin)
    # The template data set plugin (CSV rows) trains through fax-run with the same bits on 1 and 2
    # executors; it is listed with its keys and logged; a bad row, plugins of the wrong kind and an
    # unknown data set exit 2 with one line.
    cd "$WORK" || fail "no work folder"
    "$PYTHON" - <<'PY' || fail "fixture"
import random
random.seed(1)
with open("rows.csv", "w") as f:
    f.write("# client,label,features\n")
    for i in range(120):
        client, label = f"site{i % 6}", random.randrange(3)
        f.write(",".join([client, str(label)] + [f"{label + random.gauss(0, 0.5):.4f}" for _ in range(5)]) + "\n")
PY
    write csv.yaml <<'YAML'
rounds: 4
cohort: {size: 3}
data: {name: example_dataset, path: rows.csv}
model: {name: softmax_regression}
algorithm: {name: fedavg, client_lr: 0.1, batch_size: 5, local_epochs: 3}
execution: {logical_shards: 2}
logging: {eval_every: 2}
YAML
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run csv.yaml -q -o "e$e.h5" --set execution.executors=$e
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" e1.h5 e2.h5 4 || fail "1 and 2 executors differ"
    "$PYTHON" - e1.h5 <<'PY' || fail "the run log does not name the data set plugin"
import sys, h5py
f = h5py.File(sys.argv[1])
env = f["env"].attrs
assert env["data"] == "example_dataset(rows.csv): 6 clients, 5 features, 3 classes", env["data"]
assert env["data_plugin"].endswith("fax_example_dataset.so"), env["data_plugin"]
assert env["identity"].count("from plugin (") == 1, env["identity"]
assert f["metrics/eval/accuracy"][-1] > 0.6, f["metrics/eval/accuracy"][()]
PY
    run_expect 0 "" -- "$FAX_RUN" plugins
    grep -q "^example_dataset  (dataset;" "$WORK/stdout" && grep -q "  data.test_fraction " "$WORK/stdout" || fail "not listed"
    echo "site1,2,0.5,x,1,1,1" >> rows.csv
    run_expect 2 "dataset plugin 'example_dataset' \(.*fax_example_dataset\.so\): rows\.csv:122: 'x' is not a finite number" -- \
      "$FAX_RUN" run csv.yaml -o bad.h5
    [[ ! -e bad.h5 ]] || fail "a refused run wrote a log"
    run_expect 2 "fax_fedavg\.so holds an algorithm, not a dataset: name it in algorithm\.name" -- \
      "$FAX_RUN" run csv.yaml --set data.name=fedavg
    run_expect 2 "fax_example_dataset\.so holds a dataset, not an algorithm: name it in data\.name" -- \
      "$FAX_RUN" run csv.yaml --set algorithm.name=example_dataset
    ;;
  torchscript)
    # A PyTorch MLP exported to TorchScript trains through fax-run with the same bits on 1 and 2
    # executors and on 2 remote workers; a worker whose .pt file differs is refused; a file that is
    # not a module, a module of the wrong width and a missing file exit 2 with one line.
    cd "$WORK" || fail "no work folder"
    "$PYTHON" "$FAX_SOURCE_DIR/experiments/fmnist_torchscript.py" net.pt --sizes 60,32,10 || fail "export failed"
    ts=(--set model.name=torchscript --set model.path=net.pt --set rounds=4 --set execution.logical_shards=2
        --set algorithm.client_momentum=0.5)
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/e$e.h5" "${ts[@]}" --set execution.executors=$e
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/e1.h5" "$WORK/e2.h5" 4 || fail "1 and 2 executors differ"
    echo "fax-test-token" > "$WORK/token"
    port=$(free_port)
    for i in 0 1; do start_worker "w$i.log" -q; done
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/remote.h5" "${ts[@]}" --workers 2 \
      --listen "127.0.0.1:$port" --token-file "$WORK/token" "${collectives[@]}"
    for pid in "${workers[@]}"; do wait "$pid" || fail "a worker exited $? after the run"; done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/e1.h5" "$WORK/remote.h5" 4 || fail "local and remote differ"
    # The worker resolves model.path in its own folder, where net.pt is another export.
    mkdir -p "$WORK/other" && cd "$WORK/other" || fail "no folder"
    "$PYTHON" "$FAX_SOURCE_DIR/experiments/fmnist_torchscript.py" net.pt --sizes 60,32,10 --seed 1 || fail "export failed"
    port=$(free_port)
    start_worker other.log
    cd "$WORK" || fail "no work folder"
    run_expect 2 "worker .* resolved the experiment differently: it has .*model torchscript\(net\.pt \([0-9]+ bytes, FNV-1a [0-9a-f]{16}\)" -- \
      "$FAX_RUN" run "$experiment" -o "$WORK/other.h5" "${ts[@]}" --workers 1 --listen "127.0.0.1:$port" \
      --token-file "$WORK/token"
    echo "not a module" > text.pt
    run_expect 2 "model\.path: text\.pt is not a TorchScript module" -- "$FAX_RUN" run "$experiment" -o x.h5 "${ts[@]}" \
      --set model.path=text.pt
    "$PYTHON" "$FAX_SOURCE_DIR/experiments/fmnist_torchscript.py" narrow.pt --sizes 60,32,7 || fail "export failed"
    run_expect 2 "model\.path: narrow\.pt: forward\(\) maps inputs \[2, 60\] to \[2, 7\], but the data set needs \[2, 10\]" -- \
      "$FAX_RUN" run "$experiment" -o x.h5 "${ts[@]}" --set model.path=narrow.pt
    run_expect 2 "model\.path: gone\.pt: No such file or directory" -- "$FAX_RUN" run "$experiment" -o x.h5 "${ts[@]}" \
      --set model.path=gone.pt
    [[ ! -e x.h5 ]] || fail "a refused run wrote a log"
    ;;
  cifar)
    # A generated CIFAR-10-like set (binary version, written with the Python standard library)
    # trains end to end with the zoo's LeNet and ResNet-18-GN; a truncated batch exits 2 with one line.
    mkdir -p "$WORK/cifar" && cd "$WORK" || fail "no folder"
    "$PYTHON" - "$WORK/cifar" <<'PY' || fail "fixture"
import os, random, sys
random.seed(0)
def write(name, n):
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        for r in range(n):
            label = r % 10
            f.write(bytes([label]) + bytes(random.randrange(256) // 4 + 20 * label for _ in range(3072)))
for b in range(1, 6):
    write(f"data_batch_{b}.bin", 40)
write("test_batch.bin", 20)
PY
    cifar=(--set data.name=cifar10 --set data.path="$WORK/cifar" --set data.clients=10 --set data.partition=label_quantity
           --set data.labels_per_client=2 --set cohort.size=4 --set rounds=2 --set logging.eval_every=1)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/lenet.h5" "${cifar[@]}" --set model.name=lenet
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/resnet.h5" "${cifar[@]}" --set model.name=resnet18_gn \
      --set model.width=4 --set algorithm.client_momentum=0.9 --set algorithm.weight_decay=0.0005
    "$PYTHON" - "$WORK/lenet.h5" "$WORK/resnet.h5" <<'PY' || fail "the runs did not log"
import sys, h5py, numpy as np
for path in sys.argv[1:]:
    f = h5py.File(path)
    acc = f["metrics/eval/accuracy"][()]
    assert len(acc) == 2 and np.all(np.isfinite(acc)), (path, acc)
    assert "cifar10: 10 clients (label_quantity(k=2) split), 200 training and 20 test examples" in f["env"].attrs["data"]
PY
    # Augmented clients (random crops and flips from each client's stream): the same bits on 1 and
    # 2 executors, and other bits than without augmentation.
    for e in 1 2; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/augmented$e.h5" "${cifar[@]}" --set model.name=lenet \
        --set data.augment=true --set execution.executors=$e --set execution.logical_shards=2
    done
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/augmented1.h5" "$WORK/augmented2.h5" 2 || fail "1 and 2 executors differ"
    "$PYTHON" - "$WORK/augmented1.h5" "$WORK/lenet.h5" <<'PY' || fail "augmentation changed nothing"
import sys, h5py, numpy as np
augmented, plain = (h5py.File(p) for p in sys.argv[1:])
assert augmented["env"].attrs["data"].endswith("augmented (crop with padding 4, horizontal flip)"), augmented["env"].attrs["data"]
assert not np.array_equal(augmented["metrics/train/loss"][()], plain["metrics/train/loss"][()])
PY
    head -c 5000 "$WORK/cifar/test_batch.bin" > "$WORK/cifar/short" && mv "$WORK/cifar/short" "$WORK/cifar/test_batch.bin"
    run_expect 2 "test_batch\.bin: truncated or not a CIFAR binary file: 5000 bytes is not a whole number of 3073-byte records" -- \
      "$FAX_RUN" run "$experiment" -o "$WORK/bad.h5" "${cifar[@]}" --set model.name=lenet
    [[ ! -e "$WORK/bad.h5" ]] || fail "a refused run wrote a log"
    ;;
  leaf)
    # Generated LEAF data sets (JSON written with the Python standard library, as LEAF writes it):
    # a FEMNIST-like one trains end to end with FedAvg, a Shakespeare-like one with the transformer;
    # a file that is not LEAF's schema exits 2 with one line naming the file and key.
    cd "$WORK" || fail "no folder"
    "$PYTHON" - "$WORK" <<'PY' || fail "fixture"
import json, os, random, sys
random.seed(0)
def write(folder, split, users):
    os.makedirs(os.path.join(sys.argv[1], folder, split), exist_ok=True)
    names = sorted(users)
    for part in range(2):  # LEAF splits a data set over several files
        mine = names[part::2]
        data = {"users": mine, "num_samples": [len(users[u][1]) for u in mine],
                "user_data": {u: {"x": users[u][0], "y": users[u][1]} for u in mine}}
        with open(os.path.join(sys.argv[1], folder, split, f"all_data_{part}_niid_0_keep_0_{split}_9.json"), "w") as f:
            json.dump(data, f)
def image(label):
    return [round(min(1.0, random.random() * 0.3 + (0.7 if (j // 78) == label else 0.0)), 6) for j in range(784)]
def images(n, labels):
    ys = [random.choice(labels) for _ in range(n)]
    return [image(y) for y in ys], ys
write("femnist", "train", {f"f{u:04d}_{u % 3}": images(12 + u, [u % 10, (u + 3) % 10]) for u in range(8)})
write("femnist", "test", {f"f{u:04d}_{u % 3}": images(4, [u % 10, (u + 3) % 10]) for u in range(8)})
text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 4
def windows(n):
    starts = [random.randrange(len(text) - 81) for _ in range(n)]
    return [text[s:s + 80] for s in starts], [text[s + 80] for s in starts]
write("shakespeare", "train", {f"THE_TRAGEDY_{u}": windows(10) for u in range(4)})
write("shakespeare", "test", {f"THE_TRAGEDY_{u}": windows(3) for u in range(4)})
def tweets(n):
    ys = [random.randrange(2) for _ in range(n)]
    mood = lambda y: ["good", "happy", "love", "great"] if y else ["bad", "sad", "hate", "awful"]
    text = lambda y: " ".join(random.choice(mood(y) + ["the", "a", "day", "!"]) for _ in range(random.randint(3, 30)))
    return [["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", text(y)] for y in ys], ys
write("sent140", "train", {f"user{u}": tweets(20) for u in range(6)})
write("sent140", "test", {f"user{u}": tweets(5) for u in range(6)})
write("tiny", "train", {f"f{u}": images(6, [0, 1]) for u in range(4)})
write("tiny", "test", {"f0": images(2, [0, 1])})  # fewer test examples than logical shards
PY
    write leaf.yaml <<'YAML'
rounds: 3
cohort: {size: 4}
data: {name: leaf}
algorithm: {name: fedavg, client_lr: 0.05, batch_size: 10}
logging: {eval_every: 1}
YAML
    experiment="$WORK/leaf.yaml"
    leaf=()
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" --dry-run "${leaf[@]}" --set data.path="$WORK/femnist" --set model.name=mlp
    grep -q "# clients: 8; examples per client (min / median / max): 12 / 16 / 19; labels per client: 2 / 2 / 2; test examples: 32" \
      "$WORK/stdout" || fail "dry run: $(cat "$WORK/stdout")"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o femnist.h5 "${leaf[@]}" --set data.path="$WORK/femnist" \
      --set model.name=softmax_regression --set algorithm.local_epochs=2
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o shakespeare.h5 "${leaf[@]}" --set data.path="$WORK/shakespeare" \
      --set model.name=transformer --set model.width=16 --set model.depth=1 --set model.heads=2
    # Sent140: one label per tweet, so a sequence classifier (TorchScript); the transformer refuses.
    "$PYTHON" "$FAX_SOURCE_DIR/experiments/sent140_torchscript.py" bag.pt --vocab 40 --width 8 || fail "export failed"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o sent140.h5 "${leaf[@]}" --set data.path="$WORK/sent140" \
      --set model.name=torchscript --set model.path=bag.pt --set algorithm.client_lr=0.5 --set algorithm.local_epochs=2
    run_expect 2 "the transformer predicts the next token at every position, but this data set has one label per sequence" -- \
      "$FAX_RUN" run "$experiment" -o x.h5 "${leaf[@]}" --set data.path="$WORK/sent140" --set model.name=transformer
    run_expect 2 "softmax_regression needs numeric features, but this data set gives token ids \(text\)" -- \
      "$FAX_RUN" run "$experiment" -o x.h5 "${leaf[@]}" --set data.path="$WORK/shakespeare" --set model.name=softmax_regression
    [[ ! -e x.h5 ]] || fail "a refused run wrote a log"
    # Two test examples over four logical shards: evaluation leaves two parts empty.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o tiny.h5 "${leaf[@]}" --set data.path="$WORK/tiny" \
      --set model.name=softmax_regression --set execution.logical_shards=4
    "$PYTHON" - femnist.h5 shakespeare.h5 sent140.h5 <<'PY' || fail "the runs did not log"
import sys, h5py, numpy as np
for path, data in zip(sys.argv[1:], ["numeric features (FEMNIST, Synthetic)", "characters (Shakespeare)",
                                     "a vocabulary of 14 ids (0 padding, 1 other words)"]):
    f = h5py.File(path)
    acc = f["metrics/eval/accuracy"][()]
    assert len(acc) == 3 and np.all(np.isfinite(acc)), (path, acc)
    assert data in f["env"].attrs["data"], f["env"].attrs["data"]
acc = h5py.File(sys.argv[1])["metrics/eval/accuracy"][()]
assert acc[-1] > 0.5, acc  # ten classes with two per client: a model that learns nothing gets 0.1
acc = h5py.File(sys.argv[3])["metrics/eval/accuracy"][()]
assert acc[-1] > 0.8, acc  # the mood words give the sentiment away
PY
    bad="$WORK/femnist/train/all_data_1_niid_0_keep_0_train_9.json"
    printf '{"hierarchies": 5, "users": 3, "num_samples": [1]}' > "$bad"
    run_expect 2 "all_data_1_niid_0_keep_0_train_9\.json: \"users\" is a number; LEAF's schema has a list of user names" -- \
      "$FAX_RUN" run "$experiment" -o bad.h5 "${leaf[@]}" --set data.path="$WORK/femnist" --set model.name=mlp
    [[ ! -e bad.h5 ]] || fail "a refused run wrote a log"
    ;;
  missing_file)
    run_expect 2 "nowhere\.yaml: cannot open the experiment file" -- "$FAX_RUN" run "$WORK/nowhere.yaml"
    ;;
  bad_abi)
    run_expect 2 "fax_badabi\.so was built for plugin ABI version [0-9]+, but this fax \([0-9.]+\) loads plugin ABI version [0-9]+" -- \
      "$FAX_RUN" run "$experiment" --plugin-dir "$BAD_PLUGIN_DIR" --set algorithm.name=badabi
    run_expect 0 "" -- "$FAX_RUN" plugins --plugin-dir "$BAD_PLUGIN_DIR"
    grep -q "refused: .*fax_badabi.so" "$WORK/stdout" || fail "plugins does not list the refused plugin"
    grep -q "^fedavg " "$WORK/stdout" || fail "a refused plugin hid the others"
    ;;
  no_entry_point)
    run_expect 2 "fax_noentry\.so: no entry point 'fax_plugin_info'" -- \
      "$FAX_RUN" run "$experiment" --plugin-dir "$BAD_PLUGIN_DIR" --set algorithm.name=noentry
    ;;
  usage)
    run_expect 0 "" -- "$FAX_RUN" --version
    grep -q "fax-run [0-9.]* (LibTorch" "$WORK/stdout" || fail "--version: $(cat "$WORK/stdout")"
    for sub in run plugins inspect; do run_expect 0 "" -- "$FAX_RUN" "$sub" --help; done
    run_expect 2 "--bogus" -- "$FAX_RUN" run "$experiment" --bogus
    run_expect 2 "" -- "$FAX_RUN"
    ;;
  unwritable_output)
    run_expect 2 "/nonexistent-dir/run\.h5: cannot create the file.s lock" -- \
      "$FAX_RUN" run "$experiment" -o /nonexistent-dir/run.h5 --set rounds=1
    ;;
  fmnist)
    # The Fashion-MNIST experiment, a few rounds: loads the Debian data set, trains the MLP.
    run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_fedavg.yaml" -o "$WORK/fmnist.h5" -q \
      --set rounds=4 --set logging.eval_every=4
    "$PYTHON" - "$WORK/fmnist.h5" <<'PY' || fail "fmnist did not learn"
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    assert "fashion-mnist: 600 clients" in f["env"].attrs["data"], f["env"].attrs["data"]
    acc = f["metrics/eval/accuracy"][()]
    assert acc[-1] > 0.4, acc
PY
    ;;
  dp_epsilon)
    run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_dir01_dp.yaml" -o "$WORK/dp.h5" -q \
      --set rounds=4 --set cohort.size=20 --set logging.eval_every=4
    "$PYTHON" - "$WORK/dp.h5" <<'PY' || fail "epsilon is not logged every round"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    eps = f["metrics/privacy/epsilon"][()]
    assert eps.shape == (4,) and np.all(np.isfinite(eps)) and np.all(np.diff(eps) > 0), eps
    assert np.all(f["metrics/privacy/sensitivity"][()] == 0.5)
    assert np.all((f["metrics/aggregation/clipped_fraction"][()] >= 0) & (f["metrics/aggregation/clipped_fraction"][()] <= 1))
PY
    ;;
  scaffold_states)
    run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_dir01_scaffold.yaml" -o "$WORK/s.h5" -q \
      --set rounds=3 --set logging.eval_every=3
    "$PYTHON" - "$WORK/s.h5" <<'PY' || fail "client control variates missing from the checkpoint"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    c = f["checkpoints/3"]
    ids = c["client_states/id"][()]
    assert 20 <= len(ids) <= 30 and len(np.unique(ids)) == len(ids), ids
    assert c["client_states/l0.w"].shape == (len(ids), 784, 200)
    assert c["extra/control/l0.w"].shape == (784, 200)
PY
    ;;
  cohort_too_large)
    printf 'cohort:\n  size: 1000\n' | write big.yaml
    run_expect 2 "big\.yaml:2:9: cohort.size \(1000\) is larger than the population of synthetic" -- \
      "$FAX_RUN" run "$WORK/big.yaml" -o "$WORK/big.h5"
    [[ ! -e $WORK/big.h5 ]] || fail "a refused experiment left a run log"
    ;;
  zero_logical_shards)
    run_expect 2 "execution\.logical_shards: 0 is out of range \(must be >= 1\)" -- \
      "$FAX_RUN" run "$experiment" --set execution.logical_shards=0
    ;;
  truncated_hdf5)
    "$PYTHON" - "$WORK/whole.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    for c in range(3):
        f.create_dataset(f"examples/c{c}/pixels", data=np.random.rand(400, 28, 28).astype(np.float32))
        f.create_dataset(f"examples/c{c}/label", data=np.zeros(400, dtype=np.int32))
PY
    head -c 200000 "$WORK/whole.h5" > "$WORK/cut.h5"
    printf 'cohort:\n  size: 3\ndata:\n  name: tff_hdf5\n  path: %s\nexecution:\n  logical_shards: 1\n' "$WORK/cut.h5" | write cut.yaml
    run_expect 2 "cut\.h5: " -- "$FAX_RUN" run "$WORK/cut.yaml"
    ;;
  nonfinite)
    # Client f0001 holds a NaN pixel: its update is NaN from the first step.
    "$PYTHON" - "$WORK/nan.h5" <<'PY'
import sys, h5py, numpy as np
rng = np.random.default_rng(0)
with h5py.File(sys.argv[1], "w") as f:
    for c in range(3):
        x = rng.random((8, 28, 28), dtype=np.float32)
        if c == 1:
            x[3, 5, 5] = np.nan
        f.create_dataset(f"examples/f000{c}/pixels", data=x)
        f.create_dataset(f"examples/f000{c}/label", data=rng.integers(0, 10, 8).astype(np.int32))
PY
    printf 'rounds: 2\ncohort:\n  size: 3\ndata:\n  name: tff_hdf5\n  path: %s\nexecution:\n  logical_shards: 1\nalgorithm:\n  client_lr: 0.05\n' \
      "$WORK/nan.h5" | write nan.yaml
    run_expect 2 "^fax-run: round 1: the update of client 1 \(f0001\) is not finite \(NaN or Inf\); set execution.nonfinite=drop" -- \
      "$FAX_RUN" run "$WORK/nan.yaml" -o "$WORK/nan_stop.h5"
    "$FAX_RUN" run "$WORK/nan.yaml" -q -o "$WORK/nan_drop.h5" --set execution.nonfinite=drop 2> "$WORK/warnings" \
      || fail "drop did not finish: $(cat "$WORK/warnings")"
    [[ $(grep -c "warning: round [12]: dropped client 1 (f0001): its update is not finite" "$WORK/warnings") -eq 2 ]] \
      || fail "expected one warning per round: $(cat "$WORK/warnings")"
    "$PYTHON" - "$WORK/nan_drop.h5" <<'PY' || fail "dropped clients are not reported or the model is not finite"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    assert list(f["metrics/train/dropped_clients"][()]) == [1, 1]
    assert np.all(np.isfinite(f["metrics/train/loss"][()]))
    assert np.all(np.isfinite(f["checkpoints/2/params/w"][()]))
PY
    # The same with algorithms that keep per-client state or weigh by local progress.
    for algorithm in scaffold fednova fedprox; do
      run_expect 0 "" -- "$FAX_RUN" run "$WORK/nan.yaml" -q -o "$WORK/nan_$algorithm.h5" --set execution.nonfinite=drop \
        --set algorithm.name=$algorithm
      "$PYTHON" - "$WORK/nan_$algorithm.h5" <<'PY' || fail "$algorithm: the model is not finite after a dropped client"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    assert list(f["metrics/train/dropped_clients"][()]) == [1, 1]
    def finite(group):
        for key, item in group.items():
            if isinstance(item, h5py.Group):
                finite(item)
            else:
                assert np.all(np.isfinite(item[()])), key
    finite(f["checkpoints/2"])
PY
    done
    ;;
  missing_data)
    run_expect 2 "/nonexistent/fmnist: no such directory \(data.path" -- \
      "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_fedavg.yaml" --set data.path=/nonexistent/fmnist
    ;;
  corrupt_data)
    # A copy of the data set whose training labels file is cut short.
    mkdir -p "$WORK/fmnist"
    cp /usr/share/datasets/fashion-mnist/*.gz "$WORK/fmnist/" || fail "Fashion-MNIST is not installed"
    gunzip -c /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz | head -c 5000 > "$WORK/fmnist/train-labels-idx1-ubyte"
    rm "$WORK/fmnist/train-labels-idx1-ubyte.gz"
    run_expect 2 "train-labels-idx1-ubyte: truncated: the header promises 60000 bytes of data, the file holds 4992" -- \
      "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/fmnist_fedavg.yaml" --set data.path="$WORK/fmnist"
    ;;
  bench_probe)
    # The memory probe fax-run bench starts per cohort size: one MLP experiment, its peak RSS in MiB.
    mib=$("$FAX_RUN" bench --rss-probe 8) || fail "the probe failed"
    [[ $mib =~ ^[0-9]+\.[0-9]$ ]] && (( ${mib%.*} > 50 )) || fail "not a plausible peak RSS in MiB: '$mib'"
    run_expect 2 "--executors: Value 0 not in range 1 to 1024" -- "$FAX_RUN" bench --executors 0
    ;;
  sweep_resume)
    # A 2 x 2 grid x 2 seeds sweep, killed (-9) once two trials are done, then resumed: finished
    # trials are not run again, every trial ends done, the best trial is named, and a trial that
    # was cut off mid-run ends bit-identical to the same run made on its own.
    write sweep.yaml <<YAML
seed: 0
rounds: 40
cohort:
  size: 10
data:
  name: synthetic
  clients: 100
model:
  name: softmax_regression
algorithm:
  name: fedavg
  batch_size: 10
execution:
  logical_shards: 2
logging:
  eval_every: 10
  checkpoint_every: 5
sweep:
  grid:
    algorithm.client_lr: [0.01, 0.05]
    algorithm.server_lr: [0.5, 1.0]
  seeds: [0, 1]
YAML
    dir="$WORK/sweep.sweep"
    rm -rf "$dir"
    "$FAX_RUN" sweep "$WORK/sweep.yaml" -o "$dir" --executors 2 > "$WORK/first.out" 2>&1 &
    sweep_pid=$!
    done_trials() {
      "$PYTHON" - "$dir/sweep.h5" <<'PY' 2>/dev/null || echo 0
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    print(sum(s == b"done" for s in f["trials/status"][()]))
PY
    }
    for _ in $(seq 1200); do (( $(done_trials) >= 2 )) && break; sleep 0.1; done
    (( $(done_trials) >= 2 )) || fail "no two trials done in 120 s: $(cat "$WORK/first.out")"
    # A second sweep in the same directory is refused while the first one lives.
    run_expect 2 "sweep\.sweep: another fax-run sweep \(pid $sweep_pid\) is running in this directory" -- \
      "$FAX_RUN" sweep "$WORK/sweep.yaml" -o "$dir"
    kill -9 $sweep_pid
    wait $sweep_pid 2>/dev/null
    "$PYTHON" - "$dir/sweep.h5" > "$WORK/before" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    for name, status in zip(f["trials/name"][()], f["trials/status"][()]):
        print(name.decode(), status.decode())
PY
    finished=$(awk '$2 == "done" {print $1}' "$WORK/before")
    cut=$(awk '$2 == "running" {print $1; exit}' "$WORK/before")
    (( $(echo "$finished" | wc -w) < 8 )) || fail "the sweep finished before the kill"
    # Every setting's first seed (the odd trials) runs before any second seed.
    for t in $finished; do
      (( 10#${t#trial-} % 2 == 1 )) || fail "$t (a second seed) finished before every first seed ran: $(cat "$WORK/before")"
    done
    for t in $finished; do sha256sum "$dir/$t.h5"; done > "$WORK/finished.sha"
    # Harvested (scripts/sweep-harvest.sh, for a sweep that outlives its machine): the index and
    # the finished trials' logs, no checkpoint, lock or cut-off trial; continued below.
    harvest="$WORK/harvest.sweep"
    rm -rf "$harvest"
    harvest_to 0 "" "$dir" "$harvest"
    expected=$(for t in $finished; do echo "$t.h5"; echo "$t.log"; done; echo sweep.h5)
    [[ $(ls -A "$harvest" | sort) == $(echo "$expected" | sort) ]] || fail "harvest holds: $(ls -A "$harvest")"
    for f in $expected; do cmp -s "$dir/$f" "$harvest/$f" || fail "the harvested $f differs"; done
    rm -rf "$WORK/early.sweep" && cp -r "$harvest" "$WORK/early.sweep"
    run_id() { "$PYTHON" -c 'import sys, h5py; print(h5py.File(sys.argv[1])["env"].attrs["run_id"])' "$1"; }
    cut_run=$([[ -n $cut && -d $dir/$cut.h5.checkpoints ]] && run_id "$dir/$cut.h5" || true)
    run_expect 0 "" -- "$FAX_RUN" sweep "$WORK/sweep.yaml" -o "$dir" --executors 2
    grep -q "resuming: $(echo "$finished" | wc -w) done" "$WORK/stdout" || fail "no resume line: $(cat "$WORK/stdout")"
    # A cut-off trial with its checkpoints goes on from them: the same run (a new one has a new id).
    [[ -z $cut_run ]] || { [[ $(run_id "$dir/$cut.h5") == "$cut_run" ]] && ! grep -q "^$cut: .*from round 0" "$WORK/stdout"; } \
      || fail "$cut ran again instead of resuming: $(cat "$WORK/stdout")"
    for t in $finished; do
      ! grep -q "] $t " "$WORK/stdout" || fail "finished $t ran again: $(cat "$WORK/stdout")"
    done
    sha256sum -c --quiet "$WORK/finished.sha" || fail "a finished trial's log changed"
    [[ $(grep -c "^\[[0-9]/8 done\]" "$WORK/stdout") -eq $((8 - $(echo "$finished" | wc -w))) ]] \
      || fail "expected one line per remaining trial: $(cat "$WORK/stdout")"
    best=$(sed -n 's/^best trial: \(trial-[0-9]*\) .*/\1/p' "$WORK/stdout")
    "$PYTHON" - "$dir/sweep.h5" "$best" <<'PY' || fail "index: $(cat "$WORK/stdout")"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    assert all(s == b"done" for s in f["trials/status"][()]), f["trials/status"][()]
    acc = f["trials/final/eval/accuracy"][()]
    names = [n.decode() for n in f["trials/name"][()]]
    assert names[int(np.argmax(acc))] == sys.argv[2], (names, acc, sys.argv[2])
    assert f["sweep/metric"][()].decode() == "eval/accuracy" and f["sweep/mode"][()].decode() == "max"
PY
    # The table of the finished sweep: client lr by server lr, each cell the mean of its two seeds.
    run_expect 0 "" -- "$FAX_RUN" table "$dir" --rows algorithm.client_lr --cols algorithm.server_lr --scale 100
    "$PYTHON" - "$dir/sweep.h5" "$WORK/stdout" <<'PY' || fail "table: $(cat "$WORK/stdout")"
import sys, h5py, numpy as np
lines = open(sys.argv[2]).read().splitlines()
assert lines[0] == "| algorithm.client_lr | 0.5 | 1.0 |" and lines[1] == "|---|---|---|", lines
with h5py.File(sys.argv[1]) as f:
    acc = f["trials/final/eval/accuracy"][()]
    overrides = [o.decode() for o in f["trials/overrides"][()]]
for row, lr in zip(lines[2:], ["0.01", "0.05"]):
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == lr, row
    for cell, server in zip(cells[1:], ["0.5", "1.0"]):
        values = [a for a, o in zip(acc, overrides)
                  if f"algorithm.client_lr={lr}" in o.split("\n") and f"algorithm.server_lr={server}" in o.split("\n")]
        assert len(values) == 2 and cell == f"{100 * np.mean(values):.1f} ± {100 * np.std(values, ddof=1):.1f}", (cell, values)
PY
    # --minutes: the same cells as the trials' wall time in minutes, from the index's seconds.
    run_expect 0 "" -- "$FAX_RUN" table "$dir" --rows algorithm.client_lr --cols algorithm.server_lr --minutes
    "$PYTHON" - "$dir/sweep.h5" "$WORK/stdout" <<'PY' || fail "table --minutes: $(cat "$WORK/stdout")"
import sys, h5py, numpy as np
lines = open(sys.argv[2]).read().splitlines()
with h5py.File(sys.argv[1]) as f:
    minutes = f["trials/seconds"][()] / 60
    overrides = [o.decode() for o in f["trials/overrides"][()]]
assert len(lines) == 4 and all(m > 0 for m in minutes), (lines, minutes)
for row, lr in zip(lines[2:], ["0.01", "0.05"]):
    cells = [c.strip() for c in row.strip("|").split("|")]
    for cell, server in zip(cells[1:], ["0.5", "1.0"]):
        values = [m for m, o in zip(minutes, overrides)
                  if f"algorithm.client_lr={lr}" in o.split("\n") and f"algorithm.server_lr={server}" in o.split("\n")]
        assert cell == f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}", (cell, values)
PY
    run_expect 2 "sweep\.sweep/sweep\.h5: --minutes shows minutes; it takes no --scale" -- \
      "$FAX_RUN" table "$dir" --rows algorithm.client_lr --cols algorithm.server_lr --minutes --scale 100
    # --where keeps the trials with a setting: the server lr 1.0 column alone, the same cells.
    full=$("$FAX_RUN" table "$dir" --rows algorithm.client_lr --cols algorithm.server_lr --scale 100)
    run_expect 0 "" -- "$FAX_RUN" table "$dir" --rows algorithm.client_lr --cols algorithm.server_lr --scale 100 \
      --where algorithm.server_lr=1.0
    [[ $(sed -n 1p "$WORK/stdout") == "| algorithm.client_lr | 1.0 |" ]] || fail "--where header: $(cat "$WORK/stdout")"
    for row in 3 4; do
      [[ $(sed -n ${row}p "$WORK/stdout" | cut -d'|' -f3) == $(echo "$full" | sed -n ${row}p | cut -d'|' -f4) ]] \
        || fail "--where row $row: $(cat "$WORK/stdout") against $full"
    done
    run_expect 2 "--where algorithm\.server_lr=9: no trial of the sweep has these settings" -- \
      "$FAX_RUN" table "$dir" --rows algorithm.client_lr --cols algorithm.server_lr --where algorithm.server_lr=9
    run_expect 2 "--where algorithm\.server_lr: expected KEY=VALUE" -- \
      "$FAX_RUN" table "$dir" --rows algorithm.client_lr --cols algorithm.server_lr --where algorithm.server_lr
    [[ -n $cut ]] || cut=trial-0008
    overrides=$("$PYTHON" - "$dir/sweep.h5" "$cut" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    names = [n.decode() for n in f["trials/name"][()]]
    print(" ".join("--set " + o for o in f["trials/overrides"][()][names.index(sys.argv[2])].decode().split("\n")))
PY
)
    rm -rf "$WORK/alone" && mkdir "$WORK/alone"
    # shellcheck disable=SC2086
    run_expect 0 "" -- "$FAX_RUN" run "$WORK/sweep.yaml" -q -o "$WORK/alone/$cut.h5" $overrides
    # The harvest continues elsewhere with the same command: its cut-off trial starts again from
    # round 0 (here from a log that came without its checkpoint folder, which it replaces), and
    # every trial ends as in the sweep that resumed from checkpoints.
    cp "$WORK/alone/$cut.h5" "$harvest/"
    run_expect 0 "" -- "$FAX_RUN" sweep "$WORK/sweep.yaml" -o "$harvest" --executors 2
    grep -qxF "$cut: its log has no checkpoint folder beside it ($harvest/$cut.h5.checkpoints); running it from round 0" \
      "$WORK/stdout" || fail "no restart line: $(cat "$WORK/stdout")"
    grep -q "resuming: $(echo "$finished" | wc -w) done" "$WORK/stdout" || fail "harvest: $(cat "$WORK/stdout")"
    "$PYTHON" - "$dir/sweep.h5" "$harvest/sweep.h5" <<'PY' || fail "the continued harvest ends otherwise"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:
    assert list(b["trials/status"][()]) == [b"done"] * 8, b["trials/status"][()]
    for m in ("eval/accuracy", "eval/loss", "train/loss"):
        assert np.array_equal(a["trials/final/" + m][()], b["trials/final/" + m][()]), m
PY
    # Harvested again, finished: a second harvest of it copies nothing. Refused, each leaving the
    # folder as it was: a sweep's own folder (the continued one), an older harvest over a newer one,
    # a folder that indexes other settings.
    second="$WORK/second.sweep"
    rm -rf "$second"
    harvest_to 0 "" "$dir" "$second"
    grep -qx "sweep-harvest: 8 done and 0 failed trials in $dir; 16 files copied to $second" "$WORK/stdout" \
      || fail "harvest: $(cat "$WORK/stdout")"
    mkdir "$second/trial-0001.h5.checkpoints"
    harvest_to 0 "" "$dir" "$second"
    grep -q "; 0 files copied to" "$WORK/stdout" && [[ ! -e $second/trial-0001.h5.checkpoints ]] \
      || fail "harvest again: $(cat "$WORK/stdout"); $(ls "$second")"
    harvest_to 1 "harvest\.sweep is a sweep's own folder \(it has sweep\.lock\), not a harvest" "$dir" "$harvest"
    "$PYTHON" - "$second/sweep.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    o = f["trials/overrides"][()]
    o[0] = o[0].replace(b"0.01", b"0.02")
    f["trials/overrides"][...] = o
PY
    state=$(cd "$second" && ls -A && sha256sum ./*)
    harvest_to 1 "second\.sweep/sweep\.h5 indexes another sweep \(other --set or trials\); harvest into a new folder" \
      "$dir" "$second"
    [[ $(cd "$second" && ls -A && sha256sum ./*) == "$state" ]] || fail "a refused harvest changed $second"
    rm -rf "$second"
    harvest_to 0 "" "$dir" "$second"
    state=$(cd "$second" && ls -A && sha256sum ./*)
    harvest_to 1 "second\.sweep/sweep\.h5 is ahead of the sweep: trial-[0-9]{4} is done there, not in it" \
      "$WORK/early.sweep" "$second"
    [[ $(cd "$second" && ls -A && sha256sum ./*) == "$state" ]] || fail "a refused harvest changed $second"
    "$PYTHON" - "$dir/$cut.h5" "$WORK/alone/$cut.h5" "$harvest/$cut.h5" <<'PY' \
      || fail "$cut differs from the same run made alone or started again in the harvest"
import sys, h5py, numpy as np
a = h5py.File(sys.argv[1])
names = []
a["metrics"].visit(lambda n: names.append(n) if isinstance(a["metrics"][n], h5py.Dataset) else None)
names = [n for n in names if not n.startswith("time/")]
assert "eval/accuracy" in names and len(a["metrics/round"]) == 40
for other in sys.argv[2:]:
    b = h5py.File(other)
    for n in names:
        assert np.array_equal(a["metrics"][n][()], b["metrics"][n][()], equal_nan=True), (other, n)
PY
    run_expect 0 "" -- "$FAX_RUN" inspect "$dir/sweep.h5"
    grep -q "^best trial: $best " "$WORK/stdout" && grep -q "8 done" "$WORK/stdout" || fail "inspect: $(cat "$WORK/stdout")"
    grep -Eq "^time: [0-9.]+ (s|min [0-9]+ s) of trial runs; a done trial [0-9.]+ s on average$" "$WORK/stdout" \
      || fail "inspect: $(cat "$WORK/stdout")"
    # Ranked again by another window and metric: nothing reruns, the index follows.
    sed -i 's/^  seeds: \[0, 1\]$/  seeds: [0, 1]\n  average_last: 2\n  metric: eval\/loss/' "$WORK/sweep.yaml"
    run_expect 0 "" -- "$FAX_RUN" sweep "$WORK/sweep.yaml" -o "$dir"
    grep -q "resuming: 8 done, 0 to run" "$WORK/stdout" && grep -q "ranked by eval/loss (min of the mean of its last 2" \
      "$WORK/stdout" || fail "re-ranking: $(cat "$WORK/stdout")"
    "$PYTHON" - "$dir/sweep.h5" "$dir/trial-0001.h5" <<'PY' || fail "the index does not hold the last-2 means"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f, h5py.File(sys.argv[2]) as t:
    loss = t["metrics/eval/loss"][()]
    assert f["sweep/average_last"][()] == 2
    assert np.isclose(f["trials/final/eval/loss"][0], loss[~np.isnan(loss)][-2:].mean(), rtol=0, atol=1e-15)
PY
    ;;
  experiments_valid)
    # Every shipped experiment resolves (and every trial of a sweep), so none rots unnoticed, and
    # carries the results it gives (expect:; run --check compares them).
    for file in "$FAX_SOURCE_DIR"/experiments/*.yaml "$FAX_SOURCE_DIR"/experiments/*/*.yaml; do
      grep -q "^expect:" "$file" || fail "$file has no expect: section"
      run_expect 0 "" -- "$FAX_RUN" run "$file" --dry-run
      if grep -q "^sweep:" "$file"; then
        run_expect 0 "" -- "$FAX_RUN" sweep "$file" --dry-run
        grep -q "^trial-0001 " "$WORK/stdout" || fail "$file: no trials listed: $(cat "$WORK/stdout")"
      fi
    done
    run_expect 0 "" -- "$FAX_RUN" sweep "$FAX_SOURCE_DIR/experiments/fmnist_dir01_fedopt_sweep.yaml" --dry-run
    [[ $(grep -c "^trial-" "$WORK/stdout") -eq 72 ]] || fail "expected 72 trials: $(cat "$WORK/stdout")"
    grep -q "^trial-0072 algorithm.name=fedopt algorithm.server_optimizer=yogi algorithm.client_lr=0.1 algorithm.server_lr=3$" \
      "$WORK/stdout" || fail "unexpected last trial: $(tail -1 "$WORK/stdout")"
    # The non-IID tables in experiments/README.md are the ones fax-run table reads from the committed
    # sweeps (this build's and the one before; this build's cost in minutes too), line for line: a
    # harvest that does not update the README fails here.
    for table in "fmnist --scale 100" "fmnist-2842e2a --scale 100" "fmnist --minutes"; do
      sweep=${table%% *}
      # shellcheck disable=SC2086
      run_expect 0 "" -- "$FAX_RUN" table "$FAX_SOURCE_DIR/experiments/niid_bench/$sweep.sweep" --rows data \
        --cols algorithm.name ${table#* }
      [[ $(grep -c "^| " "$WORK/stdout") -eq 6 ]] || fail "$table: expected a header and 5 rows: $(cat "$WORK/stdout")"
      while IFS= read -r line; do
        grep -qxF -- "$line" "$FAX_SOURCE_DIR/experiments/README.md" || fail "experiments/README.md lacks the line of $table: $line"
      done < <(grep "^| " "$WORK/stdout")
    done
    ;;
  experiments_check_more)
    # The other experiments under a minute each reproduce the results they carry (expect:); the
    # TorchScript one from the module its script exports, in the folder the run starts from.
    cd "$WORK" || fail "no $WORK"
    "$PYTHON" "$FAX_SOURCE_DIR/experiments/fmnist_torchscript.py" fmnist_mlp.pt > /dev/null || fail "export failed"
    for name in fmnist_torchscript fmnist_cnn_fedavg fmnist_dir01_fedavg fmnist_dir01_fedadam fmnist_dir01_fedprox \
      fmnist_dir01_hypergrad fmnist_dir01_fedopt_sweep fmnist_dir01_fedopt_seeds fmnist_dir01_dp_poisson; do
      grep -q "^expect:" "$FAX_SOURCE_DIR/experiments/$name.yaml" || fail "$name.yaml has no expect: section"
      run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/$name.yaml" --check -o "$WORK/$name.h5"
      grep -q "^check: eval/accuracy at round [0-9]*: .*: ok$" "$WORK/stdout" || fail "$name: no check line: $(cat "$WORK/stdout")"
    done
    ;;
  experiments_check)
    # The short experiments (under a minute each) reproduce the results they carry (expect:).
    for name in synthetic_fedsgd synthetic_fedavg fmnist_fedavg fmnist_sync_deadline fmnist_fedbuff; do
      run_expect 0 "" -- "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/$name.yaml" --check -o "$WORK/$name.h5"
      grep -q "^check: eval/accuracy at round [0-9]*: .*: ok$" "$WORK/stdout" || fail "$name: no check line: $(cat "$WORK/stdout")"
    done
    # Their logs as a table: a row per log, its last round, the columns asked for, the rounds' time.
    run_expect 0 "" -- "$FAX_RUN" table "$WORK/synthetic_fedsgd.h5" "$WORK/fmnist_fedavg.h5" \
      --metric eval/accuracy% --metric eval/accuracy@100 --metric train/loss@last3 --metric privacy/epsilon
    "$PYTHON" - "$WORK" "$WORK/stdout" <<'PY' || fail "run table: $(cat "$WORK/stdout")"
import sys, h5py, numpy as np
lines = open(sys.argv[2]).read().splitlines()
assert lines[0] == "| run | rounds | eval/accuracy% | eval/accuracy@100 | train/loss@last3 | privacy/epsilon | time in rounds |", lines
assert lines[1] == "|---|---|---|---|---|---|---|", lines
for line, name in zip(lines[2:], ["synthetic_fedsgd", "fmnist_fedavg"]):
    with h5py.File(f"{sys.argv[1]}/{name}.h5") as f:
        m = f["metrics"]
        acc, rounds, loss = m["eval/accuracy"][()], m["round"][()], m["train/loss"][()]
        seconds = m["time/round_s"][()].sum()
    cells = [c.strip() for c in line.strip("|").split("|")]
    at100 = acc[list(rounds).index(100)]
    assert cells[:6] == [name, str(rounds[-1]), f"{100 * acc[np.isfinite(acc)][-1]:.1f}%", "-" if np.isnan(at100) else f"{at100:.4g}",
                         f"{loss[np.isfinite(loss)][-3:].mean():.4g}", "-"], (cells, name)
    assert cells[6] == (f"{seconds:.1f} s" if seconds < 60 else cells[6]), (cells, seconds)
PY
    run_expect 2 "table column 'eval/accuracy@lastx': expected METRIC, METRIC@ROUND, METRIC@lastK or METRIC@OTHER>=X" -- \
      "$FAX_RUN" table "$WORK/fmnist_fedavg.h5" --metric eval/accuracy@lastx
    run_expect 2 "fmnist_fedavg\.h5: --rows, --cols, --where, --scale and --minutes are for a sweep" -- \
      "$FAX_RUN" table "$WORK/fmnist_fedavg.h5" --rows data
    # An HDF5 file that is neither a run log nor a sweep's index: one line naming it.
    "$PYTHON" -c 'import sys, h5py; h5py.File(sys.argv[1], "w")["x"] = [1.0]' "$WORK/other.h5"
    run_expect 2 "other\.h5: not a fax run log \(no /config\)" -- "$FAX_RUN" table "$WORK/fmnist_fedavg.h5" "$WORK/other.h5"
    [[ -s $WORK/stdout ]] && fail "a partial table was printed: $(cat "$WORK/stdout")"
    # A miss exits 1 with one line naming the metric, what it got and what was expected.
    run_expect 1 "synthetic_fedsgd\.h5: check failed: eval/accuracy at round 20: [0-9.]*, expected 0\.79431 \+- 0\.005; eval/loss at round 20: .* \(expected results recorded on fax .*\)" -- \
      "$FAX_RUN" run "$FAX_SOURCE_DIR/experiments/synthetic_fedsgd.yaml" --check -q -o "$WORK/synthetic_fedsgd.h5" --set rounds=20
    sed '/^# Written by/,$d' "$FAX_SOURCE_DIR/experiments/synthetic_fedsgd.yaml" > "$WORK/unchecked.yaml"
    run_expect 2 "unchecked\.yaml: --check compares the run with the experiment's expect: section, and it has none" -- \
      "$FAX_RUN" run "$WORK/unchecked.yaml" --check -o "$WORK/x.h5"
    cp "$FAX_SOURCE_DIR/experiments/synthetic_fedsgd.yaml" "$WORK/bad.yaml" && echo "    - {metric: x}" >> "$WORK/bad.yaml"
    run_expect 2 "bad\.yaml:[0-9]*:[0-9]*: expect metrics: each entry needs metric, value and tolerance" -- \
      "$FAX_RUN" run "$WORK/bad.yaml" --dry-run
    ;;
  sweep_errors)
    rm -rf "$WORK/none" "$WORK/bad" "$WORK/fails"
    run_expect 2 "synthetic_fedavg\.yaml: nothing to sweep: add a sweep: section" -- "$FAX_RUN" sweep "$experiment" -o "$WORK/none"
    run_expect 2 "^fax-run: trial-0002 \(algorithm\.client_lr=fast\): --set algorithm\.client_lr=fast: algorithm\.client_lr: expected a float" -- \
      "$FAX_RUN" sweep "$experiment" -o "$WORK/bad" --grid algorithm.client_lr=0.1,fast
    [[ ! -e "$WORK/bad" ]] || fail "a sweep that cannot start created its directory"
    run_expect 2 "--grid: 'rounds' is not key=value" -- "$FAX_RUN" sweep "$experiment" --grid rounds
    # Settings that do not go together are refused for the trial before any trial runs: the mesh,
    # asynchronous training without cohort.concurrency.
    run_expect 2 "^fax-run: trial-0001 \(cohort\.size=1\): .*execution\.logical_shards \(2\) exceeds cohort\.size \(1\)" -- \
      "$FAX_RUN" sweep "$experiment" -o "$WORK/bad" --dry-run --grid cohort.size=1,4
    run_expect 2 "^fax-run: trial-0001 \(cohort\.concurrency=0\): .*algorithm fedbuff trains asynchronously: set cohort\.concurrency" -- \
      "$FAX_RUN" sweep "$experiment" -o "$WORK/bad" --dry-run --set algorithm.name=fedbuff \
      --set clients.speed.distribution=lognormal --grid cohort.concurrency=0,20
    [[ ! -e "$WORK/bad" ]] || fail "a refused sweep created its directory"
    # A trial that fails at run time fails alone; the sweep reports it and exits 2.
    run_expect 2 "^fax-run: 1 of 2 trials failed" -- "$FAX_RUN" sweep "$experiment" -o "$WORK/fails" --set rounds=3 \
      --grid cohort.size=5,1000
    grep -q "^failed: trial-0002 (cohort.size=1000): .*cohort" "$WORK/stdout" || fail "no failure line: $(cat "$WORK/stdout")"
    grep -q "^best trial: trial-0001 " "$WORK/stdout" || fail "no best trial: $(cat "$WORK/stdout")"
    grep -q "cohort" "$WORK/fails/trial-0002.log" || fail "the trial's log lacks its error"
    # Resuming skips the failed trial unless asked.
    run_expect 2 "^fax-run: 1 of 2 trials failed" -- "$FAX_RUN" sweep "$experiment" -o "$WORK/fails" --set rounds=3 \
      --grid cohort.size=5,1000
    grep -q "resuming: 1 done, 0 to run" "$WORK/stdout" || fail "failed trial rerun: $(cat "$WORK/stdout")"
    # Harvested: the done trial's log and output, the failed one's output, and its log where it
    # left one (such as a trial that diverged leaves; here a stand-in).
    rm -rf "$WORK/fails.harvest"
    harvest_to 0 "" "$WORK/fails" "$WORK/fails.harvest"
    grep -qx "sweep-harvest: 1 done and 1 failed trials in $WORK/fails; 3 files copied to $WORK/fails.harvest" \
      "$WORK/stdout" || fail "harvest: $(cat "$WORK/stdout")"
    cp "$WORK/fails/trial-0001.h5" "$WORK/fails/trial-0002.h5"
    harvest_to 0 "" "$WORK/fails" "$WORK/fails.harvest"
    grep -qx "sweep-harvest: 1 done and 1 failed trials in $WORK/fails; 1 files copied to $WORK/fails.harvest" \
      "$WORK/stdout" || fail "harvest: $(cat "$WORK/stdout")"
    [[ $(ls "$WORK/fails.harvest" | tr '\n' ' ') == "sweep.h5 trial-0001.h5 trial-0001.log trial-0002.h5 trial-0002.log " ]] \
      || fail "harvest holds: $(ls "$WORK/fails.harvest")"
    cmp -s "$WORK/fails/trial-0002.h5" "$WORK/fails.harvest/trial-0002.h5" || fail "the harvested trial-0002.h5 differs"
    # An index cut short, the sweep's or the harvest's: one line naming it, the harvest as it was.
    state=$(cd "$WORK/fails.harvest" && ls -A && sha256sum ./*)
    rm -rf "$WORK/cut" && mkdir "$WORK/cut" && head -c 2000 "$WORK/fails/sweep.h5" > "$WORK/cut/sweep.h5"
    harvest_to 1 "^$WORK/cut/sweep\.h5: not a readable sweep index \(" "$WORK/cut" "$WORK/fails.harvest"
    [[ $(cd "$WORK/fails.harvest" && ls -A && sha256sum ./*) == "$state" ]] || fail "a refused harvest changed it"
    cp "$WORK/fails.harvest/sweep.h5" "$WORK/whole.h5"
    head -c 2000 "$WORK/whole.h5" > "$WORK/fails.harvest/sweep.h5"
    state=$(cd "$WORK/fails.harvest" && ls -A && sha256sum ./*)
    harvest_to 1 "^$WORK/fails\.harvest/sweep\.h5: not a readable sweep index \(" "$WORK/fails" "$WORK/fails.harvest"
    [[ $(cd "$WORK/fails.harvest" && ls -A && sha256sum ./*) == "$state" ]] || fail "a refused harvest changed it"
    rm "$WORK/fails/trial-0002.h5"
    # Another grid in the same directory is refused.
    run_expect 2 "fails/sweep\.h5: holds a sweep of another experiment, --set or trial list" -- \
      "$FAX_RUN" sweep "$experiment" -o "$WORK/fails" --set rounds=3 --grid cohort.size=5,6
    ;;
  plot_svg)
    for lr in 0.01 0.1; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/lr$lr.h5" --set rounds=30 --set algorithm.client_lr=$lr
    done
    run_expect 0 "" -- "$FAX_RUN" plot "$WORK/lr0.01.h5" "$WORK/lr0.1.h5" --metric train/loss --log-y -o "$WORK/loss.svg"
    "$PYTHON" - "$WORK/loss.svg" <<'PY' || fail "the SVG is not the chart expected"
import sys, xml.etree.ElementTree as ET
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg"
lines = root.findall(".//s:polyline", ns)
assert len(lines) == 2 and all(len(l.get("points").split()) == 30 for l in lines), [l.get("points") for l in lines]
legend = [t.text for t in root.findall(".//s:text[@class='legend']", ns)]
assert legend == ["algorithm.client_lr=0.01", "algorithm.client_lr=0.1"], legend
axes = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if (t.get("class") or "").startswith("axis-label")]
assert axes == ["round", "train/loss (log scale)"], axes
PY
    run_expect 2 "lr0\.01\.h5: no metric 'eval/acc' \(it has: eval/accuracy, " -- \
      "$FAX_RUN" plot "$WORK/lr0.01.h5" --metric eval/acc -o "$WORK/x.svg"
    run_expect 0 "" -- "$FAX_RUN" inspect "$WORK/lr0.1.h5" --last 1
    grep -q "^  train/loss  *[▁▂▃▄▅▆▇█]\{30\} " "$WORK/stdout" || fail "no sparkline: $(cat "$WORK/stdout")"
    ;;
  plot_chromium)
    # The chart as a browser draws it: a headless Chromium screenshot must show both series' colours.
    browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
    if [[ -z $browser ]]; then
      echo "SKIP: no Chromium here (apt-get install chromium); the SVG's structure is checked by cli.plot_svg"
      exit 77
    fi
    for lr in 0.01 0.1; do
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/lr$lr.h5" --set rounds=20 --set algorithm.client_lr=$lr
    done
    run_expect 0 "" -- "$FAX_RUN" plot "$WORK/lr0.01.h5" "$WORK/lr0.1.h5" --metric train/loss -o "$WORK/chart.svg"
    rm -f "$WORK/chart.png"
    timeout 60 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,480 \
      --screenshot="$WORK/chart.png" "file://$WORK/chart.svg" > "$WORK/chromium.log" 2>&1 \
      || fail "chromium failed: $(tail -5 "$WORK/chromium.log")"
    "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/png_colours.py" "$WORK/chart.png" 1f77b4 ff7f0e || fail "the screenshot lacks a series"
    ;;
  *)
    fail "unknown case $1"
    ;;
esac
echo "ok: $1"
