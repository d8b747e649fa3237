// Replication (PS_REPLICATION, docs/kvstore.md "Replication and failover"): one of 3 servers
// is killed (SIGKILL) or stopped past the heartbeat timeout (SIGSTOP) at a random moment
// while 2 workers run ps-kvstore-check, whose integer-valued sums show any update lost or
// applied twice (it checks every dist_sync round, and dist_async at the end, against what an
// undisturbed run gives). In some cases the workers also run collectives every round (Init,
// SetOptimizer, checkpoints), so that the fault lands in those too. Every process is started and
// stopped by the test; every wait is bounded.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/child_process.h"
#include "tests/util/sanitizer.h"
#include "tests/util/temp_dir.h"

namespace {

using namespace std::chrono_literals;

// Descriptors process `pid` holds open, once the count held still for 3 s (the connections of
// nodes that just left close later: the scheduler's socket to a refused node lingers up to
// 2 s to flush its reply), or after 10 s.
rlim_t SettledOpenDescriptors(pid_t pid) {
  const auto count = [pid] {
    rlim_t open = 0;
    for ([[maybe_unused]] const auto& entry :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
      ++open;
    }
    return open;
  };
  rlim_t open = count();
  for (int same = 0, reads = 0; same < 60 && reads < 200; ++reads) {
    std::this_thread::sleep_for(50ms);
    const rlim_t now = count();
    same = now == open ? same + 1 : 0;
    open = now;
  }
  return open;
}
using ps::test::ChildProcess;
using Env = std::map<std::string, std::string>;

// ThreadSanitizer runs every process about ten times slower: fewer rounds keep each job within
// its bounds (and the test case within ctest's timeout), still long enough that every fault
// lands mid-job.
constexpr int kRoundsDivisor = ps::test::kThreadSanitizer ? 5 : 1;

Env JobEnv(int port) {
  return {{"DMLC_PS_ROOT_URI", "127.0.0.1"},
          {"DMLC_PS_ROOT_PORT", std::to_string(port)},
          {"DMLC_NUM_SERVER", "3"},
          {"DMLC_NUM_WORKER", "2"},
          {"PS_HEARTBEAT_INTERVAL", "0.2"},
          {"PS_HEARTBEAT_TIMEOUT", "2"},
          {"PS_REGISTER_TIMEOUT", "30"},
          // The big key is sliced over all three servers, the small ones live on one each.
          {"MXNET_KVSTORE_BIGARRAY_BOUND", "100000"},
          {"PS_CHUNK_BYTES", "262144"},
          {"DMLC_ROLE", "worker"}};
}

std::unique_ptr<ChildProcess> Start(const std::string& binary, const Env& env,
                                    std::vector<std::string> args = {}) {
  args.insert(args.begin(), ps::test::BinPath(binary));
  return std::make_unique<ChildProcess>(args, env);
}

// A job's scheduler (on a port it picks) and its 3 servers, with `env` pointing at it, before
// the workers start (the tests pick their victims by process index).
struct Job {
  Env env = JobEnv(0);
  std::unique_ptr<ChildProcess> scheduler;
  std::vector<std::unique_ptr<ChildProcess>> servers;
};

// `weighted`: server 2 holds a quarter of what each other server holds (PS_SERVER_WEIGHTS).
Job StartSchedulerAndServers(bool weighted = false) {
  Job job;
  if (weighted) job.env["PS_SERVER_WEIGHTS"] = "1,1,0.25";
  job.scheduler = Start("ps-scheduler", job.env);
  REQUIRE(job.scheduler->WaitForOutput("listening on 127.0.0.1:", 10s));
  const std::string listening = job.scheduler->Output();
  const auto at = listening.find("listening on 127.0.0.1:");
  job.env["DMLC_PS_ROOT_PORT"] = std::to_string(std::stoi(listening.substr(at + 23)));
  for (int s = 0; s < 3; ++s) job.servers.push_back(Start("ps-server", job.env));
  return job;
}

// Every worker ends with the values an undisturbed run gives, and the scheduler with status 0.
void CheckJobSucceeded(std::vector<std::unique_ptr<ChildProcess>>& workers,
                       ChildProcess& scheduler) {
  for (auto& worker : workers) {
    const auto status = worker->Wait(240s);  // a bound: about 20 s here, 60 s under TSan
    INFO(worker->name() << ": " << worker->Tail(8));
    CHECK(status == 0);
    CHECK_THAT(worker->Output(), Catch::Contains("kvstore-check: ok"));
  }
  const auto scheduler_status = scheduler.Wait(20s);
  INFO("scheduler: " << scheduler.Tail(8));
  CHECK(scheduler_status == 0);
}

// What the workers do between rounds besides pushing and pulling: nothing; every round set the
// optimizer and initialize a key (quick collectives); and save and load a checkpoint too (slow
// ones, so that the fault lands in one of them as often as not).
enum class Collectives { kNone, kInitAndOptimizer, kWithCheckpoints };

struct Disturbance {
  std::string type;
  int signal;
  bool separate_pull;
  // Then a second server, once the first one's slices were copied to new replicas: the last
  // one carries the job alone.
  bool second_victim = false;
  Collectives collectives = Collectives::kNone;
  bool weighted = false;  // server weights 1,1,0.25: the ranges move all the same
};

// One job with one server disturbed `delay` after the workers' round 10.
void RunJob(const Disturbance& what, std::size_t victim, std::chrono::milliseconds delay) {
  INFO(what.type << (what.signal == SIGKILL ? ", SIGKILL" : ", SIGSTOP") << " to server process "
                 << victim << " " << delay.count() << " ms after round 10"
                 << (what.separate_pull ? ", Push then Pull" : ", PushPull")
                 << (what.second_victim ? ", then SIGKILL to the next server process" : "")
                 << (what.collectives == Collectives::kNone ? ""
                     : what.collectives == Collectives::kInitAndOptimizer
                         ? ", Init every round"
                         : ", checkpoints every round")
                 << (what.weighted ? ", server weights 1,1,0.25" : ""));
  auto [env, scheduler, servers] = StartSchedulerAndServers(what.weighted);
  std::vector<std::unique_ptr<ChildProcess>> workers;
  // Enough rounds that the faults land mid-job on an idle machine (about 700 rounds/s here,
  // 250 with Init every round, 30 with checkpoints).
  const int base_rounds = what.collectives == Collectives::kWithCheckpoints ? 300
                          : what.second_victim                              ? 5000
                                                                            : 2500;
  const std::string rounds = std::to_string(base_rounds / kRoundsDivisor);
  std::vector<std::string> args{"--type",     what.type, "--rounds",       rounds,
                                "--keys",     "6",       "--size",         "2000",
                                "--big_size", "300000",  "--report_every", "10"};
  if (what.separate_pull) args.push_back("--separate_pull");
  const ps::test::TempDir checkpoints;
  if (what.collectives != Collectives::kNone) {
    args.insert(args.end(), {"--collectives_every", "1"});
  }
  if (what.collectives == Collectives::kWithCheckpoints) {
    args.insert(args.end(), {"--checkpoint_dir", checkpoints.path()});
  }
  for (int w = 0; w < 2; ++w) workers.push_back(Start("ps-kvstore-check", env, args));
  REQUIRE(workers[0]->WaitForOutput("kvstore-check: round 10\n", 60s));
  std::this_thread::sleep_for(delay);              // the moment of the fault, not a synchronization
  REQUIRE(workers[0]->Wait(0ms) == std::nullopt);  // still running: the fault is mid-job
  servers[victim]->Kill(what.signal);
  const std::size_t second = (victim + 1) % servers.size();
  if (what.second_victim) {
    REQUIRE(scheduler->WaitForOutput("the job goes on without server", 30s));
    // The survivors copy the dead one's slices as soon as they hear of it (a few ms here);
    // workers keep going meanwhile, so this checks the job, not a race with the copy.
    std::this_thread::sleep_for(1500ms);
    REQUIRE(workers[0]->Wait(0ms) == std::nullopt);  // still running: the kill is mid-job
    servers[second]->Kill(SIGKILL);
  }

  CheckJobSucceeded(workers, *scheduler);
  CHECK_THAT(scheduler->Output(), Catch::Contains("the job goes on without server"));
  for (std::size_t s = 0; s < servers.size(); ++s) {
    if (s == victim || (what.second_victim && s == second)) continue;
    const auto status = servers[s]->Wait(20s);
    INFO(servers[s]->name() << ": " << servers[s]->Tail(8));
    CHECK(status == 0);
  }
  servers[victim]->Kill(SIGKILL);  // a stopped one too (its destructor reaps it)
}

// A server started after one died takes its rank and becomes the replica of the server before
// it; then the two servers of the job's start die in turn (each once the copies it causes are
// made), so that in the end the new server serves every key: any update it missed shows in the
// workers' exact sums. With collectives every round (SetOptimizer, Init), the new server must
// also get the optimizer and its state with its copies, and the calls it missed while joining.
void RunRejoinJob(const std::string& type, bool collectives) {
  std::random_device seed_source;
  const unsigned seed = seed_source();
  INFO(type << (collectives ? " with collectives" : "") << ", seed " << seed);
  std::mt19937 random(seed);
  auto [env, scheduler, servers] = StartSchedulerAndServers();
  std::vector<std::unique_ptr<ChildProcess>> workers;
  // About 20 s here either way (Init every round is slower).
  const int rounds = (collectives ? 4000 : 12000) / kRoundsDivisor;
  std::vector<std::string> args{"--type",     type,     "--rounds",       std::to_string(rounds),
                                "--keys",     "6",      "--size",         "2000",
                                "--big_size", "300000", "--report_every", "10"};
  if (collectives) args.insert(args.end(), {"--collectives_every", "1"});
  for (int w = 0; w < 2; ++w) workers.push_back(Start("ps-kvstore-check", env, args));
  REQUIRE(workers[0]->WaitForOutput("kvstore-check: round 10\n", 60s));
  std::vector<std::size_t> order{0, 1, 2};
  std::shuffle(order.begin(), order.end(), random);
  std::this_thread::sleep_for(  // the moment of the fault, not a synchronization
      std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 800)(random)));
  servers[order[0]]->Kill(SIGKILL);
  REQUIRE(scheduler->WaitForOutput("the job goes on without server", 30s));
  auto joined = Start("ps-server", env);
  REQUIRE(scheduler->WaitForOutput("joined the job in the place of dead server", 30s));
  for (std::size_t i = 1; i < order.size(); ++i) {
    // The survivors copy what the change gives them as soon as they hear of it (a few ms
    // here); the workers keep going meanwhile, so this checks the job, not a race with it.
    std::this_thread::sleep_for(1500ms);
    INFO("worker 0: " << workers[0]->Tail(12) << "\nworker 1: " << workers[1]->Tail(12)
                      << "\njoined server: " << joined->Tail(8)
                      << "\nscheduler: " << scheduler->Tail(8));
    REQUIRE(workers[0]->Wait(0ms) == std::nullopt);  // still running: the kill is mid-job
    servers[order[i]]->Kill(SIGKILL);
  }
  CheckJobSucceeded(workers, *scheduler);
  const auto joined_status = joined->Wait(20s);
  INFO("joined server: " << joined->Tail(8));
  CHECK(joined_status == 0);
  // It served the job alone at the end.
  CHECK_THAT(joined->Output(), Catch::Contains("no replica is left for this server's keys"));
  // The death of the server whose rank it took is no news to it: not reported as a fresh loss.
  const std::string output = joined->Output();
  const std::string took = "took the place of dead server ";
  const std::size_t at = output.find(took);
  REQUIRE(at != std::string::npos);
  const std::string rank = output.substr(at + took.size(), 1);  // ranks 0-2 here
  CHECK_THAT(output, !Catch::Contains("scheduler reports server " + rank + " (node"));
}

}  // namespace

