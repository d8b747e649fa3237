// The scheduler's search for dist_sync workers that wait for each other (deadlock_watch.h):
// which reports make a deadlock, and the probe's steps (servers, then the workers' confirmation).
#include <catch2/catch.hpp>

#include "ps/src/wire.h"
#include "scheduler/src/deadlock_watch.h"

namespace {

using ps::WaitEdge;

WaitEdge Edge(int waiter, int awaited, std::uint64_t waiter_stall = 1,
              std::uint64_t awaited_stall = 1) {
  return WaitEdge{waiter, waiter_stall, awaited, awaited_stall,
                  "round 1 of key " + std::to_string(waiter)};
}

// A node table of workers with ids (and ranks) 0 to 6: "worker 3 (node 3 at h:0)".
std::vector<ps::NodeInfo> Nodes() {
  std::vector<ps::NodeInfo> nodes(7);
  for (int id = 0; id < 7; ++id) {
    nodes[id].id = id;
    nodes[id].rank = id;
    nodes[id].host = "h";
  }
  return nodes;
}

// A worker's or a server's answer to `probe`.
ps::Message ProbeAnswer(const ps::Message& probe, std::string body) {
  ps::Message answer;
  answer.meta.control = ps::Control::kWaitProbe;
  answer.meta.sender = probe.meta.recipient;
  answer.meta.timestamp = probe.meta.timestamp;
  answer.meta.body = std::move(body);
  return answer;
}

}  // namespace

TEST_CASE("deadlock: two stalled workers that wait for each other", "[deadlock]") {
  const std::map<int, std::uint64_t> stalls{{3, 1}, {4, 1}};
  const std::vector<WaitEdge> edges{Edge(3, 4), Edge(4, 3)};
  const auto deadlock = ps::FindDeadlock(edges, stalls);
  REQUIRE(deadlock.size() == 2);
  CHECK(deadlock.at(3).awaited == 4);
  CHECK(deadlock.at(4).awaited == 3);
  const std::string error = ps::DeadlockError(deadlock, Nodes());
  CHECK_THAT(error, Catch::Contains("worker 3 (node 3 at h:0) waits for round 1 of key 3, which "
                                    "worker 4 (node 4 at h:0) has not pushed; worker 4 (node 4 at "
                                    "h:0) waits for round 1 of key 4, which worker 3 (node 3"));
  CHECK_THAT(error, Catch::Contains("every worker must push the same keys, equally often"));
}

TEST_CASE("deadlock: none while a worker that is waited for can still push", "[deadlock]") {
  // 3 waits for 4, 4 for 5; 5 is not stalled (it computes, and will push).
  std::map<int, std::uint64_t> stalls{{3, 1}, {4, 1}};
  std::vector<WaitEdge> edges{Edge(3, 4), Edge(4, 5)};
  CHECK(ps::FindDeadlock(edges, stalls).empty());
  // One waits for itself only in a malformed report: never a deadlock.
  edges = {Edge(3, 3)};
  CHECK(ps::FindDeadlock(edges, stalls).empty());
  // A worker that waits for one outside a cycle, and for one in it, is stuck too.
  stalls[5] = 2;
  edges = {Edge(3, 4), Edge(4, 3), Edge(5, 6, 2), Edge(5, 3, 2)};
  const auto deadlock = ps::FindDeadlock(edges, stalls);
  CHECK(deadlock.size() == 3);
  CHECK(deadlock.at(5).awaited == 3);
}

TEST_CASE("deadlock: reports about a stall that is over count for nothing", "[deadlock]") {
  // Worker 4 stalled again since (stall 2): the server saw stall 1, a wait that ended.
  const std::map<int, std::uint64_t> stalls{{3, 1}, {4, 2}};
  std::vector<WaitEdge> edges{Edge(3, 4, 1, 1), Edge(4, 3, 1, 1)};
  CHECK(ps::FindDeadlock(edges, stalls).empty());
  edges = {Edge(3, 4, 1, 2), Edge(4, 3, 2, 1)};
  CHECK(ps::FindDeadlock(edges, stalls).size() == 2);
  // A worker that finished or died is no longer among the stalls.
  CHECK(ps::FindDeadlock(edges, {{3, 1}}).empty());
}

