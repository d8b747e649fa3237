#pragma once
// The raw limits ps-bench compares the parameter server with, measured in the same run:
// single-thread memcpy, a ZeroMQ echo between two processes (TCP loopback and ipc://), and the
// server's own aggregation + optimizer kernels called in-process.
#include <cstddef>
#include <string>
#include <vector>

#include "tools/bench/bench_util.h"

namespace ps::bench {

// The line the echo peer prints once it listens: "ps-bench-echo: listening in=EP out=EP".
inline constexpr const char* kEchoListening = "ps-bench-echo: listening";

// Single-thread memcpy of `bytes` (GB/s: bytes copied per second).
Result MeasureMemcpy(std::size_t bytes, const Calibration& calibration, bool verify);

// The echo peer (a child process): binds a PULL socket (in) and a PUSH socket (out) on
// `transport` ("tcp": 127.0.0.1, "ipc"), prints kEchoListening, and sends every message it
// receives straight back (the same frame, no copy) until it receives an empty one. Returns
// the exit status.
int RunEchoPeer(const std::string& transport);

// The client half, in the driver: round trips of each size against the peer's endpoints, the
// same socket types as ps's transport (PUSH to a PULL), zero-copy sends from 512 bytes on.
// GB/s: message bytes per round trip. Throws std::runtime_error on a timeout or a bad echo.
std::vector<Result> MeasureEcho(const std::string& op, const std::string& in_endpoint,
                                const std::string& out_endpoint,
                                const std::vector<std::size_t>& sizes,
                                const Calibration& calibration, bool verify);
// Tells the peer to exit (an empty message).
void StopEchoPeer(const std::string& in_endpoint);

// What a server does with one dist_sync round of a key: copy the first worker's push into the
// merge buffer, add the others' (ps::CopyInto, ps::AddInto), then apply SGD with momentum
// (ps::MakeOptimizer(...)->Update). max_threads 0 is the server's default split
// (ps::ParallelOptions). GB/s: gradient bytes merged per second (workers * bytes per round).
Result MeasureServerAggregation(std::size_t bytes, int workers, unsigned max_threads,
                                const Calibration& calibration, bool verify);

}  // namespace ps::bench