TEST_CASE("failover: a server killed or stopped at a random moment changes no value",
          "[failover]") {
  const Disturbance what = GENERATE(
      Disturbance{"dist_sync", SIGKILL, false}, Disturbance{"dist_sync", SIGKILL, true},
      Disturbance{"dist_sync", SIGSTOP, true}, Disturbance{"dist_async", SIGKILL, false},
      Disturbance{"dist_async", SIGSTOP, true}, Disturbance{"dist_sync", SIGKILL, false, true},
      Disturbance{"dist_async", SIGKILL, true, true},
      Disturbance{"dist_sync", SIGKILL, false, false, Collectives::kWithCheckpoints},
      Disturbance{"dist_async", SIGKILL, false, false, Collectives::kInitAndOptimizer},
      Disturbance{"dist_sync", SIGSTOP, false, false, Collectives::kWithCheckpoints},
      Disturbance{"dist_sync", SIGKILL, false, false, Collectives::kWithCheckpoints, true},
      Disturbance{"dist_async", SIGKILL, true, false, Collectives::kNone, true});
  // PS_FAILOVER_RUNS=N repeats each case N times at other moments (docs/kvstore.md).
  const char* runs_text = std::getenv("PS_FAILOVER_RUNS");
  const int runs =
      runs_text != nullptr ? std::max(1, std::atoi(runs_text)) : (kRoundsDivisor == 1 ? 2 : 1);
  std::random_device seed_source;
  const unsigned seed = seed_source();
  INFO("seed " << seed);
  std::mt19937 random(seed);
  for (int run = 0; run < runs; ++run) {
    const auto victim = std::uniform_int_distribution<std::size_t>(0, 2)(random);
    const auto delay =
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 800)(random));
    RunJob(what, victim, delay);
  }
}

