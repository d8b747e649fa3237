// The real binaries as separate processes on loopback: ps-scheduler, ps-server and the
// ps-test-node worker. Every process is started and stopped by the test, by pid.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <thread>
#include <tuple>
#include <vector>
#include <zmq.hpp>

#include "ps/src/job_authenticator.h"
#include "tests/util/child_process.h"
#include "tests/util/temp_dir.h"

namespace {

using namespace std::chrono_literals;
using ps::test::ChildProcess;
using Env = std::map<std::string, std::string>;

Env JobEnv(int servers, int workers, int port) {
  return {{"DMLC_PS_ROOT_URI", "127.0.0.1"},
          {"DMLC_PS_ROOT_PORT", std::to_string(port)},
          {"DMLC_NUM_SERVER", std::to_string(servers)},
          {"DMLC_NUM_WORKER", std::to_string(workers)},
          {"PS_HEARTBEAT_INTERVAL", "0.2"},
          {"PS_HEARTBEAT_TIMEOUT", "2.5"},
          {"PS_REGISTER_TIMEOUT", "30"},
          {"DMLC_ROLE", "worker"}};
}

// Starts ps-scheduler with `env` (DMLC_PS_ROOT_PORT=0: a free port) and returns it with the
// port it reported.
std::pair<std::unique_ptr<ChildProcess>, int> StartSchedulerWith(const Env& env) {
  auto scheduler = std::make_unique<ChildProcess>(
      std::vector<std::string>{ps::test::BinPath("ps-scheduler")}, env);
  REQUIRE(scheduler->WaitForOutput("ps-scheduler: listening on", 10s));
  std::smatch match;
  const std::string output = scheduler->Output();
  REQUIRE(std::regex_search(output, match, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)")));
  return {std::move(scheduler), std::stoi(match[1])};
}

// The same, then points `env` at it (DMLC_PS_ROOT_PORT): the nodes started with it join.
std::pair<std::unique_ptr<ChildProcess>, int> StartSchedulerFor(Env& env) {
  auto started = StartSchedulerWith(env);
  env["DMLC_PS_ROOT_PORT"] = std::to_string(started.second);
  return started;
}

std::pair<std::unique_ptr<ChildProcess>, int> StartScheduler(int servers, int workers) {
  return StartSchedulerWith(JobEnv(servers, workers, 0));
}

std::unique_ptr<ChildProcess> Start(const std::string& binary, const Env& env,
                                    std::vector<std::string> args = {}) {
  args.insert(args.begin(), ps::test::BinPath(binary));
  return std::make_unique<ChildProcess>(args, env);
}

// A job of one server and `workers` ps-test-node workers that block once registered, every
// worker registered: for stopping some of them.
struct BlockedJob {
  std::unique_ptr<ChildProcess> scheduler;
  std::unique_ptr<ChildProcess> server;
  std::vector<std::unique_ptr<ChildProcess>> workers;
};
BlockedJob StartBlockedJob(int workers) {
  BlockedJob job;
  int port = 0;
  std::tie(job.scheduler, port) = StartScheduler(1, workers);
  const Env env = JobEnv(1, workers, port);
  job.server = Start("ps-server", env);
  for (int i = 0; i < workers; ++i) job.workers.push_back(Start("ps-test-node", env, {"--block"}));
  for (auto& worker : job.workers) REQUIRE(worker->WaitForOutput("registered as worker", 20s));
  return job;
}

}  // namespace

TEST_CASE("processes: a job of the real binaries runs 100 barriers and everyone exits 0",
          "[processes]") {
  auto [scheduler, port] = StartScheduler(2, 3);
  const Env env = JobEnv(2, 3, port);
  std::vector<std::unique_ptr<ChildProcess>> servers, workers;
  for (int i = 0; i < 2; ++i) servers.push_back(Start("ps-server", env));
  for (int i = 0; i < 3; ++i) workers.push_back(Start("ps-test-node", env, {"--barriers", "100"}));
  for (auto& worker : workers) {
    CHECK(worker->Wait(60s) == 0);
    CHECK_THAT(worker->Output(), Catch::Contains("100 barriers done"));
  }
  for (auto& server : servers) CHECK(server->Wait(20s) == 0);
  CHECK(scheduler->Wait(20s) == 0);
  CHECK_THAT(scheduler->Output(), Catch::Contains("every worker finished"));
}

TEST_CASE("processes: two workers that ask for one PS_RANK are told apart with a warning",
          "[processes]") {
  auto [scheduler, port] = StartScheduler(1, 2);
  Env env = JobEnv(1, 2, port);
  auto server = Start("ps-server", env);
  env["PS_RANK"] = "1";  // both: two pods with the same index
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 2; ++i) workers.push_back(Start("ps-test-node", env, {"--barriers", "1"}));
  for (auto& worker : workers) CHECK(worker->Wait(60s) == 0);
  CHECK(server->Wait(20s) == 0);
  CHECK(scheduler->Wait(20s) == 0);
  CHECK_THAT(scheduler->Output(),
             Catch::Contains("asked for rank 1 (PS_RANK) and got rank 0: another worker asked "
                             "for the same one; give each node a PS_RANK of its own"));
}

TEST_CASE("processes: heartbeats turned off are a warning, and a job still runs", "[processes]") {
  Env scheduler_env = JobEnv(1, 1, 0);
  scheduler_env["PS_HEARTBEAT_INTERVAL"] = "0";
  auto [scheduler, port] = StartSchedulerWith(scheduler_env);
  CHECK(
      scheduler->WaitForOutput("PS_HEARTBEAT_INTERVAL=0 turns heartbeats off: a node that "
                               "stops (SIGSTOP, a frozen machine, a network partition) is "
                               "never declared dead",
                               10s));
  Env env = JobEnv(1, 1, port);
  env["PS_HEARTBEAT_INTERVAL"] = "0";
  auto server = Start("ps-server", env);
  auto worker = Start("ps-test-node", env, {"--barriers", "3"});
  CHECK(worker->Wait(60s) == 0);
  CHECK(server->Wait(20s) == 0);
  CHECK(scheduler->Wait(20s) == 0);
}

TEST_CASE("processes: --help and --version answer", "[processes]") {
  for (const std::string binary : {"ps-scheduler", "ps-server"}) {
    auto help = Start(binary, {}, {"--help"});
    CHECK(help->Wait(10s) == 0);
    CHECK_THAT(help->Output(),
               Catch::Contains("root_port") && Catch::Contains("DMLC_PS_ROOT_PORT"));
    // The cluster flags only, not the dozens glog defines.
    CHECK_THAT(help->Output(), !Catch::Contains("logtostderr"));
    // gflags' other help flags show the same, not "No modules matched" or glog's flags.
    for (const std::string flag : {"--helpshort", "--helpmatch=root", "-helpxml", "--helpon=cli"}) {
      INFO(flag);
      auto variant = Start(binary, {}, {flag});
      CHECK(variant->Wait(10s) == 0);
      CHECK(variant->Output() == help->Output());
    }
    auto version = Start(binary, {}, {"--version"});
    CHECK(version->Wait(10s) == 0);
    CHECK_THAT(version->Output(), Catch::Contains("version 0."));
  }
}

