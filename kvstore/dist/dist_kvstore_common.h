#pragma once
// What DistKVStore's source files share: the store's name in messages, the failures a
// collective runs again after (RunOverLiveServers), and the bounded text of a collective call.
#include <cstddef>
#include <string>
#include <string_view>

#include "kvstore/dist/dist_kvstore.h"
#include "ps/error.h"
#include "ps/runtime.h"

namespace ps::dist_detail {

inline constexpr std::string_view kStore = "dist kvstore";

// The failure of a call whose server died: with replication a collective runs again on the
// live servers (RunOverLiveServers); anywhere else it is an Error like any other.
class ServerLost : public Error {
 public:
  using Error::Error;
};
// The failure of a request in flight on a connection that was reset: with replication a
// collective runs again (RunOverLiveServers), however the reset and the retry interleave.
class ConnectionReset : public Error {
 public:
  using Error::Error;
};
// What a failed request of `result` says, if its error is `result`'s own.
DistKVStore::Failure FailureOf(const RequestResult& result, const std::string& error);
// Throws `error` as the exception its failure calls for (RunOverLiveServers tells them apart),
// else as the one of `kind`.
[[noreturn]] void ThrowFailure(DistKVStore::Failure failure, const std::string& error,
                               ErrorKind kind = ErrorKind::kOther);
// A collective call as every worker states it (Runtime::Agree compares the texts): at most
// `max_chars` (then cut, with `summary` of the whole, if any, and its fingerprint:
// Runtime::kVoteCutMarker), so that a barrier message stays small, naming the first keys so
// that a disagreement reads plainly.
inline constexpr std::size_t kMaxCallChars = 400;
std::string Bounded(std::string call, std::size_t max_chars = kMaxCallChars,
                    std::string_view summary = "");

}  // namespace ps::dist_detail
