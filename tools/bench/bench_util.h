#pragma once
// What every part of ps-bench shares: size lists, latency statistics, iteration calibration,
// the result record (one table row, one JSON object) and the text formats of both.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ps::bench {

using Clock = std::chrono::steady_clock;

// Wall-clock microseconds since the epoch: the timed loop's bounds in the result lines, which
// tools/bench/bed_bench.py lines up with the interface counters it samples (same clock in every
// network namespace).
inline long long UnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "4B,4KB,1MB,16MB,100MB" -> bytes. Units are binary (K = 1024); "B" and a bare number are
// bytes. Throws std::invalid_argument naming the bad item.
std::vector<std::size_t> ParseSizes(const std::string& text);
// "1,2,4" -> {1, 2, 4}, each in [min, max]; throws std::invalid_argument.
std::vector<int> ParseInts(const std::string& text, int min, int max);
// "a,b" -> {"a", "b"}; a blank text -> {}; an empty item ("a,,b") throws
// std::invalid_argument.
std::vector<std::string> ParseList(const std::string& text);
// Comma-joined, the inverse of the parsers above ("4B,16MB" for sizes).
std::string JoinSizes(const std::vector<std::size_t>& sizes);
std::string Join(const std::vector<std::string>& items);
// "4 B", "4 KB", "16 MB", "1.5 MB".
std::string SizeName(std::size_t bytes);
// "4B", "4KB", "16MB": the same, without the space (flags, JSON-friendly labels).
std::string SizeFlag(std::size_t bytes);
// `value` with `precision` digits after the point ("0.500" for 0.5, 3).
std::string Fixed(double value, int precision);

struct Latency {
  std::size_t count = 0;
  double min_us = 0, p50_us = 0, p99_us = 0, max_us = 0, mean_us = 0;
};
// Nearest-rank percentiles over the samples (microseconds).
Latency Summarize(std::vector<double> samples_us);

// How many timed iterations a case runs, from the time one warm-up iteration took.
struct Calibration {
  double target_seconds = 0.5;  // aim for this much timed work per case
  int min_iterations = 5;
  int max_iterations = 10000;
  int fixed_iterations = 0;  // > 0: exactly this many, no calibration
  int warmup = -1;           // < 0: WarmupFor(size)
};
int CalibratedIterations(const Calibration& calibration, double seconds_per_iteration);
// Warm-up iterations for a message of `bytes`: about 128 MB of traffic, 2..50 iterations.
int WarmupFor(const Calibration& calibration, std::size_t bytes);

// One measured case.
struct Result {
  std::string op;        // push, pull, pushpull; or a raw limit: zmq_echo_tcp, memcpy, ...
  std::size_t size = 0;  // bytes of one tensor / message / copy
  int workers = 0;       // 0 for raw limits (not a ps job)
  int servers = 0;
  std::string mode;       // dist_sync, dist_async, or "raw"
  std::string transport;  // how ps's nodes talked: "ipc" or "tcp" (PS_USE_IPC); "" for raw
  long iterations = 0;    // timed iterations per worker
  Latency latency;        // per iteration, over every worker's samples
  double gbps = 0;        // 1e9 bytes/s: `size` bytes per iteration, summed over workers
  std::string note;       // what the numbers mean when not obvious
  // ps cases: the gradient compression (push type, and "/pull type" when pulls are compressed),
  // and the bytes one worker's transport sent and received per iteration (mean over workers;
  // < 0: not measured).
  std::string compression = "none";
  double wire_sent = -1;
  double wire_received = -1;
};

// One JSON object (no trailing newline).
std::string ToJson(const Result& result);
// A JSON string literal with escapes.
std::string JsonString(const std::string& text);
// Prints results as an aligned table to stdout.
void PrintTable(const std::string& title, const std::vector<Result>& results);

// Throughput in GB/s (1e9 bytes/s) of moving `bytes` per iteration at `mean_us` per iteration.
inline double Gbps(std::size_t bytes, double mean_us) {
  return mean_us > 0 ? static_cast<double>(bytes) / (mean_us * 1e3) : 0.0;
}

}  // namespace ps::bench
