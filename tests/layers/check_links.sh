#!/usr/bin/env bash
# The layers' link arrows, read from the built libraries: libfax_core and every plugin need none of
# yaml-cpp, HDF5, TensorPipe, Gloo or fax's upper layers; each upper layer needs only those under
# it. `ldd` of a plugin may still list HDF5, TensorPipe and Gloo, but only because Debian's
# libtorch_cpu needs them: the check proves every such entry comes from LibTorch.
# Usage: check_links.sh <build dir> <plugin dir>
set -euo pipefail
build=$1
plugins=$2
fail=0

needed() {
  [ -f "$1" ] || { echo "FAIL: $1 is missing" >&2; exit 1; }
  readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}

# refuse <library> <pattern>: the library must not need anything matching the extended regex.
refuse() {
  local all hits
  all=$(needed "$1")
  hits=$(grep -E "$2" <<<"$all" || true)
  if [ -n "$hits" ]; then
    echo "FAIL: $(basename "$1") needs $(echo "$hits" | tr '\n' ' ')"
    fail=1
  else
    echo "ok: $(basename "$1") needs nothing matching $2"
  fi
}

external='yaml-cpp|hdf5|tensorpipe|gloo|libuv'
refuse "$build/core/libfax_core.so" "$external|libfax_"
refuse "$build/io/libfax_io.so" 'tensorpipe|gloo|libuv|libfax_(runtime|tools|datasets)'
refuse "$build/datasets/libfax_datasets.so" 'yaml-cpp|tensorpipe|gloo|libuv|libfax_(runtime|tools)'
refuse "$build/tools/libfax_tools.so" 'tensorpipe|gloo|libuv|libfax_(runtime|datasets)'
refuse "$build/runtime/libfax_runtime.so" 'libfax_(tools|datasets)'

shopt -s nullglob
found=0
torch_libs=$(ldd "$build/core/libfax_core.so" | awk '/libtorch_cpu/ {print $3}')
from_torch=$(ldd "$torch_libs" | awk '{print $1}' | grep -E "$external" || true)
for plugin in "$plugins"/fax_*.so; do
  found=1
  refuse "$plugin" "$external|libfax_(io|runtime|tools|datasets)"
  for lib in $(ldd "$plugin" | awk '{print $1}' | grep -E "$external" || true); do
    if ! grep -qx "$lib" <<<"$from_torch"; then
      echo "FAIL: $(basename "$plugin") loads $lib, and not through libtorch_cpu"
      fail=1
    fi
  done
done
if [ "$found" = 0 ]; then
  echo "FAIL: no plugin in $plugins"
  exit 1
fi
exit "$fail"
