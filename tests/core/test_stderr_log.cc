// LogWriter (ps/src/stderr_log.h): a thread that logs never waits for the log's reader. Lines
// go out in order; while nobody reads, they queue up to a bound and the rest are dropped and
// counted, and once the reader reads again a line says how many.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "ps/src/stderr_log.h"

namespace {

// A pipe, both ends closed at the end of the scope.
struct Pipe {
  int read_end = -1;
  int write_end = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    read_end = fds[0];
    write_end = fds[1];
  }
  ~Pipe() {
    ::close(read_end);
    ::close(write_end);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  // Reads until `writer` has nothing queued and the pipe is empty (bounded: 30 s).
  std::string Drain(ps::internal::LogWriter& writer) const {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    const int flags = ::fcntl(read_end, F_GETFL);
    ::fcntl(read_end, F_SETFL, flags | O_NONBLOCK);
    char buffer[65536];
    for (;;) {
      const ssize_t n = ::read(read_end, buffer, sizeof(buffer));
      if (n > 0) {
        text.append(buffer, static_cast<std::size_t>(n));
        continue;
      }
      if (writer.Flush(std::chrono::milliseconds(0))) {
        // Written: whatever is left is in the pipe now.
        for (ssize_t left; (left = ::read(read_end, buffer, sizeof(buffer))) > 0;) {
          text.append(buffer, static_cast<std::size_t>(left));
        }
        break;
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::yield();
    }
    ::fcntl(read_end, F_SETFL, flags);
    return text;
  }
};

// Lines of one length (i < 10^6): 100 bytes.
std::string Line(int i) {
  std::string number = std::to_string(i);
  number.insert(0, 6 - number.size(), '0');
  return "line " + number + " " + std::string(87, 'x') + "\n";
}

}  // namespace

TEST_CASE("log writer: lines keep their order, written at once while the pipe has room", "[log]") {
  Pipe pipe;
  ps::internal::LogWriter writer(pipe.write_end);
  std::string expected;
  for (int i = 0; i < 100; ++i) {
    writer.Write(Line(i));
    expected += Line(i);
  }
  // 100 short lines fit the pipe: nothing was queued, so nothing waits for the writer thread.
  CHECK(writer.Flush(std::chrono::milliseconds(0)));
  CHECK(pipe.Drain(writer) == expected);
  CHECK(writer.dropped() == 0);
}

TEST_CASE("log writer: a reader that stops reading never holds the thread that logs", "[log]") {
  Pipe pipe;
  constexpr std::size_t kBound = 256 << 10;
  ps::internal::LogWriter writer(pipe.write_end, kBound);
  // Ten times what the pipe (64 KiB) and the queue hold together, with nobody reading: every
  // call returns (a blocking write would hang this test), the overflow is dropped.
  constexpr int kLines = 30000;
  std::atomic<bool> done{false};
  std::thread logger([&] {
    for (int i = 0; i < kLines; ++i) writer.Write(Line(i));
    done = true;
  });
  logger.join();
  CHECK(done);
  CHECK(writer.dropped() > 0);
  // A warning or an error still waits for the reader: the job's end is read from those.
  const std::uint64_t dropped = writer.dropped();
  const std::string important = "W an important line\n";
  writer.Write(important, true);
  CHECK(writer.dropped() == dropped);
  CHECK_FALSE(writer.Flush(std::chrono::milliseconds(50)));  // the reader is still away
  const std::string text = pipe.Drain(writer);
  // What got out: the first lines in order, the important one, and notes of how many were
  // dropped (one per batch the writer thread wrote after drops), which add up to the count.
  std::string lines;
  std::uint64_t noted = 0;
  bool important_seen = false;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    REQUIRE(end != std::string::npos);
    const std::string line = text.substr(at, end + 1 - at);
    at = end + 1;
    if (line.starts_with("ps: ")) {
      CHECK_THAT(line, Catch::Contains(" log line(s) dropped: nothing read this process's "
                                       "stderr for a while"));
      noted += std::stoull(line.substr(4));
    } else if (line == important) {
      important_seen = true;
    } else {
      CHECK_FALSE(important_seen);  // the important line came after every written one
      lines += line;
    }
  }
  CHECK(important_seen);
  CHECK(noted == dropped);
  std::string expected;
  for (int i = 0; expected.size() < lines.size(); ++i) expected += Line(i);
  CHECK(lines == expected);
  // Every line was written or counted, and no more waited than the pipe and the bound hold.
  CHECK(lines.size() + dropped * Line(0).size() == kLines * Line(0).size());
  CHECK(lines.size() <= (64 << 10) + kBound);
  // The reader is back: lines are written as they come again.
  writer.Write("after\n");
  CHECK(pipe.Drain(writer).find("after\n") != std::string::npos);
}
