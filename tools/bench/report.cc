#include "tools/bench/report.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace ps::bench {
namespace {

// The settings of this run's environment that change what the runtime does (PS_*, DMLC_*,
// MXNET_*; not the job secret), as "NAME=value" lines.
std::string RuntimeEnvironment() {
  std::vector<std::string> lines;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const bool ours =
        text.starts_with("PS_") || text.starts_with("DMLC_") || text.starts_with("MXNET_");
    if (ours && !text.starts_with("PS_JOB_SECRET")) lines.emplace_back(text);
  }
  std::sort(lines.begin(), lines.end());
  std::string joined;
  for (const std::string& line : lines) joined += line + "\n";
  return joined;
}

}  // namespace

const Result* RunResults::Find(const std::string& op, std::size_t size, int workers, int servers,
                               const std::string& mode, const std::string& transport,
                               const std::string& compression) const {
  for (const auto* list : {&ps, &raw}) {
    for (const Result& r : *list) {
      if (r.op == op && r.size == size && r.workers == workers && r.servers == servers &&
          r.mode == mode && r.transport == transport && r.compression == compression) {
        return &r;
      }
    }
  }
  return nullptr;
}

namespace {

const std::vector<std::string> kModes = {"dist_sync", "dist_async"};

std::optional<double> Gbps(const Result* r) {
  return r ? std::optional<double>(r->gbps) : std::nullopt;
}
std::optional<double> P50(const Result* r) {
  return r ? std::optional<double>(r->latency.p50_us) : std::nullopt;
}

// The store over each transport against the raw ZeroMQ echo over it.
void AddTransportRatios(const RunResults& results, const Selection& selection,
                        std::vector<Ratio>& ratios) {
  // pushpull_16MB_vs_echo and latency_4B_vs_echo: ps over a transport against the raw ZeroMQ
  // echo over the same socket transport (shm's control travels over ipc).
  const auto echo = [](const std::string& t) { return "zmq_echo_" + (t == "tcp" ? t : "ipc"); };
  for (const std::string& t : selection.transports) {
    const Result* echo16 = results.Find(echo(t), k16MB, 0, 0, "raw");
    for (const std::string& mode : kModes) {
      ratios.push_back({"pushpull_16MB_vs_echo",
                        "16 MB push+pull, 1 worker 1 server, " + mode + " over " + t +
                            ": throughput vs ZeroMQ " + echo(t).substr(9) + " echo of 16 MB",
                        "16MB pushpull 1w1s " + mode + " " + t + " / echo",
                        Gbps(results.Find("pushpull", k16MB, 1, 1, mode, t)), Gbps(echo16), "GB/s",
                        ">= 0.9", 0.9, true});
    }
  }
  for (const std::string& t : selection.transports) {
    const Result* echo4 = results.Find(echo(t), k4B, 0, 0, "raw");
    for (const std::string& mode : kModes) {
      for (const std::string op : {"push", "pull"}) {
        ratios.push_back({"latency_4B_vs_echo",
                          "4 B " + op + ", 1 worker 1 server, " + mode + " over " + t +
                              ": p50 latency vs ZeroMQ " + echo(t).substr(9) + " echo round trip",
                          "4B " + op + " 1w1s " + mode + " " + t + " / echo",
                          P50(results.Find(op, k4B, 1, 1, mode, t)), P50(echo4), "us", "<= 1.15",
                          1.15, false});
      }
    }
  }
}

// 2 workers and 2 servers against 1 and 1.
void AddScalingRatios(const RunResults& results, const Selection& selection,
                      std::vector<Ratio>& ratios) {
  // scaling_2x2_vs_1x1 on the first transport, the one the full matrix ran on.
  const std::string t = selection.transports.front();
  ratios.push_back({"scaling_2x2_vs_1x1",
                    "16 MB push+pull dist_async over " + t +
                        ": 2 workers 2 servers vs 1+1, aggregate throughput",
                    "16MB pushpull dist_async " + t + " 2w2s / 1w1s",
                    Gbps(results.Find("pushpull", k16MB, 2, 2, "dist_async", t)),
                    Gbps(results.Find("pushpull", k16MB, 1, 1, "dist_async", t)), "GB/s", ">= 1.5",
                    1.5, true});
  ratios.push_back({"scaling_2x2_vs_1x1_sync", "the same in dist_sync",
                    "16MB pushpull dist_sync " + t + " 2w2s / 1w1s",
                    Gbps(results.Find("pushpull", k16MB, 2, 2, "dist_sync", t)),
                    Gbps(results.Find("pushpull", k16MB, 1, 1, "dist_sync", t)), "GB/s", "", 0,
                    true});
}

// The server's merge and update against memcpy.
void AddServerRatios(const RunResults& results, const Selection& /*selection*/,
                     std::vector<Ratio>& ratios) {
  const Result* memcpy16 = results.Find("memcpy", k16MB, 0, 0, "raw");
  ratios.push_back({"server_merge_vs_memcpy",
                    "server merge of 4 x 16 MB pushes + SGD momentum (the server's "
                    "default threads) vs 1-thread memcpy",
                    "merge 4x16MB + SGD momentum / memcpy",
                    Gbps(results.Find("server_agg_sgd", k16MB, 4, 0, "raw")), Gbps(memcpy16),
                    "GB/s", ">= 0.5", 0.5, true});
  ratios.push_back({"server_merge_1thread_vs_memcpy", "the same on 1 thread vs 1-thread memcpy",
                    "merge + SGD, 1 thread / memcpy",
                    Gbps(results.Find("server_agg_sgd_1thread", k16MB, 4, 0, "raw")),
                    Gbps(memcpy16), "GB/s", "", 0, true});
}

// An iteration against MPI_Allreduce of the same size.
void AddAllreduceRatios(const RunResults& results, const Selection& /*selection*/,
                        std::vector<Ratio>& ratios) {
  // pushpull_2x2_vs_allreduce: the 2x2 iteration against MPI_Allreduce, each over its kind of
  // path.
  ratios.push_back({"pushpull_2x2_vs_allreduce",
                    "16 MB push+pull iteration, 2 workers 2 servers dist_sync over tcp, p50, "
                    "vs MPI_Allreduce of 16 MB, 2 ranks over TCP loopback",
                    "16MB pushpull 2w2s tcp / MPI_Allreduce tcp",
                    P50(results.Find("pushpull", k16MB, 2, 2, "dist_sync", "tcp")),
                    P50(results.Find("mpi_allreduce_tcp", k16MB, 2, 0, "raw")), "us", "<= 1.0", 1.0,
                    false});
  ratios.push_back({"pushpull_2x2_vs_allreduce",
                    "the same over the same-host path (shm) vs MPI_Allreduce 2 ranks over "
                    "shared memory (vader)",
                    "16MB pushpull 2w2s shm / MPI_Allreduce shm",
                    P50(results.Find("pushpull", k16MB, 2, 2, "dist_sync", "shm")),
                    P50(results.Find("mpi_allreduce_shm", k16MB, 2, 0, "raw")), "us", "<= 1.5", 1.5,
                    false});
}

// The same-host path against TCP loopback.
void AddShmRatios(const RunResults& results, const Selection& /*selection*/,
                  std::vector<Ratio>& ratios) {
  // shm_vs_tcp: the same-host path against TCP loopback.
  for (const std::string& mode : kModes) {
    ratios.push_back({"shm_vs_tcp",
                      "16 MB push+pull, 1 worker 1 server, " + mode +
                          ": same-host path (shm) vs TCP loopback, throughput",
                      "16MB pushpull 1w1s " + mode + " shm / tcp",
                      Gbps(results.Find("pushpull", k16MB, 1, 1, mode, "shm")),
                      Gbps(results.Find("pushpull", k16MB, 1, 1, mode, "tcp")), "GB/s", ">= 2", 2.0,
                      true});
  }
}

// Bytes on the wire of compressed pushes against plain ones.
void AddCompressionRatios(const RunResults& results, const Selection& selection,
                          std::vector<Ratio>& ratios) {
  // compressed_push_bytes: bytes on the wire of a compressed push against an uncompressed one,
  // at the largest size both ran (2bit: at most 1/15).
  for (const std::string& compression : selection.compressions) {
    if (compression == "none") continue;
    const std::string label = selection.pull_compression == "none"
                                  ? compression
                                  : compression + "/" + selection.pull_compression;
    for (const std::string& transport : selection.transports) {
      if (transport == "shm") continue;
      for (const std::string& mode : selection.modes) {
        const int w = selection.workers.front(), sv = selection.servers.front();
        const Result* packed = nullptr;
        const Result* plain = nullptr;
        std::size_t size = 0;
        for (const std::size_t candidate : selection.sizes) {
          const Result* a = results.Find("push", candidate, w, sv, mode, transport, label);
          const Result* b = results.Find("push", candidate, w, sv, mode, transport, "none");
          if (a && b && a->wire_sent >= 0 && b->wire_sent >= 0 && candidate >= size) {
            packed = a;
            plain = b;
            size = candidate;
          }
        }
        const auto sent = [](const Result* r) {
          return r ? std::optional<double>(r->wire_sent) : std::nullopt;
        };
        const bool two_bit = compression == "2bit";
        ratios.push_back({"compressed_push_bytes",
                          (size ? SizeName(size) : std::string("largest")) + " push, " +
                              std::to_string(w) + " worker(s) " + std::to_string(sv) +
                              " server(s), " + mode + " over " + transport +
                              ": bytes on the wire with " + label + " compression vs none",
                          "push bytes " + label + " / none " + mode + " " + transport, sent(packed),
                          sent(plain), "bytes", two_bit ? "<= 0.0667" : "", 1.0 / 15.0, false});
      }
    }
  }
}

}  // namespace

