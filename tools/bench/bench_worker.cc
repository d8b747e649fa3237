#include "tools/bench/bench_worker.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "ps/kvstore.h"

namespace ps::bench {
namespace {

// The data is integer-valued, so every float sum is exact (as long as it stays below 2^24):
// worker r pushes g_r[i] = (r + 1) * (i % 7 + 1); keys start at init[i] = i % 251; with SGD at
// learning rate 1, after R rounds of every worker pushing, value[i] = init[i] - R * S * (i % 7 + 1)
// with S = W (W + 1) / 2.
float InitValue(std::size_t i) { return static_cast<float>(i % 251); }
float Pattern(std::size_t i) { return static_cast<float>(i % 7 + 1); }
float GradValue(int rank, std::size_t i) { return static_cast<float>(rank + 1) * Pattern(i); }

struct CaseState {
  std::string op;
  std::size_t size = 0;
  int rank = 0;
  int workers = 1;
  long rounds = 0;  // pushes this worker made to the key so far
  // With gradient compression the values stay exact for 2bit (every gradient here is >= 1, so
  // each push sends +0.5 everywhere) and fp16 (small integers are halves exactly); not for
  // 1bit or compressed pulls, which are checked by the KVStore's tests instead.
  std::string compression = "none";
  bool checkable = true;
};

[[noreturn]] void Mismatch(const CaseState& c, const std::string& when, std::size_t i,
                           float expected, float got) {
  throw std::runtime_error("verify failed: " + c.op + " " + SizeName(c.size) + " rank " +
                           std::to_string(c.rank) + " " + when + " element " + std::to_string(i) +
                           ": expected " + std::to_string(expected) + ", got " +
                           std::to_string(got));
}

// Every worker pushed `rounds` times (dist_sync after each round; both modes at the end).
void CheckExact(const CaseState& c, const std::vector<float>& out, long rounds,
                const std::string& when) {
  const bool two_bit = c.compression == "2bit";
  const float sum = two_bit ? 0.5f * static_cast<float>(c.workers)
                            : static_cast<float>(c.workers * (c.workers + 1) / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float expected =
        InitValue(i) - static_cast<float>(rounds) * sum * (two_bit ? 1.0f : Pattern(i));
    if (out[i] != expected) Mismatch(c, when, i, expected, out[i]);
  }
}

// dist_async push+pull: the value holds this worker's own `rounds` pushes plus any number of
// the others': init - k * pattern with k an integer, k >= rounds * (rank + 1).
void CheckAsync(const CaseState& c, const std::vector<float>& out, const std::string& when) {
  const double own = static_cast<double>(c.rounds) * (c.rank + 1);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double k = (static_cast<double>(InitValue(i)) - out[i]) / Pattern(i);
    if (!(k == std::floor(k) && k >= own)) {
      Mismatch(c,
               when + " (dist_async: expected init - k * " + std::to_string(Pattern(i)) +
                   " with an integer k >= " + std::to_string(own) + ")",
               i, InitValue(i) - static_cast<float>(own) * Pattern(i), out[i]);
    }
  }
}

// The timed loop's length, the same on every worker: dist_sync needs every worker to push a
// key equally often. Each worker pushes its `proposal` to the `control` key; SGD at rate 1
// leaves minus their sum there. A compressed push would not carry the number: then rank 0's
// proposal is the count, stored by Init (which keeps rank 0's value) and pulled in full (a
// key's first pull is never a change).
long AgreeOnIterations(KVStore& kv, Key control, int proposal, bool compressed) {
  float proposal_value = static_cast<float>(proposal);
  if (compressed) {
    kv.Init(control, Tensor(&proposal_value, 1));
    float agreed = 0.0f;
    kv.Pull(control, Tensor(&agreed, 1));
    kv.WaitAll();
    return std::max<long>(1, static_cast<long>(agreed));
  }
  kv.Push(control, Tensor(&proposal_value, 1));
  kv.WaitAll();
  kv.Barrier();
  float agreed = 0.0f;
  kv.Pull(control, Tensor(&agreed, 1));
  kv.WaitAll();
  return std::max<long>(
      1, static_cast<long>(std::ceil(-static_cast<double>(agreed) / kv.NumWorkers() - 1e-9)));
}

// One case's per-iteration times, as the driver reads them.
void PrintSamples(const std::string& id, const std::vector<std::int64_t>& samples_ns) {
  // Samples first, in lines short enough to be written atomically into the pipe the driver
  // reads (a log line of another thread cannot land inside one), then the result line.
  for (std::size_t first = 0; first < samples_ns.size(); first += kSamplesPerLine) {
    std::string line = std::string(kSamplesPrefix) + id + " ns=";
    const std::size_t last = std::min(samples_ns.size(), first + kSamplesPerLine);
    for (std::size_t i = first; i < last; ++i) {
      if (i > first) line += ',';
      line += std::to_string(samples_ns[i]);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void RunCase(KVStore& kv, const WorkerOptions& options, const std::string& op, std::size_t size,
             Key key, std::vector<float>& grad, std::vector<float>& out) {
  const std::size_t n = size / sizeof(float);
  CaseState c{op, size, kv.Rank(), kv.NumWorkers(), 0};
  const bool compressed = options.compression != "none" || options.pull_compression != "none";
  c.compression = options.compression;
  c.checkable = options.pull_compression == "none" && options.compression != "1bit";
  const bool pushes = op == "push" || op == "pushpull";
  const bool pulls = op == "pull" || op == "pushpull";
  const bool sync = options.mode == "dist_sync";
  grad.resize(n);
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    grad[i] = GradValue(c.rank, i);
    out[i] = InitValue(i);
  }
  const Tensor grad_view(grad.data(), n);
  const Tensor out_view(out.data(), n);
  // The case's key and a one-element control key the workers agree on an iteration count with.
  const Key control = key + 1;
  float control_value = 0.0f;
  if (compressed) {
    kv.Init(key, out_view);  // the control key would be compressed: see the agreement below
  } else {
    kv.Init({key, control}, {out_view, Tensor(&control_value, 1)});
  }

  const auto once = [&] {
    if (op == "push") {
      kv.Push(key, grad_view);
    } else if (op == "pull") {
      kv.Pull(key, out_view);
    } else {
      kv.PushPull(key, grad_view, out_view);
    }
    kv.WaitAll();
    if (pushes) ++c.rounds;
  };
  const auto check = [&](const std::string& when) {
    if (!pulls || !c.checkable || (compressed && !sync && op != "pull")) return;
    if (op == "pull") {
      CheckExact(c, out, 0, when);  // nobody pushes this key
    } else if (sync) {
      CheckExact(c, out, c.rounds, when);
    } else {
      CheckAsync(c, out, when);
    }
  };
  const auto poison = [&] {
    if (pulls) std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  };

  // Warm-up (connections, page faults, allocator), timed for the calibration.
  const int warmup = WarmupFor(options.calibration, size);
  double warm_seconds = 0;
  for (int i = 0; i < warmup; ++i) {
    if (options.verify) poison();
    const auto start = Clock::now();
    once();
    // The first iteration pays one-time costs: calibrate on the others when there are some.
    if (i > 0 || warmup == 1) warm_seconds += SecondsSince(start);
    if (options.verify) check("warm-up iteration " + std::to_string(i));
  }
  const double per_iteration = warm_seconds / std::max(1, warmup - 1);
  const int proposal = CalibratedIterations(options.calibration, per_iteration);

  const long iterations = AgreeOnIterations(kv, control, proposal, compressed);

  std::vector<std::int64_t> samples_ns;
  samples_ns.reserve(static_cast<std::size_t>(iterations));
  kv.Barrier();  // every worker starts the timed loop together
  const TrafficStats wire_start = kv.Traffic();
  const long long loop_start_us = UnixMicros();
  for (long i = 0; i < iterations; ++i) {
    if (options.verify) poison();
    const auto start = Clock::now();
    once();
    samples_ns.push_back(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    if (options.verify) check("iteration " + std::to_string(i));
  }
  const long long loop_end_us = UnixMicros();
  const TrafficStats wire_end = kv.Traffic();

  // Always: once every worker's pushes are in, the value must be exact.
  kv.Barrier();
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  kv.Pull(key, out_view);
  kv.WaitAll();
  if (c.checkable) {
    CheckExact(c, out, c.rounds, "final value after " + std::to_string(c.rounds) + " rounds");
  }

  const std::string id =
      "op=" + op + " size=" + std::to_string(size) + " rank=" + std::to_string(c.rank);
  PrintSamples(id, samples_ns);
  const double per = static_cast<double>(iterations);
  std::printf(
      "%s%s workers=%d iterations=%ld warmup=%d start_unix_us=%lld end_unix_us=%lld "
      "wire_sent=%.1f wire_received=%.1f\n",
      kResultPrefix, id.c_str(), c.workers, iterations, warmup, loop_start_us, loop_end_us,
      static_cast<double>(wire_end.bytes_sent - wire_start.bytes_sent) / per,
      static_cast<double>(wire_end.bytes_received - wire_start.bytes_received) / per);
  std::fflush(stdout);
}

}  // namespace

int RunWorker(const WorkerOptions& options) {
  // Outside the try: unwinding must not destroy it, or its destructor would tell the scheduler
  // this worker finished (and the job would end "successfully") before the error is reported.
  std::unique_ptr<KVStore> kv;
  try {
    kv = KVStore::Create(options.mode);
    OptimizerConfig sgd;
    sgd.name = "sgd";
    sgd.learning_rate = 1.0f;  // keeps integer data integer (see InitValue)
    kv->SetOptimizer(sgd);
    if (options.compression != "none" || options.pull_compression != "none") {
      kv->SetGradientCompression(ps::GradientCompression{
          .type = options.compression, .threshold = 0.5f, .pull_type = options.pull_compression});
    }
    std::vector<float> grad, out;
    Key key = 0;
    for (std::size_t size : options.sizes) {
      for (const std::string& op : options.ops) {
        RunCase(*kv, options, op, size, key, grad, out);
        key += 2;
      }
    }
    kv.reset();  // tells the scheduler this worker finished
    return 0;
  } catch (const std::exception& e) {
    std::printf("ps-bench-worker: error: %s\n", e.what());
    std::fflush(stdout);
    // Skip destructors (the KVStore's included): a peer may be stuck in a round this worker
    // will never join, and the driver stops the whole job anyway.
    (void)kv.release();
    std::_Exit(1);
  }
}

}  // namespace ps::bench
