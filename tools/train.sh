#!/usr/bin/env bash
# README command 1: set up a fresh machine, build, then train the mlp on Fashion-MNIST with a
# local cluster (scheduler, 2 servers, 2 workers, dist_sync) started by tools/launch.py.
# Usage: tools/train.sh [extra ps-train flags, e.g. --epochs 10 --model cnn]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
exec python3 tools/launch.py -n 2 -s 2 --launcher local \
  build/bin/ps-train --kvstore dist_sync --model mlp --epochs 3 --lr 0.05 "$@"
