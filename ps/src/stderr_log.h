#pragma once
// How the log lines of a ps process reach stderr without any of its threads waiting for
// whoever reads them.
//
// A node's threads log while they receive, send and heartbeat (with PS_VERBOSE=2, every
// message). A plain write to a pipe whose reader stopped reading (a launcher stopped by Ctrl-Z
// or SIGSTOP, a paused terminal, `| less` at a full screen) blocks, and with it glog's
// process-wide lock: every thread that logs stops, heartbeats too, and the scheduler declares
// a healthy node dead. So LogWriter writes a line at once only when that cannot block: with no
// line queued, through a non-blocking description of its own when the output is a pipe (a
// write of at most PIPE_BUF bytes then goes whole or not at all, whoever else writes into the
// pipe), else when poll says there is room. Otherwise a thread of its own writes it, from a
// queue of at most kMaxQueuedBytes, beyond which informational lines are dropped and counted
// (warnings and errors are kept), and a line says how many once the output moves again.
// Order is kept. Logging never throws: a process that cannot start that thread (out of
// threads or memory, which is what it may be logging) has its lines written by their callers.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <thread>

#include "ps/mutex.h"
#include "ps/src/scoped_fd.h"
#include "ps/thread_annotations.h"

namespace google {
class LogSink;
}  // namespace google

namespace ps::internal {

class LogWriter {
 public:
  static constexpr std::size_t kMaxQueuedBytes = 8 << 20;

  // Writes to `fd`, which the caller keeps open while this lives (tests: a pipe).
  explicit LogWriter(int fd, std::size_t max_queued_bytes = kMaxQueuedBytes);
  // Writes the queued lines first: fd_ must take them (its reader reads, or is gone).
  ~LogWriter();
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  // A whole line (its '\n' included). Never waits for the reader. An `important` line (a
  // warning or an error: what the job's end is read from) is queued past the bound, up to
  // kImportantFactor times it.
  void Write(std::string_view line, bool important = false);
  static constexpr std::size_t kImportantFactor = 4;
  // Waits up to `limit` for every queued line to be written; whether they were.
  bool Flush(std::chrono::milliseconds limit);
  // Lines dropped so far because the queue was full.
  std::uint64_t dropped() const;

 private:
  void Run();
  // Starts Run's thread unless it runs; false when it cannot be started (out of threads, or
  // of memory for its stack), and then Write writes each line itself. Tried again by each
  // line that must wait, so a process short of threads for a moment gets its writer later.
  bool StartThread() PS_REQUIRES(mu_);
  // Writes `line` now if that cannot block; whether it did (or the output is broken).
  bool TryWriteNow(std::string_view line) const;
  void WriteFully(std::string_view text) const;

  const int fd_;
  // fd_'s pipe opened anew, non-blocking (the caller's description is left as it is); -1 when
  // fd_ is no pipe.
  ScopedFd nonblocking_;
  const std::size_t max_queued_bytes_;
  mutable Mutex mu_;
  CondVar changed_;  // a line queued, the queue written, or stopping
  std::deque<std::string> queue_ PS_GUARDED_BY(mu_);
  std::size_t queued_bytes_ PS_GUARDED_BY(mu_) = 0;  // queued, or taken off to be written
  bool writing_ PS_GUARDED_BY(mu_) = false;          // Run writes lines it took off the queue
  std::uint64_t dropped_ PS_GUARDED_BY(mu_) = 0;
  std::uint64_t dropped_unreported_ PS_GUARDED_BY(mu_) = 0;
  bool stopping_ PS_GUARDED_BY(mu_) = false;
  std::thread thread_ PS_GUARDED_BY(mu_);  // Run; started by the constructor or a later Write
};

// The process's glog sink: formats lines as glog writes them to stderr and hands them to the
// process's stderr LogWriter. Used by PS_LOG before the program sets glog up, and as glog's
// only output in the processes SetUpLogging configured. Never destroyed (threads may log
// while the process exits); its writer flushes when the process exits (std::atexit), for at
// most a few seconds.
google::LogSink* ProcessStderrSink();

// Waits up to `limit` for the lines the process's stderr writer still holds: before a
// process's last words go straight to stderr, or before it exits without running its atexit
// handlers (std::_Exit).
void FlushStderrLog(std::chrono::milliseconds limit = std::chrono::seconds(3));

// Sets glog up for a program that owns its process (ps-scheduler, ps-server, ps-train, a role
// run by KVStore::Create): every line through ProcessStderrSink, none to files.
void SetUpLogging(const char* program);

}  // namespace ps::internal
