#!/usr/bin/env bash
# Copies what a sweep has finished to another folder, without checkpoints or locks: the index
# (sweep.h5) and the log and output of every trial it lists as done or failed. For a sweep that
# outlives its machine: harvest into a repository, and later continue the copy with the same
# `fax-run sweep EXPERIMENT.yaml -o COPY` (its cut-off trials start again from round 0).
#
#   scripts/sweep-harvest.sh SWEEP_DIR DEST_DIR
#
# Safe while the sweep runs: the index is read once (fax-run replaces it whole), only the trials
# it lists as ended are taken (their files no longer change), and the index goes last, so DEST
# never lists a trial whose log is missing. Each file is copied beside its target and renamed.
# Needs Python with h5py (PYTHON, default /usr/bin/python3: Debian's, which has it).
set -euo pipefail

if [[ $# -ne 2 || ! -f $1/sweep.h5 ]]; then
  echo "usage: $0 SWEEP_DIR DEST_DIR (SWEEP_DIR must hold sweep.h5)" >&2
  exit 2
fi
src=$1 dst=$2
python=${PYTHON:-/usr/bin/python3}
mkdir -p "$dst"
[[ $(cd "$src" && pwd -P) != $(cd "$dst" && pwd -P) ]] || { echo "$0: $src and $dst are one folder" >&2; exit 2; }

index=$(mktemp "$dst/.sweep.h5.XXXXXX")
trap 'rm -f "$index" "$dst"/.harvest.*' EXIT
cp "$src/sweep.h5" "$index"
# Refuses to mix two sweeps: a DEST index must list the same trials with the same settings.
ended=$("$python" - "$index" "$dst/sweep.h5" <<'PY'
import os, sys, h5py
def trials(path):
    with h5py.File(path, "r") as f:
        return list(f["trials/name"][()]), list(f["trials/overrides"][()])
if os.path.exists(sys.argv[2]) and trials(sys.argv[1]) != trials(sys.argv[2]):
    sys.exit(f"{sys.argv[2]} indexes another sweep (other trials or settings); harvest into a new folder")
with h5py.File(sys.argv[1], "r") as f:
    for name, status in zip(f["trials/name"][()], f["trials/status"][()]):
        if status in (b"done", b"failed"):
            print(name.decode(), status.decode())
PY
)

# A done trial has its log; a failed one may have failed before writing any.
copied=0 count=0
while read -r trial status; do
  [[ -n $trial ]] || continue
  count=$((count + 1))
  for file in "$trial.h5" "$trial.log"; do
    if [[ ! -f $src/$file ]]; then
      [[ $status == failed || $file == *.log ]] && continue
      echo "$0: $src/$file is missing, yet the index says $trial is done" >&2
      exit 1
    fi
    if ! cmp -s "$src/$file" "$dst/$file"; then
      tmp=$(mktemp "$dst/.harvest.XXXXXX")
      cp "$src/$file" "$tmp" && sync "$tmp" && mv "$tmp" "$dst/$file"
      copied=$((copied + 1))
    fi
  done
done <<< "$ended"
sync "$index" && mv "$index" "$dst/sweep.h5"
echo "sweep-harvest: $count trials ended in $src; $copied files copied to $dst"
