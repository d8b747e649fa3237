#!/usr/bin/env bash
# README command 1: set up a fresh machine, build, then train the mlp on Fashion-MNIST with a
# local cluster (scheduler, 2 servers, 2 workers, dist_sync) started by tools/launch.py, with the
# model's default schedule (docs/training.md, "Defaults"). Writes each worker's metrics as JSON
# lines and the training curves as a PNG into build/train/ and prints where they are.
# Usage: tools/train.sh [extra ps-train flags, e.g. --epochs 5 --model cnn]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
out=build/train
mkdir -p "$out"
rm -f "$out"/metrics-*.jsonl
python3 tools/launch.py -n 2 -s 2 --launcher local --env OPENBLAS_NUM_THREADS=1 \
  build/bin/ps-train --kvstore dist_sync --model mlp --epochs 10 \
  --metrics-out "$out/metrics-{rank}.jsonl" "$@"
# The first python3 with matplotlib (install-deps.sh installs Debian's python3-matplotlib).
plot_python=
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c "import matplotlib" 2>/dev/null; then plot_python=$candidate; break; fi
done
if [ -z "$plot_python" ]; then
  echo "train.sh: error: no python3 with matplotlib to draw the curves (apt-get install python3-matplotlib)" >&2
  exit 1
fi
"$plot_python" tools/plot_training.py "$out"/metrics-*.jsonl -o "$out/curves.png" \
  --title "ps-train, 2 workers, 2 servers, dist_sync"
echo "train.sh: metrics (JSON lines, one file per worker): $out/metrics-*.jsonl"
echo "train.sh: curves: $out/curves.png"
