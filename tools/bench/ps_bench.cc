// ps-bench: push, pull and push+pull throughput and latency of the parameter server, measured
// through the public ps::KVStore API, next to the raw limits measured in the same run
// (single-thread memcpy, a ZeroMQ echo over TCP loopback and ipc://, the server's aggregation
// and optimizer kernels, MPI_Allreduce when MPI is installed), with its named target ratios
// (report.h).
//
// ps-bench is the driver: for each job (workers, servers, mode, transport) it starts ps-scheduler,
// the ps-servers and the workers, which are ps-bench itself re-executed with --worker_mode; every
// child is stopped by its pid at the end of the job, or on failure. See docs/performance.md.
#include <gflags/gflags.h>

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ps/cli/cli.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/bench_worker.h"
#include "tools/bench/raw_baselines.h"
#include "tools/bench/report.h"
#include "tools/process/child.h"

DEFINE_string(sizes, "4B,4KB,1MB,16MB,100MB", "Tensor sizes (binary units: 4B, 4KB, 16MB)");
DEFINE_string(workers, "1,2,4", "Worker counts to run (1..16)");
DEFINE_string(servers, "1,2,4", "Server counts to run (1..16)");
DEFINE_string(modes, "dist_sync,dist_async", "KVStore modes: dist_sync, dist_async");
DEFINE_string(ops, "push,pull,pushpull", "Operations: push, pull, pushpull");
DEFINE_string(transports, "shm,ipc,tcp",
              "How the job's nodes talk: shm (the runtime's same-host default: ipc:// for "
              "control, values of 64 KiB or more through shared memory), ipc (ipc:// only, "
              "PS_USE_SHM=0), tcp (loopback, as between hosts: PS_USE_IPC=0). Without --full, "
              "transports after the first run the smallest job and the 2x2 job only");
DEFINE_bool(full, false,
            "Run every combination of the selected sizes, ops, workers and servers. Default: the "
            "smallest job (first --workers x first --servers) runs every size and op; bigger jobs "
            "run pushpull at sizes up to 16 MB");
DEFINE_bool(quick, false,
            "A fast correctness run: sizes 4B,4KB, 1-2 workers and servers, every combination, "
            "short cases, no MPI (flags given explicitly still win)");
DEFINE_bool(verify, false,
            "Check every pulled value exactly (integer-valued data), and every echo and merge; "
            "timings then include no checking but the caches are colder");
DEFINE_string(json, "", "Also write the results to this file as JSON");
DEFINE_double(target_seconds, 0.5, "Timed work per case; iterations are calibrated to it");
DEFINE_int32(min_iterations, 5, "Fewest timed iterations per case");
DEFINE_int32(max_iterations, 10000, "Most timed iterations per case");
DEFINE_int32(iterations, 0, "Exactly this many timed iterations per case (0: calibrate)");
DEFINE_int32(warmup, -1, "Warm-up iterations per case (-1: ~128 MB of traffic, 2..50)");
DEFINE_bool(ps, true, "Measure the parameter server (--ps=false: raw limits only)");
DEFINE_bool(raw, true,
            "Measure the raw limits: memcpy, ZeroMQ echo (tcp, ipc), server aggregation, MPI");
DEFINE_string(mpi, "auto",
              "MPI_Allreduce baseline: auto (when mpirun and ps-bench-mpi-allreduce are found), "
              "on, off");
DEFINE_string(server_prefix, "",
              "Command prefix for every ps-server, split at spaces (profiling, e.g. 'valgrind "
              "--tool=callgrind --callgrind-out-file=/tmp/cg.%p')");
DEFINE_string(worker_prefix, "",
              "Command prefix for every worker, split at spaces (profiling the worker side)");
DEFINE_double(case_timeout, 120, "Seconds one case may take before its job is stopped");
DEFINE_string(compression, "none",
              "Gradient compression to run (KVStore::SetGradientCompression, threshold 0.5), a "
              "list of none, 2bit, 1bit, fp16. Each type other than none runs the smallest job "
              "(first --workers x first --servers) over each socket transport (ipc, tcp) of "
              "--transports, and the bytes on the wire are compared with none's");
DEFINE_string(pull_compression, "none",
              "pull_type of the compressed jobs: none (MXNet: full values), 2bit, 1bit, fp16");
// Internal: how the driver re-executes itself.
DEFINE_bool(worker_mode, false, "Internal: run as one worker of a ps-bench job (DMLC_* env)");
DEFINE_string(mode, "dist_sync", "Internal (--worker_mode): the KVStore type");
DEFINE_string(echo_peer, "", "Internal: run as the echo peer over tcp or ipc");