std::vector<Ratio> ComputeRatios(const RunResults& results, const Selection& selection) {
  std::vector<Ratio> ratios;
  for (const auto add : {AddTransportRatios, AddScalingRatios, AddServerRatios, AddAllreduceRatios,
                         AddShmRatios, AddCompressionRatios}) {
    add(results, selection, ratios);
  }
  return ratios;
}

// The compressed cases and the uncompressed ones beside them: bytes on the wire.
void PrintWire(const RunResults& results) {
  std::vector<const Result*> rows;
  for (const Result& r : results.ps) {
    if (r.wire_sent < 0 || r.compression == "none") continue;
    if (const Result* plain =
            results.Find(r.op, r.size, r.workers, r.servers, r.mode, r.transport, "none")) {
      rows.push_back(plain);
    }
    rows.push_back(&r);
  }
  if (rows.empty()) return;
  std::printf(
      "\nBytes on the wire per iteration and worker (counted by the transport: headers "
      "and payload frames, both directions)\n");
  std::printf("%-9s %8s %2s %2s %-10s %-4s %-11s %14s %14s %9s\n", "op", "size", "W", "S", "mode",
              "net", "compression", "sent", "received", "vs none");
  for (const Result* r : rows) {
    const Result* plain =
        results.Find(r->op, r->size, r->workers, r->servers, r->mode, r->transport, "none");
    const double total = r->wire_sent + r->wire_received;
    const double plain_total = plain ? plain->wire_sent + plain->wire_received : 0;
    std::printf("%-9s %8s %2d %2d %-10s %-4s %-11s %14.0f %14.0f %9s\n", r->op.c_str(),
                SizeName(r->size).c_str(), r->workers, r->servers, r->mode.c_str(),
                r->transport.c_str(), r->compression.c_str(), r->wire_sent, r->wire_received,
                plain_total > 0 ? Fixed(total / plain_total, 4).c_str() : "-");
  }
  std::fflush(stdout);
}

