#!/usr/bin/env bash
# README command 2: set up a fresh machine, build, check the lock annotations, and run every
# test with ctest.
# Usage: tools/test.sh [ctest arguments, e.g. -L core or -R dist]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
# The lock contracts (PS_GUARDED_BY, PS_REQUIRES): the libraries and programs built with clang
# and -Wthread-safety -Werror into build-clang/ (no tests: the analysis needs no run).
cmake --preset clang-thread-safety > /dev/null
cmake --build --preset clang-thread-safety -j"${PS_BUILD_JOBS:-2}"
cd build
ctest --output-on-failure --timeout 600 "$@"
