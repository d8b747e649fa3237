// How a worker process logs when the program has not set glog up (ps/src/glog_or_stderr.h):
// glog's format on stderr, no "Logging before InitGoogleLogging()" banner, and the program may
// still call InitGoogleLogging afterwards; and a dist_sync wait that lasts says so. Real
// ps-scheduler and ps-server, and a worker process (ps-test-glog-late-worker, or
// ps-kvstore-check, which never sets glog up).
#include <catch2/catch.hpp>

#include <signal.h>

#include <regex>
#include <string>

#include "tests/kvstore/kv_cluster.h"

namespace {

using namespace std::chrono_literals;
using ps::test::ChildProcess;
using ps::test::KVCluster;

// A line as glog writes it: "I20240101 12:00:00.123456  4242 runtime.cc:123] <text>".
bool HasGlogLine(const std::string& output, const std::string& file, const std::string& text) {
  return std::regex_search(output, std::regex("(^|\n)I\\d{8} \\d\\d:\\d\\d:\\d\\d\\.\\d{6} +\\d+ " +
                                              file + ":\\d+\\] " + text));
}

// The job's settings for a worker process.
ps::test::Env WorkerEnv(const KVCluster& cluster) {
  auto env = cluster.env();
  env["DMLC_ROLE"] = "worker";
  return env;
}

}  // namespace

TEST_CASE("worker logging: no glog banner, and the program may set glog up after Create",
          "[kvstore][dist][logging]") {
  KVCluster cluster(1, 1, {{"PS_VERBOSE", "1"}});
  const auto env = WorkerEnv(cluster);
  ChildProcess worker({ps::test::BinPath("ps-test-glog-late-worker")}, env);
  CHECK(worker.Wait(60s) == 0);
  const std::string output = worker.Output();
  INFO(output);
  CHECK_THAT(output, Catch::Contains("glog late worker: ok, pulled 1"));
  CHECK_THAT(output, !Catch::Contains("Logging before InitGoogleLogging"));
  // Before the program's InitGoogleLogging: the library's lines, in glog's format.
  CHECK(HasGlogLine(output, "runtime.cc", "registered as worker"));
  // After it: the program's own glog works (it did not abort as a second initialization).
  CHECK(HasGlogLine(output, "glog_late_worker.cc", "the program set up glog"));
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("worker logging: a program that never sets glog up logs without the banner",
          "[kvstore][dist][logging]") {
  KVCluster cluster(1, 2, {{"PS_VERBOSE", "1"}});
  const auto env = WorkerEnv(cluster);
  ChildProcess first({ps::test::BinPath("ps-kvstore-check"), "--rounds", "2"}, env);
  ChildProcess second({ps::test::BinPath("ps-kvstore-check"), "--rounds", "2"}, env);
  for (ChildProcess* worker : {&first, &second}) {
    CHECK(worker->Wait(60s) == 0);
    const std::string output = worker->Output();
    INFO(output);
    CHECK_THAT(output, !Catch::Contains("Logging before InitGoogleLogging"));
    CHECK(HasGlogLine(output, "runtime.cc", "registered as worker"));
  }
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("worker logging: a dist_sync wait that lasts says what holds it up",
          "[kvstore][dist][logging]") {
  // The second worker stops at round 5 (alive, computing as far as anyone can tell): after
  // half of PS_STALL_TIMEOUT (2 s of 4) the first one's wait says why it lasts.
  KVCluster cluster(1, 2, {{"PS_STALL_TIMEOUT", "4"}});
  const auto env = WorkerEnv(cluster);
  ChildProcess waiting({ps::test::BinPath("ps-kvstore-check"), "--rounds", "20"}, env);
  ChildProcess paused(
      {ps::test::BinPath("ps-kvstore-check"), "--rounds", "20", "--pause_at_round", "5"}, env);
  CHECK(
      waiting.WaitForOutput("for dist_sync rounds: a round completes once every worker pushed "
                            "its key, so a worker still computing, or one whose pushes are still "
                            "on their way, holds the others up",
                            30s));
  INFO(waiting.Output());
  CHECK_THAT(waiting.Output(), Catch::Contains(" has waited 2"));
  // Its own pushes went out at once over loopback: nothing of its own is said to be on its way.
  CHECK_THAT(waiting.Output(), !Catch::Contains("of this worker's own messages are still on"));
  // The job cannot end: the paused worker waits for ever. Both go with the test.
  paused.Kill(SIGKILL);
  waiting.Kill(SIGKILL);
}
