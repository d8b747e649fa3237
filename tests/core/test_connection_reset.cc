// Connections reset between live nodes: what a firewall, a NAT or a middlebox does to a
// long-lived TCP connection, here done with `ss -K` (the kernel destroys the socket and sends
// the peer a reset). ZeroMQ reconnects at once, but what was in flight on the old connection is
// gone: before Runtime::OnConnectionReset the worker waited for its answer forever.
// Everything runs on 127.0.0.1 over TCP (PS_USE_IPC=0); every wait is bounded.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ps/kvstore.h"
#include "tests/kvstore/kv_cluster.h"
#include "tests/util/child_process.h"
#include "tests/util/temp_dir.h"

namespace {

using namespace std::chrono_literals;
using ps::test::ChildProcess;
using ps::test::Env;
using ps::test::KVCluster;

// Destroys every TCP socket on this machine whose remote end is 127.0.0.1:`port`; true when
// `ss` ran and succeeded.
bool ResetConnectionsTo(int port) {
  ChildProcess ss({"/bin/sh", "-c",
                   "exec ss -K dst 127.0.0.1 dport = :" + std::to_string(port) + " >/dev/null"},
                  {});
  return ss.Wait(10s) == 0;
}

// Whether `ss -K` can reset a connection here (it needs root and a kernel with
// CONFIG_INET_DIAG_DESTROY): tried on a connection of the test's own.
bool CanResetConnections() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  bool reset = false;
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      listen(listener, 1) == 0 &&
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        ResetConnectionsTo(ntohs(address.sin_port))) {
      int error = 0;
      socklen_t size = sizeof(error);
      getsockopt(client, SOL_SOCKET, SO_ERROR, &error, &size);
      char byte = 0;
      reset = error != 0 || recv(client, &byte, 1, MSG_DONTWAIT) == 0;
    }
    close(client);
  }
  close(listener);
  return reset;
}

// Whether a case can run; says why not when it cannot.
bool ResetsOrSkip() {
  if (CanResetConnections()) return true;
  WARN("skipped: needs root and ss -K (a kernel with CONFIG_INET_DIAG_DESTROY)");
  return false;
}

// The TCP ports this process listens on (its in-process workers').
std::set<int> OwnListeningPorts() {
  ChildProcess ss({"/bin/sh", "-c", "exec ss -Htlnp"}, {});
  ss.Wait(10s);
  std::set<int> ports;
  const std::regex listening(":(\\d+) .*pid=" + std::to_string(getpid()) + ",");
  std::istringstream lines(ss.Output());
  for (std::string line; std::getline(lines, line);) {
    if (std::smatch match; std::regex_search(line, match, listening))
      ports.insert(std::stoi(match[1]));
  }
  return ports;
}

// The ports the processes listen on ("listening on 127.0.0.1:PORT", logged at PS_VERBOSE=1).
std::set<int> ListeningPorts(const std::vector<ChildProcess*>& processes) {
  std::set<int> ports;
  const std::regex listening("listening on 127\\.0\\.0\\.1:(\\d+)");
  for (const ChildProcess* process : processes) {
    const std::string output = process->Output();
    for (auto it = std::sregex_iterator(output.begin(), output.end(), listening);
         it != std::sregex_iterator(); ++it) {
      ports.insert(std::stoi((*it)[1]));
    }
  }
  return ports;
}

Env ResetJobEnv() {
  return {{"PS_USE_IPC", "0"},  // TCP between every pair of nodes: ss -K resets TCP only
          {"PS_VERBOSE", "1"},
          {"PS_HEARTBEAT_TIMEOUT", "20"}};  // a reset must never pass for a death
}

std::unique_ptr<ChildProcess> StartChecker(const KVCluster& cluster, const std::string& type,
                                           int rounds, std::vector<std::string> extra = {}) {
  Env env = cluster.env();
  env["DMLC_ROLE"] = "worker";
  std::vector<std::string> args = {ps::test::BinPath("ps-kvstore-check"),
                                   "--type",
                                   type,
                                   "--rounds",
                                   std::to_string(rounds),
                                   "--report-every",
                                   "100",
                                   "--big-size",
                                   "300000"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<ChildProcess>(args, env);
}

}  // namespace

