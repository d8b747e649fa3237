#include "ps/request_tracker.h"

namespace ps {

void RequestTracker::Run(std::vector<Completion>& done) {
  for (auto& [callback, result] : done) {
    if (callback) callback(std::move(result));
  }
}

std::uint64_t RequestTracker::Start(const std::vector<int>& peers, Callback callback,
                                    std::optional<Clock::time_point> deadline) {
  std::vector<Completion> done;
  std::uint64_t timestamp = 0;
  {
    std::lock_guard lock(mu_);
    timestamp = next_timestamp_++;
    if (closed_) {
      done.emplace_back(std::move(callback), RequestResult{*closed_, {}});
    } else if (peers.empty()) {
      done.emplace_back(std::move(callback), RequestResult{});
    } else {
      Pending pending;
      pending.waiting_on.insert(peers.begin(), peers.end());
      pending.callback = std::move(callback);
      pending.deadline = deadline;
      pending_.emplace(timestamp, std::move(pending));
    }
  }
  Run(done);
  return timestamp;
}

bool RequestTracker::OnResponse(Message&& msg) {
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    const auto it = pending_.find(msg.meta.timestamp);
    if (it == pending_.end() || !it->second.waiting_on.contains(msg.meta.sender)) return false;
    Pending& pending = it->second;
    pending.waiting_on.erase(msg.meta.sender);
    const bool failed = msg.meta.control == Control::kError || !msg.meta.error.empty();
    if (failed) pending.result.error = msg.meta.error.empty() ? "request failed" : msg.meta.error;
    pending.result.responses.push_back(std::move(msg));
    if (failed || pending.waiting_on.empty()) {
      done.emplace_back(std::move(pending.callback), std::move(pending.result));
      pending_.erase(it);
    }
  }
  Run(done);
  return true;
}

void RequestTracker::FailPeer(int node, const std::string& why) {
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.waiting_on.contains(node)) {
        it->second.result.error = why;
        done.emplace_back(std::move(it->second.callback), std::move(it->second.result));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Run(done);
}

void RequestTracker::FailAll(const std::string& why) {
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    if (!closed_) closed_ = why;
    for (auto& [timestamp, pending] : pending_) {
      pending.result.error = why;
      done.emplace_back(std::move(pending.callback), std::move(pending.result));
    }
    pending_.clear();
  }
  Run(done);
}

void RequestTracker::ExpireOverdue(Clock::time_point now) {
  std::vector<Completion> done;
  {
    std::lock_guard lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline && *it->second.deadline <= now) {
        it->second.result.error = "request timed out waiting for " +
                                  std::to_string(it->second.waiting_on.size()) + " response(s)";
        done.emplace_back(std::move(it->second.callback), std::move(it->second.result));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Run(done);
}

std::size_t RequestTracker::outstanding() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

}  // namespace ps
