#pragma once
// A job with the real ps-scheduler and ps-server as processes, and workers either as threads
// of the test process (each KVStore with its own runtime) or as ps-kvstore-check processes.
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ps/config.h"
#include "ps/kvstore.h"
#include "tests/util/child_process.h"
#include "tests/util/settings_config.h"

namespace ps::test {

using Env = std::map<std::string, std::string>;

class KVCluster {
 public:
  // `server_prefix`: a command put in front of every ps-server (e.g. a namespace wrapper).
  KVCluster(int servers, int workers, Env extra = {}, std::vector<std::string> server_prefix = {})
      : servers_(servers), workers_(workers) {
    env_ = {{"DMLC_PS_ROOT_URI", "127.0.0.1"},
            {"DMLC_PS_ROOT_PORT", "0"},
            {"DMLC_NUM_SERVER", std::to_string(servers)},
            {"DMLC_NUM_WORKER", std::to_string(workers)},
            {"PS_HEARTBEAT_INTERVAL", "0.2"},
            {"PS_HEARTBEAT_TIMEOUT", "3"},
            {"PS_REGISTER_TIMEOUT", "30"}};
    for (const auto& [key, value] : extra) env_[key] = value;
    scheduler_ =
        std::make_unique<ChildProcess>(std::vector<std::string>{BinPath("ps-scheduler")}, env_);
    if (!scheduler_->WaitForOutput("ps-scheduler: listening on", std::chrono::seconds(10))) {
      throw std::runtime_error("scheduler did not start: " + scheduler_->Output());
    }
    std::smatch match;
    const std::string output = scheduler_->Output();
    std::regex_search(output, match, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"));
    port_ = std::stoi(match[1]);
    env_["DMLC_PS_ROOT_PORT"] = std::to_string(port_);
    std::vector<std::string> server_command = std::move(server_prefix);
    server_command.push_back(BinPath("ps-server"));
    for (int s = 0; s < servers; ++s) {
      server_processes_.push_back(std::make_unique<ChildProcess>(server_command, env_));
    }
  }

  const Env& env() const { return env_; }
  ChildProcess& scheduler() { return *scheduler_; }
  std::vector<std::unique_ptr<ChildProcess>>& servers() { return server_processes_; }

  // A worker's config, read from the job's settings (env()) as ps-server reads its own.
  ClusterConfig WorkerConfig() const {
    Env settings = env_;
    settings["DMLC_ROLE"] = "worker";
    return ConfigFromSettings(settings);
  }

  // Runs `body` as every worker on threads; returns each one's outcome ("" when it returned
  // normally, else the exception's text). Each KVStore is destroyed (worker finished) at the
  // end of its thread.
  std::vector<std::string> RunWorkers(const std::string& type,
                                      const std::function<void(KVStore&)>& body) {
    std::vector<std::string> outcomes(static_cast<std::size_t>(workers_));
    std::vector<std::thread> threads;
    for (int w = 0; w < workers_; ++w) {
      threads.emplace_back([&, w] {
        try {
          auto kv = KVStore::Create(type, WorkerConfig());
          body(*kv);
        } catch (const std::exception& e) {
          outcomes[static_cast<std::size_t>(w)] = e.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    return outcomes;
  }

  // The server process that registered as server `rank` (needs PS_VERBOSE=1, which logs it);
  // throws when none did within 20 s.
  ChildProcess* ServerOfRank(int rank) {
    ChildProcess* found = nullptr;
    const std::string line = "registered as server " + std::to_string(rank) + " ";
    for (auto& server : server_processes_) {
      if (!server->WaitForOutput("registered as server ", std::chrono::seconds(20))) {
        throw std::runtime_error("a server did not register within 20 s");
      }
      if (server->Output().find(line) != std::string::npos) found = server.get();
    }
    if (found == nullptr) throw std::runtime_error("no server registered as " + line);
    return found;
  }

  // After the workers finished: the servers and the scheduler end cleanly.
  bool EndedCleanly() {
    bool clean = scheduler_->Wait(std::chrono::seconds(20)) == 0;
    for (auto& server : server_processes_)
      clean = server->Wait(std::chrono::seconds(20)) == 0 && clean;
    return clean;
  }

 private:
  int servers_;
  int workers_;
  int port_ = 0;
  Env env_;
  std::unique_ptr<ChildProcess> scheduler_;
  std::vector<std::unique_ptr<ChildProcess>> server_processes_;
};

// Throws when `condition` fails: for checks inside worker threads (Catch2 is not thread-safe).
inline void Expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

}  // namespace ps::test
