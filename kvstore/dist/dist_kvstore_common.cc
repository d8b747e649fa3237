#include "kvstore/dist/dist_kvstore_common.h"

#include <cstdint>
#include <cstdio>

#include "kvstore/fnv1a.h"

namespace ps::dist_detail {

DistKVStore::Failure FailureOf(const RequestResult& result, const std::string& error) {
  if (result.ok() || error != result.error) return DistKVStore::Failure::kOther;
  if (result.peer_died()) return DistKVStore::Failure::kServerLost;
  return result.peer_reset ? DistKVStore::Failure::kConnectionReset : DistKVStore::Failure::kOther;
}

[[noreturn]] void ThrowFailure(DistKVStore::Failure failure, const std::string& error,
                               ErrorKind kind) {
  switch (failure) {
    case DistKVStore::Failure::kServerLost:
      throw ServerLost(error);
    case DistKVStore::Failure::kConnectionReset:
      throw ConnectionReset(error);
    case DistKVStore::Failure::kOther:
      break;
  }
  ThrowError(kind, error);
}

std::string Bounded(std::string call, std::size_t max_chars, std::string_view summary) {
  if (call.size() <= max_chars) return call;
  // FNV-1a over the whole text: calls that differ past the cut still differ.
  Fnv1a hash;
  hash.Add(call.data(), call.size());
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(hash.value()));
  call.resize(max_chars);
  return call + std::string(Runtime::kVoteCutMarker) + std::string(summary) +
         (summary.empty() ? "" : "; ") + "fingerprint " + digest + ")";
}

}  // namespace ps::dist_detail
