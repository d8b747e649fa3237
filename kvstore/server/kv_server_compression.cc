// KVServerStore's part of gradient compression (docs/kvstore.md, "Gradient compression"):
// the setting, the checks of compressed pushes and pulls, decoding pushed codes into float32
// gradients, and encoding pulled values as changes since the worker's copy.
#include <glog/logging.h>

#include <new>

#include "kvstore/server/kv_server.h"

namespace ps {

void KVServerStore::HandleSetCompression(const Meta& meta, const kv::Request& request) {
  const std::string server = "server " + std::to_string(runtime_.rank());
  compression::Settings settings;
  try {
    settings = compression::Parse(request.compression);
  } catch (const Error& e) {
    runtime_.ReplyError(meta, server + ": " + e.what());
    return;
  }
  if (pushed_ && settings != compression_) {
    // Residuals and pushes in flight were made with the old setting.
    runtime_.ReplyError(meta, server +
                                  ": SetGradientCompression: the compression cannot change after "
                                  "the first push (call it before any Push)");
    return;
  }
  compression_ = settings;
  compression_body_ = SettingBody(request);
  runtime_.Reply(meta, Message{});
}

std::string KVServerStore::CheckCompressedPush(const kv::SliceRef& ref, const Slice& slice,
                                               const Blob& frame) const {
  if (compression_.push == compression::Codec::kNone) {
    return KeyText(ref.key) +
           ": a compressed push, but no gradient compression is set on this server (call "
           "SetGradientCompression on every worker first)";
  }
  if (slice.dtype != DType::kFloat32) {
    return KeyText(ref.key) + ": gradient compression is for float32 keys, this key holds " +
           DTypeName(slice.dtype);
  }
  const std::size_t expected = compression::EncodedBytes(compression_.push, slice.length);
  if (frame.bytes() != expected || ref.total != slice.total) {
    return KeyText(ref.key) + ": size mismatch: a " + compression::CodecName(compression_.push) +
           " push of " + std::to_string(slice.length) + " of its " + std::to_string(slice.total) +
           " elements is " + std::to_string(expected) + " bytes, given " +
           std::to_string(frame.bytes()) + " bytes for " + std::to_string(ref.total) + " elements";
  }
  return "";
}

std::string KVServerStore::CheckCompressedPull(const kv::SliceRef& ref, const Slice& slice,
                                               bool in_shared_memory) const {
  if (compression_.pull == compression::Codec::kNone) {
    return KeyText(ref.key) +
           ": a compressed pull, but no pull compression is set on this server (pull_type of "
           "SetGradientCompression)";
  }
  if (slice.dtype != DType::kFloat32) {
    return KeyText(ref.key) + ": gradient compression is for float32 keys, this key holds " +
           DTypeName(slice.dtype);
  }
  if (in_shared_memory) return KeyText(ref.key) + ": a compressed pull through shared memory";
  return "";
}

std::string KVServerStore::DecodeCompressed(const kv::Request& request, std::vector<Blob>& data) {
  if (request.command != kv::kPush && request.command != kv::kPushPull) return "";
  pushed_ = true;  // validated: the push is handled, and the setting is fixed from now on
  for (std::size_t i = 0; i < request.slices.size(); ++i) {
    if (data[i].dtype() != DType::kUInt8) continue;
    const Slice& slice = slices_.at({request.slices[i].key, request.slices[i].offset});
    try {
      // The rounds and the optimizer take it from here like any float32 gradient: a fresh
      // buffer of this server's, which a round may sum into or adopt as the value.
      std::vector<float> decoded(slice.length);
      compression::Decode(compression_.push, compression_.threshold, data[i].data(), slice.length,
                          decoded.data());
      data[i] = Blob::FromVector(std::move(decoded), DType::kFloat32);
    } catch (const std::bad_alloc&) {
      return OutOfMemory(slice.key, slice.offset, slice.length, slice.total,
                         slice.length * sizeof(float), "to decode a compressed push");
    }
  }
  return "";
}

void KVServerStore::CompressPullReplies(Pending& pending) {
  const int worker = pending.request.sender;
  for (std::size_t i = 0; i < pending.pulls.size(); ++i) {
    const kv::PullState pull = pending.pulls[i];
    if (pull.next == 0) continue;  // this slice is pulled in full
    const auto it = slices_.find(pending.pull_ids[i]);
    if (it == slices_.end()) continue;
    Slice& slice = it->second;
    Blob& value = pending.values[i];
    const auto* current = reinterpret_cast<const float*>(value.data());
    const std::size_t n = slice.length;
    try {
      const auto mirror = slice.mirrors.find(worker);
      if (pull.base != 0 && mirror != slice.mirrors.end() && mirror->second.state == pull.base) {
        // The worker holds what the mirror holds: send the change, and move the mirror by what
        // the change carries (the worker's copy moves the same way when it arrives).
        std::vector<std::byte> codes(compression::EncodedBytes(compression_.pull, n));
        compression::EncodeDelta(compression_.pull, compression_.threshold, current,
                                 mirror->second.value.data(), n, codes.data());
        mirror->second.state = pull.next;
        value = Blob::FromVector(std::move(codes), DType::kUInt8);
        continue;
      }
      // The worker's copy is not the mirror's (its first pull, or a reply it never got):
      // the full value goes, and the mirror starts over from it.
      Mirror& fresh = slice.mirrors[worker];
      fresh.value.assign(current, current + n);
      fresh.state = pull.next;
    } catch (const std::bad_alloc&) {
      // No memory for the codes or the mirror: the full value goes (it needs none), and the
      // next pull starts over (the worker's state will not match a missing mirror).
      slice.mirrors.erase(worker);
      LOG(WARNING) << "server " << runtime_.rank() << ": " << KeyText(it->first.first)
                   << ": out of memory for a compressed pull; sent the full value";
    }
  }
}

}  // namespace ps
