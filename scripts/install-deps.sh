#!/usr/bin/env bash
# Installs the Debian packages fax builds and tests with. Idempotent: when every package is
# already installed it changes nothing and does not touch the network.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-openmp libdnnl-dev
  libtensorpipe-dev libgloo-dev libyaml-cpp-dev libfmt-dev libcli11-dev
  libhdf5-dev libgtest-dev zlib1g-dev libgoogle-perftools-dev nlohmann-json3-dev
  dataset-fashion-mnist python3-h5py python3-torch bc
  clang libclang-rt-14-dev g++-aarch64-linux-gnu
  slurm-wlm munge
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
