#!/usr/bin/env bash
# Installs the Debian packages (tools/install-deps.sh) and builds into build/.
# Usage: tools/build.sh [extra cmake configure arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j"${PS_BUILD_JOBS:-2}"