namespace ps::bench {

using process::Child;
using process::Env;
using process::FindInPath;
using process::SelfDirectory;
using process::SelfPath;

namespace {

struct Settings {
  std::vector<std::size_t> sizes;
  std::vector<int> workers;
  std::vector<int> servers;
  std::vector<std::string> modes;
  std::vector<std::string> ops;
  std::vector<std::string> transports;
  bool full = false;
  bool verify = false;
  bool quick = false;
  std::string json;
  std::string command;  // as given, for the JSON
  Calibration calibration;
  bool run_ps = true;
  bool run_raw = true;
  std::string mpi = "auto";
  std::vector<std::string> server_prefix;
  std::vector<std::string> worker_prefix;
  std::chrono::milliseconds case_timeout{120000};
  std::string bin_dir;  // where ps-bench, ps-scheduler and ps-server are
  std::vector<std::string> compressions = {"none"};
  std::string pull_compression = "none";
};

// A job: one scheduler, `servers` servers, `workers` workers, running its cases in order.
struct Job {
  int workers = 1;
  int servers = 1;
  std::string mode;
  std::string transport;  // ipc or tcp
  std::vector<std::size_t> sizes;
  std::vector<std::string> ops;
  std::string compression = "none";       // push type, or none
  std::string pull_compression = "none";  // pull type (with a compression other than none)

