#!/usr/bin/env bash
# fax-run tried as a careless or hostile user would: full disks, outputs that are inputs, a second
# writer, foreign checkpoints, another plugin build, YAML bombs. One case per ctest test:
# robust_tests.sh <case>. Each case first makes the failure happen, then checks that fax refused
# it with one clear line (exit 2) and that nothing that existed before was lost.
# Environment: FAX_RUN, FAX_SOURCE_DIR, WORK, PYTHON (with h5py).
set -uo pipefail

source "$(dirname "$0")/common.sh"
rm -rf "${WORK:?}"/* 2>/dev/null
settings=(--set rounds=6 --set logging.checkpoint_every=2 --set logging.eval_every=3)

# A run log that h5py reads whole: every metric has a row per round, every checkpoint opens.
check_log() {  # check_log <file> <rounds or "">
  "$PYTHON" - "$1" "${2:-}" <<'PY' || fail "$1 is not a complete run log"
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    rounds = f["metrics/round"][()]
    if sys.argv[2]:
        assert len(rounds) == int(sys.argv[2]), (len(rounds), sys.argv[2])
    f["config"][()]
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and name != "round":
            assert len(obj) == len(rounds), name
    f["metrics"].visititems(visit)
    for r in f.get("checkpoints", {}):
        f["checkpoints"][r]["params"]  # follows the link into the checkpoint file
PY
}
digest() { sha256sum "$@" | cut -d' ' -f1; }
# Every file of a run: the log and its checkpoint folder.
digest_run() { (cd "$(dirname "$1")" && find "$(basename "$1")" "$(basename "$1").checkpoints" -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum; }

mounted=""
unmount() { [[ -n $mounted ]] && umount "$mounted" 2>/dev/null; }
trap 'unmount; cleanup' EXIT
# small_disk <dir> <size>: a tmpfs of that size at <dir>, or exit 77 (ctest: skipped) saying why.
small_disk() {
  mkdir -p "$1"
  if ! mount -t tmpfs -o "size=$2" tmpfs "$1" 2>"$WORK/mount.err"; then
    echo "SKIP: cannot mount a tmpfs to fill (needs root): $(cat "$WORK/mount.err")"
    exit 77
  fi
  mounted=$1
}

case "$1" in
  disk_full)
    # The disk fills while the run writes its checkpoints: the run stops with exit 2 naming the
    # cause, and the log on disk is the last complete one (readable, resumable once there is room).
    small_disk "$WORK/disk" 400k
    run_expect 2 "(run\.h5|round-[0-9]+-[0-9a-f]+\.h5): cannot write: No space left on device; (the previous file is unchanged|nothing was written)$" -- \
      "$FAX_RUN" run "$experiment" -q -o "$WORK/disk/run.h5" --set rounds=500 --set logging.checkpoint_every=1
    check_log "$WORK/disk/run.h5"
    ls -A "$WORK/disk" "$WORK/disk/run.h5.checkpoints" | grep -q '\.tmp-' && fail "temporary files left behind"
    run_expect 0 "" -- "$FAX_RUN" inspect "$WORK/disk/run.h5" --last 1
    run_expect 2 "No space left on device" -- "$FAX_RUN" resume "$WORK/disk/run.h5" -q
    check_log "$WORK/disk/run.h5"
    # A new run over a complete log on a full disk: the old log and its checkpoints stay, byte for byte.
    rm -rf "$WORK/disk"/*
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/disk/old.h5" "${settings[@]}"
    before=$(digest_run "$WORK/disk/old.h5")
    head -c 1M /dev/zero > "$WORK/disk/filler" 2>/dev/null
    run_expect 2 "old\.h5.*No space left on device" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/disk/old.h5" \
      "${settings[@]}" --set seed=1
    [[ $(digest_run "$WORK/disk/old.h5") == "$before" ]] || fail "the complete log was changed by a failed run"
    check_log "$WORK/disk/old.h5" 6
    # A chart on a full disk: refused, the old chart stays.
    rm "$WORK/disk/filler"
    run_expect 0 "" -- "$FAX_RUN" plot "$WORK/disk/old.h5" --metric train/loss -o "$WORK/disk/chart.svg"
    before=$(digest "$WORK/disk/chart.svg")
    head -c 1M /dev/zero > "$WORK/disk/filler" 2>/dev/null
    run_expect 2 "chart\.svg: cannot write: No space left on device" -- \
      "$FAX_RUN" plot "$WORK/disk/old.h5" "$WORK/disk/old.h5" --metric train/loss -o "$WORK/disk/chart.svg" --width 9000
    [[ $(digest "$WORK/disk/chart.svg") == "$before" ]] || fail "the chart was replaced by a failed write"
    ;;
  second_writer)
    # A run on an -o whose run is still going is refused naming it, and touches none of its files.
    "$FAX_RUN" run "$experiment" -q -o "$WORK/live.h5" --set rounds=100000 --set logging.checkpoint_every=1 &
    live=$!
    workers+=("$live")
    for _ in $(seq 1 300); do [[ -n $(ls "$WORK/live.h5.checkpoints" 2>/dev/null) ]] && break; sleep 0.1; done
    run_expect 2 "live\.h5 is in use by fax-run run .*synthetic_fedavg\.yaml \(pid $live on .*\)" -- \
      "$FAX_RUN" run "$experiment" -q -o "$WORK/live.h5" --set rounds=2
    run_expect 2 "live\.h5 is in use by fax-run run" -- "$FAX_RUN" resume "$WORK/live.h5" -q
    kill -TERM "$live"
    wait "$live"
    [[ $? -eq $((128 + 15)) ]] || fail "the live run did not stop cleanly"
    check_log "$WORK/live.h5"
    [[ -e $WORK/live.h5.lock ]] && fail "the lock file outlived its run"
    ;;
  output_is_input)
    cp "$experiment" "$WORK/exp.yaml"
    before=$(digest "$WORK/exp.yaml")
    run_expect 2 "exp\.yaml: the run log would overwrite the input .*exp\.yaml" -- \
      "$FAX_RUN" run "$WORK/exp.yaml" -q -o "$WORK/exp.yaml"
    run_expect 2 "the run log would overwrite the input" -- \
      "$FAX_RUN" run "$WORK/exp.yaml" -q -o "$WORK/../$(basename "$WORK")/./exp.yaml"
    ln -sf "$WORK/exp.yaml" "$WORK/link.h5"
    run_expect 2 "the run log would overwrite the input" -- "$FAX_RUN" run "$WORK/exp.yaml" -q -o "$WORK/link.h5"
    [[ $(digest "$WORK/exp.yaml") == "$before" ]] || fail "the experiment file was overwritten"
    run_expect 0 "" -- "$FAX_RUN" run "$WORK/exp.yaml" -q -o "$WORK/run.h5" "${settings[@]}"
    before=$(digest "$WORK/run.h5")
    run_expect 2 "run\.h5: the chart would overwrite the input" -- "$FAX_RUN" plot "$WORK/run.h5" -o "$WORK/run.h5"
    [[ $(digest "$WORK/run.h5") == "$before" ]] || fail "plot overwrote its input"
    run_expect 2 "/dev/null: the run log exists and is not a regular file" -- \
      "$FAX_RUN" run "$WORK/exp.yaml" -q -o /dev/null
    [[ -c /dev/null ]] || fail "/dev/null is no longer a device"
    mkfifo "$WORK/fifo"
    run_expect 2 "fifo: the chart exists and is not a regular file" -- "$FAX_RUN" plot "$WORK/run.h5" -o "$WORK/fifo"
    run_expect 2 ": the run log is a directory" -- "$FAX_RUN" run "$WORK/exp.yaml" -q -o "$WORK"
    run_expect 2 ": the bench results is a directory" -- "$FAX_RUN" bench -o "$WORK"
    ;;
  failed_run_keeps_log)
    # A complete log is replaced only once the new run has finished a round: a run refused before
    # (empty test split) or failing in its first round (a NaN update) leaves it whole.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/run.h5" "${settings[@]}"
    before=$(digest_run "$WORK/run.h5")
    run_expect 2 "has no test examples to evaluate on" -- \
      "$FAX_RUN" run "$experiment" -q -o "$WORK/run.h5" --set data.test_fraction=0
    "$PYTHON" - "$WORK/nan.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    for c in range(3):
        x = np.random.default_rng(c).random((8, 28, 28), dtype=np.float32)
        if c == 1:
            x[0, 0, 0] = np.nan
        f.create_dataset(f"examples/f{c:04d}/pixels", data=x)
        f.create_dataset(f"examples/f{c:04d}/label", data=np.arange(8, dtype=np.int32) % 2)
PY
    printf 'cohort:\n  size: 3\ndata:\n  name: tff_hdf5\n  path: %s\nexecution:\n  logical_shards: 1\n' "$WORK/nan.h5" \
      | write nan.yaml
    run_expect 2 "round 1.*client" -- "$FAX_RUN" run "$WORK/nan.yaml" -q -o "$WORK/run.h5"
    [[ $(digest_run "$WORK/run.h5") == "$before" ]] || fail "a failed run changed the complete log"
    check_log "$WORK/run.h5" 6
    # A run that succeeds replaces it, checkpoints and all.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/run.h5" --set rounds=2 --set logging.checkpoint_every=1
    check_log "$WORK/run.h5" 2
    [[ $(ls "$WORK/run.h5.checkpoints" | wc -l) -eq 2 ]] || fail "the replaced run's checkpoints are still there: $(ls "$WORK/run.h5.checkpoints")"
    ;;
  foreign_checkpoint)
    # resume reads a checkpoint only from the log's own folder, and only this run's file of that round.
    mkdir -p "$WORK/a" "$WORK/b" "$WORK/elsewhere"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/a/run.h5" "${settings[@]}"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/b/run.h5" "${settings[@]}" --set seed=7
    # The log moved without its folder; another run's folder of the same name in the working directory.
    cp "$WORK/a/run.h5" "$WORK/elsewhere/run.h5"
    cp -r "$WORK/b/run.h5.checkpoints" "$WORK/run.h5.checkpoints"
    cd "$WORK" || fail "cd"
    run_expect 2 "elsewhere/run\.h5: the checkpoint of round 6 is missing" -- "$FAX_RUN" resume "$WORK/elsewhere/run.h5" -q
    # A link rewritten to point out of the folder.
    cp "$WORK/a/run.h5" "$WORK/a/hacked.h5"
    cp -r "$WORK/a/run.h5.checkpoints" "$WORK/a/hacked.h5.checkpoints"
    "$PYTHON" - "$WORK/a/hacked.h5" "../b/run.h5.checkpoints/$(ls "$WORK/b/run.h5.checkpoints" | tail -1)" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "a") as f:
    del f["checkpoints/6"]
    f["checkpoints/6"] = h5py.ExternalLink(sys.argv[2], "/")
PY
    run_expect 2 "hacked\.h5: the checkpoint of round 6 links to '\.\./b/run\.h5\.checkpoints/.*', not to its own checkpoint folder" -- \
      "$FAX_RUN" resume "$WORK/a/hacked.h5" -q
    # Another run's checkpoint under this run's file name.
    mine=$(ls "$WORK/a/run.h5.checkpoints" | tail -1)
    cp "$WORK/b/run.h5.checkpoints/$(ls "$WORK/b/run.h5.checkpoints" | tail -1)" "$WORK/a/run.h5.checkpoints/$mine"
    run_expect 2 "holds round 6 of run [0-9a-f]+, not round 6 of this run" -- "$FAX_RUN" resume "$WORK/a/run.h5" -q
    ;;
  resume_identity)
    # A run stopped halfway, resumed with another build of its plugin: refused naming both; --force
    # resumes and the log records it.
    "$FAX_RUN" run "$experiment" -q -o "$WORK/run.h5" --set rounds=100 --set logging.checkpoint_every=1 2>/dev/null &
    pid=$!
    for _ in $(seq 1 300); do [[ -e $WORK/run.h5 ]] && break; sleep 0.1; done
    kill -TERM "$pid"; wait "$pid"
    mkdir -p "$WORK/plugins"
    cp "$(dirname "$FAX_RUN")/../lib/fax/plugins/fax_fedavg.so" "$WORK/plugins/"
    printf 'another build' >> "$WORK/plugins/fax_fedavg.so"
    before=$(digest_run "$WORK/run.h5")
    run_expect 2 "run\.h5: the experiment resolves differently than when the run started: the log has algorithm fedavg \(.* bytes, FNV-1a [0-9a-f]+\).*; this host has algorithm fedavg \(.* bytes, FNV-1a [0-9a-f]+\).*--force" -- \
      "$FAX_RUN" resume "$WORK/run.h5" -q --plugin-dir "$WORK/plugins"
    [[ $(digest_run "$WORK/run.h5") == "$before" ]] || fail "a refused resume changed the log"
    "$FAX_RUN" resume "$WORK/run.h5" -q --plugin-dir "$WORK/plugins" --force 2> "$WORK/force.err" || fail "--force: $(cat "$WORK/force.err")"
    grep -q "resuming with another experiment identity (--force)" "$WORK/force.err" || fail "no warning: $(cat "$WORK/force.err")"
    "$PYTHON" - "$WORK/run.h5" <<'PY' || fail "the forced resume is not recorded"
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    env = dict(f["env"].attrs)
    forced = [k for k in env if k.startswith("forced_resume_after_round_")]
    assert len(forced) == 1 and "FNV-1a" in env[forced[0]] and env[forced[0]] != env["identity"], env
    assert len(f["metrics/round"]) == 100
PY
    ;;
  yaml_bombs)
    # Each is refused within seconds, with one line naming the file.
    # Nine mappings of nine, each naming the one before: 700 bytes that expand to 9^9 keys.
    "$PYTHON" - > "$WORK/bomb.yaml" <<'PY'
print("a: &a {" + ", ".join(f"x{i}: 1" for i in range(9)) + "}")
for prev, c in zip("abcdefg", "bcdefgh"):
    print(f"{c}: &{c} {{" + ", ".join(f"{prev}{i}: *{prev}" for i in range(9)) + "}")
print("i: {" + ", ".join(f"h{i}: *h" for i in range(9)) + "}")
PY
    [[ $(wc -c < "$WORK/bomb.yaml") -lt 1024 ]] || fail "the bomb is not small"
    run_expect 2 "bomb\.yaml: the YAML expands to more than 100000 nodes" -- timeout 20 "$FAX_RUN" run "$WORK/bomb.yaml"
    { cat "$WORK/bomb.yaml"; printf 'sweep:\n  grid:\n    algorithm.client_lr: [0.1, 0.2]\n'; } | write sweep_bomb.yaml
    run_expect 2 "sweep_bomb\.yaml: the YAML expands to more than 100000 nodes" -- \
      timeout 20 "$FAX_RUN" sweep "$WORK/sweep_bomb.yaml" -o "$WORK/sweep"
    # 10^5 keys (a minute of quadratic checks before): over the cap. Under it, keys are checked in
    # linear time (40000 keys: 80001 nodes).
    "$PYTHON" -c 'print("\n".join(f"k{i}: {i}" for i in range(100000)))' > "$WORK/wide.yaml"
    run_expect 2 "wide\.yaml: the YAML expands to more than 100000 nodes" -- timeout 20 "$FAX_RUN" run "$WORK/wide.yaml"
    "$PYTHON" -c 'print("\n".join(f"k{i % 20000}: {i}" for i in range(40000)))' > "$WORK/dups.yaml"
    run_expect 2 "dups\.yaml:20001:1: duplicate key 'k0' \(first set at .*dups\.yaml:1:1\)" -- timeout 20 "$FAX_RUN" run "$WORK/dups.yaml"
    "$PYTHON" -c 'print("rounds: " + "[" * 100000 + "]" * 100000)' > "$WORK/deep.yaml"
    run_expect 2 "deep\.yaml.*YAML syntax error" -- timeout 20 "$FAX_RUN" run "$WORK/deep.yaml"
    printf 'rounds: 3\n---\nrounds: 4\n' | write two.yaml
    run_expect 2 "two\.yaml: holds 2 YAML documents" -- "$FAX_RUN" run "$WORK/two.yaml" --dry-run
    mkdir -p "$WORK/dir.yaml"
    run_expect 2 "dir\.yaml: is a directory, not an experiment file" -- "$FAX_RUN" run "$WORK/dir.yaml"
    run_expect 2 "dir\.yaml: is a directory, not an experiment file" -- "$FAX_RUN" sweep "$WORK/dir.yaml"
    run_expect 2 "larger than 16 MiB" -- "$FAX_RUN" run /dev/zero --dry-run
    ;;
  plugin_faults)
    # A library that crashes when loaded: listed as refused, the others still listed; a mistyped
    # name lists what is there without loading anything; running it names it.
    run_expect 0 "" -- "$FAX_RUN" plugins --plugin-dir "$BAD_PLUGIN_DIR"
    grep -A1 "refused: .*fax_crash\.so" "$WORK/stdout" | grep -q "crashed while loading (signal 11" \
      || fail "plugins does not report the crashing library: $(cat "$WORK/stdout")"
    grep -q "^fedavg " "$WORK/stdout" && grep -q "^throwing " "$WORK/stdout" || fail "a crashing plugin hid the others"
    run_expect 2 "algorithm plugin 'fedavgg' not found: .*available: .*crash.*fedavg" -- \
      "$FAX_RUN" run "$experiment" --plugin-dir "$BAD_PLUGIN_DIR" --set algorithm.name=fedavgg
    run_expect 2 "plugin .*fax_crash\.so: crashed while loading \(signal 11\)" -- \
      "$FAX_RUN" run "$experiment" --plugin-dir "$BAD_PLUGIN_DIR" --set algorithm.name=crash
    # Exceptions of any type, from init (the main thread) or round (executor threads).
    printf 'rounds: 2\nalgorithm:\n  name: throwing\n' | write throwing.yaml
    for e in 1 2; do
      run_expect 2 "^fax-run: algorithm plugin 'throwing' \(.*fax_throwing\.so\) failed in round\(\): unknown exception$" -- \
        "$FAX_RUN" run "$WORK/throwing.yaml" -q -o "$WORK/t.h5" --plugin-dir "$BAD_PLUGIN_DIR" --set execution.executors=$e
    done
    run_expect 2 "^fax-run: algorithm plugin 'throwing' \(.*\) failed in init\(\): boom from the plugin$" -- \
      "$FAX_RUN" run "$WORK/throwing.yaml" -q -o "$WORK/t.h5" --plugin-dir "$BAD_PLUGIN_DIR" \
      --set algorithm.throw_in=init --set algorithm.throw_what=std
    ;;
  *)
    fail "unknown case $1"
    ;;
esac
echo "ok: $1"
