#include "ps/src/stderr_log.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>
#include <utility>

namespace ps::internal {
namespace {

// How long an exiting process waits for its queued log lines (a reader that stopped for good
// must not hold the exit).
constexpr std::chrono::seconds kExitFlush{3};
// How long glog's FATAL line waits for the lines before it.
constexpr std::chrono::seconds kFatalFlush{2};

}  // namespace

LogWriter::LogWriter(int fd, std::size_t max_queued_bytes)
    : fd_(fd), max_queued_bytes_(max_queued_bytes), thread_([this] { Run(); }) {}

LogWriter::~LogWriter() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  changed_.NotifyAll();
  thread_.join();  // Run writes what is queued first
}

bool LogWriter::WritableNow(std::size_t bytes) const {
  // A pipe takes PIPE_BUF bytes at once whenever poll says it is writable; longer lines, and
  // anything while the pipe is full, go through the queue.
  if (bytes > PIPE_BUF) return false;
  pollfd out{fd_, POLLOUT, 0};
  return ::poll(&out, 1, 0) == 1 && (out.revents & POLLOUT) != 0;
}

void LogWriter::WriteFully(std::string_view text) const {
  while (!text.empty()) {
    const ssize_t n = ::write(fd_, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed or broken stderr: nothing to be done about it here
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

void LogWriter::Write(std::string_view line) {
  MutexLock lock(mu_);
  // Written here only when nothing is ahead of it, so the order stays the order of the calls.
  if (queue_.empty() && !writing_ && WritableNow(line.size())) {
    WriteFully(line);
    return;
  }
  if (queued_bytes_ + line.size() > max_queued_bytes_) {
    ++dropped_;
    ++dropped_unreported_;
    return;
  }
  queue_.emplace_back(line);
  queued_bytes_ += line.size();
  changed_.NotifyAll();
}

void LogWriter::Run() {
  MutexLock lock(mu_);
  for (;;) {
    while (queue_.empty() && dropped_unreported_ == 0 && !stopping_) changed_.Wait(mu_);
    if (queue_.empty() && dropped_unreported_ == 0) return;  // stopping, and all written
    std::deque<std::string> lines;
    lines.swap(queue_);
    const std::uint64_t dropped = std::exchange(dropped_unreported_, 0);
    writing_ = true;
    lock.Unlock();            // the writes may block: callers queue meanwhile
    std::size_t written = 0;  // the lines count against the bound until written
    for (const std::string& line : lines) {
      WriteFully(line);
      written += line.size();
    }
    if (dropped > 0) {
      WriteFully("ps: " + std::to_string(dropped) +
                 " log line(s) dropped: nothing read this process's stderr for a while (a "
                 "stopped launcher or terminal?), and the lines waiting for it filled " +
                 std::to_string(max_queued_bytes_ >> 20) + " MiB\n");
    }
    lock.Lock();
    queued_bytes_ -= written;
    writing_ = false;
    changed_.NotifyAll();
  }
}

bool LogWriter::Flush(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  MutexLock lock(mu_);
  while (!queue_.empty() || writing_ || dropped_unreported_ > 0) {
    if (!changed_.WaitUntil(mu_, deadline) && std::chrono::steady_clock::now() >= deadline) {
      return queue_.empty() && !writing_ && dropped_unreported_ == 0;
    }
  }
  return true;
}

std::uint64_t LogWriter::dropped() const {
  MutexLock lock(mu_);
  return dropped_;
}

namespace {

// Never destroyed: threads may log while the process exits (its writer thread runs to the end).
LogWriter& ProcessStderrWriter() {
  alignas(LogWriter) static unsigned char storage[sizeof(LogWriter)];
  static LogWriter* const writer = [] {
    LogWriter* made = std::construct_at(reinterpret_cast<LogWriter*>(storage), STDERR_FILENO);
    std::atexit([] { ProcessStderrWriter().Flush(kExitFlush); });
    return made;
  }();
  return *writer;
}

}  // namespace

void StderrLogSink::send(google::LogSeverity severity, const char* full_filename,
                         const char* base_filename, int line, const google::LogMessageTime& time,
                         const char* message, std::size_t message_len) {
  static_cast<void>(full_filename);
  std::string text = ToString(severity, base_filename, line, time, message, message_len);
  text += '\n';
  ProcessStderrWriter().Write(text);
  // glog aborts after a FATAL line: it and the lines before it get out first, if they can.
  if (severity == google::GLOG_FATAL) ProcessStderrWriter().Flush(kFatalFlush);
}

StderrLogSink& ProcessStderrSink() {
  alignas(StderrLogSink) static unsigned char storage[sizeof(StderrLogSink)];
  static StderrLogSink* const sink = std::construct_at(reinterpret_cast<StderrLogSink*>(storage));
  return *sink;
}

void SetUpLogging(const char* program) {
  // glog writes nowhere itself (no file for any severity, nothing straight to stderr): every
  // line goes through the sink, which never blocks the thread that logs.
  FLAGS_logtostderr = false;
  FLAGS_alsologtostderr = false;
  FLAGS_stderrthreshold = google::NUM_SEVERITIES;
  google::InitGoogleLogging(program);
  for (int severity = 0; severity < google::NUM_SEVERITIES; ++severity) {
    google::SetLogDestination(severity, "");
  }
  google::AddLogSink(&ProcessStderrSink());
}

}  // namespace ps::internal