TEST_CASE("connection reset: a replicated job goes on, every value exact", "[reset]") {
  if (!ResetsOrSkip()) return;
  const std::string type = GENERATE("dist_sync", "dist_async");
  INFO("type " << type);
  KVCluster cluster(2, 2, ResetJobEnv());
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int w = 0; w < 2; ++w) workers.push_back(StartChecker(cluster, type, 1200));
  // Every connection to a server or a worker, at eight moments spread over the job: requests,
  // answers and the servers' updates to their replicas are all in flight at some of them.
  for (int round = 100; round <= 800; round += 100) {
    REQUIRE(workers[0]->WaitForOutput("kvstore-check: round " + std::to_string(round) + "\n", 60s));
    std::vector<ChildProcess*> nodes;
    for (auto& server : cluster.servers()) nodes.push_back(server.get());
    for (auto& worker : workers) nodes.push_back(worker.get());
    const std::set<int> ports = ListeningPorts(nodes);
    REQUIRE(ports.size() == 4);
    for (const int port : ports) REQUIRE(ResetConnectionsTo(port));
  }
  // Then a server dies: its replica serves its slices from the copies the resets left it, so
  // a copy that missed an update, or took one twice, shows in the values.
  REQUIRE(workers[0]->WaitForOutput("kvstore-check: round 900\n", 60s));
  cluster.servers()[0]->Kill(SIGKILL);
  std::string logs;
  for (auto& worker : workers) {
    const auto status = worker->Wait(60s);
    INFO("worker output: " << worker->Tail(10));
    CHECK(status == 0);
    CHECK_THAT(worker->Output(), Catch::Contains("kvstore-check: ok"));
    logs += worker->Output();
  }
  CHECK(cluster.scheduler().Wait(20s) == 0);
  CHECK(cluster.servers()[1]->Wait(20s) == 0);
  for (auto& server : cluster.servers()) logs += server->Output();
  // The resets happened and were acted on (not merely survived by luck).
  CHECK_THAT(logs, Catch::Contains("was reset (#1)"));
}

TEST_CASE("connection reset: collectives run again, every value exact", "[reset]") {
  if (!ResetsOrSkip()) return;
  // Every 3rd round SetOptimizer, an Init checked by a pull, SaveCheckpoint and LoadCheckpoint.
  // Every connection is reset: the servers', the workers' and the scheduler's (the collectives'
  // barriers are sent again).
  KVCluster cluster(2, 2, ResetJobEnv());
  const ps::test::TempDir checkpoints;
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(
        StartChecker(cluster, "dist_sync", 900,
                     {"--collectives-every", "3", "--checkpoint-dir", checkpoints.path()}));
  }
  std::vector<ChildProcess*> servers;
  for (auto& server : cluster.servers()) servers.push_back(server.get());
  for (int round = 100; round <= 800; round += 100) {
    if (!workers[0]->WaitForOutput("kvstore-check: round " + std::to_string(round) + "\n", 60s)) {
      FAIL("no round " << round << "; worker 0: " << workers[0]->Tail(12) << "\nworker 1: "
                       << workers[1]->Tail(12) << "\nserver 0: " << servers[0]->Tail(8)
                       << "\nserver 1: " << servers[1]->Tail(8));
    }
    std::vector<ChildProcess*> nodes = servers;
    for (auto& worker : workers) nodes.push_back(worker.get());
    std::set<int> ports = ListeningPorts(nodes);
    REQUIRE(ports.size() == 4);
    ports.insert(std::stoi(cluster.env().at("DMLC_PS_ROOT_PORT")));
    for (const int port : ports) REQUIRE(ResetConnectionsTo(port));
  }
  for (auto& worker : workers) {
    const auto status = worker->Wait(60s);
    INFO("worker output: " << worker->Tail(10));
    CHECK(status == 0);
    CHECK_THAT(worker->Output(), Catch::Contains("kvstore-check: ok"));
  }
  CHECK(cluster.EndedCleanly());
}

