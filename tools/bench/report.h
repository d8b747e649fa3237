#pragma once
// ps-bench's report of one run: the named targets, each a ratio of two numbers measured in that
// run; the table of bytes on the wire of the compressed cases; the targets' verdicts; and the
// JSON file that tools/plot_bench.py draws. The driver (ps_bench.cc) measures, this reports.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench/bench_util.h"

namespace ps::bench {

// The sizes the targets are stated at.
inline constexpr std::size_t k4B = 4;
inline constexpr std::size_t k16MB = std::size_t{16} << 20;

// Every case one run measured.
struct RunResults {
  std::vector<Result> ps;   // the parameter server's cases, in the order they ran
  std::vector<Result> raw;  // the raw limits: memcpy, echo, server kernels, MPI

  // The case with exactly these fields, or nullptr. transport: "shm", "ipc" or "tcp" for ps
  // cases, "" for raw limits.
  const Result* Find(const std::string& op, std::size_t size, int workers, int servers,
                     const std::string& mode, const std::string& transport = "",
                     const std::string& compression = "none") const;
};

// What the run was asked for: the targets look for the cases it implies.
struct Selection {
  std::vector<std::size_t> sizes;
  std::vector<int> workers;
  std::vector<int> servers;
  std::vector<std::string> modes;
  std::vector<std::string> transports;
  std::vector<std::string> compressions;
  std::string pull_compression = "none";
};

// One target: a number measured in the run over its baseline measured in the same run.
struct Ratio {
  std::string id;     // the target's name, e.g. "pushpull_16MB_vs_echo"; several rows may share it
  std::string what;   // the row in words
  std::string label;  // a short form of `what`, for plots
  std::optional<double> numerator, denominator;
  std::string unit;    // of numerator and denominator
  std::string target;  // ">= 0.9", "<= 1.15", "" (information)
  double bound = 0;
  bool at_least = true;

  std::optional<double> Value() const {
    if (!numerator || !denominator || *denominator == 0) return std::nullopt;
    return *numerator / *denominator;
  }
  std::optional<bool> Met() const {
    const auto value = Value();
    if (!value || target.empty()) return std::nullopt;
    return at_least ? *value >= bound : *value <= bound;
  }
};

// Every target row the selection allows; a row whose cases did not run has no value.
std::vector<Ratio> ComputeRatios(const RunResults& results, const Selection& selection);

// Prints to stdout: the compressed cases and the uncompressed ones beside them (bytes on the
// wire), nothing when no compressed case ran.
void PrintWire(const RunResults& results);
// Prints to stdout: each target row, its figures and its verdict.
void PrintRatios(const std::vector<Ratio>& ratios);

// What the JSON records besides the results.
struct RunContext {
  std::string command;     // CommandLine() of this run
  std::string load_start;  // LoadAverage() at the start and at the end of the run
  std::string load_end;
  Calibration calibration;
  bool verify = false;
  bool quick = false;
};

// Writes the run to `path` as one JSON object (tool, date, hardware threads, load, settings,
// cases, ratios, failures); says on stderr that it did, or that it could not (false).
bool WriteJson(const std::string& path, const RunResults& results, const std::vector<Ratio>& ratios,
               const std::vector<std::string>& failures, const RunContext& context);

// The first three fields of /proc/loadavg ("1.02 0.80 0.71"), or "unknown": benchmarks on a
// shared machine are only as good as its load while they ran.
std::string LoadAverage();
// "2026-11-23T09:15:00Z".
std::string UtcNow();
// argv as a shell would take it back: every argument with a character outside [A-Za-z0-9_./=:,+-]
// in single quotes.
std::string CommandLine(int argc, char** argv);

}  // namespace ps::bench