// Two ps-kvstore-check workers with more rounds than a test lasts, once they are under way.
std::vector<std::unique_ptr<ChildProcess>> StartEndlessWorkers(const Env& env) {
  std::vector<std::unique_ptr<ChildProcess>> workers;
  const std::vector<std::string> args{"--rounds",       "1000000", "--keys",     "6",
                                      "--size",         "2000",    "--big_size", "300000",
                                      "--report_every", "10"};
  for (int w = 0; w < 2; ++w) workers.push_back(Start("ps-kvstore-check", env, args));
  REQUIRE(workers[0]->WaitForOutput("kvstore-check: round 10\n", 60s));
  return workers;
}

TEST_CASE("failover: two servers lost at once end the job naming the lost keys", "[failover]") {
  // Both copies of some slices die before a new copy can be made: the job cannot recover them
  // and must end with a message saying so, not hang or compute on.
  auto [env, scheduler, servers] = StartSchedulerAndServers();
  auto workers = StartEndlessWorkers(env);
  servers[0]->Kill(SIGKILL);
  servers[1]->Kill(SIGKILL);
  for (auto& worker : workers) {
    const auto status = worker->Wait(60s);
    INFO(worker->name() << ": " << worker->Tail(8));
    CHECK(status == 1);
    CHECK_THAT(worker->Output(), Catch::Contains("lost: the servers that held it died before a "
                                                 "new copy was made"));
  }
  const auto scheduler_status = scheduler->Wait(20s);
  INFO("scheduler: " << scheduler->Tail(8));
  CHECK(scheduler_status == 1);
  const auto survivor = servers[2]->Wait(20s);
  INFO("server: " << servers[2]->Tail(8));
  CHECK(survivor.has_value());
}

