#!/usr/bin/env bash
# Tests of ps-bench (registered with ctest by tests/bench/CMakeLists.txt, label "bench").
# usage: test_bench.sh smoke|shm|server_failure|bad_flags|gpu_staging TOOL OUT_DIR
#        test_bench.sh plot PLOT_BENCH_PY OUT_DIR
#        test_bench.sh alloc ALLOC_PER_OP_SH OUT_DIR PS_BENCH
# Correctness only: no assertion on any timing.
set -uo pipefail

what=$1
tool=$2
out=$3
mkdir -p "$out"
json=$out/bench_smoke.json

fail() {
  echo "test_bench $what: FAILED: $*"
  exit 1
}

case $what in
smoke)
  rm -f "$json"
  log=$out/bench_smoke.log
  PS_WAIT_SPIN_US=200 timeout 50 "$tool" --quick --verify --sizes=4B,4KB --workers=1,2 \
    --servers=1,2 --transports=ipc,tcp --json "$json" >"$log" 2>&1
  rc=$?
  cat "$log"
  ((rc == 0)) || fail "ps-bench exited with status $rc"
  grep -q "^Parameter server" "$log" || fail "no parameter-server table"
  grep -q "^Raw limits measured in this run" "$log" || fail "no raw-limits table"
  grep -qE "^pushpull +4 KB +2 +2 dist_async +tcp +[0-9]+" "$log" || fail "no 2x2 dist_async row"
  grep -qE "^zmq_echo_ipc +4 B " "$log" || fail "no ipc echo row"
  grep -q "^Targets, each from numbers measured in this run" "$log" || fail "no targets section"
  grep -q "every value verified" "$log" || fail "the run was not verified"
  python3 - "$json" <<'PY' || fail "bad JSON"
import json, sys
doc = json.load(open(sys.argv[1]))
# The run can be repeated from the file: its command line and its runtime settings.
assert "--sizes=4B,4KB" in doc["command"] and "--json" in doc["command"], doc["command"]
assert "PS_WAIT_SPIN_US=200\n" in doc["environment"], doc["environment"]
cases = doc["cases"]
ps = [c for c in cases if c["mode"] in ("dist_sync", "dist_async")]
# 2 transports x 2 modes x 2 worker counts x 2 server counts x 2 sizes x 3 ops
assert len(ps) == 96, len(ps)
keys = {(c["op"], c["size"], c["workers"], c["servers"], c["mode"], c["transport"]) for c in ps}
assert len(keys) == 96, "duplicate cases"
for c in ps:
    assert c["iterations"] >= 5, c
    assert c["samples"] == c["iterations"] * c["workers"], c
    assert 0 < c["min_us"] <= c["p50_us"] <= c["p99_us"] <= c["max_us"], c
    assert c["throughput_gbps"] > 0, c
ops = {c["op"] for c in cases}
for raw in ("memcpy", "zmq_echo_tcp", "zmq_echo_ipc", "server_agg_sgd"):
    assert raw in ops, raw
assert doc["failures"] == [], doc["failures"]
assert any(r["id"] == "latency_4B_vs_echo" and r["ratio"] is not None for r in doc["ratios"])
print("test_bench smoke: JSON ok: %d cases, %d ratios" % (len(cases), len(doc["ratios"])))
PY
  ;;
shm)
  # Sizes that take the same-host shared-memory path, every value verified, both modes, with
  # the target shm_vs_tcp against TCP in the same run.
  log=$out/bench_shm.log
  timeout 100 "$tool" --raw=false --verify --full --sizes=256KB,2MB --workers=1,2 --servers=1,2 \
    --transports=shm,tcp --target_seconds=0.02 >"$log" 2>&1
  rc=$?
  cat "$log"
  ((rc == 0)) || fail "ps-bench exited with status $rc"
  grep -qE "^pushpull +2 MB +2 +2 dist_sync +shm +[0-9]+" "$log" || fail "no 2x2 shm row"
  grep -q "every value verified" "$log" || fail "the run was not verified"
  ;;
