#include "kvstore/dist/shm_slots.h"

namespace ps {
namespace {

// Slots start on page boundaries, so a slot's copies never share a page with another's.
constexpr std::size_t kSlotAlignment = 4096;

std::size_t AlignUp(std::size_t bytes) {
  return (bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
}

}  // namespace

bool ShmSlot::TryAcquire() {
  int expected = kFree;
  return state_.compare_exchange_strong(expected, kBusy, std::memory_order_acquire);
}

void ShmSlot::Release() { state_.store(kFree, std::memory_order_release); }

void ShmSlot::Retire() { state_.store(kRetired, std::memory_order_release); }

ShmSlots::NewSegment ShmSlots::Create(const std::vector<std::size_t>& sizes) {
  std::size_t total = 0;
  for (const std::size_t bytes : sizes) total += AlignUp(bytes);
  auto segment = SharedSegment::Create(total);
  NewSegment created;
  created.id = static_cast<std::uint32_t>(segments_.size());
  created.descriptor = segment->descriptor();
  std::size_t offset = SharedSegment::kHeaderBytes;
  for (const std::size_t bytes : sizes) {
    slots_.emplace_back(segment->data() + offset, bytes, created.id, offset);
    created.slots.push_back(&slots_.back());
    offset += AlignUp(bytes);
  }
  segments_.push_back(std::move(segment));
  ++mapped_;
  return created;
}

void ShmSlots::Attached(const NewSegment& segment) { segments_[segment.id]->CloseFd(); }

void ShmSlots::Abandon(const NewSegment& segment) {
  for (ShmSlot* slot : segment.slots) slot->Retire();
  if (segments_[segment.id]) --mapped_;
  segments_[segment.id].reset();
}

}  // namespace ps