TEST_CASE("connection reset: without replication the worker fails naming it, never hangs",
          "[reset]") {
  if (!ResetsOrSkip()) return;
  // One worker stops before its push of round 50, so the other's push of that round waits at the
  // server for good: a request certainly in flight when the connection is reset.
  KVCluster cluster(1, 2, ResetJobEnv());
  Env env = cluster.env();
  env["DMLC_ROLE"] = "worker";
  const std::vector<std::string> check = {ps::test::BinPath("ps-kvstore-check"), "--rounds", "100",
                                          "--report-every", "1"};
  ChildProcess waiting(check, env);
  std::vector<std::string> pausing_args = check;
  pausing_args.insert(pausing_args.end(), {"--pause-at-round", "50"});
  ChildProcess pausing(pausing_args, env);
  REQUIRE(pausing.WaitForOutput("kvstore-check: paused at round 50\n", 60s));
  REQUIRE(waiting.WaitForOutput("kvstore-check: round 49\n", 60s));
  const std::set<int> ports = ListeningPorts({cluster.servers()[0].get()});
  REQUIRE(ports.size() == 1);
  REQUIRE(ResetConnectionsTo(*ports.begin()));
  const auto status = waiting.Wait(30s);
  INFO("worker output: " << waiting.Tail(10));
  REQUIRE(status.has_value());
  CHECK(*status != 0);
  CHECK_THAT(waiting.Output(),
             Catch::Contains("was reset while this request was in flight, so it or its answer "
                             "may be lost"));
  // The job ends naming the worker's failure: the scheduler and the server do not wait on.
  CHECK(cluster.scheduler().Wait(20s).has_value());
  CHECK(cluster.servers()[0]->Wait(20s).has_value());
}

TEST_CASE("connection reset: barriers are sent again, every one holds", "[reset]") {
  if (!ResetsOrSkip()) return;
  // The workers are threads of this process, each with its own runtime, over TCP: resetting
  // the scheduler's port and this process's ports resets both directions between them.
  KVCluster cluster(1, 2, {{"PS_USE_IPC", "0"}, {"PS_VERBOSE", "1"}});
  const int scheduler_port = std::stoi(cluster.env().at("DMLC_PS_ROOT_PORT"));
  constexpr int kBarriers = 2000;
  std::array<std::atomic<int>, 2> entered{};  // barriers each worker entered
  std::promise<void> waiting_promise;         // worker 0 waits in the first barrier
  std::promise<void> resets_done_promise;     // the first barrier's resets are over
  std::promise<void> finished_promise;        // both workers left the loop
  std::shared_future<void> resets_done = resets_done_promise.get_future().share();
  std::shared_future<void> finished = finished_promise.get_future().share();
  int resets = 0;
  std::thread resetter([&, waiting = waiting_promise.get_future()]() mutable {
    const auto reset_all = [&] {
      bool done = ResetConnectionsTo(scheduler_port);
      for (const int port : OwnListeningPorts()) done = ResetConnectionsTo(port) && done;
      resets += done ? 1 : 0;
    };
    // First: worker 0 waits in a barrier while every connection it has with the scheduler is
    // reset, and worker 1 joins only afterwards.
    if (waiting.wait_for(60s) == std::future_status::ready) {
      for (int round = 0; round < 5; ++round) {
        reset_all();
        finished.wait_for(300ms);  // time for the reconnections
      }
    }
    resets_done_promise.set_value();
    // Then: resets while both run barriers back to back, some of them between a request or a
    // release and its arrival.
    for (int round = 0; round < 1000 && finished.wait_for(20ms) != std::future_status::ready;
         ++round) {
      reset_all();
    }
    // A barrier that never ends: without the scheduler the workers fail (heartbeat timeout).
    if (finished.wait_for(60s) != std::future_status::ready) cluster.scheduler().Kill(SIGKILL);
  });
  std::atomic<int> left{0};
  const auto outcomes = cluster.RunWorkers("dist_sync", [&](ps::KVStore& kv) {
    const int rank = kv.Rank();
    const int other = 1 - rank;
    if (rank == 0) {
      waiting_promise.set_value();
    } else {
      ps::test::Expect(resets_done.wait_for(60s) == std::future_status::ready,
                       "the resets did not end");
    }
    for (int barrier = 1; barrier <= kBarriers; ++barrier) {
      entered[rank].store(barrier);
      kv.Barrier();
      // A barrier released early, or a release of an earlier one taken for this one, shows
      // here: the other worker has not entered it yet.
      ps::test::Expect(entered[other].load() >= barrier,
                       "barrier " + std::to_string(barrier) + " released worker " +
                           std::to_string(rank) + " before worker " + std::to_string(other) +
                           " entered it");
    }
    if (++left == 2) finished_promise.set_value();
  });
  resetter.join();
  INFO("outcomes: " << outcomes[0] << " / " << outcomes[1]);
  CHECK(outcomes[0].empty());
  CHECK(outcomes[1].empty());
  CHECK(resets >= 5);
  CHECK(cluster.EndedCleanly());
}
