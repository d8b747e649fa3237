#pragma once
// How the log lines of a ps process reach stderr without any of its threads waiting for
// whoever reads them.
//
// A node's threads log while they receive, send and heartbeat (with PS_VERBOSE=2, every
// message). A plain write to a pipe whose reader stopped reading (a launcher stopped by Ctrl-Z
// or SIGSTOP, a paused terminal, `| less` at a full screen) blocks, and with it glog's
// process-wide lock: every thread that logs stops, heartbeats too, and the scheduler declares
// a healthy node dead. So LogWriter writes a line at once only when that cannot block (no
// line queued, and the pipe has room for it); otherwise a thread of its own writes it, from a
// queue of at most kMaxQueuedBytes, beyond which lines are dropped and counted, and a line
// says how many once the output moves again. Order is kept.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <thread>

#include <glog/logging.h>

#include "ps/mutex.h"
#include "ps/thread_annotations.h"

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

  // A whole line (its '\n' included). Never waits for the reader.
  void Write(std::string_view line);
  // Waits up to `limit` for every queued line to be written; whether they were.
  bool Flush(std::chrono::milliseconds limit);
  // Lines dropped so far because the queue was full.
  std::uint64_t dropped() const;

 private:
  void Run();
  // Whether `bytes` can be written to fd_ now without blocking.
  bool WritableNow(std::size_t bytes) const;
  void WriteFully(std::string_view text) const;

  const int fd_;
  const std::size_t max_queued_bytes_;
  mutable Mutex mu_;
  CondVar changed_;  // a line queued, the queue written, or stopping
  std::deque<std::string> queue_ PS_GUARDED_BY(mu_);
  std::size_t queued_bytes_ PS_GUARDED_BY(mu_) = 0;  // queued, or taken off to be written
  bool writing_ PS_GUARDED_BY(mu_) = false;          // Run writes lines it took off the queue
  std::uint64_t dropped_ PS_GUARDED_BY(mu_) = 0;
  std::uint64_t dropped_unreported_ PS_GUARDED_BY(mu_) = 0;
  bool stopping_ PS_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Run; started last
};

// Formats glog lines as glog writes them to stderr, and hands them to the process's stderr
// LogWriter. Used by PS_LOG before the program sets glog up, and as glog's only output in the
// processes whose glog SetUpLogging configured.
class StderrLogSink final : public google::LogSink {
 public:
  using google::LogSink::send;
  void send(google::LogSeverity severity, const char* full_filename, const char* base_filename,
            int line, const google::LogMessageTime& time, const char* message,
            std::size_t message_len) override;
};

// The process's stderr sink; never destroyed (threads may log while the process exits). Its
// writer flushes when the process exits (std::atexit), for at most a few seconds.
StderrLogSink& ProcessStderrSink();

// Sets glog up for a program that owns its process (ps-scheduler, ps-server, ps-train, a role
// run by KVStore::Create): every line through ProcessStderrSink, none to files.
void SetUpLogging(const char* program);

}  // namespace ps::internal
