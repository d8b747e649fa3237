#include "tools/bench/raw_baselines.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <zmq.hpp>

#include "kvstore/optimizer.h"

namespace ps::bench {
namespace {

// Below this size ps's transport copies a payload into the frame; so does the echo client.
constexpr std::size_t kZeroCopyMinBytes = 512;
// No wait in the echo exchange may exceed this.
constexpr int kEchoTimeoutMs = 30000;

// A call through a volatile pointer: the compiler cannot drop or merge the copies.
void* (*volatile g_memcpy)(void*, const void*, std::size_t) = std::memcpy;

std::vector<float> Pattern(std::size_t bytes, int scale) {
  std::vector<float> data(bytes / sizeof(float));
  for (std::size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<float>(scale) * static_cast<float>(i % 7 + 1);
  }
  return data;
}

void NoFree(void* /*data*/, void* /*hint*/) {}

}  // namespace

Result MeasureMemcpy(std::size_t bytes, const Calibration& calibration, bool verify) {
  const std::vector<float> source = Pattern(bytes, 1);
  std::vector<float> target(source.size(), 0.0f);
  // Small copies are timed in batches (the clock costs more than the copy); latency is per copy.
  const std::size_t batch = std::max<std::size_t>(1, (std::size_t{256} << 10) / bytes);
  const auto run = [&](std::vector<double>* samples) {
    const auto start = Clock::now();
    for (std::size_t b = 0; b < batch; ++b) g_memcpy(target.data(), source.data(), bytes);
    const double us = SecondsSince(start) * 1e6 / static_cast<double>(batch);
    if (samples) samples->push_back(us);
    return us;
  };
  const int warmup = WarmupFor(calibration, bytes);
  double warm_us = 0;
  for (int i = 0; i < warmup; ++i) warm_us += run(nullptr);
  const int iterations =
      CalibratedIterations(calibration, warm_us * 1e-6 * static_cast<double>(batch) / warmup);
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) run(&samples);
  if (verify && std::memcmp(source.data(), target.data(), bytes) != 0) {
    throw std::runtime_error("verify failed: memcpy of " + SizeName(bytes));
  }
  Result result;
  result.op = "memcpy";
  result.size = bytes;
  result.mode = "raw";
  result.iterations = iterations;
  result.latency = Summarize(std::move(samples));
  result.gbps = Gbps(bytes, result.latency.mean_us);
  result.note = "single thread; GB/s = bytes copied per second";
  if (batch > 1) result.note += "; timed in batches of " + std::to_string(batch);
  return result;
}

int RunEchoPeer(const std::string& transport) {
  try {
    zmq::context_t context(1);
    zmq::socket_t in(context, zmq::socket_type::pull);
    zmq::socket_t out(context, zmq::socket_type::push);
    for (zmq::socket_t* socket : {&in, &out}) {
      socket->set(zmq::sockopt::linger, 1000);
      socket->set(zmq::sockopt::rcvhwm, 0);
      socket->set(zmq::sockopt::sndhwm, 0);
    }
    // Waits are bounded: a driver that vanished must not leave the peer behind.
    in.set(zmq::sockopt::rcvtimeo, 10 * kEchoTimeoutMs);
    const std::string endpoint = transport == "ipc" ? "ipc://*" : "tcp://127.0.0.1:*";
    in.bind(endpoint);
    out.bind(endpoint);
    std::printf("%s in=%s out=%s\n", kEchoListening, in.get(zmq::sockopt::last_endpoint).c_str(),
                out.get(zmq::sockopt::last_endpoint).c_str());
    std::fflush(stdout);
    while (true) {
      zmq::message_t message;
      if (!in.recv(message)) {
        std::printf("ps-bench-echo: error: nothing received for %d s\n",
                    10 * kEchoTimeoutMs / 1000);
        return 1;
      }
      if (message.size() == 0) return 0;
      out.send(message, zmq::send_flags::none);  // the same frame back: no copy
    }
  } catch (const zmq::error_t& e) {
    std::printf("ps-bench-echo: error: %s\n", e.what());
    return 1;
  }
}

