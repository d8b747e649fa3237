#include "ps/src/stderr_log.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>
#include <system_error>
#include <utility>

namespace ps::internal {
namespace {

// How long an exiting process waits for its queued log lines (a reader that stopped for good
// must not hold the exit).
constexpr std::chrono::seconds kExitFlush{3};
// How long glog's FATAL line waits for the lines before it, and how long the process may
// take to abort after it (SIGALRM ends it then).
constexpr std::chrono::seconds kFatalFlush{2};
constexpr unsigned kFatalDeadline = 10;

// `fd`'s pipe opened again, as a description of its own with O_NONBLOCK (set on `fd` itself,
// it would reach every process that shares the pipe); -1 when `fd` is no pipe (a file opened
// again would start at offset 0).
int NonBlockingPipe(int fd) {
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISFIFO(status.st_mode)) return -1;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  return ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
}

}  // namespace

LogWriter::LogWriter(int fd, std::size_t max_queued_bytes)
    : fd_(fd), nonblocking_(NonBlockingPipe(fd)), max_queued_bytes_(max_queued_bytes) {
  MutexLock lock(mu_);
  StartThread();
}

LogWriter::~LogWriter() {
  std::thread thread;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  changed_.NotifyAll();
  if (thread.joinable()) thread.join();  // Run writes what is queued first
}

bool LogWriter::StartThread() {
  if (thread_.joinable()) return true;
  // The thread takes no signal, whenever it starts: a program that handles SIGTERM on a thread
  // of its own blocks it in the threads it starts later, and this one may start first.
  sigset_t all;
  sigset_t before;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &before);
  bool started = true;
  try {
    thread_ = std::thread([this] { Run(); });
  } catch (const std::system_error&) {
    // Out of threads or of memory for a stack: logging must not throw where the program
    // reports exactly that trouble. Lines are written by their callers then (Write).
    started = false;
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  return started;
}

bool LogWriter::TryWriteNow(std::string_view line) const {
  // Longer lines could be written in part: they go through the queue, whole.
  if (line.size() > PIPE_BUF) return false;
  if (nonblocking_.get() >= 0) {
    for (;;) {
      const ssize_t n = ::write(nonblocking_.get(), line.data(), line.size());
      if (n < 0 && errno == EINTR) continue;
      // Up to PIPE_BUF bytes go into a pipe whole or not at all (EAGAIN: it is full).
      return n >= 0 || errno != EAGAIN;
    }
  }
  // A file, a terminal: poll says whether there is room.
  pollfd out{fd_, POLLOUT, 0};
  if (::poll(&out, 1, 0) != 1 || (out.revents & POLLOUT) == 0) return false;
  WriteFully(line);
  return true;
}

void LogWriter::WriteFully(std::string_view text) const {
  while (!text.empty()) {
    const ssize_t n = ::write(fd_, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed or broken stderr: nothing to be done about it here
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

void LogWriter::Write(std::string_view line, bool important) {
  MutexLock lock(mu_);
  // Written here only when nothing is ahead of it, so the order stays the order of the calls.
  if (queue_.empty() && !writing_ && TryWriteNow(line)) return;
  if (!StartThread()) {
    // No thread to hand the line to (none could be started): written here, waiting for the
    // reader if need be, rather than lost. Nothing is queued without a thread.
    WriteFully(line);
    return;
  }
  const std::size_t bound = important ? kImportantFactor * max_queued_bytes_ : max_queued_bytes_;
  if (queued_bytes_ + line.size() > bound) {
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
                 std::to_string(max_queued_bytes_ >> 10) + " KiB (warnings and errors kept)\n");
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
  const auto written = [this]() PS_REQUIRES(mu_) {
    return queue_.empty() && !writing_ && dropped_unreported_ == 0;
  };
  while (!written()) {
    if (!changed_.WaitUntil(mu_, deadline) && std::chrono::steady_clock::now() >= deadline) break;
  }
  return written();
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

// Formats glog lines as glog writes them to stderr, for the process's stderr LogWriter.
class StderrLogSink final : public google::LogSink {
 public:
  using google::LogSink::send;
  void send(google::LogSeverity severity, const char* full_filename, const char* base_filename,
            int line, const google::LogMessageTime& time, const char* message,
            std::size_t message_len) override;
};

void StderrLogSink::send(google::LogSeverity severity, const char* full_filename,
                         const char* base_filename, int line, const google::LogMessageTime& time,
                         const char* message, std::size_t message_len) {
  static_cast<void>(full_filename);
  std::string text = ToString(severity, base_filename, line, time, message, message_len);
  text += '\n';
  ProcessStderrWriter().Write(text, severity >= google::GLOG_WARNING);
  if (severity == google::GLOG_FATAL) {
    // glog aborts after a FATAL line: it and the lines before it get out first, if they can.
    ProcessStderrWriter().Flush(kFatalFlush);
    // glog then writes its stack trace to stderr itself, blocking: a reader that stopped must
    // not keep a failed process alive (its other threads would go on heartbeating).
    ::alarm(kFatalDeadline);
  }
}

}  // namespace

void FlushStderrLog(std::chrono::milliseconds limit) { ProcessStderrWriter().Flush(limit); }

google::LogSink* ProcessStderrSink() {
  alignas(StderrLogSink) static unsigned char storage[sizeof(StderrLogSink)];
  static StderrLogSink* const sink = std::construct_at(reinterpret_cast<StderrLogSink*>(storage));
  return sink;
}

void SetUpLogging(const char* program) {
  // glog writes nowhere itself (no file for any severity, nothing straight to stderr): every
  // line goes through the sink, which never blocks the thread that logs.
  FLAGS_logtostderr = false;
  FLAGS_logtostdout = false;
  FLAGS_alsologtostderr = false;
  FLAGS_stderrthreshold = google::NUM_SEVERITIES;
  google::InitGoogleLogging(program);
  for (int severity = 0; severity < google::NUM_SEVERITIES; ++severity) {
    google::SetLogDestination(severity, "");
  }
  google::AddLogSink(ProcessStderrSink());
  // Its thread starts now, not at the first line, which may be a report of the process
  // running out of threads or memory.
  static_cast<void>(ProcessStderrWriter());
}

}  // namespace ps::internal