TEST_CASE("processes: --help shows each role's flags with their real defaults", "[processes]") {
  auto scheduler = Start("ps-scheduler", {}, {"--help"});
  auto server = Start("ps-server", {}, {"--help"});
  REQUIRE(scheduler->Wait(10s) == 0);
  REQUIRE(server->Wait(10s) == 0);
  for (auto* help : {scheduler.get(), server.get()}) {
    const std::string output = help->Output();
    INFO(output);
    // Not gflags' placeholders for "not given" (-1, ""), which are nobody's default.
    CHECK_THAT(output, !Catch::Contains("-1") && !Catch::Contains("\"\""));
    CHECK_THAT(output, Catch::Contains("--root_port (int32; env DMLC_PS_ROOT_PORT; required)"));
    CHECK_THAT(output, Catch::Contains("--heartbeat_interval (double; env PS_HEARTBEAT_INTERVAL; "
                                       "default: 2)"));
    CHECK_THAT(output, Catch::Contains("--register_timeout (double; env PS_REGISTER_TIMEOUT; "
                                       "default: 60)"));
    CHECK_THAT(output, Catch::Contains("--verbose (int32; env PS_VERBOSE; default: 0)"));
    // The flag gflags reads itself, and where the settings without a flag are described.
    CHECK_THAT(output, Catch::Contains("--flagfile=FILE") &&
                           Catch::Contains("read from the environment only: ") &&
                           Catch::Contains("PS_REPLICATION") &&
                           Catch::Contains("share/doc/ps/README.md"));
  }
  // Only the scheduler reads DMLC_USE_KUBERNETES and PS_STALL_TIMEOUT.
  CHECK_THAT(scheduler->Output(), Catch::Contains("--use_kubernetes (bool; env "
                                                  "DMLC_USE_KUBERNETES; default: false)"));
  CHECK_THAT(scheduler->Output(), Catch::Contains("--stall_timeout (double; env "
                                                  "PS_STALL_TIMEOUT; default: 600)"));
  CHECK_THAT(server->Output(),
             !Catch::Contains("--use_kubernetes") && !Catch::Contains("--stall_timeout"));
}

TEST_CASE("processes: an argument that is not a flag is a one-line error", "[processes]") {
  for (const std::string binary : {"ps-scheduler", "ps-server", "ps-kvstore-check", "ps-bench"}) {
    auto process = Start(binary, JobEnv(1, 1, 0), {"--verbose=0", "stray"});
    CHECK(process->Wait(10s) == 1);
    CHECK(process->Output() == binary +
                                   ": error: unexpected argument 'stray': every setting is a flag "
                                   "(--name=value) or its environment variable; see --help\n");
  }
}

TEST_CASE("processes: an unknown flag, a missing value or a wrong one is a one-line error",
          "[processes]") {
  // Not gflags' own "ERROR: unknown command line flag ..." line.
  for (const std::string binary : {"ps-scheduler", "ps-server", "ps-kvstore-check", "ps-bench"}) {
    const auto error = [&](std::vector<std::string> args) {
      auto process = Start(binary, JobEnv(1, 1, 0), std::move(args));
      CHECK(process->Wait(10s) == 1);
      return process->Output();
    };
    CHECK(error({"--verbose=0", "--no_such_flag=3"}) ==
          binary + ": error: unknown flag --no_such_flag: see --help for the flags " + binary +
              " takes\n");
    CHECK(error({"--verbose=many"}) ==
          binary + ": error: invalid value 'many' for --verbose (int32): see --help\n");
    CHECK(error({"--verbose"}) ==
          binary + ": error: flag --verbose needs a value (--verbose=VALUE)\n");
  }
  // The scheduler's own flags, which ps-server's --help does not list, are not ignored there.
  for (const std::string flag : {"--use_kubernetes", "--stall_timeout=5"}) {
    auto process = Start("ps-server", JobEnv(1, 1, 0), {flag});
    CHECK(process->Wait(10s) == 1);
    const std::string name = flag.substr(0, flag.find('='));
    CHECK(process->Output() ==
          "ps-server: error: " + name + " is read by ps-scheduler only (" +
              (name == "--use_kubernetes" ? "DMLC_USE_KUBERNETES" : "PS_STALL_TIMEOUT") +
              "); a server would ignore it: drop it\n");
  }
}

TEST_CASE("processes: a flag file's lines are checked as the command line is", "[processes]") {
  // gflags reads a --flagfile itself and took a flag it does not know there in silence (a
  // misspelt --root_url was simply not set); a missing file got its own unformatted line.
  ps::test::TempDir dir;
  const auto file = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.path() + "/" + name) << text;
    return dir.path() + "/" + name;
  };
  const std::string unknown = file("unknown", "# settings\n\n--verbose=0\n--no_such_flag=3\n");
  const std::string invalid = file("invalid", "--verbose=many\n");
  const std::string stray = file("stray", "verbose=1\n");
  const std::string spaced = file("spaced", "  --verbose=1 \n");
  const std::string loop = file("loop", "--flagfile=" + dir.path() + "/loop\n");
  const std::string fifo = dir.path() + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string binary : {"ps-scheduler", "ps-server", "ps-kvstore-check", "ps-bench"}) {
    const auto error = [&](std::vector<std::string> args) {
      auto process = Start(binary, JobEnv(1, 1, 0), std::move(args));
      CHECK(process->Wait(10s) == 1);
      return process->Output();
    };
    const std::string prefix = binary + ": error: ";
    CHECK(error({"--flagfile=" + unknown}) == prefix + "unknown flag --no_such_flag (line 4 of " +
                                                  unknown + "): see --help for the flags " +
                                                  binary + " takes\n");
    CHECK(error({"--flagfile", invalid}) ==
          prefix + "invalid value 'many' for --verbose (int32) (line 1 of " + invalid +
              "): see --help\n");
    // A list of files, as gflags splits it: the second one is checked too.
    CHECK(error({"--flagfile=" + file("fine", "--verbose=0\n") + "," + invalid}) ==
          prefix + "invalid value 'many' for --verbose (int32) (line 1 of " + invalid +
              "): see --help\n");
    CHECK(error({"--flagfile=" + stray}) ==
          prefix + "'verbose=1' (line 1 of " + stray +
              ") is not a flag (--name=value) nor a line of program names\n");
    CHECK(error({"--flagfile=" + spaced}) ==
          prefix + "'--verbose=1' (line 1 of " + spaced +
              ") ends in a space, a tab or a carriage return (a Windows line end?), which gflags "
              "would keep in the flag: remove it\n");
    CHECK(error({"--flagfile=" + loop}) == prefix + "--flagfile " + loop +
                                               ": flag files nest more than 8 deep (does one name "
                                               "itself?)\n");
    CHECK(error({"--flagfile=" + dir.path() + "/missing"}) ==
          prefix + "cannot read --flagfile " + dir.path() +
              "/missing: No such file or directory: give a file of --name=value lines, one per "
              "line\n");
    CHECK(error({"--flagfile=" + dir.path()}) ==
          prefix + "--flagfile " + dir.path() +
              " is a directory: give a file of --name=value lines, one per line\n");
    // Bounded: a device that never ends, or a FIFO nobody writes to, fails at once.
    CHECK(error({"--flagfile=/dev/zero"}) ==
          prefix +
              "cannot read --flagfile /dev/zero: it is not a regular file (a device or a socket): "
              "give a file of --name=value lines, one per line\n");
    CHECK(error({"--flagfile=" + fifo}) ==
          prefix + "cannot read --flagfile " + fifo +
              ": it is a pipe, not a regular file: give a file of --name=value lines, one per "
              "line\n");
  }
  // A good one is read as gflags reads it, sections of program names included: the flags
  // after a line of names apply only to the programs it names.
  const std::string good = file("good",
                                "ps-kvstore-check\n"
                                "--type=local\n"
                                "--rounds=2\n"
                                "ps-scheduler ps-ser*\n"
                                "--no_such_flag=1\n");
  auto check = Start("ps-kvstore-check", JobEnv(1, 1, 0), {"--flagfile=" + good});
  CHECK(check->Wait(10s) == 0);
  CHECK_THAT(check->Output(), Catch::Contains("kvstore-check: ok") && Catch::Contains("rounds=2"));
  auto server = Start("ps-server", JobEnv(1, 1, 0), {"--flagfile=" + good});
  CHECK(server->Wait(10s) == 1);
  CHECK_THAT(server->Output(), Catch::Contains("unknown flag --no_such_flag (line 5 of " + good));
}

