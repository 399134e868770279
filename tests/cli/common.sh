# Shared by the end-to-end scripts (sourced): failing, expected exits, scratch files, remote workers.
# Environment: FAX_RUN (the binary), FAX_SOURCE_DIR, WORK (a scratch directory), PYTHON (with h5py).
fail() { echo "FAIL: $*" >&2; exit 1; }

# run_expect <exit code> <stderr regex> -- command...: checks the exit code and that stderr is one
# line matching the regex.
run_expect() {
  local code=$1 pattern=$2; shift 3
  local err out rc
  out=$("$@" 2>"$WORK/stderr"); rc=$?
  err=$(cat "$WORK/stderr")
  [[ $rc -eq $code ]] || fail "'$*' exited $rc, expected $code; stderr: $err"
  if [[ -n $pattern ]]; then
    [[ $(printf '%s\n' "$err" | wc -l) -eq 1 ]] || fail "stderr is not one line: $err"
    [[ $err =~ $pattern ]] || fail "stderr '$err' does not match /$pattern/"
  fi
  printf '%s' "$out" > "$WORK/stdout"
}

experiment="$FAX_SOURCE_DIR/experiments/synthetic_fedavg.yaml"
mkdir -p "$WORK"

write() { cat > "$WORK/$1"; }

# harvest_to <exit code> <stderr regex> SWEEP_DIR DEST_DIR: scripts/sweep-harvest.sh, as run_expect.
harvest_to() { PYTHON="$PYTHON" run_expect "$1" "$2" -- "$FAX_SOURCE_DIR/scripts/sweep-harvest.sh" "$3" "$4"; }

# Remote workers: where their allreduces go (the cases remote_* run once per backend: ctest sets
# FAX_COLLECTIVES), a free loopback port, workers in the background (their pids in $workers),
# waiting for a line in a log.
collectives=(--collectives "${FAX_COLLECTIVES:-tensorpipe}")
# A count that only makes a case last some seconds: a third of it under the sanitizers, which run
# 3-4x slower (FAX_SANITIZED=1, set by tests/cli/CMakeLists.txt).
lasting() { echo $(( ${FAX_SANITIZED:-0} ? $1 / 3 : $1 )); }
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
workers=()
start_worker() {  # start_worker <log> [args...]
  local log=$1; shift
  "$FAX_RUN" worker --connect "127.0.0.1:$port" --token-file "$WORK/token" "$@" > "$WORK/$log" 2>&1 &
  workers+=($!)
}
namespaces=()
cleanup() {
  # Only processes still this script's children: a pid already waited for may belong to another
  # test's process by now (pids wrap around at 32768 here).
  for pid in "${workers[@]}"; do
    [[ $(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ') == "$$" ]] || continue
    kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null
  done
  for ns in "${namespaces[@]}"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -9; ip netns del "$ns"; done
}
trap cleanup EXIT
wait_for_line() {  # wait_for_line <file> <regex> <seconds>
  local deadline=$((SECONDS + $3))
  until grep -Eq "$2" "$1" 2>/dev/null; do
    (( SECONDS < deadline )) || fail "no line /$2/ in $1 within $3 s: $(tail -5 "$1")"
    sleep 0.1
  done
}