std::vector<Result> MeasureEcho(const std::string& op, const std::string& in_endpoint,
                                const std::string& out_endpoint,
                                const std::vector<std::size_t>& sizes,
                                const Calibration& calibration, bool verify) {
  zmq::context_t context(1);
  zmq::socket_t to_peer(context, zmq::socket_type::push);
  zmq::socket_t from_peer(context, zmq::socket_type::pull);
  for (zmq::socket_t* socket : {&to_peer, &from_peer}) {
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::rcvhwm, 0);
    socket->set(zmq::sockopt::sndhwm, 0);
    socket->set(zmq::sockopt::rcvtimeo, kEchoTimeoutMs);
    socket->set(zmq::sockopt::sndtimeo, kEchoTimeoutMs);
  }
  to_peer.connect(in_endpoint);
  from_peer.connect(out_endpoint);

  std::vector<Result> results;
  for (std::size_t bytes : sizes) {
    const std::vector<float> payload = Pattern(bytes, 1);
    const auto round_trip = [&] {
      zmq::message_t message =
          bytes < kZeroCopyMinBytes
              ? zmq::message_t(payload.data(), bytes)
              // The buffer outlives the exchange and is never written: no free function needed.
              : zmq::message_t(const_cast<float*>(payload.data()), bytes, &NoFree, nullptr);
      if (!to_peer.send(message, zmq::send_flags::none)) {
        throw std::runtime_error(op + ": send timed out after " +
                                 std::to_string(kEchoTimeoutMs / 1000) + " s");
      }
      zmq::message_t reply;
      if (!from_peer.recv(reply)) {
        throw std::runtime_error(op + ": no echo within " + std::to_string(kEchoTimeoutMs / 1000) +
                                 " s");
      }
      if (verify &&
          (reply.size() != bytes || std::memcmp(reply.data(), payload.data(), bytes) != 0)) {
        throw std::runtime_error("verify failed: " + op + " " + SizeName(bytes) +
                                 ": the echo differs from the message sent");
      }
    };
    const int warmup = WarmupFor(calibration, bytes);
    double warm_seconds = 0;
    for (int i = 0; i < warmup; ++i) {
      const auto start = Clock::now();
      round_trip();
      if (i > 0 || warmup == 1) warm_seconds += SecondsSince(start);
    }
    const int iterations =
        CalibratedIterations(calibration, warm_seconds / std::max(1, warmup - 1));
    std::vector<double> samples;
    samples.reserve(static_cast<std::size_t>(iterations));
    for (int i = 0; i < iterations; ++i) {
      const auto start = Clock::now();
      round_trip();
      samples.push_back(SecondsSince(start) * 1e6);
    }
    Result result;
    result.op = op;
    result.size = bytes;
    result.mode = "raw";
    result.iterations = iterations;
    result.latency = Summarize(std::move(samples));
    result.gbps = Gbps(bytes, result.latency.mean_us);
    result.note = "round trip between two processes; GB/s = message bytes per round trip";
    results.push_back(result);
  }
  return results;
}

void StopEchoPeer(const std::string& in_endpoint) {
  zmq::context_t context(1);
  zmq::socket_t to_peer(context, zmq::socket_type::push);
  to_peer.set(zmq::sockopt::linger, 2000);
  to_peer.set(zmq::sockopt::sndtimeo, 2000);
  to_peer.connect(in_endpoint);
  (void)to_peer.send(zmq::message_t(), zmq::send_flags::none);
}

Result MeasureServerAggregation(std::size_t bytes, int workers, unsigned max_threads,
                                const Calibration& calibration, bool verify) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<std::vector<float>> grads;
  for (int w = 0; w < workers; ++w) grads.push_back(Pattern(bytes, w + 1));
  std::vector<float> merge(n, 0.0f);
  std::vector<float> weight(n, 0.0f);
  OptimizerConfig config;
  config.name = "sgd";
  config.learning_rate = 0.01f;
  config.momentum = 0.9f;
  ParallelPool pool;  // as a server has: helper threads started once
  ParallelOptions parallel;
  parallel.max_threads = max_threads;
  parallel.pool = max_threads == 1 ? nullptr : &pool;
  const std::unique_ptr<Optimizer> optimizer = MakeOptimizer(config, parallel);

  // As KVServerStore does: the round's sum accumulates in place in the first push's buffer
  // (`merge` here, refilled with a fresh first push outside the timed region).
  const auto round = [&] {
    std::memcpy(merge.data(), grads[0].data(), bytes);
    const auto start = Clock::now();
    for (int w = 1; w < workers; ++w)
      AddInto(merge.data(), grads[static_cast<std::size_t>(w)].data(), n, parallel);
    optimizer->Update(1, weight.data(), merge.data(), n);
    return SecondsSince(start);
  };
  const int warmup = WarmupFor(calibration, bytes);
  double warm_seconds = 0;
  for (int i = 0; i < warmup; ++i) {
    const double seconds = round();
    if (i > 0 || warmup == 1) warm_seconds += seconds;
  }
  const int iterations = CalibratedIterations(calibration, warm_seconds / std::max(1, warmup - 1));
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) samples.push_back(round() * 1e6);
  if (verify) {
    const float sum = static_cast<float>(workers * (workers + 1) / 2);
    for (std::size_t i = 0; i < n; ++i) {
      const float expected = sum * static_cast<float>(i % 7 + 1);
      if (merge[i] != expected) {
        throw std::runtime_error("verify failed: aggregation element " + std::to_string(i) +
                                 ": expected " + std::to_string(expected) + ", got " +
                                 std::to_string(merge[i]));
      }
    }
  }
  Result result;
  result.op = max_threads == 1 ? "server_agg_sgd_1thread" : "server_agg_sgd";
  result.size = bytes;
  result.workers = workers;
  result.mode = "raw";
  result.iterations = iterations;
  result.latency = Summarize(std::move(samples));
  result.gbps = Gbps(bytes * static_cast<std::size_t>(workers), result.latency.mean_us);
  result.note = "in-process: " + std::to_string(workers - 1) +
                " AddInto into the first push + SGD momentum Update over " + SizeName(bytes) +
                "; " +
                (max_threads == 1 ? "1 thread"
                                  : "the server's default threads (" +
                                        std::to_string(ParallelThreads(n, parallel)) + ")") +
                "; GB/s = pushed gradient bytes merged per second";
  return result;
}

}  // namespace ps::bench
