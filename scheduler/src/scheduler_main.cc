// ps-scheduler: runs the scheduler of one job and exits with the job's status.
#include <cstdio>
#include <string>

#include "ps/cli/cli.h"
#include "ps/error.h"
#include "ps/mutex.h"
#include "ps/scheduler.h"
#include "ps/src/stderr_log.h"
#include "ps/thread_annotations.h"

int main(int argc, char** argv) {
  ps::cli::Init(&argc, &argv,
                "runs the scheduler of a parameter-server job.\n"
                "Usage: ps-scheduler [flags]\n"
                "Every flag falls back to its DMLC_*/PS_* environment variable.",
                ps::Role::kScheduler);
  // The scheduler a signal stops: null before it exists and again once it has ended. A signal
  // after the end is ignored: the process is on its way out and has printed its one error line
  // (the launcher and its wrapper shell may each send a TERM).
  struct {
    ps::Mutex mu;
    ps::Scheduler* running PS_GUARDED_BY(mu) = nullptr;
    bool ended PS_GUARDED_BY(mu) = false;
  } target;
  try {
    // Started before any other thread so that all of them inherit the blocked signals.
    ps::cli::SignalWatcher signals([&](int signal) {
      const std::string why = std::string("the scheduler was stopped by signal ") +
                              (signal == SIGINT ? "SIGINT" : "SIGTERM");
      ps::MutexLock lock(target.mu);
      if (target.running != nullptr) {
        target.running->Stop(why);
      } else if (!target.ended) {
        ps::cli::Die("ps-scheduler", why);
      }
    });
    const ps::ClusterConfig config = ps::cli::ReadClusterConfig(ps::Role::kScheduler);
    ps::Scheduler scheduler(config);
    {
      ps::MutexLock lock(target.mu);
      target.running = &scheduler;
    }
    scheduler.PrintListeningLine();  // the launcher learns the port from it
    const int status = scheduler.Run();
    {
      ps::MutexLock lock(target.mu);
      target.running = nullptr;
      target.ended = true;
    }
    // The one report of a failure: the Scheduler hands it back and does not log it.
    if (status != 0) {
      ps::internal::FlushStderrLog();  // the log lines before it, then the last word
      std::fprintf(stderr, "ps-scheduler: error: %s\n", scheduler.failure().c_str());
    }
    return status;
  } catch (const std::exception& e) {  // ps::Error, or out of memory or threads at start
    ps::cli::DieOf("ps-scheduler", e);
  }
}
