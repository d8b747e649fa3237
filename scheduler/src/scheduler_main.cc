// ps-scheduler: runs the scheduler of one job and exits with the job's status.
#include <atomic>
#include <cstdio>
#include <iostream>

#include "cli.h"
#include "ps/error.h"
#include "ps/scheduler.h"

int main(int argc, char** argv) {
  ps::cli::Init(&argc, &argv,
                "runs the scheduler of a parameter-server job.\n"
                "Usage: ps-scheduler [flags]\n"
                "Every flag falls back to its DMLC_*/PS_* environment variable; see README.md.");
  // Started before any other thread so that all of them inherit the blocked signals.
  std::atomic<ps::Scheduler*> running{nullptr};
  ps::cli::SignalWatcher signals([&running](int signal) {
    const std::string why =
        std::string("stopped by signal ") + (signal == SIGINT ? "SIGINT" : "SIGTERM");
    if (ps::Scheduler* scheduler = running.load()) {
      scheduler->Stop(why);
    } else {
      ps::cli::Die("ps-scheduler", why);
    }
  });
  try {
    const ps::ClusterConfig config = ps::cli::ReadClusterConfig(ps::Role::kScheduler);
    ps::Scheduler scheduler(config);
    running = &scheduler;
    // The launcher reads this line to learn the port when DMLC_PS_ROOT_PORT=0.
    std::cout << "ps-scheduler: listening on " << config.root_uri << ":" << scheduler.port()
              << std::endl;
    const int status = scheduler.Run();
    running = nullptr;
    if (status != 0) std::fprintf(stderr, "ps-scheduler: error: %s\n", scheduler.failure().c_str());
    return status;
  } catch (const ps::Error& e) {
    ps::cli::Die("ps-scheduler", e.what());
  }
}