TEST_CASE("processes: ps-kvstore-check refuses counts that check nothing", "[processes]") {
  // Not "ok" for zero rounds or keys, nor a store error for a negative count.
  for (const auto& [flag, want] : {std::pair{"--rounds=0", "--rounds 0: want 1 or more"},
                                   std::pair{"--rounds=-1", "--rounds -1: want 1 or more"},
                                   std::pair{"--keys=-3", "--keys -3: want 0 or more"},
                                   std::pair{"--size=0", "--size 0: want 1 or more"},
                                   std::pair{"--big-size=-1", "--big-size -1: want 0 or more"},
                                   std::pair{"--keys=0",
                                             "--keys 0 without --big-size checks "
                                             "nothing: give a key"}}) {
    INFO(flag);
    auto check = Start("ps-kvstore-check", JobEnv(1, 1, 0), {"--type=local", flag});
    CHECK(check->Wait(10s) == 1);
    CHECK(check->Output() == std::string("ps-kvstore-check: error: ") + want + "\n");
  }
  auto fine = Start("ps-kvstore-check", JobEnv(1, 1, 0),
                    {"--type=local", "--keys=0", "--big-size=100", "--rounds=2"});
  CHECK(fine->Wait(10s) == 0);
  CHECK_THAT(fine->Output(), Catch::Contains("kvstore-check: ok"));
}

TEST_CASE("processes: a node of a job that never fills says it was accepted",
          "[processes][fault]") {
  // Not "refused": the node registered, the job as a whole could not start.
  Env env = JobEnv(1, 1, 0);
  env["PS_REGISTER_TIMEOUT"] = "2";
  auto [scheduler, port] = StartSchedulerFor(env);
  auto worker = Start("ps-test-node", env, {"--barriers", "1"});
  CHECK(worker->Wait(30s) != 0);
  CHECK(scheduler->Wait(30s) == 1);
  INFO(worker->Output());
  CHECK_THAT(worker->Output(),
             Catch::Contains("the scheduler at 127.0.0.1:" + std::to_string(port) +
                             " accepted this node, but the job cannot start: only 0 of 1 "
                             "server(s) and 1 of 1 worker(s) registered within 2 s"));
}

TEST_CASE("processes: a failed scheduler says why once", "[processes][fault]") {
  const auto count = [](const std::string& text, const std::string& part) {
    std::size_t n = 0;
    for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  };
  SECTION("the job does not fill up") {
    Env env = JobEnv(1, 1, 0);
    env["PS_REGISTER_TIMEOUT"] = "0.5";
    auto scheduler = Start("ps-scheduler", env);
    CHECK(scheduler->Wait(10s) == 1);
    const std::string output = scheduler->Output();
    INFO(output);
    CHECK_THAT(output, Catch::Contains("ps-scheduler: error: only 0 of 1 server(s)"));
    CHECK(count(output, "registered within") == 1);
  }
  SECTION("stopped by signals") {
    // The launcher and its wrapper shell each send a TERM: the second, arriving while the first
    // ends the job, must not print another line.
    auto [scheduler, port] = StartScheduler(1, 1);
    scheduler->Kill(SIGTERM);
    CHECK(scheduler->WaitForOutput("stopped by signal SIGTERM", 10s));
    scheduler->Kill(SIGTERM);  // the process may have exited already: nothing happens then
    CHECK(scheduler->Wait(10s) == 1);
    const std::string output = scheduler->Output();
    INFO(output);
    CHECK(count(output, "stopped by signal") == 1);
    CHECK_THAT(output, Catch::EndsWith(
                           "ps-scheduler: error: the scheduler was stopped by signal SIGTERM\n"));
  }
}

TEST_CASE("processes: a bad environment is a one-line error naming the variable", "[processes]") {
  Env env = JobEnv(1, 1, 1234);
  env["DMLC_NUM_SERVER"] = "zero";
  auto server = Start("ps-server", env);
  CHECK(server->Wait(10s) == 1);
  CHECK(server->Output() ==
        "ps-server: error: DMLC_NUM_SERVER='zero' is invalid: expected an integer in 1..65536 "
        "(or the flag --num_servers)\n");
  // A setting misspelt is named where the one meant is missing, and warned of anyway.
  Env misspelt = JobEnv(1, 1, 1234);
  misspelt.erase("DMLC_NUM_SERVER");
  misspelt.erase("PS_HEARTBEAT_TIMEOUT");
  misspelt["DMLC_NUM_SEVER"] = "1";
  misspelt["PS_HEARTBEAT_TIMOUT"] = "1";
  auto named = Start("ps-server", misspelt);
  CHECK(named->Wait(10s) == 1);
  CHECK_THAT(named->Output(),
             Catch::Contains("PS_HEARTBEAT_TIMOUT is set, but nothing reads it: a misspelling of "
                             "PS_HEARTBEAT_TIMEOUT? (PS_HEARTBEAT_TIMEOUT is not set)") &&
                 Catch::EndsWith("ps-server: error: DMLC_NUM_SERVER is not set: set it to an "
                                 "integer in 1..65536 (or the flag --num_servers); "
                                 "DMLC_NUM_SEVER is set: a misspelling of DMLC_NUM_SERVER?\n"));
  // A setting of the scheduler's, which the server checks too but takes no flag for.
  Env stall = JobEnv(1, 1, 1234);
  stall["PS_STALL_TIMEOUT"] = "abc";
  auto checked = Start("ps-server", stall);
  CHECK(checked->Wait(10s) == 1);
  CHECK_THAT(checked->Output(),
             Catch::EndsWith("(a setting of ps-scheduler's, which every role checks)\n"));
  // A flag on the command line wins over the environment.
  auto fixed = Start("ps-server", env, {"--num_servers=1", "--root_port=0"});
  CHECK(fixed->Wait(10s) == 1);
  CHECK_THAT(fixed->Output(), Catch::Contains("DMLC_PS_ROOT_PORT='0' is invalid"));
  // A scheduler address no resolver takes is refused at once, not retried until the
  // registration timeout (30 s here).
  for (const auto& [uri, want] :
       {std::pair{"127.0.0.1:9000",
                  "DMLC_PS_ROOT_URI='127.0.0.1:9000' holds a port: give the "
                  "host name or IPv4 address alone (the port goes in "
                  "DMLC_PS_ROOT_PORT)"},
        std::pair{"tcp://127.0.0.1", "DMLC_PS_ROOT_URI='tcp://127.0.0.1' holds a scheme"},
        std::pair{"127.0.0.1\n", "DMLC_PS_ROOT_URI='127.0.0.1\n' holds a blank or a line break"}}) {
    INFO(uri);
    Env bad = JobEnv(1, 1, 1234);
    bad["DMLC_PS_ROOT_URI"] = uri;
    auto node = Start("ps-server", bad);
    CHECK(node->Wait(10s) == 1);
    CHECK_THAT(node->Output(), Catch::StartsWith(std::string("ps-server: error: ") + want));
  }
}

TEST_CASE("processes: a descriptor limit too low for ZeroMQ is a one-line error naming it",
          "[processes][fault]") {
  // ZeroMQ asserts (an abort) when it runs out of descriptors for its threads and the job's
  // connections, and a scheduler with too few spun on failed accepts: a node refuses to start.
  const std::string why =
      "error: the descriptor limit (ulimit -n) is 24, below the 76 that a node of a job of 3 "
      "nodes needs at the least: raise it to at least 143 (ulimit -n in the shell that starts "
      "the node, or LimitNOFILE for a service)";
  for (const std::string binary : {"ps-scheduler", "ps-server", "ps-kvstore-check"}) {
    INFO(binary);
    Env env = JobEnv(1, 1, binary == "ps-scheduler" ? 0 : 9);
    ChildProcess node({"/bin/bash", "-c", "ulimit -n 24 && exec " + ps::test::BinPath(binary)},
                      env);
    CHECK(node.Wait(10s) == 1);
    const std::string output = node.Output();
    CHECK_THAT(output, Catch::EndsWith(why + "\n"));
    CHECK(std::count(output.begin(), output.end(), '\n') == 1);
  }
}

