#!/usr/bin/env bash
# Heap allocations per operation in steady state, on the worker and on the server, measured
# with heaptrack (Debian package heaptrack). Two ps-bench runs of one case, N and 3N timed
# iterations; the difference of their allocation counts divided by 2N cancels start-up,
# registration and shutdown, and leaves what each operation costs.
#
# Exit status: 0, 1 on failure, 2 for bad arguments, 3 without heaptrack.
# usage: tools/bench/alloc_per_op.sh [--size 4B] [--op pushpull] [--transport tcp]
#                                    [--mode dist_sync] [--iterations N] [--bench PS_BENCH]
set -euo pipefail

size=4B op=pushpull transport=tcp mode=dist_sync iterations=1000
bench=$(cd "$(dirname "$0")/../.." && pwd)/build/bin/ps-bench
while (($#)); do
  case $1 in
  --size | --op | --transport | --mode | --iterations | --bench)
    (($# >= 2)) || {
      echo "alloc_per_op: $1 needs a value" >&2
      exit 2
    }
    declare "${1#--}=$2"
    shift 2
    ;;
  -h | --help)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "alloc_per_op: unknown argument '$1' (see --help)" >&2
    exit 2
    ;;
  esac
done
command -v heaptrack >/dev/null && command -v heaptrack_print >/dev/null || {
  echo "alloc_per_op: heaptrack is not installed: apt-get install heaptrack" >&2
  exit 3
}
[[ -x $bench ]] || {
  echo "alloc_per_op: no $bench: build first (bash tools/build.sh)" >&2
  exit 1
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Total allocation calls recorded in one heaptrack file.
calls() { heaptrack_print -f "$1" 2>/dev/null | sed -n 's/^calls to allocation functions: \([0-9]*\).*/\1/p'; }

declare -A total
for n in "$iterations" $((3 * iterations)); do
  "$bench" --sizes="$size" --ops="$op" --transports="$transport" --modes="$mode" \
    --workers=1 --servers=1 --raw=false --iterations="$n" --warmup=50 \
    --server_prefix="heaptrack -o $out/server.$n" --worker_prefix="heaptrack -o $out/worker.$n" \
    >"$out/bench.$n.log" 2>&1 || {
    cat "$out/bench.$n.log" >&2
    echo "alloc_per_op: ps-bench failed" >&2
    exit 1
  }
  for role in worker server; do
    file=$(ls "$out/$role.$n".* | head -1)
    total[$role.$n]=$(calls "$file")
  done
done
echo "heap allocations per $op of $size, 1 worker 1 server, $mode over $transport" \
  "(steady state, $((2 * iterations)) operations):"
for role in worker server; do
  awk -v a="${total[$role.$iterations]}" -v b="${total[$role.$((3 * iterations))]}" \
    -v n=$((2 * iterations)) -v r="$role" 'BEGIN {
      v = (b - a) / n  # one-off allocations that differ between the runs can make it dip below 0
      printf "  %s: %.1f\n", r, (v < 0 ? 0 : v)
    }'
done
