#pragma once
// WakeFd: an eventfd that wakes a thread blocked in zmq_poll (as a plain descriptor item),
// for the threads that poll ZeroMQ sockets and must also be told to stop or to look again.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "ps/error.h"

namespace ps {

class WakeFd {
 public:
  // `owner` names the thread's owner in the error: "the connection monitor".
  explicit WakeFd(const std::string& owner) : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) {
      throw Error("cannot create " + owner + "'s eventfd: " + std::strerror(errno) +
                  " (raise the descriptor limit, ulimit -n)");
    }
  }
  ~WakeFd() { close(fd_); }
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  int fd() const { return fd_; }
  // Any thread. Fails only when the counter is saturated, which wakes the poller just as well.
  void Wake() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto written = write(fd_, &one, sizeof(one));
  }
  // The polling thread, when the descriptor is readable: resets it.
  void Drain() const {
    std::uint64_t count = 0;
    [[maybe_unused]] const auto read_bytes = read(fd_, &count, sizeof(count));
  }

 private:
  const int fd_;
};

}  // namespace ps
