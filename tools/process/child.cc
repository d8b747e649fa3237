#include "tools/process/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

extern char** environ;

namespace ps::process {

Child::Child(std::string name, const std::vector<std::string>& argv, const Env& env)
    : name_(std::move(name)) {
  if (argv.empty()) throw std::runtime_error(name_ + ": empty command");
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
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
  const pid_t parent = getpid();

  int pipe_fds[2];
  int cancel_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error(name_ + ": pipe failed");
  if (pipe2(cancel_fds, O_CLOEXEC) != 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    throw std::runtime_error(name_ + ": pipe failed");
  }
  pid_ = fork();
  if (pid_ < 0) {
    for (int fd : {pipe_fds[0], pipe_fds[1], cancel_fds[0], cancel_fds[1]}) close(fd);
    throw std::runtime_error(name_ + ": fork failed: " + std::strerror(errno));
  }
  if (pid_ == 0) {
    // Dies with its starter (PR_SET_PDEATHSIG follows the forking thread: start children from
    // a thread that outlives them, as ps-bench's and the tests' main threads do).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argp[0], argp.data(), envp.data());
    const char* prefix = "exec failed: ";
    (void)!write(STDERR_FILENO, prefix, std::strlen(prefix));
    (void)!write(STDERR_FILENO, argp[0], std::strlen(argp[0]));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  close(pipe_fds[1]);
  out_fd_ = pipe_fds[0];
  const int cancel_read = cancel_fds[0];
  cancel_fd_ = cancel_fds[1];
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  reader_ = std::thread([this, cancel_read] {
    char buffer[8192];
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {cancel_read, POLLIN, 0}};
    while (true) {
      const int ready = poll(fds, 2, -1);
      if (ready < 0 && errno == EINTR) continue;
      ssize_t n = 0;
      if (ready > 0 && (fds[1].revents & POLLIN) == 0) {
        n = read(out_fd_, buffer, sizeof(buffer));
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      }
      MutexLock lock(mu_);
      if (n <= 0) {
        closed_ = true;
        grew_.NotifyAll();
        break;
      }
      output_.append(buffer, static_cast<std::size_t>(n));
      grew_.NotifyAll();
    }
    close(cancel_read);
  });
}

Child::Child(const std::vector<std::string>& argv, const Env& env)
    : Child(argv.empty() ? std::string("(empty)")
                         : std::filesystem::path(argv[0]).filename().string(),
            argv, env) {}

void Child::Kill(int signal) {
  if (!status_) kill(pid_, signal);
}

bool Child::WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) const {
  return WaitForOutput(
      [&text](const std::string& output) { return output.find(text) != std::string::npos; },
      timeout);
}

Child::~Child() {
  Stop();
  // The pipe closes once every process holding it exited; a grandchild that outlives its
  // parent (an mpirun rank, say) must not hang us: give up reading after a bounded wait.
  {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    MutexLock lock(mu_);
    while (!closed_ && grew_.WaitUntil(mu_, deadline)) {
    }
    if (!closed_) (void)!write(cancel_fd_, "x", 1);
  }
  reader_.join();
  close(cancel_fd_);
  close(out_fd_);
  if (pidfd_ >= 0) close(pidfd_);
}

std::optional<int> Child::Wait(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  if (pidfd_ >= 0) {
    pollfd fd{pidfd_, POLLIN, 0};
    int ready = 0;
    do {
      ready = poll(&fd, 1, static_cast<int>(timeout.count()));
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) return std::nullopt;
  }
  int raw = 0;
  pid_t got = 0;
  do {
    got = waitpid(pid_, &raw, 0);
  } while (got < 0 && errno == EINTR);
  if (got != pid_) return std::nullopt;
  status_ = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  // Let the reader drain what the process wrote before it exited, so Output() is complete.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  MutexLock lock(mu_);
  while (!closed_ && grew_.WaitUntil(mu_, deadline)) {
  }
  return status_;
}

void Child::Stop(std::chrono::milliseconds grace) {
  if (status_) return;
  kill(pid_, SIGTERM);
  if (Wait(grace)) return;
  kill(pid_, SIGKILL);
  Wait(std::chrono::seconds(10));
}

std::string Child::Output() const {
  MutexLock lock(mu_);
  return output_;
}

std::string Child::Tail(int lines) const {
  const std::string output = Output();
  std::size_t pos = output.size();
  if (pos > 0 && output[pos - 1] == '\n') --pos;
  for (int i = 0; i < lines && pos > 0; ++i) {
    const auto nl = output.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    pos = nl;
  }
  std::string tail = output.substr(pos == 0 ? 0 : pos + 1);
  if (tail.empty()) return "  (no output)\n";
  std::string indented;
  std::size_t start = 0;
  while (start < tail.size()) {
    auto end = tail.find('\n', start);
    if (end == std::string::npos) end = tail.size();
    indented += "  | " + tail.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return indented;
}

bool Child::WaitForOutput(const std::function<bool(const std::string&)>& done,
                          std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(mu_);
  while (!closed_ && !done(output_) && grew_.WaitUntil(mu_, deadline)) {
  }
  return done(output_);
}

std::string SelfPath() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw std::runtime_error("cannot read /proc/self/exe: " + error.message());
  return path.string();
}

std::string SelfDirectory() { return std::filesystem::path(SelfPath()).parent_path().string(); }

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  const std::string dirs = path;
  std::size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

}  // namespace ps::process
