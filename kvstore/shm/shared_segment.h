#pragma once
// SharedSegment: a block of memory two processes on one host map together, the data path of
// same-host KVStore traffic (the socket then carries only the control message).
//
// The worker creates a segment (an anonymous memfd, so nothing is left in /dev/shm when a
// process dies) and the server attaches to it through /proc/<pid>/fd/<fd>. The creator writes
// a random token into the first 8 bytes; Attach checks it, so a recycled pid or fd number
// cannot map the wrong memory. Unmapped (and the fd closed) on destruction; the memory goes
// back to the kernel when the last process unmaps it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ps {

// The most segments a process maps: PS_SHM_MAX_SEGMENTS, or when 0 a quarter of the kernel's
// limit on a process's memory mappings (vm.max_map_count), the rest left for the process's own
// memory. Resolved once per store (it reads /proc), then asked at each new segment.
class SegmentLimit {
 public:
  explicit SegmentLimit(int configured);
  // Why a process that maps `mapped` segments may map no more ("" when it may), for `who`.
  std::string Exceeded(std::size_t mapped, const std::string& who) const;

 private:
  bool configured_;
  std::size_t most_;
};

class SharedSegment {
 public:
  // Where another process finds the segment.
  struct Descriptor {
    std::int64_t pid = 0;
    std::int64_t fd = -1;
    std::uint64_t bytes = 0;
    std::uint64_t token = 0;
  };
  // Bytes at the start of every segment that hold the token; usable space starts here.
  static constexpr std::size_t kHeaderBytes = 4096;

  // Throws ps::Error naming the system call that failed.
  static std::unique_ptr<SharedSegment> Create(std::size_t bytes);
  // Maps another process's segment read-write. Throws ps::Error saying why it cannot (other
  // pid namespace, permissions, wrong size or token).
  static std::unique_ptr<SharedSegment> Attach(const Descriptor& where);

  SharedSegment(std::byte* base, std::size_t bytes, int fd, Descriptor descriptor);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Closes the creator's file descriptor once every peer has attached; the mapping stays.
  void CloseFd();

  std::byte* data() const { return base_; }
  std::size_t bytes() const { return bytes_; }
  const Descriptor& descriptor() const { return descriptor_; }

 private:
  std::byte* base_;
  std::size_t bytes_;
  int fd_;  // -1 when closed (an attached segment needs only the mapping)
  Descriptor descriptor_;
};

}  // namespace ps