TEST_CASE("deadlock: the probe asks the servers, then the workers, then ends the job",
          "[deadlock]") {
  using namespace std::chrono_literals;
  std::vector<ps::Message> sent;
  std::vector<std::string> warnings;
  ps::DeadlockWatch watch([&](ps::Message msg) { sent.push_back(std::move(msg)); },
                          [&](const std::string& warning) { warnings.push_back(warning); }, 60s);
  const std::vector<int> servers{1, 2};
  const std::vector<ps::NodeInfo> nodes = Nodes();
  auto now = std::chrono::steady_clock::now();
  const auto answer = [&](const ps::Message& probe, std::string body) {
    return watch.OnAnswer(ProbeAnswer(probe, std::move(body)), servers, nodes, {}, now);
  };
  const auto report = [](std::vector<WaitEdge> edges) { return ps::wire::EncodeWaitReport(edges); };
  watch.OnStalled(3, {1}, servers, now);
  REQUIRE(sent.size() == 2);  // both servers asked
  watch.OnStalled(4, {1}, servers, now);
  CHECK(sent.size() == 2);  // one probe at a time: another follows this one
  CHECK(answer(sent[0], report({Edge(3, 4)})).empty());
  CHECK(answer(sent[0], report({Edge(3, 4)})).empty());  // twice: ignored
  CHECK(answer(sent[1], report({Edge(4, 3)})).empty());
  REQUIRE(sent.size() == 4);  // the two workers are asked whether they still wait
  CHECK(sent[2].meta.recipient == 3);
  CHECK(sent[3].meta.recipient == 4);
  CHECK(answer(sent[2], "1").empty());
  CHECK_THAT(answer(sent[3], "1"),
             Catch::Contains("worker 3 (node 3 at h:0) waits for round 1 of key 3"));

  // A worker in another wait by now (it answers 0, or another number) ends the probe; the
  // next one, asked for meanwhile, starts no sooner than kProbeGap after the last.
  for (const std::string moved_on : {"0", "7"}) {
    INFO("the worker answers " << moved_on);
    sent.clear();
    now += 1s;
    watch.OnStalled(3, {2}, servers, now);
    watch.OnStalled(4, {2}, servers, now);
    REQUIRE(sent.size() == 2);
    CHECK(answer(sent[0], report({Edge(3, 4, 2, 2), Edge(4, 3, 2, 2)})).empty());
    CHECK(answer(sent[1], "not a report").empty());  // malformed: adds nothing
    REQUIRE(sent.size() == 4);
    CHECK(answer(sent[2], moved_on).empty());
    CHECK(answer(sent[3], "2").empty());  // too late: the probe ended
    CHECK(sent.size() == 4);
    watch.OnTick(servers, now + ps::DeadlockWatch::kProbeGap / 2);
    CHECK(sent.size() == 4);
    watch.OnTick(servers, now + ps::DeadlockWatch::kProbeGap);
    REQUIRE(sent.size() == 6);  // the probe asked for while this one ran
    CHECK(sent[4].meta.timestamp != sent[0].meta.timestamp);
    now += ps::DeadlockWatch::kProbeGap;
    CHECK(answer(sent[4], report({})).empty());
    CHECK(answer(sent[5], report({})).empty());  // no edges: no deadlock, nobody asked
    CHECK(sent.size() == 6);
  }

  // A worker that finishes while asked ends the probe; so does a server that never answers
  // (after kProbeTimeout) or dies.
  sent.clear();
  now += 1s;
  watch.OnStalled(3, {3}, servers, now);
  watch.OnStalled(4, {3}, servers, now);
  CHECK(answer(sent[0], report({Edge(3, 4, 3, 3), Edge(4, 3, 3, 3)})).empty());
  CHECK(answer(sent[1], report({})).empty());
  REQUIRE(sent.size() == 4);
  watch.Forget(4, servers, now);
  CHECK(answer(sent[2], "3").empty());
  CHECK(answer(sent[3], "3").empty());  // the probe is over
  sent.clear();
  now += 1s;
  watch.OnStalled(4, {4}, servers, now);
  REQUIRE(sent.size() == 2);
  CHECK(answer(sent[0], report({})).empty());
  watch.OnTick(servers, now + ps::DeadlockWatch::kProbeTimeout + 1s);
  CHECK(answer(sent[1], report({})).empty());  // too late
  now += ps::DeadlockWatch::kProbeTimeout + 2s;
  watch.OnStalled(3, {4}, servers, now);
  REQUIRE(sent.size() == 4);
  watch.Forget(2, {1}, now);
  now += 1s;
  watch.OnStalled(4, {5}, {1}, now);
  CHECK(sent.size() == 5);  // a new probe, of the one server left
  CHECK(warnings.empty());  // every stall came from a worker that pushes from one thread
}

