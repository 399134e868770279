#!/usr/bin/env bash
# fax builds on aarch64 (Graviton, Apple silicon under Linux), not only on x86: the sources that
# hold instruction-set code, and the tests of it, must compile for it, with Debian's cross compiler
# (g++-aarch64-linux-gnu): its own C and C++ headers first, then the host's for LibTorch's, fmt's
# and gtest's, which are the same on both architectures. Library sources compile to objects at
# -O2 (code generation included: target attributes, intrinsics); tests, whose code is not at issue,
# only to their syntax (half the time). Nothing links: the host has no aarch64 LibTorch.
# Usage: check_aarch64.sh <source dir> <build dir> <files relative to the source dir...>
set -euo pipefail
src=$1 build=$2
shift 2
cxx=$(command -v aarch64-linux-gnu-g++ || true)
if [ -z "$cxx" ]; then
  echo "FAIL: aarch64-linux-gnu-g++ not found (scripts/install-deps.sh installs g++-aarch64-linux-gnu)"
  exit 1
fi
fail=0
for f in "$@"; do
  mode=(-c -O2 -o /dev/null)
  [[ $f == tests/* ]] && mode=(-fsyntax-only)
  if "$cxx" -std=c++17 "${mode[@]}" -Wall -Wextra -DFMT_SHARED -I"$src/core/include" -I"$build/core/include" \
      -I"$src/core/src/nn/kernels" -I"$src/tests/core" -isystem /usr/include/torch/csrc/api/include \
      -idirafter /usr/include "$src/$f"; then
    echo "ok: $f"
  else
    echo "FAIL: $f does not compile for aarch64"
    fail=1
  fi
done
exit $fail