server_failure)
  # "false ps-server": every server exits 1 at once; the workers wait for servers that never
  # come. ps-bench must notice, stop everything, and fail well before the case timeout.
  log=$out/bench_server_failure.log
  start=$SECONDS
  timeout 50 "$tool" --raw=false --sizes=4B --workers=1 --servers=1 --modes=dist_sync \
    --transports=tcp --server_prefix=false --case_timeout=40 >"$log" 2>&1
  rc=$?
  elapsed=$((SECONDS - start))
  cat "$log"
  ((rc == 1)) || fail "expected exit status 1, got $rc"
  grep -q "server 0 exited with status 1 while the workers were running" "$log" ||
    fail "the failure does not name the server"
  ((elapsed < 30)) || fail "took ${elapsed}s: the failure was not noticed promptly"
  ;;
bad_flags)
  # A --json path that cannot be written is refused before the run, not found out after it.
  for args in "--sizes=3B" "--modes=local" "--ops=push,fly" "--workers=0" "--servers=17" "--transports=udp" \
    "--min-iterations=10 --max-iterations=5" "--warmup=0" "--warmup=-2" "--workers=1,,2" \
    "--ops=push,,pull" "--ps=false --raw=false" "--json=/nonexistent/dir/run.json" \
    "--json=$out"; do
    # shellcheck disable=SC2086
    message=$(timeout 20 "$tool" $args 2>&1)
    rc=$?
    echo "$args -> $rc: $message"
    ((rc == 2)) || fail "$args: expected exit status 2, got $rc"
    flag=${args%%=*}
    grep -q -- "$flag" <<<"$message" || fail "$args: the message does not name $flag"
  done
  # --help lists ps-bench's own flags, not glog's, and none of the internal ones.
  help=$(timeout 20 "$tool" --help 2>&1) || fail "--help exited with status $?"
  grep -q -- "--target-seconds" <<<"$help" || fail "--help does not describe --target-seconds"
  ! grep -qE -- "logtostderr|worker-mode" <<<"$help" || fail "--help lists foreign or internal flags"
  # The MPI baseline helper (built only where MPI is installed), run as an MPI singleton:
  # --help and a bad flag end cleanly, without MPI_Abort.
  mpi_tool=$(dirname "$tool")/ps-bench-mpi-allreduce
  if [[ -x $mpi_tool ]]; then
    help=$(timeout 20 "$mpi_tool" --help 2>&1) || fail "$mpi_tool --help exited with status $?"
    grep -q -- "--sizes=LIST" <<<"$help" || fail "$mpi_tool --help does not describe --sizes"
    message=$(timeout 20 "$mpi_tool" --bogus 2>&1)
    rc=$?
    ((rc == 2)) || fail "$mpi_tool --bogus: expected exit status 2, got $rc"
    grep -q -- "unknown argument '--bogus'" <<<"$message" || fail "$mpi_tool: $message"
    ! grep -q "MPI_ABORT" <<<"$message" || fail "$mpi_tool aborted on a bad flag"
  fi
  ;;