TEST_CASE("deadlock: workers that push from several threads: a warning, then the timeout",
          "[deadlock]") {
  // Another thread of such a worker may still push: a deadlock among them is only suspected.
  // Once the same workers stayed in the same stalls (none of them pushed) for half the stall
  // timeout (at most kWarnAfter) it is logged, once; after the timeout the job ends. A push
  // starts it again; a timeout of 0 only warns.
  using namespace std::chrono_literals;
  const auto timeout = GENERATE(5000ms, 0ms);
  INFO("PS_STALL_TIMEOUT " << timeout.count() << " ms");
  std::vector<ps::Message> sent;
  std::vector<std::string> warnings;
  ps::DeadlockWatch watch([&](ps::Message msg) { sent.push_back(std::move(msg)); },
                          [&](const std::string& warning) { warnings.push_back(warning); },
                          timeout);
  const std::vector<int> servers{1};
  const std::vector<ps::NodeInfo> nodes = Nodes();
  auto now = std::chrono::steady_clock::now();
  // 2 s on, worker 3 reports stall `number3` (of several threads), worker 4 `number4` (of
  // one); the server and both workers answer. Returns the job's error, or "".
  const auto round = [&](std::uint64_t number3, std::uint64_t number4) {
    sent.clear();
    now += 2s;
    watch.OnStalled(3, {number3, true}, servers, now);
    watch.OnStalled(4, {number4}, servers, now);
    REQUIRE(sent.size() == 1);
    const auto reply = [&](const ps::Message& probe, std::string body) {
      return watch.OnAnswer(ProbeAnswer(probe, std::move(body)), servers, nodes, {}, now);
    };
    const std::vector<WaitEdge> edges{Edge(3, 4, number3, number4), Edge(4, 3, number4, number3)};
    CHECK(reply(sent[0], ps::wire::EncodeWaitReport(edges)).empty());
    REQUIRE(sent.size() == 3);  // both workers asked
    CHECK(reply(sent[1], std::to_string(number3)).empty());
    return reply(sent[2], std::to_string(number4));
  };
  CHECK(round(1, 1).empty());
  CHECK(round(2, 1).empty());  // worker 3 pushed: it starts again
  int rounds = 0;              // 2 s each
  while (warnings.empty() && rounds < 10) {
    CHECK(round(2, 1).empty());
    ++rounds;
  }
  CHECK(rounds == (timeout.count() > 0 ? 2 : 5));  // 2.5 s, or kWarnAfter
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0],
             Catch::Contains("the workers may wait for each other's pushes: worker 3 (node 3 at "
                             "h:0) waits for round 1 of key 3, which worker 4 (node 4 at h:0) "
                             "has not pushed") &&
                 Catch::Contains(timeout.count() > 0
                                     ? "the job ends once they waited 5 s (PS_STALL_TIMEOUT)"
                                     : "with PS_STALL_TIMEOUT=0 the job waits for ever"));
  const std::string late = round(2, 1);  // 6 s, or 12 s
  if (timeout.count() == 0) {
    CHECK(late.empty());
  } else {
    CHECK_THAT(late, Catch::Contains("the workers waited 5 s (PS_STALL_TIMEOUT) for each other's "
                                     "pushes, and no thread of theirs pushed: worker 3 (node 3"));
  }
  CHECK(warnings.size() == 1);
  // A worker of it that finishes forgets the suspicion: the same stalls again start over.
  watch.Forget(4, servers, now);
  CHECK(round(2, 1).empty());
  CHECK(warnings.size() == 1);
}