TEST_CASE("failover: the last server's death ends the job saying that none is left", "[failover]") {
  // Two deaths survived, then the third: the job ends naming that none is left, not one of
  // the deaths it survived (which the requests sent to a dead owner used to name).
  auto [env, scheduler, servers] = StartSchedulerAndServers();
  auto workers = StartEndlessWorkers(env);
  servers[0]->Kill(SIGKILL);
  REQUIRE(scheduler->WaitForOutput("2 server(s) left", 30s));
  servers[1]->Kill(SIGKILL);
  REQUIRE(scheduler->WaitForOutput("1 server(s) left", 30s));
  servers[2]->Kill(SIGKILL);
  const std::string none_left = "and no server is left (";
  for (auto& worker : workers) {
    const auto status = worker->Wait(60s);
    INFO(worker->name() << ": " << worker->Tail(8));
    CHECK(status == 1);
    const std::string output = worker->Output();
    const auto error_at = output.rfind("ps-kvstore-check: error: ");
    REQUIRE(error_at != std::string::npos);
    const std::string error = output.substr(error_at, output.find('\n', error_at) - error_at);
    CHECK_THAT(error, Catch::Contains("no server is left") ||
                          Catch::Contains("no server of the job is left"));
  }
  const auto scheduler_status = scheduler->Wait(20s);
  INFO("scheduler: " << scheduler->Tail(8));
  CHECK(scheduler_status == 1);
  CHECK_THAT(scheduler->Output(),
             Catch::Contains(none_left) && Catch::Contains("start the job again from its last "
                                                           "checkpoint"));
}

