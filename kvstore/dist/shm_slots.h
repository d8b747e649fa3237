#pragma once
// ShmSlots: a worker's shared-memory slots for same-host servers, one per key slice of at
// least kShmMinBytes on such a server.
//
// A request that owns a slot passes the slice's value through it instead of a data frame:
// the worker copies a pushed gradient in before sending, the server reads it in place and
// writes the reply value back, and the worker copies that out when the reply arrives. So a
// 16 MB push+pull costs two copies on the worker and one on the server, against four kernel
// socket copies and a copy out of the received frame over ipc or TCP.
//
// Ownership: ShmSlots owns its segments and slots, which live until it is destroyed (slots
// are never freed, so KeyInfo may hold plain pointers). A slot's state decides who may touch
// its memory: kFree (nobody), kBusy (the request that acquired it; the server between
// receiving that request and answering it), kRetired (a request failed without a clean reply,
// so the server might still write: never used again, the slice falls back to frames).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "kvstore/shm/shared_segment.h"
#include "ps/message.h"

namespace ps {

// Smaller slices travel as frames: the socket's own copy costs no more than the slot's.
constexpr std::size_t kShmMinBytes = std::size_t{64} << 10;

class ShmSlot {
 public:
  ShmSlot(std::byte* data, std::size_t bytes, std::uint32_t segment, std::uint64_t offset)
      : data_(data), bytes_(bytes), segment_(segment), offset_(offset) {}

  // True when this caller now owns the slot (it was free).
  bool TryAcquire();
  void Release();  // the owner's request completed cleanly
  void Retire();   // the owner's request failed; the slot is never used again

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  std::uint32_t segment() const { return segment_; }
  std::uint64_t offset() const { return offset_; }
  // The server (node id) that maps this slot's segment besides the slice's own, its replica
  // (kNoNode: none). Set once, before the slot is published to other threads (Init).
  int mirror() const { return mirror_; }
  void set_mirror(int node) { mirror_ = node; }

 private:
  enum State : int { kFree, kBusy, kRetired };
  std::byte* const data_;
  const std::size_t bytes_;
  const std::uint32_t segment_;
  const std::uint64_t offset_;
  int mirror_ = kNoNode;
  std::atomic<int> state_{kFree};
};

class ShmSlots {
 public:
  // A new segment with one slot per entry of `sizes` (bytes), not yet announced to a server.
  struct NewSegment {
    std::uint32_t id = 0;
    SharedSegment::Descriptor descriptor;
    std::vector<ShmSlot*> slots;  // in the order of `sizes`
  };
  // Throws ps::Error when the segment cannot be created.
  NewSegment Create(const std::vector<std::size_t>& sizes);
  // The server attached (the fd can go) or could not (the segment and its slots are dropped;
  // `segment.slots` must not be used).
  void Attached(const NewSegment& segment);
  void Abandon(const NewSegment& segment);
  // Segments mapped now (created and not abandoned).
  std::size_t mapped() const { return mapped_; }

 private:
  std::deque<std::unique_ptr<SharedSegment>> segments_;  // index = segment id; null: dropped
  std::deque<ShmSlot> slots_;                            // stable addresses
  std::size_t mapped_ = 0;
};

}  // namespace ps