TEST_CASE("deadlock: a stall of several threads stays suspected when another kind follows",
          "[deadlock]") {
  // Worker 3's deadlock was found by a stall of several threads; while the workers confirm,
  // another thread of it, the only one that pushes, reports a stall of its own. The
  // confirmation is about the first: the deadlock is still only suspected.
  using namespace std::chrono_literals;
  std::vector<ps::Message> sent;
  std::vector<std::string> warnings;
  ps::DeadlockWatch watch([&](ps::Message msg) { sent.push_back(std::move(msg)); },
                          [&](const std::string& warning) { warnings.push_back(warning); }, 5s);
  const std::vector<int> servers{1};
  const std::vector<ps::NodeInfo> nodes = Nodes();
  const auto now = std::chrono::steady_clock::now();
  const auto answer = [&](const ps::Message& probe, std::string body) {
    return watch.OnAnswer(ProbeAnswer(probe, std::move(body)), servers, nodes, {}, now);
  };
  watch.OnStalled(3, {1, true}, servers, now);
  watch.OnStalled(4, {1}, servers, now);
  REQUIRE(sent.size() == 1);
  const std::vector<WaitEdge> edges{Edge(3, 4), Edge(4, 3)};
  CHECK(answer(sent[0], ps::wire::EncodeWaitReport(edges)).empty());
  REQUIRE(sent.size() == 3);
  CHECK(answer(sent[1], "1").empty());
  watch.OnStalled(3, {2}, servers, now);
  CHECK(answer(sent[2], "1").empty());  // a suspicion that just began: no error, no warning
  CHECK(warnings.empty());
}

TEST_CASE("deadlock: a worker in a vote waits for those that have not voted", "[deadlock]") {
  // Worker 3 votes in a Barrier it could not announce (a stall of several threads); worker 4
  // waits for a round that worker 3 has not pushed into. The servers know only the second;
  // the scheduler adds the first (VoteWait): a suspected deadlock, which names the vote.
  using namespace std::chrono_literals;
  std::vector<ps::Message> sent;
  std::vector<std::string> warnings;
  ps::DeadlockWatch watch([&](ps::Message msg) { sent.push_back(std::move(msg)); },
                          [&](const std::string& warning) { warnings.push_back(warning); }, 4s);
  const std::vector<int> servers{1};
  const std::vector<ps::NodeInfo> nodes = Nodes();
  auto now = std::chrono::steady_clock::now();
  const std::vector<ps::VoteWait> votes{{3, 4, "Barrier"}};
  const std::vector<WaitEdge> edges{Edge(4, 3)};
  // Both report stall 1 again; the server and then (when a deadlock is found) both workers
  // answer. Returns the job's error, or "".
  const auto round = [&](std::span<const ps::VoteWait> voting) {
    sent.clear();
    now += 2s;
    watch.OnStalled(3, {1, true}, servers, now);
    watch.OnStalled(4, {1}, servers, now);
    REQUIRE(sent.size() == 1);
    const auto reply = [&](const ps::Message& probe, std::string body) {
      return watch.OnAnswer(ProbeAnswer(probe, std::move(body)), servers, nodes, voting, now);
    };
    std::string error = reply(sent[0], ps::wire::EncodeWaitReport(edges));
    if (sent.size() == 3) {  // a deadlock: both workers asked
      CHECK(reply(sent[1], "1").empty());
      error = reply(sent[2], "1");
    }
    return error;
  };
  CHECK(round({}).empty());
  CHECK(sent.size() == 1);  // worker 4's edge alone: nobody asked
  CHECK(round(votes).empty());
  CHECK(sent.size() == 3);
  CHECK(round(votes).empty());  // 2 s of the 4: warned
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("worker 3 (node 3 at h:0) waits for the collective "
                                          "Barrier, which worker 4 (node 4 at h:0) has not "
                                          "entered; worker 4 (node 4 at h:0) waits for round 1 "
                                          "of key 4, which worker 3 (node 3 at h:0) has not "
                                          "pushed"));
  CHECK_THAT(round(votes), Catch::Contains("the workers waited 4 s (PS_STALL_TIMEOUT)"));
}
