#include "shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "ps/error.h"

namespace ps {
namespace {

std::string SystemError(const std::string& what) { return what + ": " + std::strerror(errno); }

std::byte* MapShared(int fd, std::size_t bytes) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return base == MAP_FAILED ? nullptr : static_cast<std::byte*>(base);
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

std::unique_ptr<SharedSegment> SharedSegment::Create(std::size_t bytes) {
  bytes += kHeaderBytes;
  const int fd = memfd_create("ps-kvstore-values", MFD_CLOEXEC);
  if (fd < 0) throw Error(SystemError("memfd_create"));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string error = SystemError("ftruncate of a shared-memory segment");
    close(fd);
    throw Error(error);
  }
  std::byte* base = MapShared(fd, bytes);
  if (base == nullptr) {
    const std::string error = SystemError("mmap of a shared-memory segment");
    close(fd);
    throw Error(error);
  }
  Descriptor where;
  where.pid = getpid();
  where.fd = fd;
  where.bytes = bytes;
  where.token = std::random_device{}() * 0x100000000ULL + std::random_device{}();
  std::memcpy(base, &where.token, sizeof(where.token));
  return std::make_unique<SharedSegment>(base, bytes, fd, where);
}

std::unique_ptr<SharedSegment> SharedSegment::Attach(const Descriptor& where) {
  const std::string path = "/proc/" + std::to_string(where.pid) + "/fd/" + std::to_string(where.fd);
  if (where.bytes <= kHeaderBytes) throw Error("shared-memory segment " + path + " is empty");
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw Error(SystemError("cannot open " + path));
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) ||
      static_cast<std::uint64_t>(info.st_size) != where.bytes) {
    close(fd);
    throw Error(path + " is not the shared-memory segment announced (" +
                std::to_string(where.bytes) + " bytes)");
  }
  std::byte* base = MapShared(fd, where.bytes);
  const std::string map_error = base == nullptr ? SystemError("cannot map " + path) : "";
  close(fd);  // the mapping keeps the memory
  if (base == nullptr) throw Error(map_error);
  auto segment = std::make_unique<SharedSegment>(base, where.bytes, -1, where);
  std::uint64_t token = 0;
  std::memcpy(&token, base, sizeof(token));
  if (token != where.token) throw Error(path + " holds another segment (token mismatch)");
  return segment;
}

}  // namespace ps
