#!/usr/bin/env bash
# Installs the Debian packages this project builds, tests and trains with.
# Idempotent: packages already present are skipped; `apt-get update` runs at most once.
# Works as root or through sudo.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config clang-format
  libzmq3-dev cppzmq-dev
  libprotobuf-dev protobuf-compiler
  libgflags-dev libgoogle-glog-dev
  catch2 zlib1g-dev libopenblas-dev heaptrack
  dataset-fashion-mnist
  python3 python3-yaml python3-matplotlib
  openssh-server openssh-client rsync procps iproute2
)

if [[ ${1:-} == --help || ${1:-} == -h ]]; then
  echo "usage: tools/install-deps.sh [--print]"
  echo "Installs the Debian packages the project needs (idempotent)."
  echo "  --print   list the packages and exit"
  exit 0
fi
if [[ ${1:-} == --print ]]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then
    SUDO="sudo"
  else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