// `ulimit -s` sizes the default stack of every thread: under 32 KiB, ZeroMQ's threads overflowed
// theirs and every node died of SIGSEGV without a word. A soft limit is raised; a hard one too
// low for the main thread is a one-line error naming it.
TEST_CASE("processes: a small stack limit is raised, or a one-line error naming it",
          "[processes][fault]") {
  SECTION("a soft limit of 32 KiB: a job runs") {
    const std::string soft = "ulimit -S -s 32 && exec \"$0\" \"$@\"";
    Env env = JobEnv(1, 1, 0);
    ChildProcess scheduler({"/bin/bash", "-c", soft, ps::test::BinPath("ps-scheduler")}, env);
    REQUIRE(scheduler.WaitForOutput("ps-scheduler: listening on", 10s));
    std::smatch match;
    const std::string listening = scheduler.Output();
    REQUIRE(std::regex_search(listening, match, std::regex("127\\.0\\.0\\.1:(\\d+)")));
    env["DMLC_PS_ROOT_PORT"] = match[1];
    ChildProcess server({"/bin/bash", "-c", soft, ps::test::BinPath("ps-server")}, env);
    ChildProcess worker(
        {"/bin/bash", "-c", soft, ps::test::BinPath("ps-kvstore-check"), "--rounds", "3"}, env);
    CHECK(worker.Wait(60s) == 0);
    CHECK_THAT(worker.Output(), Catch::Contains("kvstore-check: ok rank=0"));
    CHECK(server.Wait(20s) == 0);
    CHECK(scheduler.Wait(20s) == 0);
  }
  SECTION("a hard limit of 32 KiB: each role says so and exits 1") {
    const std::string why =
        "error: the stack limit (ulimit -s) is 32 KiB, below the 1024 KiB a node needs: raise "
        "it (ulimit -s 8192 is the usual, in the shell that starts the node)";
    for (const std::string binary : {"ps-scheduler", "ps-server", "ps-kvstore-check"}) {
      INFO(binary);
      ChildProcess node({"/bin/bash", "-c", "ulimit -s 32 && exec " + ps::test::BinPath(binary)},
                        JobEnv(1, 1, binary == "ps-scheduler" ? 0 : 9));
      CHECK(node.Wait(10s) == 1);
      const std::string output = node.Output();
      CHECK_THAT(output, Catch::EndsWith(why + "\n"));
      CHECK(std::count(output.begin(), output.end(), '\n') == 1);
    }
  }
}

TEST_CASE("processes: a role whose output reader went away goes on, not killed by SIGPIPE",
          "[processes][fault]") {
  // `ps-scheduler 2>&1 | grep -m1 listening` picks up the port, and grep exits: the
  // scheduler's next line used to kill it (status 141), silently. It now drops its output and
  // goes on: here to its registration timeout, ending 1.
  Env env = JobEnv(1, 1, 0);
  env["PS_REGISTER_TIMEOUT"] = "1";
  for (const std::string binary : {"ps-scheduler", "ps-server"}) {
    INFO(binary);
    if (binary == "ps-server") env["DMLC_PS_ROOT_PORT"] = std::to_string(ps::test::FindFreePort());
    ChildProcess piped(
        {"/bin/bash", "-c", "\"$0\" 2>&1 | head -c 1 >/dev/null; exit ${PIPESTATUS[0]}",
         ps::test::BinPath(binary)},
        env);
    const std::optional<int> status = piped.Wait(30s);
    REQUIRE(status);
    CHECK(*status == 1);
  }
}

TEST_CASE("processes: a port in use is a one-line error naming the port", "[processes][fault]") {
  auto [first, port] = StartScheduler(1, 1);
  auto second = Start("ps-scheduler", JobEnv(1, 1, port));
  CHECK(second->Wait(10s) == 1);
  const std::string output = second->Output();
  CHECK_THAT(output, Catch::StartsWith("ps-scheduler: error: port " + std::to_string(port) +
                                       " on 127.0.0.1 is already in use"));
  CHECK(std::count(output.begin(), output.end(), '\n') == 1);
  first->Kill(SIGTERM);
  CHECK(first->Wait(10s) == 1);
  CHECK_THAT(first->Output(), Catch::Contains("stopped by signal SIGTERM"));
}

// RLIMIT_FSIZE (ulimit -f) counts the shared-memory segments and the checkpoint files: a file
// grown past it used to kill the process with SIGXFSZ. Now a worker's 12 MB key travels over
// the socket, and a checkpoint past the server's limit fails naming it, leaving no file.
TEST_CASE("processes: a file-size limit is an error naming it, never SIGXFSZ",
          "[processes][fault]") {
  const std::string limited = "ulimit -f 1024 && exec \"$0\" \"$@\"";  // 1 MiB
  const std::vector<std::string> check_args = {"--rounds", "4", "--big-size", "3000000"};
  SECTION("a worker's shared memory") {
    auto [scheduler, port] = StartScheduler(1, 1);
    const Env env = JobEnv(1, 1, port);
    auto server = Start("ps-server", env);
    std::vector<std::string> args = {"/bin/bash", "-c", limited,
                                     ps::test::BinPath("ps-kvstore-check")};
    args.insert(args.end(), check_args.begin(), check_args.end());
    ChildProcess worker(args, env);
    CHECK(worker.Wait(60s) == 0);
    CHECK_THAT(worker.Output(),
               Catch::Contains("travel over the socket, not shared memory") &&
                   Catch::Contains("past this process's file-size limit (ulimit -f: 1048576 "
                                   "bytes)") &&
                   Catch::Contains("kvstore-check: ok rank=0"));
    CHECK(server->Wait(30s) == 0);
    CHECK(scheduler->Wait(30s) == 0);
  }
  SECTION("a server's checkpoint") {
    char pattern[] = "/tmp/ps-fsize-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    const std::string dir = pattern;
    auto [scheduler, port] = StartScheduler(1, 1);
    const Env env = JobEnv(1, 1, port);
    ChildProcess server({"/bin/bash", "-c", limited, ps::test::BinPath("ps-server")}, env);
    std::vector<std::string> args = check_args;
    args.insert(args.end(), {"--collectives-every", "2", "--checkpoint-dir", dir + "/ck"});
    auto worker = Start("ps-kvstore-check", env, args);
    CHECK(worker->Wait(60s) == 1);
    CHECK_THAT(worker->Output(),
               Catch::Contains("SaveCheckpoint failed on every worker") &&
                   Catch::Contains("server 0: checkpoint file " + dir + "/ck") &&
                   Catch::Contains("past this process's file-size limit (ulimit -f"));
    CHECK_THAT(server.Output(), !Catch::Contains("File size limit exceeded"));
    // Nothing of the failed save is left: its temporary file went with it.
    std::vector<std::string> left;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
      if (entry.is_regular_file()) left.push_back(entry.path().string());
    }
    CHECK(left.empty());
    std::filesystem::remove_all(dir);
    server.Kill(SIGTERM);
    scheduler->Kill(SIGTERM);
  }
}

// A node listens on a port the kernel picks from its ephemeral range; with every one of them
// taken, "port 0 is already in use" would send the user after a process that does not exist.
// The range is made small and held in a network namespace of the test's own (root, unshare).
TEST_CASE("processes: no free ephemeral port is named as such, not as port 0 in use",
          "[processes][fault]") {
  if (::geteuid() != 0 || !std::filesystem::exists("/usr/bin/unshare")) {
    WARN("skipped: needs root and unshare(1) for a network namespace of its own");
    return;
  }
  const std::string hold_range_then_run = R"(
import os, socket, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write("40000 40009")
held = []
for port in range(40000, 40010):
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    held.append(s)
sys.exit(subprocess.run([sys.argv[1]]).returncode)
)";
  Env env = JobEnv(1, 1, 9);  // never reached: the node fails at its own listener
  env["DMLC_ROLE"] = "server";
  env["PS_USE_IPC"] = "0";
  ChildProcess server({"/usr/bin/unshare", "--net", "python3", "-c", hold_range_then_run,
                       ps::test::BinPath("ps-server")},
                      env);
  CHECK(server.Wait(30s) == 1);
  CHECK_THAT(server.Output(),
             Catch::Contains("ps-server: error: no free port on 127.0.0.1 to listen on") &&
                 Catch::Contains("net.ipv4.ip_local_port_range") && !Catch::Contains("port 0 on"));
}

