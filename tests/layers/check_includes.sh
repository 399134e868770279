#!/usr/bin/env bash
# The arrows inside libfax_core, which one library cannot enforce by linking: base includes only
# base, spmd and nn only base and themselves, train any of core. Also: nothing in core includes a
# header of io, runtime, tools or datasets, and <fax/fax.h> reaches only core.
# Usage: check_includes.sh <source dir>
set -euo pipefail
src=$1
fail=0

# check <group> <allowed groups regex>
check() {
  local group=$1 allowed=$2 hits
  hits=$(grep -HnE '#include <fax/' "$src/core/include/fax/$group" "$src/core/src/$group" -r |
    grep -vE "#include <fax/($allowed)/" || true)
  if [ -n "$hits" ]; then
    echo "FAIL: $group includes outside ($allowed):"
    echo "$hits"
    fail=1
  else
    echo "ok: $group includes only ($allowed)"
  fi
}

check base 'base'
check spmd 'base|spmd'
check nn 'base|nn'
check train 'base|spmd|nn|train'

umbrella=$(grep -hE '#include <fax/' "$src"/core/include/fax/*.h | grep -vE '#include <fax/(base|spmd|nn|train)(/|\.h)' || true)
if [ -n "$umbrella" ]; then
  echo "FAIL: core's umbrella headers include $umbrella"
  fail=1
else
  echo "ok: the umbrella headers reach only core"
fi
exit "$fail"
