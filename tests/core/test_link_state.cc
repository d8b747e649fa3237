// LinkState (ps/src/link_state.h): what a node's TCP connection to a silent peer says of the
// path. A connection whose data the peer's kernel acknowledges points at a stopped or hung
// process; one whose data goes unacknowledged, at a host down or a network that cuts, drops
// or queues the packets. The unacknowledged case on real links is tested on the multi-host
// bed (tests/launcher/test_multihost_jobs.py); here, the judgement and a real loopback socket.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "ps/src/link_state.h"
#include "ps/src/scoped_fd.h"

using namespace std::chrono_literals;
using ps::JudgePath;
using ps::LinkState;
using ps::PathVerdict;

namespace {

// A state as TCP_INFO reports one: sent `since_sent` ago, the last ACK `since_ack` ago.
LinkState State(std::chrono::milliseconds since_sent, std::chrono::milliseconds since_ack,
                std::uint32_t unacknowledged, std::uint32_t backoff = 0) {
  LinkState state;
  state.round_trip = 1ms;
  state.since_sent = since_sent;
  state.since_acknowledged = since_ack;
  state.unacknowledged = unacknowledged;
  state.backoff = backoff;
  state.segments_sent = 100;
  return state;
}

}  // namespace

TEST_CASE("link state: a path is judged by what the peer's kernel acknowledged", "[link]") {
  constexpr auto kTimeout = 5000ms;
  // Everything sent acknowledged: the host answers.
  CHECK(JudgePath(State(100ms, 100ms, 0), kTimeout) == PathVerdict::kAcknowledged);
  // A segment in flight while ACKs keep coming is no silence.
  CHECK(JudgePath(State(10ms, 300ms, 1), kTimeout) == PathVerdict::kAcknowledged);
  // Sent, never acknowledged for seconds, or retransmitting: the path carries nothing back.
  CHECK(JudgePath(State(10ms, 4000ms, 3), kTimeout) == PathVerdict::kUnacknowledged);
  CHECK(JudgePath(State(10ms, 300ms, 1, 2), kTimeout) == PathVerdict::kUnacknowledged);
  // On a path of a 1.5 s round trip, 2.3 s without an ACK is data in flight, not silence.
  LinkState distant = State(10ms, 2300ms, 3);
  distant.round_trip = 1500ms;
  CHECK(JudgePath(distant, kTimeout) == PathVerdict::kAcknowledged);
  distant.since_acknowledged = 3100ms;
  CHECK(JudgePath(distant, kTimeout) == PathVerdict::kUnacknowledged);
  // Nothing sent within the window, or no connection: nothing is known of the path now.
  CHECK(JudgePath(State(6000ms, 6000ms, 0), kTimeout) == PathVerdict::kUnknown);
  CHECK(JudgePath(std::nullopt, kTimeout) == PathVerdict::kUnknown);
}

