// A process that cannot start a thread (out of threads, or of memory for a stack): a node's
// threads fail with a ps::Error that names the limits (ps/src/start_thread.h), and its log
// lines still get out (ps/src/stderr_log.h), instead of std::system_error ending the process.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <thread>

#include "ps/error.h"
#include "ps/src/start_thread.h"
#include "ps/src/stderr_log.h"
#include "tests/util/sanitizer.h"

namespace {

// Exit statuses of RunWithoutThreads' child besides the body's own.
constexpr int kThreadStarted = 100;  // the cap did not hold: the test would prove nothing
constexpr int kCapFailed = 101;

struct ChildResult {
  int status = -1;     // the child's exit status
  std::string output;  // what it wrote into the pipe it was given
};

// Runs `body(fd)` in a child process capped (RLIMIT_AS) at what it maps now plus 1 MiB, where
// no thread's stack fits; `fd` is a pipe's write end, read once the child ended (the pipe
// holds what the tests write). After fork only this test's code runs in the child: the
// parent's other threads are not there.
ChildResult RunWithoutThreads(const std::function<int(int fd)>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    long size_kb = -1;
    FILE* status = std::fopen("/proc/self/status", "r");
    char line[256];
    while (status != nullptr && std::fgets(line, sizeof(line), status) != nullptr) {
      if (std::strncmp(line, "VmSize:", 7) == 0) size_kb = std::atol(line + 7);
    }
    if (status != nullptr) std::fclose(status);
    const auto cap = static_cast<rlim_t>(size_kb + 1024) << 10;
    const rlimit limit{cap, cap};
    if (size_kb <= 0 || ::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(kCapFailed);
    try {
      std::thread probe([] {});
      probe.join();
      ::_exit(kThreadStarted);
    } catch (const std::system_error&) {
    }
    ::_exit(body(fds[1]));
  }
  ::close(fds[1]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  ChildResult result{WEXITSTATUS(status), ""};
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) {
    result.output.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  return result;
}

// Whether the test can cap its child's address space; else it says why it is skipped.
bool CanCapAddressSpace() {
  if (!ps::test::kSanitizer) return true;
  WARN("skipped: a sanitizer's shadow memory leaves RLIMIT_AS nothing to cap");
  return false;
}

}  // namespace

TEST_CASE("thread limits: a thread that cannot start is a ps::Error naming the limits",
          "[threads]") {
  if (!CanCapAddressSpace()) return;
  const ChildResult child = RunWithoutThreads([](int fd) {
    try {
      ps::internal::StartThread("the timer", [] {});
    } catch (const ps::Error& e) {
      const std::string text = std::string(e.what()) + "\n";
      static_cast<void>(::write(fd, text.data(), text.size()));
      return 0;
    } catch (...) {
      return 2;
    }
    return 3;
  });
  CHECK(child.status == 0);
  CHECK_THAT(child.output, Catch::StartsWith("cannot start the timer thread: ") &&
                               Catch::Contains("ulimit -u") && Catch::Contains("pids.max") &&
                               Catch::Contains("ulimit -v"));
}

TEST_CASE("thread limits: a log writer that cannot start its thread still writes every line",
          "[threads]") {
  if (!CanCapAddressSpace()) return;
  // The writer has no thread, so a line longer than PIPE_BUF (never written at once) is
  // written by its caller.
  const std::string long_line = std::string(3 * PIPE_BUF, 'y') + "\n";
  const ChildResult child = RunWithoutThreads([&](int fd) {
    try {
      ps::internal::LogWriter writer(fd);
      writer.Write("first\n");
      writer.Write(long_line, true);
      writer.Write("last\n");
    } catch (...) {
      return 2;
    }
    return 0;
  });
  CHECK(child.status == 0);
  CHECK(child.output == "first\n" + long_line + "last\n");
}