TEST_CASE("processes: an unreachable scheduler fails registration within the timeout",
          "[processes][fault]") {
  const int port = ps::test::FindFreePort();
  Env env = JobEnv(1, 1, port);
  env["PS_REGISTER_TIMEOUT"] = "1";
  const auto start = std::chrono::steady_clock::now();
  env["DMLC_ROLE"] = "sever";  // a typo: the command decides, and says so
  auto server = Start("ps-server", env);
  CHECK(server->Wait(15s) == 1);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK_THAT(server->Output(),
             Catch::Contains("cannot reach the scheduler at 127.0.0.1:" + std::to_string(port)) &&
                 Catch::Contains("DMLC_PS_ROOT_PORT") &&
                 Catch::Contains("DMLC_ROLE=sever is not a role (scheduler, server or worker) "
                                 "and is ignored: ps-server runs the server role"));
}

TEST_CASE("processes: a node with the wrong secret is told so, not left to time out",
          "[processes][fault][security]") {
  // The scheduler (PS_JOB_SECRET=right) refuses the node's connections, and ZeroMQ tells the
  // node why at once: it ends at its first report (3 s), not at its registration deadline.
  Env env = JobEnv(1, 1, 0);
  env["PS_JOB_SECRET"] = "right";
  env["PS_REGISTER_TIMEOUT"] = "4";
  auto [scheduler, port] = StartSchedulerFor(env);
  env["PS_JOB_SECRET"] = "wrong";
  env["PS_REGISTER_TIMEOUT"] = "600";
  auto server = Start("ps-server", env);
  CHECK(scheduler->Wait(20s) == 1);
  CHECK(server->Wait(20s) == 1);
  INFO(server->Output());
  CHECK_THAT(
      server->Output(),
      Catch::EndsWith("ps-server: error: the scheduler at 127.0.0.1:" + std::to_string(port) +
                      " refused this node's connection: its PS_JOB_SECRET is not the "
                      "job's (or the job has a secret and this node none): give every "
                      "node of the job the same PS_JOB_SECRET or PS_JOB_SECRET_FILE "
                      "(launch.py hands its own processes the job's)\n") &&
          !Catch::Contains("wrong"));  // the secret itself is never shown
  // The scheduler's own verdict names the refusals as the likelier cause.
  const std::string scheduler_output = scheduler->Output();
  INFO(scheduler_output);
  CHECK_THAT(scheduler_output,
             Catch::Contains("registered within 4 s") &&
                 Catch::Contains(" connection(s) were refused meanwhile for a wrong or missing "
                                 "PS_JOB_SECRET or another PS_ENCRYPT"));
}

TEST_CASE("processes: with PS_ENCRYPT a node of another secret is refused and logged",
          "[processes][fault][security]") {
  // Its CURVE keys come from its secret, so its handshake fails: the node itself learns
  // nothing (its handshake stalls), so the scheduler must say it, and count it in its verdict.
  Env env = JobEnv(1, 1, 0);
  env["PS_JOB_SECRET"] = "right";
  env["PS_ENCRYPT"] = "1";
  env["PS_REGISTER_TIMEOUT"] = "4";
  auto [scheduler, port] = StartSchedulerFor(env);
  env["PS_JOB_SECRET"] = "wrong";
  auto server = Start("ps-server", env);
  CHECK(scheduler->Wait(20s) == 1);
  CHECK(server->Wait(20s) == 1);
  const std::string scheduler_output = scheduler->Output();
  INFO(scheduler_output);
  CHECK_THAT(scheduler_output,
             Catch::Contains("refused a connection (#1): the peer's CURVE keys are not this "
                             "job's") &&
                 Catch::Contains(" connection(s) were refused meanwhile for a wrong or missing "
                                 "PS_JOB_SECRET or another PS_ENCRYPT"));
}

TEST_CASE("processes: a scheduler paused for a while judges no node on its own silence",
          "[processes][fault]") {
  // Stopped for 3 s of a 4 s heartbeat timeout: the nodes keep their contact, and the
  // scheduler, resumed, counts heartbeats from then on instead of from before its pause.
  Env env = JobEnv(1, 1, 0);
  env["PS_HEARTBEAT_TIMEOUT"] = "4";
  auto [scheduler, port] = StartSchedulerFor(env);
  auto server = Start("ps-server", env);
  auto worker = Start("ps-test-node", env, {"--block"});
  REQUIRE(worker->WaitForOutput("registered as worker", 20s));
  scheduler->Kill(SIGSTOP);
  std::this_thread::sleep_for(3s);  // the pause itself, not a wait for anything
  scheduler->Kill(SIGCONT);
  CHECK(scheduler->WaitForOutput("heartbeats are counted from now", 10s));
  CHECK_FALSE(scheduler->WaitForOutput("is dead", 6s));  // past a whole timeout
  INFO(scheduler->Output());
  CHECK_THAT(scheduler->Output(),
             Catch::Matches("(.|\n)*the scheduler did not run for 3(\\.[0-9])? s "
                            "\\(stopped, e\\.g\\. by SIGSTOP(.|\n)*"));
  CHECK_THAT(server->Output(), !Catch::Contains("lost contact"));
}

TEST_CASE("processes: a scheduler stopped past the timeout names its own pause as the cause",
          "[processes][fault]") {
  // The nodes give up on it and report their failure on their way out; the resumed scheduler
  // used to end naming that report ("worker 0 failed: ...") instead of its own pause.
  Env env = JobEnv(1, 1, 0);
  auto [scheduler, port] = StartSchedulerFor(env);
  auto server = Start("ps-server", env);
  auto worker = Start("ps-test-node", env, {"--block"});
  REQUIRE(worker->WaitForOutput("registered as worker", 20s));
  scheduler->Kill(SIGSTOP);
  // The worker gives up on it (a last word to the stopped scheduler may hold its exit a while).
  CHECK(worker->WaitForOutput("lost contact with the scheduler", 20s));
  scheduler->Kill(SIGCONT);
  CHECK(scheduler->Wait(30s) == 1);
  CHECK(worker->Wait(30s).value_or(0) != 0);
  CHECK(server->Wait(30s).value_or(0) != 0);
  INFO("server:\n" << server->Output());
  INFO("scheduler:\n" << scheduler->Output());
  CHECK_THAT(scheduler->Output(),
             Catch::Contains("ps-scheduler: error: the scheduler itself did not run for") &&
                 Catch::Contains("longer than the nodes wait for it (PS_HEARTBEAT_TIMEOUT 2.5 s), "
                                 "so they gave up; then "));
}

TEST_CASE("processes: a node stopped past the timeout is named as stopped, its host answering",
          "[processes][fault]") {
  // The scheduler probes a node quiet for half the timeout: the stopped node's kernel
  // acknowledges the probe, so the network is not what failed (link_state.h).
  BlockedJob job = StartBlockedJob(2);
  ChildProcess& stopped = *job.workers[0];
  stopped.Kill(SIGSTOP);
  CHECK(job.scheduler->Wait(20s) == 1);
  stopped.Kill(SIGCONT);
  INFO(job.scheduler->Output());
  CHECK_THAT(job.scheduler->Output(),
             Catch::Contains(") is dead: no heartbeat for over 2.5 s (PS_HEARTBEAT_TIMEOUT), and "
                             "its host acknowledges what the scheduler sends it, so the network "
                             "carries packets both ways: the process is stopped (e.g. by "
                             "SIGSTOP), hung or starved of CPU"));
}