gpu_staging)
  # ps-bench-gpu-staging ($tool) on the CPU backend: the same code path a GPU run takes,
  # every line present with a positive figure; bad input is a one-line error.
  out_text=$(timeout 60 "$tool" --device cpu --repeat 3 --peak-mib 16 2>&1) ||
    fail "exited with status $?: $out_text"
  echo "$out_text"
  grep -qE "^gpu-staging: peak: one 16 MiB copy to page-locked memory: [0-9.]+ GB/s$" <<<"$out_text" ||
    fail "no peak line"
  grep -qE "^gpu-staging: mlp gradients: 6 copies, 0\.90 MiB into one page-locked buffer: [0-9.]+ ms, [0-9.]+ GB/s \([0-9.]+x peak\)$" \
    <<<"$out_text" || fail "no staging line for the mlp's 6 parameters"
  grep -qE "^gpu-staging: mlp gradients, copies queued, one wait: [0-9.]+ ms, [0-9.]+ GB/s \([0-9.]+x peak\)$" \
    <<<"$out_text" || fail "no line for the queued copies"
  grep -qE "^gpu-staging: KVStore staging of a 16 MiB tensor: [0-9.]+ GB/s \([0-9.]+x peak\) into its pool's buffers \(page-locked: (yes|no)\), [0-9.]+ GB/s into ordinary memory$" \
    <<<"$out_text" || fail "no KVStore staging line"
  grep -qE "^gpu-staging: local KVStore push of a 16 MiB cpu tensor: [0-9.]+ GB/s \([0-9.]+x peak\)$" \
    <<<"$out_text" || fail "no KVStore push line"
  grep -qE "^gpu-staging: local KVStore pull into a 16 MiB cpu tensor: [0-9.]+ GB/s$" \
    <<<"$out_text" || fail "no KVStore pull line"
  ! grep -qE " 0\.00 GB/s" <<<"$out_text" || fail "a zero bandwidth"
  message=$(timeout 20 "$tool" --device cpu --model resnet 2>&1)
  rc=$?
  ((rc == 1)) || fail "--model resnet: expected exit status 1, got $rc"
  [[ $message == "ps-bench-gpu-staging: error: unknown --model 'resnet': use mlp or cnn" ]] ||
    fail "--model resnet: $message"
  ;;
alloc)
  # tools/bench/alloc_per_op.sh (here $tool, with ps-bench as $4): the steady-state heap
  # allocations per 4 B push+pull stay far below what they were before the pooling work
  # (worker 34, server 27; now 1 and 0: the 1 is ZeroMQ's copy of the request header).
  # Counts, not timings: they do not depend on load.
  bench=$4
  log=$out/bench_alloc.log
  timeout 100 bash "$tool" --iterations 300 --bench "$bench" >"$log" 2>&1
  rc=$?
  cat "$log"
  ((rc == 3)) && exit 77  # heaptrack is not installed: skipped
  ((rc == 0)) || fail "alloc_per_op.sh exited with status $rc"
  worker=$(sed -n 's/^  worker: \([0-9.]*\)$/\1/p' "$log")
  server=$(sed -n 's/^  server: \([0-9.]*\)$/\1/p' "$log")
  [[ -n $worker && -n $server ]] || fail "no per-operation figures in the output"
  awk -v w="$worker" -v s="$server" 'BEGIN { exit !(w <= 2 && s <= 1) }' ||
    fail "worker $worker, server $server allocations per push+pull: more than 2 / 1"
  ;;
plot)
  [[ -f $json ]] || fail "no $json (bench.smoke writes it)"
  # --summary needs no matplotlib.
  summary=$(python3 "$tool" --summary "$json" "$json") || fail "plot_bench.py --summary failed"
  echo "$summary"
  row="^\| latency_4B_vs_echo <= 1.15x \| 4 B push, 1 worker 1 server, dist_sync over ipc.* \| 2 \| "
  grep -qE "$row" <<<"$summary" || fail "--summary has no row for latency_4B_vs_echo over 2 runs"
  # PATH's python3 may be a private one (pyenv, venv) without Debian's python3-matplotlib.
  python=""
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import matplotlib" 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  [[ -n $python ]] || {
    echo "test_bench plot: python3-matplotlib is not installed: skipped"
    exit 77
  }
  png=$out/bench_smoke.png
  rm -f "$png"
  "$python" "$tool" "$json" -o "$png" || fail "plot_bench.py failed"
  [[ -s $png ]] || fail "no PNG written"
  [[ $(head -c 8 "$png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "not a PNG"
  ;;
*)
  fail "unknown test '$what'"
  ;;
esac
echo "test_bench $what: ok"
