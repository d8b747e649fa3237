#include "child_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>

extern char** environ;

namespace ps::test {

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> merged;
  for (char** it = environ; *it != nullptr; ++it) {
    const std::string entry = *it;
    const auto eq = entry.find('=');
    if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [key, value] : env) merged[key] = value;
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : merged) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& arg : args) argp.push_back(arg.data());
  argp.push_back(nullptr);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argp[0], argp.data(), envp.data());
    const std::string why = std::string("exec ") + argp[0] + " failed: " + strerror(errno) + "\n";
    (void)!write(STDERR_FILENO, why.data(), why.size());
    _exit(127);
  }
  close(pipe_fds[1]);
  out_fd_ = pipe_fds[0];
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  reader_ = std::thread([this] {
    char buffer[4096];
    while (true) {
      const ssize_t n = read(out_fd_, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard lock(mu_);
      if (n <= 0) {
        closed_ = true;
        grew_.notify_all();
        return;
      }
      output_.append(buffer, static_cast<std::size_t>(n));
      grew_.notify_all();
    }
  });
}

ChildProcess::~ChildProcess() {
  if (!status_) {
    Kill(SIGKILL);
    Wait(std::chrono::seconds(10));
  }
  // The pipe closes once every process holding it has exited (grandchildren included).
  reader_.join();
  close(out_fd_);
  if (pidfd_ >= 0) close(pidfd_);
}

std::optional<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  pollfd fd{pidfd_, POLLIN, 0};
  const int ready = poll(&fd, 1, static_cast<int>(timeout.count()));
  if (ready <= 0) return std::nullopt;
  int raw = 0;
  if (waitpid(pid_, &raw, 0) != pid_) return std::nullopt;
  status_ = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  // Let the reader drain what the process wrote before it exited, so Output() is complete.
  std::unique_lock lock(mu_);
  grew_.wait_for(lock, std::chrono::seconds(5), [this] { return closed_; });
  return status_;
}

void ChildProcess::Kill(int signal) {
  if (!status_) kill(pid_, signal);
}

bool ChildProcess::Running() { return !Wait(std::chrono::milliseconds(0)).has_value(); }

std::string ChildProcess::Output() const {
  std::lock_guard lock(mu_);
  return output_;
}

bool ChildProcess::WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return grew_.wait_for(lock, timeout, [&] {
    return output_.find(text) != std::string::npos || closed_;
  }) && output_.find(text) != std::string::npos;
}

int FindFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t length = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string BinPath(const std::string& name) {
  const std::string path = std::string(PS_BIN_DIR) + "/" + name;
  if (!std::filesystem::exists(path)) throw std::runtime_error("test binary missing: " + path);
  return path;
}

int ThreadCount() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++count;
  }
  return count;
}

}  // namespace ps::test
