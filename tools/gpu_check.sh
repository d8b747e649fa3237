#!/usr/bin/env bash
# Every GPU figure of docs/performance.md ("GPU figures") and docs/training.md ("On a GPU") in
# one run of a few minutes: the CUDA tests, the staging benchmark, ps-train with --device cuda
# (mlp and cnn; local and a 2-worker, 2-server dist_sync job sharing the GPU), the CPU backend
# beside it, and the cnn's step time against its batch size.
#
# Usage: tools/gpu_check.sh [--build-dir DIR] [--out DIR] [--quick] [--ncu]
#   --build-dir DIR  a build configured with CUDA (default: build-cuda, configured and built
#                    here for this machine's GPU with -DCMAKE_CUDA_ARCHITECTURES=native)
#   --out DIR        where the logs go (default: DIR/gpu-check)
#   --quick          one epoch per training run instead of the accuracy runs (10 mlp, 5 cnn)
#   --ncu            also time every kernel of a few cnn steps with Nsight Compute (ncu)
# Needs an NVIDIA GPU and driver, the CUDA toolkit, and the Debian packages of
# tools/install-deps.sh. Prints a summary last; every log stays in the output directory.
set -uo pipefail
cd "$(dirname "$0")/.."

build=build-cuda
out=
epochs_mlp=10
epochs_cnn=5
ncu=0
while (($#)); do
  case $1 in
  --build-dir) build=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --quick) epochs_mlp=1; epochs_cnn=1; shift ;;
  --ncu) ncu=1; shift ;;
  -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_check: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: error: no NVIDIA GPU here (nvidia-smi finds none): run it on a GPU machine" >&2
  exit 1
fi
if [[ ! -x $build/bin/ps-train ]]; then
  echo "gpu_check: configuring and building $build for this machine's GPU"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPS_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null || exit 1
  cmake --build "$build" -j"$(nproc)" >/dev/null || exit 1
fi
out=${out:-$build/gpu-check}
mkdir -p "$out"
bin=$(cd "$build/bin" && pwd)
export PS_BIN_DIR=$bin PYTHONUNBUFFERED=1
log=$out/train.log
: >"$log"
failed=0

step() { # name timeout command...: appends to train.log
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "=== $name: $*" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc wall=$((SECONDS - t0))s" >>"$log"
  echo "gpu_check: $name: exit $rc, $((SECONDS - t0)) s"
  ((rc == 0)) || failed=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "gpu_check: ctest -L cuda"
(cd "$build" && ctest -L cuda -j4 --output-on-failure >"$out/ctest-cuda.log" 2>&1) || failed=1
grep -E "tests passed" "$out/ctest-cuda.log"

: >"$out/staging.log"
for model in mlp cnn; do
  timeout 120 "$bin/ps-bench-gpu-staging" --device cuda --model "$model" \
    >>"$out/staging.log" 2>&1 || failed=1
done

job=(python3 tools/launch.py -n 2 -s 2 --launcher local)
step cnn-local-cuda 600 "$bin/ps-train" --kvstore local --device cuda --model cnn \
  --epochs $epochs_cnn
step mlp-local-cuda 600 "$bin/ps-train" --kvstore local --device cuda --model mlp \
  --epochs $epochs_mlp
step cnn-dist-cuda 900 "${job[@]}" "$bin/ps-train" --device cuda --kvstore dist_sync --model cnn \
  --epochs $epochs_cnn
step mlp-dist-cuda 900 "${job[@]}" "$bin/ps-train" --device cuda --kvstore dist_sync --model mlp \
  --epochs $epochs_mlp
# The CPU backend on the same machine (OpenBLAS on every core), for samples/sec.
step mlp-local-cpu 300 env -u OPENBLAS_NUM_THREADS "$bin/ps-train" --kvstore local --device cpu \
  --model mlp --epochs 1
step cnn-local-cpu 300 env -u OPENBLAS_NUM_THREADS "$bin/ps-train" --kvstore local --device cpu \
  --model cnn --epochs 1 --num-examples 6400
# How much of the cnn's step the communication adds, against the batch size.
for batch in 32 128 256; do
  step cnn-dist-b$batch 300 "${job[@]}" "$bin/ps-train" --device cuda --kvstore dist_sync \
    --model cnn --epochs 1 --batch-size $batch
done
# The same step without a replica and with the big key sliced over both servers: what the
# same-host round trip costs (docs/performance.md, "Communication against compute").
step cnn-dist-b32-norepl-sliced 300 env PS_REPLICATION=0 MXNET_KVSTORE_BIGARRAY_BOUND=100000 \
  "${job[@]}" "$bin/ps-train" --device cuda --kvstore dist_sync --model cnn --epochs 1
step cnn-local-b128 300 "$bin/ps-train" --kvstore local --device cuda --model cnn --epochs 1 \
  --batch-size 128
if ((ncu)); then
  # Each kernel of about three cnn steps, timed on the GPU (no other metric: one pass each).
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 300 \
    --launch-count 120 --print-summary per-kernel "$bin/ps-train" --kvstore local --device cuda \
    --model cnn --epochs 1 --num-examples 3200 >"$out/ncu.log" 2>&1 || failed=1
fi

echo
echo "== gpu_check summary ($(date -u +%F), $(head -1 "$out/gpu.txt"))"
grep -E "tests passed" "$out/ctest-cuda.log"
grep -E "peak:|copies queued|KVStore staging" "$out/staging.log"
grep -E "^=== .* rc=|final test_accuracy|Epoch\[0\] Batch-time" "$log" | cut -c1-150
echo "gpu_check: logs in $out"
exit $failed
