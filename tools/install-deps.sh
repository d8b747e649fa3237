#!/usr/bin/env bash
# Installs the Debian packages this project builds, tests and trains with, and the few Python
# packages from PyPI that Debian does not ship (PYPI_PACKAGES, pinned).
# Idempotent: packages already present are skipped; `apt-get update` runs at most once.
# Works as root or through sudo. PS_DEPS_PYPI=0 skips the PyPI packages (the k8s image does).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config clang-format clang
  libzmq3-dev libsodium-dev cppzmq-dev
  libprotobuf-dev protobuf-compiler
  libgflags-dev libgoogle-glog-dev
  catch2 zlib1g-dev libopenblas-dev heaptrack
  dataset-fashion-mnist
  python3 python3-yaml python3-matplotlib python3-pip
  openssh-server openssh-client rsync procps iproute2 iptables
  openmpi-bin libopenmpi-dev
)

# kubernetes-validate: the Kubernetes API's JSON schemas and a validator, so that
# tests/launcher/test_k8s_manifests.py checks tools/k8s offline. Installed with pip --target
# into PS_PYTHON_DIR/pythonX.Y (X.Y: the version of the python3 first on PATH, which the tests
# run too), where the test finds it; nothing is installed into Python's own site-packages.
PYPI_PACKAGES=(kubernetes-validate==1.37.0)
PS_PYTHON_DIR=${PS_PYTHON_DIR:-/usr/local/lib/ps-python}

if [[ ${1:-} == --help || ${1:-} == -h ]]; then
  echo "usage: tools/install-deps.sh [--print]"
  echo "Installs the Debian packages the project needs, and ${PYPI_PACKAGES[*]} from PyPI"
  echo "into $PS_PYTHON_DIR (idempotent)."
  echo "  --print   list the packages and exit"
  exit 0
fi
if [[ ${1:-} == --print ]]; then
  printf '%s\n' "${PACKAGES[@]}" "${PYPI_PACKAGES[@]}"
  exit 0
fi

SUDO=""
need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then
      SUDO="sudo"
    else
      echo "install-deps: need root or sudo to install: $*" >&2
      exit 1
    fi
  fi
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
else
  need_root "${missing[*]}"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [[ ${PS_DEPS_PYPI:-1} == 0 ]]; then
  exit 0
fi
python=$(python3 -c 'import sys; print(sys.executable)')
target=$PS_PYTHON_DIR/python$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
stamp=$target/.installed
if [[ -f $stamp && $(cat "$stamp") == "${PYPI_PACKAGES[*]}" ]]; then
  echo "install-deps: ${PYPI_PACKAGES[*]} present in $target"
  exit 0
fi
if [[ ! -w $(dirname "$PS_PYTHON_DIR") && ! -w $PS_PYTHON_DIR ]]; then
  need_root "${PYPI_PACKAGES[*]} into $PS_PYTHON_DIR"
fi
echo "install-deps: installing ${PYPI_PACKAGES[*]} into $target"
$SUDO mkdir -p "$PS_PYTHON_DIR"
fresh=$($SUDO mktemp -d "$PS_PYTHON_DIR/.new.XXXXXX")
$SUDO "$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --no-cache-dir --root-user-action=ignore --target "$fresh" "${PYPI_PACKAGES[@]}"
echo "${PYPI_PACKAGES[*]}" | $SUDO tee "$fresh/.installed" > /dev/null
$SUDO chmod -R a+rX "$fresh"
$SUDO rm -rf "$target"
$SUDO mv "$fresh" "$target"
