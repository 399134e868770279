#!/usr/bin/env bash
# fax-run tried as a careless or hostile user would: full disks, outputs that are inputs, a second
# writer, foreign or edited checkpoints, another plugin build, YAML bombs. One case per ctest test:
# robust_tests.sh <case>. Each case first makes the failure happen, then checks that fax refused
# it with one clear line (exit 2) and that nothing that existed before was lost.
# Environment: FAX_RUN, FAX_SOURCE_DIR, WORK, PYTHON (with h5py); FAX_SANITIZED=1 under the
# sanitizers (shorter rounds where a case only needs them to last some seconds).
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
      "$FAX_RUN" run "$experiment" -q -o "$WORK/disk/run.h5" --set rounds=500 --set logging.checkpoint_every=1 \
      --set logging.keep_checkpoints=0
    check_log "$WORK/disk/run.h5"
    ls -A "$WORK/disk" "$WORK/disk/run.h5.checkpoints" | grep '\.tmp-' >/dev/null && fail "temporary files left behind"
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
    "$FAX_RUN" run "$experiment" -q -o "$WORK/live.h5" --set rounds=100000 --set logging.checkpoint_every=1 \
      --set logging.keep_checkpoints=0 &
    live=$!
    workers+=("$live")
    for _ in $(seq 1 300); do [[ -n $(ls "$WORK/live.h5.checkpoints" 2>/dev/null) ]] && break; sleep 0.1; done
    run_expect 2 "live\.h5 is in use by fax-run run .*synthetic_fedavg\.yaml \(pid $live on .*\)" -- \
      "$FAX_RUN" run "$experiment" -q -o "$WORK/live.h5" --set rounds=2
    run_expect 2 "live\.h5 is in use by fax-run run" -- "$FAX_RUN" resume "$WORK/live.h5" -q
    # The same log through a link, its lock file, one of its checkpoints: none is a way around.
    ln -s "$WORK/live.h5" "$WORK/alias.h5"
    run_expect 2 "live\.h5 is in use by fax-run run" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/alias.h5" --set rounds=2
    run_expect 2 "live\.h5\.lock: exists and is not a fax run log" -- \
      "$FAX_RUN" run "$experiment" -q -o "$WORK/live.h5.lock" --set rounds=2
    checkpoint=$(ls "$WORK/live.h5.checkpoints" | head -1)
    run_expect 2 "$checkpoint: is named like a checkpoint file" -- \
      "$FAX_RUN" run "$experiment" -q -o "$WORK/live.h5.checkpoints/$checkpoint" --set rounds=2
    # Nor a new file under a checkpoint's name, which the live run's clean-up would take for its own.
    run_expect 2 "round-00999999-0123456789abcdef\.h5: is named like a checkpoint file" -- \
      "$FAX_RUN" run "$experiment" -q -o "$WORK/live.h5.checkpoints/round-00999999-0123456789abcdef.h5" --set rounds=2
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
    # A checkpoint folder that is a link to a shared one: replacing the run removes only its own
    # checkpoints and the replaced run's, never another run's or anyone's files.
    mkdir -p "$WORK/shared"
    echo precious > "$WORK/shared/notes.txt"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/other.h5" --set rounds=2 --set logging.checkpoint_every=1
    cp "$WORK/other.h5.checkpoints"/* "$WORK/shared/"
    ln -s "$WORK/shared" "$WORK/linked.h5.checkpoints"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/linked.h5" --set rounds=2 --set logging.checkpoint_every=1
    [[ $(cat "$WORK/shared/notes.txt") == precious ]] || fail "a file of the shared folder was removed"
    [[ $(ls "$WORK/shared" | wc -l) -eq 5 ]] || fail "the shared folder lost another run's checkpoints: $(ls "$WORK/shared")"
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
    run_expect 2 "two\.yaml: holds more than one YAML document" -- "$FAX_RUN" run "$WORK/two.yaml" --dry-run
    mkdir -p "$WORK/dir.yaml"
    run_expect 2 "dir\.yaml: is a directory; the experiment file must be a regular file" -- "$FAX_RUN" run "$WORK/dir.yaml"
    run_expect 2 "dir\.yaml: is a directory; the experiment file must be a regular file" -- "$FAX_RUN" sweep "$WORK/dir.yaml"
    truncate -s 17M "$WORK/huge.yaml"
    run_expect 2 "huge\.yaml: larger than 16 MiB" -- "$FAX_RUN" run "$WORK/huge.yaml" --dry-run
    # A FIFO would block for ever, a device never end.
    mkfifo "$WORK/fifo.yaml"
    run_expect 2 "fifo\.yaml: is not a regular file" -- timeout 20 "$FAX_RUN" run "$WORK/fifo.yaml" --dry-run
    run_expect 2 "/dev/zero: is not a regular file" -- timeout 20 "$FAX_RUN" run /dev/zero --dry-run
    run_expect 2 "fifo\.yaml: is not a regular file .*the token file" -- \
      timeout 20 "$FAX_RUN" worker --connect 127.0.0.1:1 --token-file "$WORK/fifo.yaml"
    ;;
  plugin_faults)
    # A library that crashes when loaded: listed as refused, the others still listed; a mistyped
    # name lists what is there without loading anything; running it names it.
    run_expect 0 "" -- "$FAX_RUN" plugins --plugin-dir "$BAD_PLUGIN_DIR"
    grep -A1 "refused: .*fax_crash\.so" "$WORK/stdout" | grep "crashed while loading (signal 11" >/dev/null \
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
    # A run failing in round 41 keeps the 40 rounds it finished, although rounds this short are
    # committed to the log only about once a second (and no checkpoint came in between).
    run_expect 2 "failed in round\(\): boom from the plugin$" -- "$FAX_RUN" run "$WORK/throwing.yaml" -q \
      -o "$WORK/late.h5" --plugin-dir "$BAD_PLUGIN_DIR" --set rounds=60 --set algorithm.throw_from_round=40 \
      --set algorithm.throw_what=std --set logging.checkpoint_every=0 --set logging.eval_every=0
    "$PYTHON" -c 'import sys, h5py; r = h5py.File(sys.argv[1])["metrics/round"][()]; assert list(r) == list(range(1, 41)), r' \
      "$WORK/late.h5" || fail "the failed run's log lost finished rounds"
    ;;
  malformed_logs)
    # Logs whose objects have the wrong type, shape or name: inspect, plot and resume refuse them
    # with one line naming the file and the object (before: LibTorch or stoll errors, exit 1).
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/good.h5" "${settings[@]}" --set logging.per_client=true
    "$PYTHON" - "$WORK" <<'PY'
import os, shutil, sys, h5py, numpy as np
work = sys.argv[1]
def rep(f, k, v):
    del f[k]
    f[k] = v
variants = {
    "round_float": lambda f: rep(f, "metrics/round", np.zeros(6)),
    "round_2d": lambda f: rep(f, "metrics/round", np.zeros((3, 2), dtype=np.int64)),
    "metric_short": lambda f: rep(f, "metrics/train/loss", np.zeros(2)),
    "metric_int": lambda f: rep(f, "metrics/train/loss", np.zeros(6, dtype=np.int32)),
    "checkpoint_name": lambda f: f["checkpoints"].move("2", "abc"),
    "checkpoint_huge": lambda f: f["checkpoints"].move("2", "99999999999999999999999"),
    "clients_short": lambda f: rep(f, "clients/train_loss", np.zeros((2, 10))),
    # Padding (-1, Poisson cohorts) only ends a row: a hole before an id is not the log's.
    "clients_hole": lambda f: f["clients/id"].write_direct(np.array([[-1]], dtype=np.int64), np.s_[0:1, 0:1], np.s_[0:1, 0:1]),
    "config_number": lambda f: rep(f, "config", 5),
}
for name, change in variants.items():
    os.makedirs(f"{work}/{name}")
    shutil.copy(f"{work}/good.h5", f"{work}/{name}/run.h5")
    shutil.copytree(f"{work}/good.h5.checkpoints", f"{work}/{name}/run.h5.checkpoints")
    with h5py.File(f"{work}/{name}/run.h5", "a") as f:
        change(f)
        # The links name good.h5's folder: point them at the copy's.
        for r in list(f.get("checkpoints", {})):
            link = f["checkpoints"].get(r, getlink=True)
            del f["checkpoints"][r]
            f["checkpoints"][r] = h5py.ExternalLink(link.filename.replace("good.h5", "run.h5"), "/")
PY
    expect_refused() {  # expect_refused <variant> <object regex> <commands...>
      local variant=$1 object=$2; shift 2
      for command in "$@"; do
        case $command in
          inspect) args=(inspect "$WORK/$variant/run.h5") ;;
          plot) args=(plot "$WORK/$variant/run.h5" --metric train/loss -o "$WORK/$variant/chart.svg") ;;
          resume) args=(resume "$WORK/$variant/run.h5" -q) ;;
        esac
        run_expect 2 "^fax-run: .*$variant/run\.h5: .*$object" -- "$FAX_RUN" "${args[@]}"
      done
    }
    expect_refused round_float "/metrics/round is not an int64 \[rounds\] dataset" inspect plot resume
    expect_refused round_2d "/metrics/round is not an int64 \[rounds\] dataset" inspect plot resume
    expect_refused metric_short "/metrics/train/loss has 2 rows for 6 rounds" inspect plot resume
    expect_refused metric_int "/metrics/train/loss is not a float64" inspect plot resume
    expect_refused checkpoint_name "/checkpoints/abc is not named after a round" inspect resume
    expect_refused checkpoint_huge "/checkpoints/9+ is not named after a round" inspect resume
    expect_refused clients_short "/clients/train_loss does not have the shape of /clients/id" resume
    expect_refused clients_hole "/clients/id row 1 holds ids below 0 other than its trailing padding" resume
    expect_refused config_number "" inspect plot resume
    ;;
  tampered_state)
    # A checkpoint whose state was edited (adaptive clipping's C, a parameter's shape, client states):
    # resume refuses it with one line naming the checkpoint and the value, before the log is touched.
    # (A NaN parameter is refused too: it would stop the run a round later, after the log was cut back.)
    adaptive=(--set aggregation.stages=clip --set aggregation.clip.adaptive=true --set aggregation.clip.norm=0.1)
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/good.h5" "${settings[@]}" "${adaptive[@]}"
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/feedback.h5" "${settings[@]}" --set aggregation.stages=top_k \
      --set aggregation.top_k.fraction=0.1 --set aggregation.top_k.error_feedback=true
    # dp_fedavg keeps its adaptive C as its own state (Algorithm::check_state).
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/dp.h5" "${settings[@]}" --set algorithm.name=dp_fedavg \
      --set algorithm.adaptive_clipping=true --set algorithm.count_noise=1
    # The simulated clock's time (clock/now_us) travels with the state.
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/clock.h5" "${settings[@]}" \
      --set clients.speed.distribution=lognormal --set cohort.deadline_s=2
    # Asynchronous training keeps the model versions clients in flight started from (async/v<N>/).
    run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/async.h5" "${settings[@]}" --set algorithm.name=fedbuff \
      --set clients.speed.distribution=lognormal --set clients.speed.sigma=1 --set cohort.size=4 --set cohort.concurrency=20
    "$PYTHON" - "$WORK" <<'PY'
import os, shutil, sys, h5py, numpy as np
work = sys.argv[1]
state = "extra/aggregation/clip/norm"
def rep(f, v):
    del f[state]
    f[state] = v
def leaves(f, names):
    f.attrs["leaves"] = "\n".join(names)
variants = {
    "negative": lambda f: rep(f, -1.0),
    "nan": lambda f: rep(f, np.nan),
    "vector": lambda f: rep(f, np.ones(2)),
    "missing": lambda f: (f.__delitem__(state), leaves(f, ["params/w", "params/b"])),
    "unknown": lambda f: (f.create_dataset("extra/aggregation/other", data=1.0),
                          leaves(f, ["params/w", "params/b", state, "extra/aggregation/other"])),
    # Another model's parameters: refused before a plugin's round fails on them.
    "params": lambda f: (f.__delitem__("params/w"), f.create_dataset("params/w", data=np.ones((3, 2)))),
    "nanparams": lambda f: f["params/w"].write_direct(np.full(f["params/w"].shape, np.nan, np.float32)),
}
def edit_ids(f, change):
    ids = f["client_states/id"][()]
    change(ids)
    del f["client_states/id"]
    f["client_states/id"] = ids
# Client states (error feedback's residuals): rows of another shape, ids outside the population,
# an id twice.
residual = "client_states/aggregation/error/w"
feedback = {
    "rows": lambda f: (f.__delitem__(residual), f.create_dataset(residual, data=np.ones((len(f["client_states/id"]), 3), np.float32))),
    "rowtype": lambda f: (lambda rows: (f.__delitem__(residual), f.create_dataset(residual, data=rows.astype(np.float64))))(f[residual][()]),
    "ids": lambda f: edit_ids(f, lambda ids: ids.__setitem__(0, 100)),
    "twice": lambda f: edit_ids(f, lambda ids: ids.__setitem__(1, ids[0])),
}
def rep_dp(f, v):
    del f["extra/clip/norm"]
    f["extra/clip/norm"] = v
dp = {"dpclip": lambda f: rep_dp(f, 0.0)}
def rep_now(f, v):
    del f["clock/now_us"]
    f["clock/now_us"] = v
clock = {
    "clocknegative": lambda f: rep_now(f, np.int64(-5)),
    "clockhuge": lambda f: rep_now(f, np.int64(2**63 - 808)),
    "clocktype": lambda f: rep_now(f, 1.5),
    "clockmissing": lambda f: (f.__delitem__("clock/now_us"),
                               leaves(f, [n for n in f.attrs["leaves"].split("\n") if n != "clock/now_us"])),
}
# A clock's time in the checkpoint of a run without one.
noclock = {"clockextra": lambda f: (f.create_dataset("clock/now_us", data=np.int64(7)),
                                    leaves(f, f.attrs["leaves"].split("\n") + ["clock/now_us"]))}
def first_version(f):
    return "async/" + sorted(f["async"], key=lambda v: int(v[1:]))[0]
def drop_version(f):
    v = first_version(f)
    del f[v]
    leaves(f, [n for n in f.attrs["leaves"].split("\n") if not n.startswith(v + "/")])
def add_leaf(f, name, value):
    f.create_dataset(name, data=value)
    leaves(f, f.attrs["leaves"].split("\n") + [name])
asynchronous = {
    "asyncmissing": drop_version,
    "asyncnow": lambda f: rep_now(f, f["clock/now_us"][()] + 1),
    "asyncnan": lambda f: f[first_version(f) + "/w"].write_direct(np.full(f["params/w"].shape, np.nan, np.float32)),
    "asyncname": lambda f: add_leaf(f, "async/x/w", f["params/w"][()]),
}
# Versions in the checkpoint of a synchronous run.
noasync = {"asyncextra": lambda f: add_leaf(f, "async/v0/w", f["params/w"][()])}
for base, edits in (("good", variants), ("feedback", feedback), ("dp", dp), ("clock", clock), ("good", noclock),
                    ("async", asynchronous), ("good", noasync)):
  for name, change in edits.items():
    os.makedirs(f"{work}/{name}")
    shutil.copy(f"{work}/{base}.h5", f"{work}/{name}/run.h5")
    shutil.copytree(f"{work}/{base}.h5.checkpoints", f"{work}/{name}/run.h5.checkpoints")
    with h5py.File(f"{work}/{name}/run.h5", "a") as f:
        for r in list(f["checkpoints"]):
            link = f["checkpoints"].get(r, getlink=True)
            del f["checkpoints"][r]
            f["checkpoints"][r] = h5py.ExternalLink(link.filename.replace(f"{base}.h5", "run.h5"), "/")
    last = sorted(os.listdir(f"{work}/{name}/run.h5.checkpoints"))[-1]
    with h5py.File(f"{work}/{name}/run.h5.checkpoints/{last}", "a") as f:
        change(f)
PY
    for variant in negative:"is -1; it must be finite and positive" nan:"is nan; it must be finite and positive" \
                   vector:"extra/aggregation/clip/norm is a Double tensor of shape \[2\]; this experiment keeps a Double of shape \[\]" \
                   missing:"lacks extra/aggregation/clip/norm, which this experiment keeps" \
                   unknown:"has extra/aggregation/other, which this experiment does not keep" \
                   params:"params/w is a Double tensor of shape \[3, 2\]; this experiment keeps a Float of shape \[[0-9, ]+\]" \
                   nanparams:"params/w holds NaN or infinite values" \
                   rows:"client_states/aggregation/error/w has Float rows of shape \[3\]; parameter w is a Float of shape \[[0-9, ]+\]" \
                   rowtype:"client_states/aggregation/error/w has Double rows of shape \[[0-9, ]+\]; parameter w is a Float" \
                   ids:"client_states/id holds ids outside the population's 0\.\.[0-9]+" twice:"client_states/id names a client twice" \
                   dpclip:"dp_fedavg's adaptive clip norm \(extra/clip/norm\) is 0; it must be finite and positive" \
                   clocknegative:"clock/now_us \(-5\) is not in \[0, 4611686018427387904\]" \
                   clockhuge:"clock/now_us \(9223372036854775000\) is not in \[0, 4611686018427387904\]" \
                   clocktype:"clock/now_us is a Double tensor of shape \[\]; this experiment keeps a Long of shape \[\]" \
                   clockmissing:"the state lacks clock/now_us, which this experiment keeps" \
                   clockextra:"the checkpoint holds a simulated time \(clock/\) but this experiment has no simulated clock" \
                   asyncmissing:"the checkpoint keeps model versions \[[0-9, ]*\]; the clients in flight after server step 6 started from \[[0-9, ]+\]" \
                   asyncnow:"clock/now_us \([0-9]+\) is not the simulated time after 6 server steps \([0-9]+\)" \
                   asyncnan:"async/v[0-9]+/w holds NaN or infinite values" \
                   asyncname:"the state has async/x/w, which this experiment does not keep" \
                   asyncextra:"the checkpoint holds model versions \(async/\) of asynchronous training, but algorithm fedavg is synchronous"; do
      name=${variant%%:*}
      before=$(digest_run "$WORK/$name/run.h5")
      run_expect 2 "^fax-run: .*$name/run\.h5: the checkpoint of round 6: .*${variant#*:}" -- \
        "$FAX_RUN" resume "$WORK/$name/run.h5" -q
      [[ $(digest_run "$WORK/$name/run.h5") == "$before" ]] || fail "$name: a refused resume changed the run's files"
    done
    ;;
  resource_limits)
    # Sizes that cannot fit are refused before anything is allocated: one line, exit 2, in seconds.
    for setting in "model.name=mlp --set model.hidden=100000000,100000000" "data.clients=1000000000" \
                   "algorithm.batch_size=1000000000" "data.dimension=100000000" "data.dimension=4611686018427387903" \
                   "data.classes=9223372036854775807" "algorithm.local_epochs=9223372036854775807"; do
      read -ra extra <<< "--set $setting"
      run_expect 2 "the run needs .* of memory \(data .*, model .*, local training .*\), but this host has .* available; .*--force runs it anyway" -- \
        timeout 20 "$FAX_RUN" run "$experiment" -q -o "$WORK/big.h5" --set rounds=1 "${extra[@]}"
    done
    [[ -e $WORK/big.h5 ]] && fail "a refused run wrote its log"
    # A robust aggregator gathers the whole cohort's updates to every executor: 100 clients of a
    # 14M-parameter MLP (one client per chunk) are counted, and refused.
    { cat "$experiment"; echo "aggregation: [median]"; } > "$WORK/median.yaml"
    run_expect 2 "the run needs .* of memory \(data .*, model .*, local training .*\), but this host has .* available" -- \
      timeout 20 "$FAX_RUN" run "$WORK/median.yaml" -q -o "$WORK/big.h5" --set rounds=1 --set model.name=mlp \
      --set model.hidden=200000 --set execution.vectorize=1 --set cohort.size=100 --set data.clients=100
    run_expect 2 "the run would start 100000 threads \(execution.executors x execution.threads\) on a host with [0-9]+ hardware threads" -- \
      timeout 20 "$FAX_RUN" run "$experiment" -q -o "$WORK/threads.h5" --set execution.threads=100000
    # --force runs it (80 executor threads are plenty for 80 one-client shards) and the log says so.
    many=(--set rounds=1 --set cohort.size=80 --set execution.logical_shards=80 --set execution.executors=80)
    run_expect 2 "would start 80 threads" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/many.h5" "${many[@]}"
    "$FAX_RUN" run "$experiment" -q -o "$WORK/many.h5" "${many[@]}" --force 2> "$WORK/force.err" || fail "--force: $(cat "$WORK/force.err")"
    grep -q "would start 80 threads.*(--force: running anyway)" "$WORK/force.err" || fail "no warning: $(cat "$WORK/force.err")"
    "$PYTHON" -c 'import sys, h5py; assert "80 threads" in h5py.File(sys.argv[1])["env"].attrs["forced_resources"]' "$WORK/many.h5" \
      || fail "the forced run is not recorded in its log"
    # Past the estimate (forced, and a small address space): running out of memory is one line, exit 2.
    # Not under AddressSanitizer, whose shadow memory needs more address space than any such limit
    # and whose allocator aborts on a failed allocation instead of reporting it.
    # (ldd's output captured whole: `ldd | grep -q` under pipefail fails when grep exits first.)
    if [[ $(ldd "$FAX_RUN") == *libasan* ]]; then
      echo "skipped the out-of-memory step: AddressSanitizer build"
    else
      run_expect 2 "^fax-run: out of memory: .*the run needs more memory than this host gives it" -- \
        bash -c "ulimit -v 4000000; exec \"\$0\" \"\$@\"" "$FAX_RUN" run "$experiment" -q -o "$WORK/oom.h5" \
        --set rounds=1 --set data.dimension=100000000 --force
    fi
    # A sweep grid of 10^20 trials is counted, not built.
    "$PYTHON" - "$WORK/grid.yaml" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("rounds: 1\nsweep:\n  grid:\n")
    for i in range(20):
        f.write(f"    seed{i}: [" + ", ".join(str(v) for v in range(10)) + "]\n")
PY
    run_expect 2 "the sweep has more than 10\^19 trials, more than the 100000 fax-run sweep runs" -- \
      timeout 20 "$FAX_RUN" sweep "$WORK/grid.yaml" -o "$WORK/grid.sweep" --dry-run
    ;;
  sigterm_mid_round)
    # Rounds of several seconds.
    epochs=$(lasting 150)
    # Stopped in round 1 of a new log: nothing was completed, and it says so.
    "$FAX_RUN" run "$experiment" -q -o "$WORK/first.h5" --set rounds=3 --set algorithm.local_epochs=$epochs 2> "$WORK/first.err" &
    pid=$!
    workers+=("$pid")
    for _ in $(seq 1 300); do [[ -e $WORK/first.h5 ]] && break; sleep 0.1; done
    sleep 0.5
    kill -TERM "$pid"
    wait "$pid"
    [[ $? -eq 143 ]] || fail "SIGTERM in round 1: $(cat "$WORK/first.err")"
    grep -q "stopped by signal 15 in round 1 of 3; no round was completed; nothing to resume: run it again" "$WORK/first.err" \
      || fail "SIGTERM in round 1: $(cat "$WORK/first.err")"
    # Rounds of several seconds: SIGTERM in the middle of round 2 stops the run
    # within a local step, checkpoints round 1, and the resumed run ends bit-identical to one that
    # was never stopped (one executor, and two, whose collectives are released).
    for executors in 1 2; do
      long=(--set rounds=3 --set algorithm.local_epochs=$epochs --set logging.checkpoint_every=0
            --set execution.executors=$executors --set execution.logical_shards=2)
      run_expect 0 "" -- "$FAX_RUN" run "$experiment" -q -o "$WORK/reference$executors.h5" "${long[@]}"
      log="$WORK/stopped$executors.h5"
      "$FAX_RUN" run "$experiment" -q -o "$log" "${long[@]}" 2> "$WORK/stop.err" &
      pid=$!
      workers+=("$pid")
      for _ in $(seq 1 600); do
        [[ $("$PYTHON" -c 'import sys, h5py; print(len(h5py.File(sys.argv[1])["metrics/round"]))' "$log" 2>/dev/null) == 1 ]] && break
        sleep 0.1
      done
      sleep 1
      kill -TERM "$pid"
      start=$SECONDS
      wait "$pid"
      status=$?
      (( SECONDS - start <= 3 )) || fail "SIGTERM mid-round took $((SECONDS - start)) s to stop the run"
      [[ $status -eq 143 ]] || fail "exit status $status: $(cat "$WORK/stop.err")"
      grep -q "stopped by signal 15 after round 1 of 3; the state is checkpointed" "$WORK/stop.err" \
        || fail "unexpected message: $(cat "$WORK/stop.err")"
      check_log "$log" 1
      run_expect 0 "" -- "$FAX_RUN" resume "$log" -q
      "$PYTHON" "$FAX_SOURCE_DIR/tests/cli/same_runs.py" "$WORK/reference$executors.h5" "$log" 3 \
        || fail "the resumed run differs from the uninterrupted one ($executors executors)"
    done
    ;;
  remote_hostile)
    # Garbage, an HTTP request, a huge length, bare connect-and-close, a hello that never
    # authenticates and 300 silent connections at a coordinator: it drops each of them alone (the
    # silent ones within the handshake timeout), keeps its file descriptors, and the run completes
    # with a real worker.
    echo "token-$RANDOM" > "$WORK/token"
    port=$(free_port)
    "$FAX_RUN" run "$experiment" -o "$WORK/run.h5" --set rounds=5 --workers 1 --listen "127.0.0.1:$port" \
      --token-file "$WORK/token" --handshake-timeout 2 "${collectives[@]}" > "$WORK/coordinator.log" 2>&1 &
    coordinator=$!
    workers+=("$coordinator")
    wait_for_line "$WORK/coordinator.log" "waiting for workers" 30
    fds_before=$(ls /proc/$coordinator/fd | wc -l)
    "$PYTHON" - "$port" "$FAX_SOURCE_DIR/tests/fuzz/corpus/listener/hello" <<'PY' || fail "hostile client"
import os, socket, sys, time
port, hello = int(sys.argv[1]), open(sys.argv[2], "rb").read()
def connection(payload=b"", half_close=True):
    s = socket.create_connection(("127.0.0.1", port))
    try:  # the coordinator may hang up before all is sent: that is what is asked of it
        s.sendall(payload)
        if half_close:
            s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    return s
def closed_within(s, seconds):
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return True
    except (socket.timeout, TimeoutError):
        return False
    except OSError:
        return True
for payload in [b"GET / HTTP/1.1\r\nHost: coordinator\r\n\r\n", os.urandom(64), b"\xff" * 8 + b"tail", b""]:
    s = connection(payload)
    assert closed_within(s, 5), payload
    s.close()
for _ in range(20):
    socket.create_connection(("127.0.0.1", port)).close()
# A TensorPipe hello that never goes on to authenticate, and silent connections: closed by the
# coordinator after the handshake timeout (2 s), not kept.
quiet = [connection(hello, half_close=False)] + [connection(half_close=False) for _ in range(300)]
start = time.time()
assert all(closed_within(s, 8 - (time.time() - start)) for s in quiet), "a silent connection was kept"
print(f"hostile client: all closed within {time.time() - start:.1f} s")
PY
    sleep 0.5
    fds_after=$(ls /proc/$coordinator/fd | wc -l)
    (( fds_after <= fds_before + 2 )) || fail "the coordinator holds $fds_after descriptors, $fds_before before"
    grep -q "did not say hello within 2 s" "$WORK/coordinator.log" || fail "the silent hello was not closed: $(cat "$WORK/coordinator.log")"
    start_worker worker.log
    wait "$coordinator" || fail "the coordinator failed: $(tail -5 "$WORK/coordinator.log")"
    check_log "$WORK/run.h5" 5
    ;;
  *)
    fail "unknown case $1"
    ;;
esac
echo "ok: $1"