TEST_CASE("failover: a server started after one died takes its rank and carries the job alone",
          "[failover]") {
  RunRejoinJob(GENERATE(as<std::string>{}, "dist_sync", "dist_async"), false);
}

TEST_CASE("failover: a server that takes a dead one's rank gets the optimizer with its copies",
          "[failover]") {
  RunRejoinJob("dist_sync", true);
}

TEST_CASE(
    "failover: a late server is refused while none died or with other settings and the "
    "job goes on",
    "[failover]") {
  auto [env, scheduler, servers] = StartSchedulerAndServers();
  std::vector<std::unique_ptr<ChildProcess>> workers;
  const std::vector<std::string> args{"--rounds",       std::to_string(12000 / kRoundsDivisor),
                                      "--keys",         "6",
                                      "--size",         "2000",
                                      "--report_every", "10"};
  for (int w = 0; w < 2; ++w) workers.push_back(Start("ps-kvstore-check", env, args));
  REQUIRE(workers[0]->WaitForOutput("kvstore-check: round 10\n", 60s));
  const auto refused = [](const Env& late_env, const std::string& why) {
    auto late = Start("ps-server", late_env);
    const auto late_status = late->Wait(30s);
    INFO("late server: " << late->Tail(4));
    CHECK(late_status == 1);
    CHECK_THAT(late->Output(), Catch::Contains(why));
  };
  refused(env,
          "none of its servers died: a server started later joins a running job only in "
          "the place of a dead one");
  // A worker too many (started twice, or a second store in a process): refused, named.
  auto late_worker = Start("ps-kvstore-check", env, {"--rounds", "1"});
  const auto late_worker_status = late_worker->Wait(30s);
  INFO("late worker: " << late_worker->Tail(4));
  CHECK(late_worker_status == 1);
  CHECK_THAT(late_worker->Output(), Catch::Contains("the job already has all its nodes") &&
                                        Catch::Contains("second dist KVStore"));
  servers[0]->Kill(SIGKILL);
  REQUIRE(scheduler->WaitForOutput("the job goes on without server", 30s));
  // A rank is free now, but a server that sees the job differently cannot take it; the job
  // does not end for it either.
  Env other = env;
  other["PS_HEARTBEAT_TIMEOUT"] = "3";
  refused(other, "PS_HEARTBEAT_TIMEOUT");
  // The scheduler near its descriptor limit: a server that could take the rank is refused and
  // told why, not admitted, announced and then never reached (declared dead 20 s later).
  {
    rlimit before{};
    REQUIRE(::prlimit(scheduler->pid(), RLIMIT_NOFILE, nullptr, &before) == 0);
    rlimit tight = before;
    tight.rlim_cur = SettledOpenDescriptors(scheduler->pid()) + 7;  // a reply's worth to spare
    REQUIRE(::prlimit(scheduler->pid(), RLIMIT_NOFILE, &tight, nullptr) == 0);
    refused(env, "the scheduler cannot take another node: this process has ");
    REQUIRE(::prlimit(scheduler->pid(), RLIMIT_NOFILE, &before, nullptr) == 0);
  }
  // Once a server took the free rank, the next one is told that, not that none died.
  auto replacement = Start("ps-server", env);
  REQUIRE(scheduler->WaitForOutput("joined the job in the place of dead server", 30s));
  refused(env,
          "and each of its servers that died was replaced already: a server started later "
          "joins a running job only in the place of a dead one");
  INFO("worker 0 at the end of the refusals: " << workers[0]->Tail(1));
  REQUIRE(workers[0]->Wait(0ms) == std::nullopt);  // still running: the refusals were mid-job
  CheckJobSucceeded(workers, *scheduler);
}