TEST_CASE("processes: every node silent at once points at the scheduler's own network",
          "[processes][fault]") {
  // All nodes stopped together (as the scheduler sees a link of its own go down): naming the
  // first one "dead" would blame a node for the scheduler's own trouble.
  BlockedJob job = StartBlockedJob(1);
  job.server->Kill(SIGSTOP);
  job.workers[0]->Kill(SIGSTOP);
  CHECK(job.scheduler->Wait(20s) == 1);
  job.server->Kill(SIGCONT);
  job.workers[0]->Kill(SIGCONT);
  INFO(job.scheduler->Output());
  CHECK_THAT(job.scheduler->Output(),
             Catch::Contains("no node of the job has been heard from for over 2.5 s "
                             "(PS_HEARTBEAT_TIMEOUT): all 2 went silent together") &&
                 !Catch::Contains("is dead"));
}

TEST_CASE("processes: a server resumed after the job went on without it says it was stopped",
          "[processes][fault]") {
  // SIGSTOP past PS_HEARTBEAT_TIMEOUT: declared dead, the job goes on (replication). On
  // SIGCONT the server finds no scheduler contact; the cause is its own pause, not the network
  // nor a scheduler "stopped ... or hung". With PS_HEARTBEAT_INTERVAL=2 and
  // PS_HEARTBEAT_TIMEOUT=5 the scheduler declares it dead 3 to 5 s into the stop; the server
  // used to check for a pause of its own only every 6 s (three intervals), and blamed the
  // scheduler.
  for (const auto& [interval, timeout] : {std::pair<std::string, std::string>{"0.2", "2.5"},
                                          std::pair<std::string, std::string>{"2", "5"}}) {
    INFO("PS_HEARTBEAT_INTERVAL=" << interval << " PS_HEARTBEAT_TIMEOUT=" << timeout);
    Env env = JobEnv(2, 1, 0);
    env["PS_HEARTBEAT_INTERVAL"] = interval;
    env["PS_HEARTBEAT_TIMEOUT"] = timeout;
    auto [scheduler, port] = StartSchedulerFor(env);
    Env verbose = env;
    verbose["PS_VERBOSE"] = "1";  // "registered as server R": its heartbeats run from then
    auto stopped = Start("ps-server", verbose);
    auto other = Start("ps-server", env);
    auto worker = Start("ps-test-node", env, {"--block"});
    REQUIRE(stopped->WaitForOutput("registered as server", 20s));
    stopped->Kill(SIGSTOP);
    REQUIRE(scheduler->WaitForOutput("the job goes on without server", 20s));
    stopped->Kill(SIGCONT);  // at once
    CHECK(stopped->Wait(20s) == 1);
    INFO(stopped->Output() << "\nscheduler:\n" << scheduler->Tail(6));
    CHECK_THAT(stopped->Output(), Catch::Contains("lost contact with the scheduler") &&
                                      Catch::Contains("this process itself did not run for") &&
                                      Catch::Contains("SIGSTOP") &&
                                      !Catch::Contains("it is stopped (e.g. by SIGSTOP) or hung"));
  }
}

// A Kubernetes pod may start before its scheduler has a DNS record or listens: the node waits
// (until PS_REGISTER_TIMEOUT), saying each few seconds what it waits for. The name is made to
// appear later in a private /etc/hosts, which needs a mount namespace (root, unshare(1)).
TEST_CASE("processes: a node waits for the scheduler's name to resolve and its port to open",
          "[processes][fault]") {
  if (::geteuid() != 0 || !std::filesystem::exists("/usr/bin/unshare")) {
    WARN("skipped: needs root and unshare(1) for a private /etc/hosts");
    return;
  }
  char pattern[] = "/tmp/ps-hosts-XXXXXX";
  const int fd = ::mkstemp(pattern);
  REQUIRE(fd >= 0);
  ::close(fd);
  const std::string hosts = pattern;
  std::ofstream(hosts) << "127.0.0.1 localhost\n";
  const int port = ps::test::FindFreePort();
  Env env = JobEnv(1, 1, port);
  env["DMLC_PS_ROOT_URI"] = "ps-scheduler.test";
  env["DMLC_ROLE"] = "server";
  // mount(8) in a namespace of its own: the machine's /etc/hosts is untouched.
  auto server = std::make_unique<ChildProcess>(
      std::vector<std::string>{
          "/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c",
          "mount --bind " + hosts + " /etc/hosts && exec " + ps::test::BinPath("ps-server")},
      env);
  CHECK(server->WaitForOutput("waiting for DMLC_PS_ROOT_URI='ps-scheduler.test' to resolve", 15s));
  std::ofstream(hosts, std::ios::app) << "127.0.0.1 ps-scheduler.test\n";
  CHECK(server->WaitForOutput("connection refused, nothing listens on port " + std::to_string(port),
                              15s));
  CHECK_THAT(server->Output(), Catch::Contains("left of PS_REGISTER_TIMEOUT"));
  // Among the causes: a job that ended (a store created after it finds no scheduler).
  CHECK_THAT(server->Output(), Catch::Contains("its job ended, as a scheduler exits once every "
                                               "worker finished"));

  Env scheduler_env = JobEnv(1, 1, port);
  auto scheduler = Start("ps-scheduler", scheduler_env);
  auto worker = Start("ps-test-node", JobEnv(1, 1, port), {"--barriers", "3"});
  CHECK(worker->Wait(30s) == 0);
  CHECK(server->Wait(30s) == 0);
  CHECK(scheduler->Wait(30s) == 0);
  std::filesystem::remove(hosts);
}

// A node that advertises an address the scheduler cannot reach (DMLC_NODE_HOST wrong for
// this network) registers, but its reply never arrives: both sides name the address and the
// setting, not only a missing heartbeat. In a network namespace of its own with only loopback
// (root, unshare(1)): 198.18.5.5 has no route there, so nothing leaves it.
TEST_CASE("processes: a node whose advertised address cannot be reached is named so",
          "[processes][fault]") {
  if (::geteuid() != 0 || !std::filesystem::exists("/usr/bin/unshare")) {
    WARN("skipped: needs root and unshare(1) for a network namespace of its own");
    return;
  }
  Env env = JobEnv(1, 1, 9000);       // the namespace's own ports: any is free
  env["PS_HEARTBEAT_TIMEOUT"] = "5";  // past the server's first report of its wait (3 s)
  // The worker waits in a barrier until the job ends (the server's death ends it).
  const std::string script =
      "ip link set lo up || exit 90; " + ps::test::BinPath("ps-scheduler") +
      " & DMLC_ROLE=server DMLC_NODE_HOST=198.18.5.5 PS_REGISTER_TIMEOUT=8 " +
      ps::test::BinPath("ps-server") + " & " + ps::test::BinPath("ps-test-node") + " --block; wait";
  ChildProcess job({"/usr/bin/unshare", "--net", "sh", "-c", script}, env);
  job.Wait(60s);
  const std::string output = job.Output();
  INFO(output);
  CHECK_THAT(output, Catch::Contains("no heartbeat for over 5 s (PS_HEARTBEAT_TIMEOUT), and "
                                     "the scheduler could not connect to its address "
                                     "198.18.5.5:") &&
                         Catch::Contains("set DMLC_NODE_HOST (or DMLC_INTERFACE) on that node"));
  CHECK_THAT(output, Catch::Contains("can the scheduler connect to this node's address "
                                     "198.18.5.5:"));
}