  // "2bit", "2bit/fp16" (push/pull), "none".
  std::string CompressionLabel() const {
    return pull_compression == "none" ? compression : compression + "/" + pull_compression;
  }
  std::string Label() const {
    return std::to_string(workers) + " worker(s), " + std::to_string(servers) + " server(s), " +
           mode + " over " + transport +
           (compression == "none" && pull_compression == "none"
                ? ""
                : ", compression " + CompressionLabel());
  }
};

// "key=value" tokens of one line.
std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream stream(line);
  std::string token;
  while (stream >> token) {
    const auto eq = token.find('=');
    if (eq != std::string::npos) fields[token.substr(0, eq)] = token.substr(eq + 1);
  }
  return fields;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  std::string line;
  while (std::getline(stream, line)) lines.push_back(line);
  return lines;
}

std::size_t CountLinesStartingWith(const std::string& text, const std::string& prefix) {
  std::size_t count = 0;
  std::size_t pos = 0;
  while ((pos = text.find(prefix, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') ++count;
    pos += prefix.size();
  }
  return count;
}

class Driver {
 public:
  explicit Driver(Settings settings) : s_(std::move(settings)) {}

  int Run() {
    const auto start = Clock::now();
    load_start_ = LoadAverage();
    std::fprintf(stderr, "ps-bench: %u hardware threads, load average %s; GB/s = 1e9 bytes/s\n",
                 std::thread::hardware_concurrency(), load_start_.c_str());
    if (s_.run_raw) RunRaw();
    if (s_.run_ps) {
      const std::vector<Job> jobs = Plan();
      for (std::size_t j = 0; j < jobs.size(); ++j) {
        std::fprintf(stderr, "ps-bench: job %zu/%zu: %s: %zu case(s)\n", j + 1, jobs.size(),
                     jobs[j].Label().c_str(), jobs[j].sizes.size() * jobs[j].ops.size());
        RunJob(jobs[j]);
      }
    }
    PrintTable(
        "Parameter server (through ps::KVStore; latency per iteration = op + WaitAll; GB/s "
        "= tensor bytes per iteration, summed over workers)",
        results_.ps);
    PrintWire(results_);
    PrintTable("Raw limits measured in this run", results_.raw);
    const std::vector<Ratio> ratios = ComputeRatios(results_, ToSelection());
    PrintRatios(ratios);
    load_end_ = LoadAverage();
    std::printf(
        "\nps-bench: %u hardware threads; load average (1, 5, 15 min) %s at the start, %s "
        "at the end: other load on the machine skews every number above\n",
        std::thread::hardware_concurrency(), load_start_.c_str(), load_end_.c_str());
    const bool written = s_.json.empty() || WriteJson(s_.json, results_, ratios, failures_,
                                                      {s_.command, load_start_, load_end_,
                                                       s_.calibration, s_.verify, s_.quick});
    std::printf("\nps-bench: %zu case(s) in %.1f s%s\n", results_.ps.size() + results_.raw.size(),
                SecondsSince(start),
                s_.verify && failures_.empty() ? ", every value verified" : "");
    for (const std::string& failure : failures_)
      std::printf("ps-bench: FAILED: %s", failure.c_str());
    if (!failures_.empty()) {
      std::printf("ps-bench: %zu failure(s)\n", failures_.size());
      return 1;
    }
    return written ? 0 : 1;
  }

 private:
  std::vector<Job> Plan() const {
    std::vector<Job> jobs;
    const bool has_pushpull = std::find(s_.ops.begin(), s_.ops.end(), "pushpull") != s_.ops.end();
    for (const std::string& transport : s_.transports) {
      for (const std::string& mode : s_.modes) {
        for (int w : s_.workers) {
          for (int s : s_.servers) {
            Job job{w, s, mode, transport, s_.sizes, s_.ops};
            const bool smallest = w == s_.workers.front() && s == s_.servers.front();
            // Other transports: the smallest job, and 2x2 for pushpull_2x2_vs_allreduce.
            const bool two_by_two = w == 2 && s == 2;
            if (!s_.full && !smallest && !two_by_two && transport != s_.transports.front()) {
              continue;
            }
            if (!s_.full && !smallest) {
              // Bigger jobs: the training op, at sizes that fit the time budget.
              job.ops = has_pushpull ? std::vector<std::string>{"pushpull"} : s_.ops;
              job.sizes.clear();
              for (std::size_t size : s_.sizes) {
                if (size <= k16MB) job.sizes.push_back(size);
              }
            }
            if (!job.sizes.empty() && !job.ops.empty()) jobs.push_back(job);
          }
        }
      }
    }
    // Gradient compression: the smallest job over each socket transport (through shared
    // memory an uncompressed value never touches the socket, so there is nothing to compare).
    for (const std::string& compression : s_.compressions) {
      if (compression == "none" && s_.pull_compression == "none") continue;
      for (const std::string& transport : s_.transports) {
        if (transport == "shm") continue;
        for (const std::string& mode : s_.modes) {
          Job job{s_.workers.front(), s_.servers.front(), mode, transport, s_.sizes, s_.ops};
          job.compression = compression;
          job.pull_compression = s_.pull_compression;
          jobs.push_back(job);
        }
      }
    }
    return jobs;
  }

  std::string Sibling(const std::string& name) const {
    const std::string path = s_.bin_dir + "/" + name;
    if (access(path.c_str(), X_OK) != 0) {
      throw std::runtime_error(name + " not found next to ps-bench in " + s_.bin_dir +
                               ": build it (cmake --build build --target " + name + ")");
    }
    return path;
  }

  void Fail(const std::string& what, const Child* who) {
    std::string message = what + "\n";
    if (who) message += "  last output of " + who->name() + ":\n" + who->Tail();
    std::fprintf(stderr, "ps-bench: FAILED: %s", message.c_str());
    failures_.push_back(message);
  }

  // ---- the raw limits ----

  void RunRaw() {
    std::fprintf(stderr, "ps-bench: raw limits: memcpy, ZeroMQ echo (tcp, ipc), server kernels%s\n",
                 s_.mpi == "off" ? "" : ", MPI");
    try {
      // 16 MB always: server_merge_vs_memcpy compares with it.
      std::set<std::size_t> sizes(s_.sizes.begin(), s_.sizes.end());
      sizes.insert(k16MB);
      for (std::size_t size : sizes) {
        results_.raw.push_back(MeasureMemcpy(size, s_.calibration, s_.verify));
      }
    } catch (const std::exception& e) {
      Fail(std::string("memcpy: ") + e.what(), nullptr);
    }
    RunEcho("tcp");
    RunEcho("ipc");
    try {
      // server_merge_vs_memcpy: a server merging 4 workers' 16 MB pushes and applying SGD with
      // momentum.
      Calibration calibration = s_.calibration;
      calibration.warmup = std::min(calibration.warmup < 0 ? 3 : calibration.warmup, 3);
      results_.raw.push_back(MeasureServerAggregation(k16MB, 4, 0, calibration, s_.verify));
      results_.raw.push_back(MeasureServerAggregation(k16MB, 4, 1, calibration, s_.verify));
    } catch (const std::exception& e) {
      Fail(std::string("server aggregation: ") + e.what(), nullptr);
    }
    if (s_.mpi != "off") RunMpi();
  }

  void RunEcho(const std::string& transport) {
    const std::string op = "zmq_echo_" + transport;
    try {
      Child peer("echo peer (" + transport + ")", {SelfPathChecked(), "--echo_peer=" + transport},
                 {});
      const std::string listening = std::string(kEchoListening) + " ";
      if (!peer.WaitForOutput(
              [&](const std::string& out) {
                const auto at = out.find(listening);
                return at != std::string::npos && out.find('\n', at) != std::string::npos;
              },
              std::chrono::seconds(10))) {
        Fail(op + ": the echo peer did not start listening within 10 s", &peer);
        return;
      }
      const std::string output = peer.Output();
      std::smatch match;
      if (!std::regex_search(output, match, std::regex("in=(\\S+) out=(\\S+)"))) {
        Fail(op + ": cannot read the echo peer's endpoints", &peer);
        return;
      }
      const std::string in = match[1], out = match[2];
      try {
        for (Result& r : MeasureEcho(op, in, out, s_.sizes, s_.calibration, s_.verify)) {
          results_.raw.push_back(std::move(r));
        }
      } catch (const std::exception& e) {
        Fail(e.what(), &peer);
      }
      StopEchoPeer(in);
      const auto status = peer.Wait(std::chrono::seconds(10));
      if (!status || *status != 0) {
        Fail(op + ": the echo peer " +
                 (status ? "exited with status " + std::to_string(*status) : "did not exit"),
             &peer);
      }
      // peer's destructor stops it by pid if it is still running.
    } catch (const std::exception& e) {
      Fail(op + ": " + e.what(), nullptr);
    }
  }

  void RunMpi() {
    const std::string mpirun = FindInPath("mpirun");
    const std::string bench = s_.bin_dir + "/ps-bench-mpi-allreduce";
    const bool have = !mpirun.empty() && access(bench.c_str(), X_OK) == 0;
    if (!have) {
      const std::string why =
          mpirun.empty() ? "mpirun is not in PATH" : bench + " was not built (CMake found no MPI)";
      if (s_.mpi == "on") {
        Fail("MPI baseline requested (--mpi=on) but " + why, nullptr);
      } else {
        std::fprintf(stderr, "ps-bench: skipping the MPI baseline: %s\n", why.c_str());
      }
      return;
    }
    struct Variant {
      std::string op;
      std::vector<std::string> mca;
    };
    const std::vector<Variant> variants = {
        {"mpi_allreduce_tcp",
         {"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"}},
        {"mpi_allreduce_shm", {"--mca", "pml", "ob1", "--mca", "btl", "vader,self"}},
    };
    for (const Variant& variant : variants) {
      std::vector<std::string> argv = {mpirun, "--allow-run-as-root", "--oversubscribe", "-np",
                                       "2"};
      argv.insert(argv.end(), variant.mca.begin(), variant.mca.end());
      argv.insert(
          argv.end(),
          {bench, "--sizes=16MB", "--target_seconds=" + Fixed(s_.calibration.target_seconds, 3),
           "--min_iterations=" + std::to_string(s_.calibration.min_iterations),
           "--max_iterations=" + std::to_string(s_.calibration.max_iterations)});
      if (s_.calibration.fixed_iterations > 0) {
        argv.push_back("--iterations=" + std::to_string(s_.calibration.fixed_iterations));
      }
      if (s_.verify) argv.push_back("--verify");
      try {
        Child run(variant.op, argv, {});
        const auto status = run.Wait(s_.case_timeout);
        if (!status || *status != 0) {
          Fail(variant.op + ": mpirun " +
                   (status ? "exited with status " + std::to_string(*status)
                           : "did not finish within the case timeout"),
               &run);
          continue;
        }
        bool found = false;
        for (const std::string& line : Lines(run.Output())) {
          if (line.rfind("mpi-allreduce: size=", 0) != 0) continue;
          const auto f = Fields(line);
          Result r;
          r.op = variant.op;
          r.size = std::stoull(f.at("size"));
          r.workers = std::stoi(f.at("ranks"));
          r.mode = "raw";
          r.iterations = std::stol(f.at("iterations"));
          r.latency.count = static_cast<std::size_t>(r.iterations);
          r.latency.min_us = std::stod(f.at("min_us"));
          r.latency.p50_us = std::stod(f.at("p50_us"));
          r.latency.p99_us = std::stod(f.at("p99_us"));
          r.latency.max_us = std::stod(f.at("max_us"));
          r.latency.mean_us = std::stod(f.at("mean_us"));
          r.gbps = std::stod(f.at("algbw_gbps"));
          r.note = "MPI_Allreduce sum, 2 ranks, btl " + variant.mca[5] +
                   "; GB/s = size / time (algorithm bandwidth)";
          results_.raw.push_back(r);
          found = true;
        }
        if (!found) Fail(variant.op + ": no result line from ps-bench-mpi-allreduce", &run);
      } catch (const std::exception& e) {
        Fail(variant.op + ": " + e.what(), nullptr);
      }
    }
  }

  std::string SelfPathChecked() const { return Sibling("ps-bench"); }

  // ---- the parameter-server jobs ----

  void RunJob(const Job& job) {
    try {
      RunJobOrThrow(job);
    } catch (const std::exception& e) {
      Fail(job.Label() + ": " + e.what(), nullptr);
    }
  }

  void RunJobOrThrow(const Job& job) {
    const std::string label = job.Label();
    Env env = {{"DMLC_PS_ROOT_URI", "127.0.0.1"},
               {"DMLC_PS_ROOT_PORT", "0"},
               {"DMLC_NUM_SERVER", std::to_string(job.servers)},
               {"DMLC_NUM_WORKER", std::to_string(job.workers)},
               {"DMLC_NODE_HOST", "127.0.0.1"},
               {"DMLC_INTERFACE", ""},
               // Generous: a loaded 2-core machine; a server under valgrind (--server_prefix)
               // is ~50x slower still.
               {"PS_HEARTBEAT_INTERVAL", "1"},
               {"PS_HEARTBEAT_TIMEOUT",
                s_.server_prefix.empty() && s_.worker_prefix.empty() ? "30" : "300"},
               {"PS_REGISTER_TIMEOUT", "60"},
               {"PS_USE_IPC", job.transport == "tcp" ? "0" : "1"},
               {"PS_USE_SHM", job.transport == "shm" ? "1" : "0"}};
    // Every child is stopped by its pid when this vector goes, whatever path leaves here.
    std::vector<std::unique_ptr<Child>> children;
    env["DMLC_ROLE"] = "scheduler";
    children.push_back(std::make_unique<Child>(
        "ps-scheduler", std::vector<std::string>{Sibling("ps-scheduler")}, env));
    Child& scheduler = *children.back();
    const std::string listening = "ps-scheduler: listening on ";
    if (!scheduler.WaitForOutput(
            [&](const std::string& out) {
              const auto at = out.find(listening);
              return at != std::string::npos && out.find('\n', at) != std::string::npos;
            },
            std::chrono::seconds(30))) {
      return Fail(label + ": ps-scheduler did not print '" + listening + "HOST:PORT' within 30 s",
                  &scheduler);
    }
    std::smatch match;
    const std::string scheduler_output = scheduler.Output();
    if (!std::regex_search(scheduler_output, match,
                           std::regex("ps-scheduler: listening on \\S+:(\\d+)"))) {
      return Fail(label + ": cannot read the scheduler's port", &scheduler);
    }
    env["DMLC_PS_ROOT_PORT"] = match[1];

    env["DMLC_ROLE"] = "server";
    std::vector<Child*> servers;
    for (int s = 0; s < job.servers; ++s) {
      std::vector<std::string> argv = s_.server_prefix;
      argv.push_back(Sibling("ps-server"));
      children.push_back(std::make_unique<Child>("server " + std::to_string(s), argv, env));
      servers.push_back(children.back().get());
    }
    env["DMLC_ROLE"] = "worker";
    std::vector<std::string> worker_argv = s_.worker_prefix;
    worker_argv.insert(
        worker_argv.end(),
        {SelfPathChecked(), "--worker_mode", "--mode=" + job.mode,
         "--sizes=" + JoinSizes(job.sizes), "--ops=" + Join(job.ops),
         "--target_seconds=" + Fixed(s_.calibration.target_seconds, 6),
         "--min_iterations=" + std::to_string(s_.calibration.min_iterations),
         "--max_iterations=" + std::to_string(s_.calibration.max_iterations),
         "--iterations=" + std::to_string(s_.calibration.fixed_iterations),
         "--warmup=" + std::to_string(s_.calibration.warmup), "--compression=" + job.compression,
         "--pull_compression=" + job.pull_compression,
         std::string("--verify=") + (s_.verify ? "true" : "false")});
    std::vector<Child*> workers;
    for (int w = 0; w < job.workers; ++w) {
      children.push_back(std::make_unique<Child>("worker " + std::to_string(w), worker_argv, env));
      workers.push_back(children.back().get());
    }

    // Each worker prints one result line per case; a case may take up to --case_timeout. The
    // scheduler and servers must live until the workers are done: checked between slices of
    // the wait, so a crashed server fails the job at once instead of at the timeout.
    const std::size_t cases = job.sizes.size() * job.ops.size();
    std::vector<Child*> infrastructure = servers;
    infrastructure.push_back(&scheduler);
    for (std::size_t done = 1; done <= cases; ++done) {
      for (Child* worker : workers) {
        const auto deadline = Clock::now() + s_.case_timeout;
        bool ok = false;
        while (true) {
          ok = worker->WaitForOutput(
              [&](const std::string& out) {
                return CountLinesStartingWith(out, kResultPrefix) >= done;
              },
              std::chrono::milliseconds(250));
          if (ok || Clock::now() >= deadline || worker->Wait(std::chrono::milliseconds(0))) break;
          // Another worker that failed is the root cause of whatever follows: name it first.
          for (Child* other : workers) {
            const auto status = other->Wait(std::chrono::milliseconds(0));
            if (status && *status != 0) {
              return Fail(
                  label + ": " + other->name() + " exited with status " + std::to_string(*status),
                  other);
            }
          }
          for (Child* node : infrastructure) {
            if (const auto status = node->Wait(std::chrono::milliseconds(0))) {
              return Fail(label + ": " + node->name() + " exited with status " +
                              std::to_string(*status) + " while the workers were running",
                          node);
            }
          }
        }
        if (!ok) {
          const auto status = worker->Wait(std::chrono::milliseconds(0));
          return Fail(
              label + ": " + worker->name() +
                  (status
                       ? " exited with status " + std::to_string(*status) + " after " +
                             std::to_string(done - 1) + " of " + std::to_string(cases) + " case(s)"
                       : " reported no result for case " + std::to_string(done) + " within " +
                             std::to_string(s_.case_timeout.count() / 1000) +
                             " s (--case_timeout)"),
              worker);
        }
      }
    }
    for (Child* worker : workers) {
      const auto status = worker->Wait(std::chrono::seconds(60));
      if (!status || *status != 0) {
        return Fail(label + ": " + worker->name() +
                        (status ? " exited with status " + std::to_string(*status)
                                : " did not exit within 60 s after its last case"),
                    worker);
      }
    }
    // Once every worker finished the scheduler ends the job: the servers and it exit cleanly.
    const auto end_timeout =
        s_.server_prefix.empty() ? std::chrono::seconds(30) : std::chrono::seconds(300);
    for (Child* node : servers) {
      const auto status = node->Wait(end_timeout);
      if (!status || *status != 0) {
        return Fail(label + ": " + node->name() +
                        (status ? " exited with status " + std::to_string(*status)
                                : " did not exit after the job ended"),
                    node);
      }
    }
    const auto status = scheduler.Wait(std::chrono::seconds(30));
    if (!status || *status != 0) {
      return Fail(label + ": ps-scheduler " +
                      (status ? "exited with status " + std::to_string(*status)
                              : "did not exit after the job ended"),
                  &scheduler);
    }
    Collect(job, workers);
  }

  void Collect(const Job& job, const std::vector<Child*>& workers) {
    struct PerWorker {
      long iterations = 0;
      std::vector<double> samples_us;
      double wire_sent = -1, wire_received = -1;  // bytes per iteration
    };
    // (op, size) -> rank -> what that worker measured
    std::map<std::pair<std::string, std::size_t>, std::map<int, PerWorker>> cases;
    for (Child* worker : workers) {
      for (const std::string& line : Lines(worker->Output())) {
        const bool samples = line.rfind(kSamplesPrefix, 0) == 0;
        const bool result = line.rfind(kResultPrefix, 0) == 0;
        if (!samples && !result) continue;
        const auto f = Fields(line);
        try {
          PerWorker& entry =
              cases[{f.at("op"), std::stoull(f.at("size"))}][std::stoi(f.at("rank"))];
          if (result) {
            entry.iterations = std::stol(f.at("iterations"));
            if (f.contains("wire_sent")) {
              entry.wire_sent = std::stod(f.at("wire_sent"));
              entry.wire_received = std::stod(f.at("wire_received"));
            }
          } else {
            for (const std::string& ns : ParseList(f.at("ns"))) {
              entry.samples_us.push_back(std::stod(ns) / 1e3);
            }
          }
        } catch (const std::exception&) {
          return Fail(job.Label() + ": cannot parse a line of " + worker->name() + ": " +
                          line.substr(0, 200),
                      worker);
        }
      }
    }
    for (std::size_t size : job.sizes) {
      for (const std::string& op : job.ops) {
        const auto& per_rank = cases[{op, size}];
        Result r;
        r.op = op;
        r.size = size;
        r.workers = job.workers;
        r.servers = job.servers;
        r.mode = job.mode;
        r.transport = job.transport;
        r.compression = job.CompressionLabel();
        std::vector<double> all;
        double wire_sent = 0, wire_received = 0;
        bool wire = true;
        bool complete = static_cast<int>(per_rank.size()) == job.workers;
        for (const auto& [rank, entry] : per_rank) {
          complete = complete && entry.iterations > 0 &&
                     entry.samples_us.size() == static_cast<std::size_t>(entry.iterations);
          r.iterations = entry.iterations;
          double sum = 0;
          for (double us : entry.samples_us) sum += us;
          if (!entry.samples_us.empty()) {
            r.gbps += Gbps(size, sum / static_cast<double>(entry.samples_us.size()));
          }
          all.insert(all.end(), entry.samples_us.begin(), entry.samples_us.end());
          wire = wire && entry.wire_sent >= 0;
          wire_sent += entry.wire_sent;
          wire_received += entry.wire_received;
        }
        if (wire && !per_rank.empty()) {
          r.wire_sent = wire_sent / static_cast<double>(per_rank.size());
          r.wire_received = wire_received / static_cast<double>(per_rank.size());
        }
        if (!complete) {
          return Fail(job.Label() + ": incomplete results for " + op + " " + SizeName(size),
                      nullptr);
        }
        r.latency = Summarize(std::move(all));
        results_.ps.push_back(r);
        std::fprintf(stderr, "ps-bench:   %-8s %7s  %ld iterations  p50 %.1f us  %.3f GB/s\n",
                     op.c_str(), SizeName(size).c_str(), r.iterations, r.latency.p50_us, r.gbps);
      }
    }
  }

  Selection ToSelection() const {
    return {s_.sizes,      s_.workers,      s_.servers,         s_.modes,
            s_.transports, s_.compressions, s_.pull_compression};
  }

  Settings s_;
  std::string load_start_, load_end_;
  RunResults results_;
  std::vector<std::string> failures_;
};

std::vector<std::string> ParseWords(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream stream(text);
  std::string word;
  while (stream >> word) words.push_back(word);
  return words;
}

bool IsDefault(const char* flag) { return gflags::GetCommandLineFlagInfoOrDie(flag).is_default; }

std::vector<std::string> CheckedList(const std::string& flag, const std::string& text,
                                     const std::set<std::string>& accepted) {
  std::vector<std::string> items;
  try {
    items = ParseList(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("--" + flag + ": " + e.what());
  }
  if (items.empty()) throw std::invalid_argument("--" + flag + " is empty");
  for (const std::string& item : items) {
    if (!accepted.contains(item)) {
      std::string names;
      for (const std::string& name : accepted) names += (names.empty() ? "" : ", ") + name;
      throw std::invalid_argument("--" + flag + ": unknown '" + item + "' (accepted: " + names +
                                  ")");
    }
  }
  return items;
}

// Which jobs run: sizes, node counts, modes, ops and transports (--quick's smaller set where
// a flag was left at its default).
void ReadJobMatrix(Settings& s) {
  const auto pick = [&](const char* flag, const std::string& value, const std::string& quick) {
    return s.quick && IsDefault(flag) ? quick : value;
  };
  try {
    s.sizes = ParseSizes(pick("sizes", FLAGS_sizes, "4B,4KB"));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--sizes: ") + e.what());
  }
  const auto counts = [&](const char* flag, const std::string& value) {
    try {
      return ParseInts(pick(flag, value, "1,2"), 1, 16);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("--" + std::string(flag) + ": " + e.what());
    }
  };
  s.workers = counts("workers", FLAGS_workers);
  s.servers = counts("servers", FLAGS_servers);
  s.modes = CheckedList("modes", FLAGS_modes, {"dist_sync", "dist_async"});
  s.ops = CheckedList("ops", FLAGS_ops, {"push", "pull", "pushpull"});
  s.transports = CheckedList("transports", FLAGS_transports, {"shm", "ipc", "tcp"});
}

// Checks --json's file before the run, not after it: the results would be lost.
void CheckJsonPath(const std::string& path) {
  if (path.empty()) return;
  const std::filesystem::path json(path);
  const std::filesystem::path dir = json.has_parent_path() ? json.parent_path() : ".";
  std::error_code error;
  if (std::filesystem::is_directory(json, error)) {
    throw std::invalid_argument("--json " + path + ": is a directory; give a file's path");
  }
  if (access(dir.c_str(), W_OK) != 0) {
    throw std::invalid_argument("--json " + path + ": cannot write into " + dir.string() + ": " +
                                std::strerror(errno));
  }
}

// How long each case runs.
void ReadCalibration(Settings& s) {
  s.calibration.target_seconds =
      s.quick && IsDefault("target_seconds") ? 0.02 : FLAGS_target_seconds;
  s.calibration.min_iterations = FLAGS_min_iterations;
  s.calibration.max_iterations =
      s.quick && IsDefault("max_iterations") ? 200 : FLAGS_max_iterations;
  s.calibration.fixed_iterations = FLAGS_iterations;
  s.calibration.warmup = s.quick && IsDefault("warmup") ? 2 : FLAGS_warmup;
  // Integer-valued sums stay exact below 2^24: 200000 rounds x 4 workers' pattern sum fits.
  constexpr int kMostIterations = 200000;
  if (!(s.calibration.target_seconds > 0 && s.calibration.target_seconds <= 60)) {
    throw std::invalid_argument("--target-seconds: expected (0, 60]");
  }
  if (s.calibration.min_iterations < 1 ||
      s.calibration.max_iterations < s.calibration.min_iterations ||
      s.calibration.max_iterations > kMostIterations) {
    throw std::invalid_argument("--min-iterations/--max-iterations: need 1 <= min <= max <= " +
                                std::to_string(kMostIterations));
  }
  if (s.calibration.fixed_iterations < 0 || s.calibration.fixed_iterations > kMostIterations) {
    throw std::invalid_argument("--iterations: expected 0.." + std::to_string(kMostIterations));
  }
  if (s.calibration.warmup < -1 || s.calibration.warmup > 1000) {
    throw std::invalid_argument("--warmup: expected -1 (about 128 MB of traffic) or 0..1000");
  }
  if (s.calibration.warmup == 0 && s.calibration.fixed_iterations == 0) {
    throw std::invalid_argument("--warmup=0 needs --iterations: the calibration times the warm-up");
  }
  if (!(FLAGS_case_timeout >= 1 && FLAGS_case_timeout <= 86400)) {
    throw std::invalid_argument("--case-timeout: expected 1..86400 seconds");
  }
  s.case_timeout = std::chrono::milliseconds(static_cast<long long>(FLAGS_case_timeout * 1000));
}

// The commands the nodes run under (--server-prefix, --worker-prefix), found in PATH.
std::vector<std::string> ReadPrefix(const char* flag, const std::string& text) {
  std::vector<std::string> words = ParseWords(text);
  if (!words.empty() && words[0].find('/') == std::string::npos) {
    const std::string found = FindInPath(words[0]);
    if (found.empty()) {
      throw std::invalid_argument(std::string("--") + flag + ": '" + words[0] + "' is not in PATH");
    }
    words[0] = found;
  }
  return words;
}

// Reads and validates every flag once, here at the edge.
Settings ReadSettings() {
  Settings s;
  s.quick = FLAGS_quick;
  ReadJobMatrix(s);
  s.full = FLAGS_full || s.quick;
  s.verify = FLAGS_verify;
  s.json = FLAGS_json;
  CheckJsonPath(s.json);
  s.run_ps = FLAGS_ps;
  s.run_raw = FLAGS_raw;
  if (!s.run_ps && !s.run_raw) {
    throw std::invalid_argument("--ps=false with --raw=false leaves nothing to measure: keep one");
  }
  s.mpi = s.quick && IsDefault("mpi") ? "off" : FLAGS_mpi;
  if (s.mpi != "auto" && s.mpi != "on" && s.mpi != "off") {
    throw std::invalid_argument("--mpi: expected auto, on or off, got '" + s.mpi + "'");
  }
  ReadCalibration(s);
  s.server_prefix = ReadPrefix("server_prefix", FLAGS_server_prefix);
  s.worker_prefix = ReadPrefix("worker_prefix", FLAGS_worker_prefix);
  s.bin_dir = SelfDirectory();
  s.compressions = CheckedList("compression", FLAGS_compression, {"none", "2bit", "1bit", "fp16"});
  s.pull_compression = FLAGS_pull_compression;
  if (s.pull_compression != "none" && s.pull_compression != "2bit" &&
      s.pull_compression != "1bit" && s.pull_compression != "fp16") {
    throw std::invalid_argument("--pull-compression: expected none, 2bit, 1bit or fp16, got '" +
                                s.pull_compression + "'");
  }
  return s;
}

}  // namespace
}  // namespace ps::bench

int main(int argc, char** argv) {
  const std::string usage =
      "ps-bench: measures the parameter server's push, pull and push+pull throughput and latency "
      "next to the raw limits (memcpy, ZeroMQ echo, MPI) in one run.\n"
      "Usage: ps-bench [--quick] [--verify] [--json FILE] [--sizes 4B,16MB] [--workers 1,2] "
      "[--servers 1,2] [--modes dist_sync] [--ops pushpull] [--compression none,2bit]\n"
      "Needs ps-scheduler and ps-server next to it. See docs/performance.md.";
  const std::string command = ps::bench::CommandLine(argc, argv);  // before flags are taken out
  if (ps::cli::HelpOrParseFlags(&argc, &argv, usage, "ps_bench.cc")) return 0;
  using namespace ps::bench;
  if (FLAGS_worker_mode) {
    WorkerOptions options;
    options.mode = FLAGS_mode;
    try {
      options.sizes = ParseSizes(FLAGS_sizes);
    } catch (const std::invalid_argument& e) {
      std::printf("ps-bench-worker: error: --sizes: %s\n", e.what());
      return 2;
    }
    options.ops = ParseList(FLAGS_ops);
    options.calibration.target_seconds = FLAGS_target_seconds;
    options.calibration.min_iterations = FLAGS_min_iterations;
    options.calibration.max_iterations = FLAGS_max_iterations;
    options.calibration.fixed_iterations = FLAGS_iterations;
    options.calibration.warmup = FLAGS_warmup;
    options.verify = FLAGS_verify;
    options.compression = FLAGS_compression;
    options.pull_compression = FLAGS_pull_compression;
    return RunWorker(options);
  }
  if (!FLAGS_echo_peer.empty()) return RunEchoPeer(FLAGS_echo_peer);
  try {
    Settings settings = ReadSettings();
    settings.command = command;
    Driver driver(std::move(settings));
    return driver.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps-bench: error: %s\n", e.what());
    return 2;
  }
}
