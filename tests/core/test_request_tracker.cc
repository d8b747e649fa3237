#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <vector>

#include "ps/pause_watch.h"
#include "ps/request_tracker.h"

namespace {

ps::Message ResponseFrom(int sender, std::uint64_t timestamp, const std::string& error = "") {
  ps::Message msg;
  msg.meta.sender = sender;
  msg.meta.timestamp = timestamp;
  msg.meta.error = error;
  if (!error.empty()) msg.meta.control = ps::Control::kError;
  return msg;
}

}  // namespace

TEST_CASE("tracker: completes once every peer answered", "[tracker]") {
  ps::RequestTracker tracker;
  std::optional<ps::RequestResult> result;
  const auto ts = tracker.Start({1, 2}, [&](ps::RequestResult&& r) { result = std::move(r); });
  CHECK(tracker.outstanding() == 1);
  CHECK(tracker.OnResponse(ResponseFrom(1, ts)));
  CHECK_FALSE(result);
  CHECK_FALSE(tracker.OnResponse(ResponseFrom(1, ts)));  // a duplicate is ignored
  CHECK_FALSE(tracker.OnResponse(ResponseFrom(3, ts)));  // not asked
  CHECK(tracker.OnResponse(ResponseFrom(2, ts)));
  REQUIRE(result);
  CHECK(result->ok());
  CHECK(result->responses.size() == 2);
  CHECK(tracker.outstanding() == 0);  // the table keeps only outstanding requests
}

TEST_CASE("tracker: the first error completes the request", "[tracker]") {
  ps::RequestTracker tracker;
  std::optional<ps::RequestResult> result;
  const auto ts = tracker.Start({1, 2}, [&](ps::RequestResult&& r) { result = std::move(r); });
  tracker.OnResponse(ResponseFrom(2, ts, "key 7: size mismatch"));
  REQUIRE(result);
  CHECK(result->error == "key 7: size mismatch");
  CHECK_FALSE(tracker.OnResponse(ResponseFrom(1, ts)));  // late answer: ignored
}

TEST_CASE("tracker: a dead peer fails only the requests waiting on it", "[tracker]") {
  ps::RequestTracker tracker;
  std::optional<ps::RequestResult> on_dead, on_other;
  tracker.Start({1, 2}, [&](ps::RequestResult&& r) { on_dead = std::move(r); });
  const auto other = tracker.Start({3}, [&](ps::RequestResult&& r) { on_other = std::move(r); });
  tracker.FailPeer(2, "worker 1 (node 2 at h:1) died");
  REQUIRE(on_dead);
  CHECK(on_dead->error == "worker 1 (node 2 at h:1) died");
  CHECK_FALSE(on_other);
  tracker.OnResponse(ResponseFrom(3, other));
  REQUIRE(on_other);
  CHECK(on_other->ok());
}

TEST_CASE("tracker: a reset names its peer as lost but alive, a death as lost", "[tracker]") {
  ps::RequestTracker tracker;
  std::optional<ps::RequestResult> reset, died, plain;
  tracker.Start({1, 2}, [&](ps::RequestResult&& r) { reset = std::move(r); });
  tracker.FailReset(2, "the connection was reset");
  REQUIRE(reset);
  CHECK(reset->error == "the connection was reset");
  CHECK(reset->lost_peer == 2);
  CHECK(reset->peer_reset);
  // The slot is used again: neither flag carries over.
  tracker.Start({2}, [&](ps::RequestResult&& r) { died = std::move(r); });
  tracker.FailPeer(2, "server 1 died", /*died=*/true);
  REQUIRE(died);
  CHECK(died->lost_peer == 2);
  CHECK_FALSE(died->peer_reset);
  tracker.Start({2}, [&](ps::RequestResult&& r) { plain = std::move(r); });
  tracker.FailPeer(2, "cannot send");
  REQUIRE(plain);
  CHECK(plain->lost_peer == ps::kNoNode);
  CHECK_FALSE(plain->peer_reset);
}

TEST_CASE("tracker: FailAll fails outstanding and later requests", "[tracker]") {
  ps::RequestTracker tracker;
  std::optional<ps::RequestResult> first, later;
  tracker.Start({1}, [&](ps::RequestResult&& r) { first = std::move(r); });
  tracker.FailAll("shutting down");
  REQUIRE(first);
  CHECK(first->error == "shutting down");
  tracker.Start({1}, [&](ps::RequestResult&& r) { later = std::move(r); });
  REQUIRE(later);
  CHECK(later->error == "shutting down");
  CHECK(tracker.outstanding() == 0);
}

