// ps-bench-mpi-allreduce: MPI_Allreduce (sum of float32) timings, the collective baseline
// ps-bench compares a push+pull round with. Built only when CMake finds MPI. Run it under
// mpirun, e.g. 2 ranks over TCP loopback:
//   mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl tcp,self
//     --mca btl_tcp_if_include lo ps-bench-mpi-allreduce --sizes=16MB
// Rank 0 prints one line per size:
//   mpi-allreduce: size=BYTES ranks=N iterations=I min_us=.. p50_us=.. p99_us=.. max_us=..
//   mean_us=.. algbw_gbps=.. start_unix_us=.. end_unix_us=..
// (algbw: size / mean time, the usual allreduce "algorithm bandwidth"; start/end: the timed
// loop's wall-clock bounds on rank 0, which tools/bench/bed_bench.py lines up with link counters)
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ps/cli/cli.h"
#include "tools/bench/bench_util.h"

namespace {

struct Options {
  std::string sizes = "16MB";
  ps::bench::Calibration calibration;
  bool verify = false;
  bool help = false;
  bool version = false;
};

constexpr const char* kUsage =
    "ps-bench-mpi-allreduce: MPI_Allreduce (sum of float32) timings, run under mpirun by "
    "ps-bench.\n"
    "usage: mpirun -np 2 ps-bench-mpi-allreduce [flags]\n"
    "  --sizes=LIST           sizes, comma-separated, binary units (default 16MB)\n"
    "  --target_seconds=S     timed work per size; iterations are calibrated to it\n"
    "  --min_iterations=N     lower bound of the calibration\n"
    "  --max_iterations=N     upper bound of the calibration\n"
    "  --iterations=N         exactly N timed iterations\n"
    "  --warmup=N             warm-up iterations (default: about 128 MB of traffic, 2..50)\n"
    "  --verify               check every reduced value\n"
    "  --version              print the version\n"
    "Rank 0 prints one 'mpi-allreduce: size=...' line per size.\n";

bool StartsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const std::string& name) { return arg.substr(name.size()); };
    if (StartsWith(arg, "--sizes=")) {
      options.sizes = value("--sizes=");
    } else if (StartsWith(arg, "--target_seconds=")) {
      options.calibration.target_seconds = std::stod(value("--target_seconds="));
    } else if (StartsWith(arg, "--min_iterations=")) {
      options.calibration.min_iterations = std::stoi(value("--min_iterations="));
    } else if (StartsWith(arg, "--max_iterations=")) {
      options.calibration.max_iterations = std::stoi(value("--max_iterations="));
    } else if (StartsWith(arg, "--iterations=")) {
      options.calibration.fixed_iterations = std::stoi(value("--iterations="));
    } else if (StartsWith(arg, "--warmup=")) {
      options.calibration.warmup = std::stoi(value("--warmup="));
    } else if (arg == "--verify") {
      options.verify = true;
    } else if (ps::cli::IsHelpFlag(arg)) {
      options.help = true;
    } else if (arg == "--version") {
      options.version = true;
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "' (see --help)");
    }
  }
  return options;
}

int Run(const Options& options, int rank, int ranks) {
  for (std::size_t bytes : ps::bench::ParseSizes(options.sizes)) {
    const std::size_t n = bytes / sizeof(float);
    const int count = static_cast<int>(n);
    std::vector<float> send(n), receive(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) send[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
    const auto once = [&] {
      const auto start = ps::bench::Clock::now();
      MPI_Allreduce(send.data(), receive.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return ps::bench::SecondsSince(start);
    };
    const int warmup = ps::bench::WarmupFor(options.calibration, bytes);
    double warm_seconds = 0;
    for (int i = 0; i < warmup; ++i) {
      const double seconds = once();
      if (i > 0 || warmup == 1) warm_seconds += seconds;
    }
    int iterations = ps::bench::CalibratedIterations(options.calibration,
                                                     warm_seconds / std::max(1, warmup - 1));
    MPI_Bcast(&iterations, 1, MPI_INT, 0, MPI_COMM_WORLD);  // every rank runs rank 0's count
    std::vector<double> samples;
    MPI_Barrier(MPI_COMM_WORLD);
    const long long loop_start_us = ps::bench::UnixMicros();
    for (int i = 0; i < iterations; ++i) {
      samples.push_back(once() * 1e6);
      if (options.verify) {
        const float sum = static_cast<float>(ranks * (ranks + 1) / 2);
        for (std::size_t j = 0; j < n; ++j) {
          if (receive[j] != sum * static_cast<float>(j % 7 + 1)) {
            std::fprintf(stderr, "mpi-allreduce: verify failed: rank %d element %zu\n", rank, j);
            return 1;
          }
        }
      }
    }
    const long long loop_end_us = ps::bench::UnixMicros();
    const ps::bench::Latency latency = ps::bench::Summarize(samples);
    if (rank == 0) {
      std::printf(
          "mpi-allreduce: size=%zu ranks=%d iterations=%d min_us=%.3f p50_us=%.3f p99_us=%.3f "
          "max_us=%.3f mean_us=%.3f algbw_gbps=%.6f start_unix_us=%lld end_unix_us=%lld\n",
          bytes, ranks, iterations, latency.min_us, latency.p50_us, latency.p99_us, latency.max_us,
          latency.mean_us, ps::bench::Gbps(bytes, latency.mean_us), loop_start_us, loop_end_us);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Every rank parses the same arguments, so a bad flag (or --help) ends every rank the same
  // way: a clean exit, no MPI_Abort and its screenful.
  Options options;
  try {
    options = Parse(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "mpi-allreduce: error: %s\n", e.what());
    MPI_Finalize();
    return 2;
  }
  if (options.help || options.version) {
    if (rank == 0 && options.help) std::fputs(kUsage, stdout);
    if (rank == 0 && options.version) {
      std::printf("ps-bench-mpi-allreduce version %s\n", ps::cli::Version());
    }
    MPI_Finalize();
    return 0;
  }
  int status = 0;
  try {
    status = Run(options, rank, ranks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi-allreduce: error on rank %d: %s\n", rank, e.what());
    status = 2;
  }
  // A failure on one rank leaves the others blocked in a collective: abort them all.
  if (status != 0) MPI_Abort(MPI_COMM_WORLD, status);
  MPI_Finalize();
  return status;
}
