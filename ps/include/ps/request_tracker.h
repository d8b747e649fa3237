#pragma once
// RequestTracker: matches responses to outstanding requests by timestamp. A request waits for
// one response from each of a set of peers; it completes once all have answered, or fails at
// the first error response, when one of its peers dies, at its deadline, or at shutdown.
//
// Threads: every method may be called from any thread. Callbacks run outside the lock, on the
// thread that completed the request (usually the receive thread): keep them short.
// The table holds only outstanding requests: a completed one is erased at once.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ps/message.h"

namespace ps {

struct RequestResult {
  std::string error;               // empty: success
  std::vector<Message> responses;  // in arrival order; partial on error
  bool ok() const { return error.empty(); }
};

class RequestTracker {
 public:
  using Clock = std::chrono::steady_clock;
  using Callback = std::function<void(RequestResult&&)>;

  // Registers a request awaiting one response from each of `peers` and returns its timestamp.
  // `deadline`: fail with a timeout error if not complete by then.
  std::uint64_t Start(const std::vector<int>& peers, Callback callback,
                      std::optional<Clock::time_point> deadline = std::nullopt);

  // A response (or error) from msg.meta.sender for msg.meta.timestamp. Unknown timestamps
  // (late answers to failed requests) are ignored; returns false for them.
  bool OnResponse(Message&& msg);

  // Fails every request still waiting on `node` with `why`.
  void FailPeer(int node, const std::string& why);
  // Fails every outstanding request with `why`, and every later Start() at once.
  void FailAll(const std::string& why);
  // Fails the requests whose deadline is past.
  void ExpireOverdue(Clock::time_point now);

  std::size_t outstanding() const;

 private:
  struct Pending {
    std::set<int> waiting_on;
    RequestResult result;
    Callback callback;
    std::optional<Clock::time_point> deadline;
  };
  using Completion = std::pair<Callback, RequestResult>;
  static void Run(std::vector<Completion>& done);

  mutable std::mutex mu_;
  std::uint64_t next_timestamp_ = 1;          // GUARDED_BY(mu_)
  std::map<std::uint64_t, Pending> pending_;  // GUARDED_BY(mu_)
  std::optional<std::string> closed_;         // GUARDED_BY(mu_): set by FailAll
};

}  // namespace ps
