#!/usr/bin/env bash
# README command 2: set up a fresh machine, build, and run every test with ctest.
# Usage: tools/test.sh [ctest arguments, e.g. -L core or -R dist]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
cd build
ctest --output-on-failure --timeout 600 "$@"
