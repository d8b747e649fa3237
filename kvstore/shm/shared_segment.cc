#include "kvstore/shm/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string_view>
#include <utility>

#include "kvstore/file_size_limit.h"
#include "ps/error.h"
#include "ps/src/internal.h"

namespace ps {
namespace {

constexpr const char* kMemfdName = "ps-kvstore-values";

std::string SystemError(const std::string& what) { return what + ": " + std::strerror(errno); }

// Where a /proc/.../fd/<fd> link points; throws when it cannot be read.
std::string LinkTarget(const std::string& path) {
  char target[512] = {};
  const ssize_t length = readlink(path.c_str(), target, sizeof(target) - 1);
  if (length < 0) throw Error(SystemError("cannot read the link " + path));
  return std::string(target, static_cast<std::size_t>(length));
}

// True for one of our memfds: a peer must not make a server map, and then write into, any
// other file the server can open.
bool IsOurMemfd(std::string_view link) {
  return link.starts_with("/memfd:") && link.substr(7).starts_with(kMemfdName) &&
         link.ends_with(" (deleted)");
}

std::byte* MapShared(int fd, std::size_t bytes, const std::string& what) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) throw Error(SystemError("cannot map " + what));
  return static_cast<std::byte*>(base);
}

}  // namespace

SharedSegment::SharedSegment(std::byte* base, std::size_t bytes, int fd, Descriptor descriptor)
    : base_(base), bytes_(bytes), fd_(fd), descriptor_(descriptor) {}

SharedSegment::~SharedSegment() {
  munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

void SharedSegment::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

SegmentLimit::SegmentLimit(int configured) : configured_(configured > 0) {
  if (configured_) {
    most_ = static_cast<std::size_t>(configured);
    return;
  }
  std::size_t max_map_count = 65530;  // Linux's default
  if (std::FILE* file = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    unsigned long long value = 0;
    if (std::fscanf(file, "%llu", &value) == 1 && value > 0) max_map_count = value;
    std::fclose(file);
  }
  most_ = std::max<std::size_t>(1, max_map_count / 4);
}

std::string SegmentLimit::Exceeded(std::size_t mapped, const std::string& who) const {
  if (mapped < most_) return "";
  return who + " maps " + std::to_string(mapped) + " shared-memory segments, its most (" +
         (configured_ ? "PS_SHM_MAX_SEGMENTS" : "a quarter of the kernel's vm.max_map_count") +
         "): each Init call makes one per server, so Init the keys in few calls (one call "
         "with a list of keys makes one segment), or raise PS_SHM_MAX_SEGMENTS and "
         "vm.max_map_count";
}

std::unique_ptr<SharedSegment> SharedSegment::Create(std::size_t bytes) {
  bytes += kHeaderBytes;
  CheckFileSizeLimit(bytes, "a shared-memory segment");  // memfds count as files
  ScopedFd fd(memfd_create(kMemfdName, MFD_CLOEXEC));
  if (fd.get() < 0) throw Error(SystemError("memfd_create"));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    throw Error(SystemError("ftruncate of a shared-memory segment"));
  }
  std::byte* base = MapShared(fd.get(), bytes, "a new shared-memory segment");
  Descriptor where;
  where.pid = getpid();
  where.fd = fd.get();
  where.bytes = bytes;
  where.token = std::random_device{}() * 0x100000000ULL + std::random_device{}();
  std::memcpy(base, &where.token, sizeof(where.token));
  return std::make_unique<SharedSegment>(base, bytes, fd.release(), where);
}

std::unique_ptr<SharedSegment> SharedSegment::Attach(const Descriptor& where) {
  const std::string path = "/proc/" + std::to_string(where.pid) + "/fd/" + std::to_string(where.fd);
  if (where.bytes <= kHeaderBytes) throw Error("shared-memory segment " + path + " is empty");
  const ScopedFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) throw Error(SystemError("cannot open " + path));
  // Checked on the descriptor opened, so the peer cannot swap files in between.
  const std::string link = LinkTarget("/proc/self/fd/" + std::to_string(fd.get()));
  if (!IsOurMemfd(link)) {
    throw Error(path + " is not a KVStore shared-memory segment (it is " + link + ")");
  }
  struct stat info {};
  if (fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode) ||
      static_cast<std::uint64_t>(info.st_size) != where.bytes) {
    throw Error(path + " is not the shared-memory segment announced (" +
                std::to_string(where.bytes) + " bytes)");
  }
  // The mapping keeps the memory; the descriptor closes with `fd`.
  auto segment = std::make_unique<SharedSegment>(MapShared(fd.get(), where.bytes, path),
                                                 where.bytes, -1, where);
  std::uint64_t token = 0;
  std::memcpy(&token, segment->data(), sizeof(token));
  if (token != where.token) throw Error(path + " holds another segment (token mismatch)");
  return segment;
}

}  // namespace ps