TEST_CASE("tracker: deadlines expire", "[tracker]") {
  ps::RequestTracker tracker;
  const auto now = ps::RequestTracker::Clock::now();
  std::optional<ps::RequestResult> timed, untimed;
  tracker.Start(
      {1}, [&](ps::RequestResult&& r) { timed = std::move(r); }, now + std::chrono::seconds(1));
  tracker.Start({1}, [&](ps::RequestResult&& r) { untimed = std::move(r); });
  tracker.ExpireOverdue(now);
  CHECK_FALSE(timed);
  tracker.ExpireOverdue(now + std::chrono::seconds(2));
  REQUIRE(timed);
  CHECK_THAT(timed->error, Catch::Contains("timed out"));
  CHECK_FALSE(untimed);
  CHECK(tracker.outstanding() == 1);
}

TEST_CASE("tracker: a request to nobody completes at once", "[tracker]") {
  ps::RequestTracker tracker;
  bool called = false;
  tracker.Start({}, [&](ps::RequestResult&& r) { called = r.ok(); });
  CHECK(called);
}

TEST_CASE("tracker: many requests outstanding at once, answered out of order", "[tracker]") {
  // 100 requests at once, answered newest first, then the same again through the reused
  // slots; each completes once, with its own responses.
  ps::RequestTracker tracker;
  for (int pass = 0; pass < 2; ++pass) {
    constexpr int kRequests = 100;
    std::vector<std::uint64_t> timestamps;
    std::vector<int> completions(kRequests, 0);
    std::vector<std::size_t> responses(kRequests, 0);
    for (int r = 0; r < kRequests; ++r) {
      timestamps.push_back(tracker.Start({1, 2}, [&, r](ps::RequestResult&& result) {
        ++completions[r];
        responses[r] = result.ok() ? result.responses.size() : 0;
      }));
    }
    CHECK(tracker.outstanding() == kRequests);
    for (int r = kRequests - 1; r >= 0; --r) {
      CHECK(tracker.OnResponse(ResponseFrom(2, timestamps[r])));
      CHECK(tracker.OnResponse(ResponseFrom(1, timestamps[r])));
    }
    CHECK(tracker.outstanding() == 0);
    CHECK(std::all_of(completions.begin(), completions.end(), [](int c) { return c == 1; }));
    CHECK(std::all_of(responses.begin(), responses.end(), [](std::size_t n) { return n == 2; }));
    // Late duplicates of finished requests are ignored.
    CHECK_FALSE(tracker.OnResponse(ResponseFrom(1, timestamps.front())));
  }
}

TEST_CASE("tracker: an old request still waiting does not disturb newer ones", "[tracker]") {
  ps::RequestTracker tracker;
  std::optional<ps::RequestResult> old_result;
  const auto old = tracker.Start({7}, [&](ps::RequestResult&& r) { old_result = std::move(r); });
  int done = 0;
  for (int r = 0; r < 200; ++r) {  // each completes at once, reusing one slot
    const auto ts = tracker.Start({1}, [&](ps::RequestResult&& result) { done += result.ok(); });
    CHECK(tracker.OnResponse(ResponseFrom(1, ts)));
  }
  CHECK(done == 200);
  CHECK(tracker.outstanding() == 1);
  tracker.FailPeer(7, "worker 3 died");
  REQUIRE(old_result);
  CHECK(old_result->error == "worker 3 died");
  CHECK_FALSE(tracker.OnResponse(ResponseFrom(7, old)));
}

TEST_CASE("pause watch: a gap of the threshold or more between ticks is a pause, once",
          "[tracker]") {
  using namespace std::chrono_literals;
  ps::PauseWatch watch(500ms);
  const auto t0 = ps::PauseWatch::Clock::time_point{} + 1h;
  watch.Start(t0);
  CHECK(watch.Tick(t0 + 100ms) == 0ms);
  CHECK(watch.Tick(t0 + 599ms) == 0ms);  // 499 ms since the last tick, not since Start
  CHECK(watch.last_pause() == 0ms);
  CHECK(watch.Tick(t0 + 1099ms) == 500ms);
  CHECK(watch.last_pause() == 500ms);
  CHECK(watch.last_pause_ended() == t0 + 1099ms);
  CHECK(watch.Tick(t0 + 1200ms) == 0ms);  // the last pause is remembered
  CHECK(watch.last_pause() == 500ms);
  watch.Start(t0 + 5s);  // a new reference: the time before it is no pause
  CHECK(watch.Tick(t0 + 5s + 100ms) == 0ms);
}