TEST_CASE("link state: silence is explained by the path, and loss named when notable", "[link]") {
  constexpr auto kTimeout = 5000ms;
  const std::string stopped = ps::ExplainSilence(State(100ms, 100ms, 0), kTimeout, "the scheduler");
  CHECK_THAT(stopped, Catch::StartsWith("its host acknowledges what the scheduler sends it") &&
                          Catch::Contains("stopped (e.g. by SIGSTOP), hung or starved of CPU"));
  // A cut link resends the unacknowledged data once per timeout (3 so far, and a tail probe):
  // no word of loss for those.
  LinkState cut_off = State(10ms, 4200ms, 3, 3);
  cut_off.segments_resent = 4;
  CHECK_THAT(ps::ExplainSilence(cut_off, kTimeout, "this node"),
             Catch::Contains("was acknowledged") && !Catch::Contains("had to be resent"));
  LinkState lossy = State(10ms, 4200ms, 3, 3);
  lossy.segments_resent = 19;
  const std::string cut = ps::ExplainSilence(lossy, kTimeout, "this node");
  CHECK_THAT(cut, Catch::StartsWith("nothing this node sent it for 4.2 s was acknowledged") &&
                      Catch::Contains("holds them in a queue for longer than "
                                      "PS_HEARTBEAT_TIMEOUT") &&
                      Catch::Contains("15 of the 100 packets sent on this connection (15%) had "
                                      "to be resent"));
  CHECK(ps::ExplainSilence(std::nullopt, kTimeout, "the scheduler").empty());
  // Acknowledged, but over a lossy path, or one the caller saw busy: one direction may work
  // and the other drop or queue what comes back, so a stopped process is not the only reading.
  LinkState acknowledged_lossy = State(100ms, 100ms, 0);
  acknowledged_lossy.segments_resent = 15;
  for (const std::string& both :
       {ps::ExplainSilence(acknowledged_lossy, kTimeout, "this node"),
        ps::ExplainSilence(State(100ms, 100ms, 0), kTimeout, "this node", true)}) {
    CHECK_THAT(both, Catch::StartsWith("its host acknowledges what this node sends it, but what "
                                       "it sends back may be lost or held in a queue") &&
                         Catch::Contains("or the process is stopped") &&
                         !Catch::Contains("carries packets both ways"));
  }
  // One resent packet in a hundred is not worth a word; two in a hundred is.
  LinkState few = State(10ms, 10ms, 0);
  few.segments_resent = 1;
  CHECK(ps::LossNote(few).empty());
  few.segments_resent = 2;
  CHECK(ps::LossNote(few).empty());  // under three packets: chance
  few.segments_sent = 200;
  few.segments_resent = 3;
  CHECK(ps::LossNote(few).empty());  // 1.5%
  few.segments_resent = 4;
  CHECK_THAT(ps::LossNote(few), Catch::Contains("4 of the 200 packets sent on this connection "
                                                "(2%) had to be resent"));
}

TEST_CASE("link state: a loopback connection whose peer does not read is still acknowledged",
          "[link]") {
  // A stopped process's kernel acknowledges what arrives: so does one that does not read.
  ps::ScopedFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(listener.get() >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  // Not yet connected: no state to read.
  CHECK_FALSE(ps::ReadLinkState(listener.get()).has_value());
  socklen_t length = sizeof(address);
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  ps::ScopedFd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(client.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  ps::ScopedFd accepted(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(accepted.get() >= 0);
  const std::string data(1000, 'x');
  REQUIRE(::send(client.get(), data.data(), data.size(), 0) == static_cast<ssize_t>(data.size()));
  // The ACK comes from the kernel at once; give it a bounded while on a busy machine.
  std::optional<LinkState> state;
  for (int attempt = 0; attempt < 200; ++attempt) {
    state = ps::ReadLinkState(client.get());
    REQUIRE(state.has_value());
    if (state->unacknowledged == 0) break;
    ::usleep(10'000);
  }
  CHECK(state->unacknowledged == 0);
  CHECK(state->segments_sent >= 1);
  CHECK(JudgePath(state, 5000ms) == PathVerdict::kAcknowledged);
  // The peer reads nothing: once its receive buffer is full, what is sent waits on this side
  // (a slow link looks the same from here), and the state counts it.
  const int flags = ::fcntl(client.get(), F_GETFL);
  REQUIRE(::fcntl(client.get(), F_SETFL, flags | O_NONBLOCK) == 0);
  const std::string block(64 * 1024, 'y');
  std::size_t queued = 0;
  for (int sends = 0; sends < 10'000; ++sends) {  // bounded: the buffers hold a few MiB at most
    const ssize_t sent = ::send(client.get(), block.data(), block.size(), MSG_NOSIGNAL);
    if (sent <= 0) break;
    queued += static_cast<std::size_t>(sent);
  }
  REQUIRE(queued > 0);
  state = ps::ReadLinkState(client.get());
  REQUIRE(state.has_value());
  CHECK(state->unsent_bytes + state->unacknowledged_bytes > 0);
  CHECK(state->unsent_bytes + state->unacknowledged_bytes <= queued + data.size());
  // A descriptor that is no TCP socket has no link state.
  int pipe_ends[2];
  REQUIRE(::pipe(pipe_ends) == 0);
  ps::ScopedFd read_end(pipe_ends[0]);
  ps::ScopedFd write_end(pipe_ends[1]);
  CHECK_FALSE(ps::ReadLinkState(read_end.get()).has_value());
}
