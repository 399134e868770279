#!/usr/bin/env bash
# Copies what a sweep has finished to another folder, without checkpoints or locks: the index
# (sweep.h5) and the log and output of every done or failed trial. For a sweep that outlives its
# machine: harvest into a repository, and later continue the copy with the same
# `fax-run sweep EXPERIMENT.yaml -o COPY` (its cut-off trials start again from round 0, and
# --retry-failed runs a failed one again from round 0, as their checkpoints stayed behind).
#
#   scripts/sweep-harvest.sh SWEEP_DIR DEST_DIR
#
# Safe while the sweep runs: the index is read once (fax-run replaces it whole) and only the trials
# it lists as ended are taken. Every file is copied beside its target, compared with its source,
# fsynced, and renamed only once all are; the index goes last. DEST must be new or hold an earlier
# harvest of the same sweep (refused otherwise: other trials or --set, or a trial done there that
# is not done in SWEEP_DIR); files of trials the index does not list as ended are removed from it.
# Needs Python with h5py (PYTHON, default /usr/bin/python3: Debian's, which has it).
set -euo pipefail

die() { echo "$0: $*" >&2; exit 1; }
if [[ $# -ne 2 || ! -f $1/sweep.h5 ]]; then
  echo "usage: $0 SWEEP_DIR DEST_DIR (SWEEP_DIR must hold sweep.h5)" >&2
  exit 2
fi
src=$1 dst=$2
python=${PYTHON:-/usr/bin/python3}
mkdir -p -- "$dst"
[[ $(cd -- "$src" && pwd -P) != $(cd -- "$dst" && pwd -P) ]] || die "$src and $dst are one folder"
# A sweep's own folder holds checkpoints and its lock; a harvest holds neither.
[[ ! -e $dst/sweep.lock ]] || die "$dst is a sweep's own folder (it has sweep.lock), not a harvest"
[[ -e $dst/sweep.h5 ]] || ! compgen -G "$dst/trial-*" > /dev/null || die "$dst holds trial files but no sweep.h5"

# Staged copies: temporary files in DEST (removed on any exit until renamed) and their names.
tmps=() names=()
trap 'rm -f -- "${tmps[@]}"' EXIT
stage() {  # stage SOURCE NAME: a verified, fsynced copy of SOURCE beside DEST/NAME
  local tmp
  tmp=$(mktemp -- "$dst/.harvest.XXXXXX") || die "cannot create a file in $dst"
  tmps+=("$tmp") names+=("$2")
  cp -- "$1" "$tmp" || die "cannot copy $1 to $dst"
  cmp -s -- "$1" "$tmp" || die "the copy of $1 differs from it"
  chmod 644 -- "$tmp" || die "cannot write $tmp"
  sync -- "$tmp" || die "cannot write $tmp"
}

stage "$src/sweep.h5" sweep.h5
# The trials ("NAME STATUS" lines); refuses to mix two sweeps or to go back in time.
ended=$("$python" - "${tmps[0]}" "$dst/sweep.h5" "$src/sweep.h5" <<'PY'
import os, re, sys, h5py
def read(path, shown):
    try:
        with h5py.File(path, "r") as f:
            names = [n.decode() for n in f["trials/name"][()]]
            status = [s.decode() for s in f["trials/status"][()]]
            # What fax-run sweep holds fixed on resume (the experiment's text may change in comments).
            settings = (f["sweep/base"][()], names, list(f["trials/overrides"][()]))
    except (OSError, KeyError, AttributeError, TypeError, ValueError) as e:
        sys.exit(f"{shown}: not a readable sweep index ({e})")
    if len(names) != len(status):
        sys.exit(f"{shown}: not a sweep index ({len(names)} trial names, {len(status)} statuses)")
    for n, s in zip(names, status):
        if not re.fullmatch(r"trial-[0-9]{4,}", n) or s not in ("pending", "running", "done", "failed"):
            sys.exit(f"{shown}: not a sweep index (trial '{n}', status '{s}')")
    return settings, dict(zip(names, status))
new, status = read(sys.argv[1], sys.argv[3])
if os.path.exists(sys.argv[2]):
    old, before = read(sys.argv[2], sys.argv[2])
    if old != new:
        sys.exit(f"{sys.argv[2]} indexes another sweep (other --set or trials); harvest into a new folder")
    back = [n for n, s in before.items() if s == "done" and status[n] != "done"]
    if back:
        sys.exit(f"{sys.argv[2]} is ahead of the sweep: {back[0]} is done there, not in it")
for n, s in status.items():
    if s in ("done", "failed"):
        print(n, s)
PY
) || exit 1

# A done trial's log and output; a failed one's where it wrote them (its log up to the failure, its
# output with the error).
keep=() n_done=0 n_failed=0
while read -r trial status; do
  case $status in
    done) n_done=$((n_done + 1)) ;;
    failed) n_failed=$((n_failed + 1)) ;;
    *) continue ;;
  esac
  for file in "$trial.h5" "$trial.log"; do
    if [[ ! -f $src/$file ]]; then
      [[ $file == *.log || $status == failed ]] && continue
      die "$src/$file is missing, yet the index says $trial is done"
    fi
    keep+=("$file")
    cmp -s -- "$src/$file" "$dst/$file" || stage "$src/$file" "$file"
  done
done <<< "$ended"

# The trials' files, then the index.
for ((i = ${#tmps[@]} - 1; i >= 0; i--)); do
  mv -- "${tmps[i]}" "$dst/${names[i]}" || die "cannot rename into $dst"
done
tmps=()
# What an interrupted earlier harvest or a retried failed trial left behind.
for f in "$dst"/trial-*; do
  [[ -e $f ]] || continue
  printf '%s\n' "${keep[@]}" | grep -qxF -- "${f##*/}" || rm -rf -- "$f"
done
sync -- "$dst"
echo "sweep-harvest: $n_done done and $n_failed failed trials in $src; $((${#names[@]} - 1)) files copied to $dst"