void PrintRatios(const std::vector<Ratio>& ratios) {
  if (std::none_of(ratios.begin(), ratios.end(), [](const Ratio& r) { return r.Value(); })) {
    std::printf("\nTargets: none computable from the cases of this run\n");
    return;
  }
  std::printf("\nTargets, each from numbers measured in this run\n");
  for (const Ratio& ratio : ratios) {
    std::printf("(%s) %s:\n    ", ratio.id.c_str(), ratio.what.c_str());
    const auto value = ratio.Value();
    if (!value) {
      std::printf("n/a: a case it needs was not run in this run (or failed)\n");
      continue;
    }
    std::printf("%.3f / %.3f %s = %.3fx", *ratio.numerator, *ratio.denominator, ratio.unit.c_str(),
                *value);
    if (const auto met = ratio.Met()) {
      std::printf("   target %sx: %s\n", ratio.target.c_str(), *met ? "MET" : "NOT MET");
    } else {
      std::printf("   (information)\n");
    }
  }
  std::fflush(stdout);
}

bool WriteJson(const std::string& path, const RunResults& results, const std::vector<Ratio>& ratios,
               const std::vector<std::string>& failures, const RunContext& context) {
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "ps-bench: error: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return false;
  }
  out << "{\n  \"tool\": \"ps-bench\",\n  \"date_utc\": " << JsonString(UtcNow())
      << ",\n  \"command\": " << JsonString(context.command)
      << ",\n  \"environment\": " << JsonString(RuntimeEnvironment())
      << ",\n  \"hardware_threads\": " << std::thread::hardware_concurrency()
      << ",\n  \"load_average_start\": " << JsonString(context.load_start)
      << ",\n  \"load_average_end\": " << JsonString(context.load_end)
      << ",\n  \"throughput_unit\": "
      << JsonString(
             "GB/s = 1e9 bytes/s; ps ops: tensor bytes per iteration summed over workers; "
             "echo: message bytes per round trip; memcpy: bytes copied")
      << ",\n  \"settings\": {\"target_seconds\": " << context.calibration.target_seconds
      << ", \"min_iterations\": " << context.calibration.min_iterations
      << ", \"max_iterations\": " << context.calibration.max_iterations
      << ", \"fixed_iterations\": " << context.calibration.fixed_iterations
      << ", \"verify\": " << (context.verify ? "true" : "false")
      << ", \"quick\": " << (context.quick ? "true" : "false") << "},\n  \"cases\": [\n";
  bool first = true;
  for (const auto* list : {&results.ps, &results.raw}) {
    for (const Result& r : *list) {
      out << (first ? "" : ",\n") << "    " << ToJson(r);
      first = false;
    }
  }
  out << "\n  ],\n  \"ratios\": [\n";
  for (std::size_t i = 0; i < ratios.size(); ++i) {
    const Ratio& ratio = ratios[i];
    const auto number = [](std::optional<double> v) { return v ? Fixed(*v, 6) : "null"; };
    const auto met = ratio.Met();
    out << "    {\"id\": " << JsonString(ratio.id) << ", \"what\": " << JsonString(ratio.what)
        << ", \"label\": " << JsonString(ratio.label)
        << ", \"numerator\": " << number(ratio.numerator)
        << ", \"denominator\": " << number(ratio.denominator)
        << ", \"unit\": " << JsonString(ratio.unit) << ", \"ratio\": " << number(ratio.Value())
        << ", \"target\": " << JsonString(ratio.target)
        << ", \"met\": " << (met ? (*met ? "true" : "false") : "null") << "}"
        << (i + 1 < ratios.size() ? ",\n" : "\n");
  }
  out << "  ],\n  \"failures\": [";
  for (std::size_t i = 0; i < failures.size(); ++i) {
    out << (i ? ", " : "") << JsonString(failures[i]);
  }
  out << "]\n}\n";
  out.flush();
  if (!out) {
    std::fprintf(stderr, "ps-bench: error: could not write all of %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return false;
  }
  std::fprintf(stderr, "ps-bench: wrote %s\n", path.c_str());
  return true;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  if (!(in >> one >> five >> fifteen)) return "unknown";
  return one + " " + five + " " + fifteen;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string CommandLine(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
             std::string_view("_./=:,+-").find(c) != std::string_view::npos;
    });
    if (i > 0) command += ' ';
    if (plain) {
      command += arg;
      continue;
    }
    command += '\'';
    for (const char c : arg) command += c == '\'' ? std::string("'\\''") : std::string(1, c);
    command += '\'';
  }
  return command;
}

}  // namespace ps::bench