TEST_CASE("processes: a worker killed with SIGKILL is reported dead and nothing hangs",
          "[processes][fault]") {
  auto [scheduler, port] = StartScheduler(1, 3);
  const Env env = JobEnv(1, 3, port);
  auto server = Start("ps-server", env);
  auto victim = Start("ps-test-node", env, {"--block"});
  auto first = Start("ps-test-node", env, {"--barriers", "10"});
  auto second = Start("ps-test-node", env, {"--barriers", "10"});
  REQUIRE(victim->WaitForOutput("registered as worker", 30s));
  std::smatch match;
  const std::string registered = victim->Output();
  REQUIRE(std::regex_search(registered, match, std::regex("registered as worker (\\d)")));
  const std::string victim_name = "worker " + match[1].str() + " (";
  victim->Kill(SIGKILL);
  REQUIRE(victim->Wait(5s) == 128 + SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();

  // The survivors' barrier fails with an error naming the dead worker.
  for (auto* survivor : {first.get(), second.get()}) {
    CHECK(survivor->Wait(15s) == 2);
    CHECK_THAT(survivor->Output(),
               Catch::Contains("barrier failed: " + victim_name) && Catch::Contains("died"));
  }
  CHECK(scheduler->Wait(15s) == 1);
  CHECK(std::chrono::steady_clock::now() - killed_at < 10s);
  CHECK_THAT(scheduler->Output(), Catch::Contains(victim_name) && Catch::Contains("is dead"));
  CHECK(server->Wait(15s) == 1);
  CHECK_THAT(server->Output(), Catch::Contains("the job failed"));
}

TEST_CASE("processes: ps-kvstore-check's reason for failing reaches the whole job",
          "[processes][fault]") {
  // Workers that push a different number of rounds: the one that finds out tells the job why,
  // rather than the job learning only that a worker left through an exception.
  auto [scheduler, port] = StartScheduler(1, 2);
  const Env env = JobEnv(1, 2, port);
  auto server = Start("ps-server", env);
  auto few = Start("ps-kvstore-check", env, {"--rounds", "3"});
  auto many = Start("ps-kvstore-check", env, {"--rounds", "6"});
  for (auto* worker : {few.get(), many.get()}) {
    CHECK(worker->Wait(30s) == 1);
    CHECK_THAT(worker->Output(), Catch::Contains("kvstore-check: error: "));
    // The worker that did not report learned of the failure first: it says so, not that its
    // own finish was lost on the way.
    CHECK_THAT(worker->Output(), !Catch::Contains("could not tell the scheduler"));
  }
  CHECK_THAT(few->Output() + many->Output(),
             Catch::Contains("finished after the job ended: the job failed: worker "));
  CHECK(scheduler->Wait(15s) == 1);
  const std::string output = scheduler->Output();
  INFO(output);
  CHECK_THAT(output, Catch::Contains("this dist_sync round can never complete"));
  CHECK_THAT(output, !Catch::Contains("left the KVStore through an exception"));
  CHECK(server->Wait(15s) == 1);
}

TEST_CASE("processes: nodes whose scheduler disappears exit non-zero with a clear message",
          "[processes][fault]") {
  // Killed, its kernel closes the connections; stopped, they stay open and it falls silent:
  // the nodes say which, so a user looks for an exit or for a stopped or hung process.
  for (const auto& [signal, says] :
       {std::pair{SIGKILL, "its connection closed: it exited or was killed"},
        std::pair{SIGSTOP,
                  "its connection is still open but it sent nothing: it is stopped (e.g. by "
                  "SIGSTOP) or hung (its host acknowledges what this node sends it"}}) {
    INFO("scheduler given signal " << signal);
    auto [scheduler, port] = StartScheduler(1, 1);
    Env env = JobEnv(1, 1, port);
    env["PS_VERBOSE"] = "1";  // both log "registered as ..."
    auto server = Start("ps-server", env);
    auto worker = Start("ps-test-node", env, {"--block"});
    // Both must hold the node table: a scheduler killed before the server's copy left it would
    // leave the server in registration, which ends only with PS_REGISTER_TIMEOUT.
    REQUIRE(worker->WaitForOutput("registered as worker", 30s));
    REQUIRE(server->WaitForOutput("registered as server", 30s));
    scheduler->Kill(signal);
    CHECK(server->Wait(15s) == 1);
    INFO(server->Output());
    CHECK_THAT(server->Output(), Catch::Contains("lost contact with the scheduler at 127.0.0.1:" +
                                                 std::to_string(port)) &&
                                     Catch::Contains(says));
    CHECK(worker->Wait(15s) == 2);
    CHECK_THAT(worker->Output(),
               Catch::Contains("lost contact with the scheduler") && Catch::Contains(says));
  }
}

TEST_CASE("processes: a scheduler killed is noticed with heartbeats off and before the job fills",
          "[processes][fault]") {
  SECTION("PS_HEARTBEAT_INTERVAL=0: its closed connection, not a heartbeat, ends the nodes") {
    Env env = JobEnv(1, 1, 0);
    env["PS_HEARTBEAT_INTERVAL"] = "0";
    auto [scheduler, port] = StartSchedulerFor(env);
    env["PS_VERBOSE"] = "1";
    auto server = Start("ps-server", env);
    auto worker = Start("ps-test-node", env, {"--block"});
    REQUIRE(worker->WaitForOutput("registered as worker", 30s));
    REQUIRE(server->WaitForOutput("registered as server", 30s));
    scheduler->Kill(SIGKILL);
    const std::string says =
        "lost the scheduler at 127.0.0.1:" + std::to_string(port) + ": its connection closed ";
    CHECK(server->Wait(15s) == 1);
    CHECK_THAT(server->Output(),
               Catch::Contains(says) && Catch::Contains("PS_HEARTBEAT_INTERVAL=0"));
    CHECK(worker->Wait(15s) == 2);
    CHECK_THAT(worker->Output(), Catch::Contains(says));
  }
  SECTION("registered, waiting for the job to fill up: not until PS_REGISTER_TIMEOUT") {
    auto [scheduler, port] = StartScheduler(1, 2);
    auto server = Start("ps-server", JobEnv(1, 2, port));  // the workers never come
    REQUIRE(server->WaitForOutput("waiting for the job to fill up", 20s));
    scheduler->Kill(SIGKILL);
    CHECK(server->Wait(15s) == 1);  // PS_REGISTER_TIMEOUT is 30 s
    CHECK_THAT(server->Output(),
               Catch::Contains("the scheduler at 127.0.0.1:" + std::to_string(port) +
                               " accepted this server, but its connection closed ") &&
                   Catch::Contains("before the job filled up, and has not opened again: it "
                                   "exited or was killed"));
  }
}

TEST_CASE("processes: a worker that dies before the job fills up is replaced",
          "[processes][fault]") {
  // A pod that crash-loops before the job starts: its restart takes the dead one's place,
  // where before it was refused ("the job already has its 2 worker(s)") and the job failed.
  Env env = JobEnv(1, 2, 0);
  env["PS_VERBOSE"] = "1";
  auto [scheduler, port] = StartSchedulerFor(env);
  auto server = Start("ps-server", env);
  auto doomed = Start("ps-test-node", env, {"--barriers", "2"});
  // Its first wait report (after 3 s): the scheduler's connection to it is long open, so its
  // closing is seen (one that never opened says nothing).
  REQUIRE(doomed->WaitForOutput("waiting for the job to fill up", 20s));
  doomed->Kill(SIGKILL);
  REQUIRE(
      scheduler->WaitForOutput("before the job filled up: its place goes to the next worker", 10s));
  auto first = Start("ps-test-node", env, {"--barriers", "2"});
  auto second = Start("ps-test-node", env, {"--barriers", "2"});
  CHECK(first->Wait(30s) == 0);
  CHECK(second->Wait(30s) == 0);
  CHECK(server->Wait(15s) == 0);
  CHECK(scheduler->Wait(15s) == 0);
  INFO(scheduler->Output());
  CHECK_THAT(first->Output() + second->Output(), Catch::Contains("registered as worker 0") &&
                                                     Catch::Contains("registered as worker 1"));
  CHECK_THAT(scheduler->Output(), Catch::Contains("takes the place of worker at"));
}

TEST_CASE("processes: settings of a registrant that exited do not bind the job",
          "[processes][fault]") {
  // A worker started wrongly (another bound, another store type) is killed before the job
  // filled up. A right one that registers while the scheduler still holds the wrong one's
  // place (its connection closed under a second ago) is refused, as it differs from that
  // earlier node, but the job does not end over a node on its way out. Once the place is
  // free, the wrong one's settings go with it: right nodes fill the job and it runs, where
  // before the gone worker's settings were the ones to match and the server was refused.
  Env env = JobEnv(1, 2, 0);
  env["PS_VERBOSE"] = "1";
  auto [scheduler, port] = StartSchedulerFor(env);
  Env wrong = env;
  wrong["MXNET_KVSTORE_BIGARRAY_BOUND"] = "5";
  auto doomed = Start("ps-kvstore-check", wrong, {"--type", "dist_async"});
  REQUIRE(doomed->WaitForOutput("waiting for the job to fill up", 20s));
  doomed->Kill(SIGKILL);
  REQUIRE(scheduler->WaitForOutput("closed: it is declared dead unless it is back within", 10s));
  auto early = Start("ps-kvstore-check", env, {"--rounds", "3"});
  CHECK(early->Wait(30s) == 1);
  const std::string freed = "before the job filled up: its place goes to the next worker";
  REQUIRE(scheduler->WaitForOutput(freed, 10s));
  auto server = Start("ps-server", env);
  auto first = Start("ps-kvstore-check", env, {"--rounds", "3"});
  auto second = Start("ps-kvstore-check", env, {"--rounds", "3"});
  INFO(scheduler->Output() + early->Output() + server->Output() + first->Output() +
       second->Output());
  CHECK(first->Wait(30s) == 0);
  CHECK(second->Wait(30s) == 0);
  CHECK(server->Wait(15s) == 0);
  CHECK(scheduler->Wait(15s) == 0);
  CHECK_THAT(early->Output(),
             Catch::Contains("an earlier") && Catch::Contains("that node's connection has closed"));
  const std::string after = scheduler->Output().substr(scheduler->Output().find(freed));
  CHECK_THAT(after,
             !Catch::Contains("MXNET_KVSTORE_BIGARRAY_BOUND=5") && !Catch::Contains("dist_async"));
}

TEST_CASE("processes: a vacated registrant's settings pass to the next registered node",
          "[processes][fault]") {
  // The first worker, the reference of the job's settings and store type, exits before the
  // job filled up: the next one still registered becomes the reference, and a wrong worker is
  // refused naming it (the server for the key slicing, the other worker for the type).
  for (const bool type : {false, true}) {
    INFO((type ? "store type" : "key slicing"));
    Env env = JobEnv(1, 3, 0);
    env["PS_VERBOSE"] = "1";
    auto [scheduler, port] = StartSchedulerFor(env);
    auto gone = Start("ps-kvstore-check", env, {"--rounds", "3"});
    REQUIRE(gone->WaitForOutput("waiting for the job to fill up", 20s));
    auto reference =
        type ? Start("ps-kvstore-check", env, {"--rounds", "3"}) : Start("ps-server", env);
    REQUIRE(scheduler->WaitForOutput("registered (2 of 4)", 20s));
    gone->Kill(SIGKILL);
    REQUIRE(scheduler->WaitForOutput("before the job filled up: its place goes to the next", 10s));
    Env wrong = env;
    if (!type) wrong["MXNET_KVSTORE_BIGARRAY_BOUND"] = "5";
    auto refused = Start("ps-kvstore-check", wrong,
                         {"--rounds", "3", "--type", type ? "dist_async" : "dist_sync"});
    CHECK(refused->Wait(30s) == 1);
    // A live node disagrees: the job cannot run as started, and the registered nodes are told.
    const auto status = reference->Wait(15s);
    INFO(scheduler->Output() + refused->Output() + reference->Output());
    CHECK(status == 1);
    const std::string earlier =
        type ? "an earlier worker (worker at 127.0.0.1:" : "an earlier node (server at 127.0.0.1:";
    CHECK_THAT(refused->Output(), Catch::Contains(earlier));
  }
}

TEST_CASE("processes: garbage sent to the scheduler's port does not disturb the job",
          "[processes][fault]") {
  auto [scheduler, port] = StartScheduler(1, 2);
  {
    zmq::context_t context;
    zmq::socket_t attacker(context, zmq::socket_type::push);
    attacker.set(zmq::sockopt::linger, 1000);
    // A job without PS_JOB_SECRET admits whoever speaks PLAIN with the no-secret password.
    attacker.set(zmq::sockopt::plain_username, "outsider");
    attacker.set(zmq::sockopt::plain_password, ps::kNoJobSecret);
    attacker.connect("tcp://127.0.0.1:" + std::to_string(port));
    for (int i = 0; i < 50; ++i) attacker.send(zmq::str_buffer("\x01\x02garbage"));
  }
  const Env env = JobEnv(1, 2, port);
  auto server = Start("ps-server", env);
  auto first = Start("ps-test-node", env, {"--barriers", "5"});
  auto second = Start("ps-test-node", env, {"--barriers", "5"});
  CHECK(first->Wait(30s) == 0);
  CHECK(second->Wait(30s) == 0);
  const auto server_status = server->Wait(15s);
  INFO("server output: " << server->Output());
  CHECK(server_status == 0);
  const auto scheduler_status = scheduler->Wait(15s);
  INFO("scheduler output: " << scheduler->Output());
  CHECK(scheduler_status == 0);
  CHECK_THAT(scheduler->Output(), Catch::Contains("dropped malformed message"));
}

TEST_CASE("processes: PS_VERBOSE=1 logs connections and PS_VERBOSE=2 every message",
          "[processes]") {
  for (const std::string level : {"1", "2"}) {
    INFO("PS_VERBOSE=" << level);
    Env env = JobEnv(1, 1, 0);
    env["PS_VERBOSE"] = level;
    auto scheduler = std::make_unique<ChildProcess>(
        std::vector<std::string>{ps::test::BinPath("ps-scheduler")}, env);
    REQUIRE(scheduler->WaitForOutput("ps-scheduler: listening on", 10s));
    std::smatch match;
    const std::string listening = scheduler->Output();
    REQUIRE(std::regex_search(listening, match, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)")));
    env["DMLC_PS_ROOT_PORT"] = match[1].str();
    auto server = Start("ps-server", env);
    auto worker = Start("ps-test-node", env, {"--barriers", "1"});
    CHECK(worker->Wait(30s) == 0);
    CHECK(server->Wait(15s) == 0);
    CHECK(scheduler->Wait(15s) == 0);
    CHECK_THAT(scheduler->Output(), Catch::Contains("connected to node 1 at tcp://127.0.0.1:"));
    CHECK_THAT(server->Output(), Catch::Contains("registered as server 0"));
    if (level == "2") {
      CHECK_THAT(scheduler->Output(), Catch::Contains("received register request"));
      CHECK_THAT(scheduler->Output(), Catch::Contains("sent barrier-release"));
    } else {
      CHECK_THAT(scheduler->Output(), !Catch::Contains("received register request"));
    }
  }
}

TEST_CASE("processes: nodes that disagree on the job's shape all end naming the variable",
          "[processes][fault]") {
  // The scheduler and the workers run a job of 1 server and 2 workers; the server was told 2
  // servers. It used to register, size its rounds for a job that does not exist and wait, with
  // everyone else, forever.
  auto [scheduler, port] = StartScheduler(1, 2);
  const Env env = JobEnv(1, 2, port);
  Env server_env = env;
  server_env["DMLC_NUM_SERVER"] = "2";
  const auto start = std::chrono::steady_clock::now();
  auto server = Start("ps-server", server_env);
  auto first = Start("ps-test-node", env, {"--barriers", "3"});
  auto second = Start("ps-test-node", env, {"--barriers", "3"});
  const std::string why =
      "was started with DMLC_NUM_SERVER=2, the scheduler with DMLC_NUM_SERVER=1: start every "
      "node of the job with the same DMLC_NUM_SERVER";
  CHECK(server->Wait(30s) == 1);
  CHECK_THAT(server->Output(),
             Catch::Contains("refused this node: server at") && Catch::Contains(why));
  for (auto* worker : {first.get(), second.get()}) {
    CHECK(worker->Wait(30s) != 0);
    CHECK_THAT(worker->Output(), Catch::Contains(why));
  }
  CHECK(scheduler->Wait(30s) == 1);
  CHECK_THAT(scheduler->Output(), Catch::Contains(why));
  CHECK(std::chrono::steady_clock::now() - start < 30s);
}
