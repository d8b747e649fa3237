// ReadSmallFile (ps/src/small_file.h): the bounded reader of files users name (a job secret, a
// flag file). Nothing it is given may fill memory or block the program.
#include "ps/src/small_file.h"

#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>

#include "ps/error.h"
#include "tests/util/temp_dir.h"

namespace ps {
namespace {

using std::chrono::milliseconds;

std::string ErrorOf(const std::string& path, const SmallFileLimits& limits) {
  try {
    ReadSmallFile(path, limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A pipe as process substitution gives one (`<(echo ...)`), by its /proc path; closed with
// the test.
struct Pipe {
  Pipe() { REQUIRE(::pipe(fds) == 0); }
  ~Pipe() {
    for (const int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fds[0]); }
  void Write(const std::string& text) {
    REQUIRE(::write(fds[1], text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  }
  void CloseWriter() {
    ::close(fds[1]);
    fds[1] = -1;
  }
  int fds[2] = {-1, -1};
};

TEST_CASE("small file: regular files within the bound, whole or their first line",
          "[config][small_file]") {
  test::TempDir dir;
  const std::string path = dir.path() + "/text";
  std::ofstream(path) << "first\nsecond\n";
  CHECK(ReadSmallFile(path, {.max_bytes = 13}) == "first\nsecond\n");
  CHECK(ReadSmallFile(path, {.max_bytes = 6, .first_line = true}) == "first");
  CHECK(ErrorOf(path, {.max_bytes = 12}) == "it is larger than 12 bytes");
  CHECK(ErrorOf(path, {.max_bytes = 4, .first_line = true}) ==
        "no line end within its first 4 bytes");
  std::ofstream(path, std::ios::trunc) << "no line end";
  CHECK(ReadSmallFile(path, {.max_bytes = 100, .first_line = true}) == "no line end");
  CHECK(ErrorOf(dir.path(), {.max_bytes = 100}) == "it is a directory");
  CHECK(ErrorOf(dir.path() + "/missing", {.max_bytes = 100}) == "No such file or directory");
}

TEST_CASE("small file: a device that never ends or a FIFO without a writer fails at once",
          "[config][small_file]") {
  CHECK(ErrorOf("/dev/zero", {.max_bytes = 100, .pipe_timeout = milliseconds(100)}) ==
        "it is not a regular file (a device or a socket)");
  test::TempDir dir;
  const std::string fifo = dir.path() + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(ErrorOf(fifo, {.max_bytes = 100}) == "it is a pipe, not a regular file");
  CHECK(ErrorOf(fifo, {.max_bytes = 100, .pipe_timeout = milliseconds(100)}) ==
        "the pipe was closed without sending anything");
}

TEST_CASE("small file: a pipe is read within its time", "[config][small_file]") {
  {
    Pipe pipe;  // `<(echo secret)`: written and closed
    pipe.Write("secret\nrest");
    pipe.CloseWriter();
    CHECK(ReadSmallFile(pipe.path(), {.max_bytes = 100, .pipe_timeout = milliseconds(2000)}) ==
          "secret\nrest");
  }
  {
    Pipe pipe;  // its first line is enough, whether the writer goes on or not
    pipe.Write("secret\n");
    CHECK(ReadSmallFile(pipe.path(), {.max_bytes = 100,
                                      .first_line = true,
                                      .pipe_timeout = milliseconds(2000)}) == "secret");
  }
  {
    Pipe pipe;  // a writer that never writes: the time runs out
    CHECK(ErrorOf(pipe.path(), {.max_bytes = 100, .pipe_timeout = milliseconds(200)}) ==
          "it is a pipe that sent no end within 0.2 s");
  }
}

}  // namespace
}  // namespace ps
