#include "ps/src/link_state.h"

#include <linux/tcp.h>  // struct tcp_info with tcpi_notsent_bytes etc. (glibc's lacks them)
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>

#include "ps/src/log_text.h"

namespace ps {
namespace {

// A peer's kernel acknowledges a segment within a round trip plus its delayed-ACK time (at most
// 200 ms on Linux): data unacknowledged for longer than this (or two round trips, on a long
// path), with no ACK meanwhile, is not a mere segment in flight.
constexpr std::chrono::milliseconds kAckExpectedWithin{1000};
// A share of resent packets worth naming: a healthy LAN resends almost none.
constexpr std::uint64_t kNotableResentPercent = 2;
constexpr std::uint64_t kNotableResentSegments = 3;
// TCP_ESTABLISHED, tcpi_state's value for an open connection (<netinet/tcp.h>, which has the
// name, clashes with <linux/tcp.h>).
constexpr std::uint8_t kTcpEstablished = 1;

}  // namespace

std::optional<LinkState> ReadLinkState(int fd) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return std::nullopt;
  // Linux 4.6 and later fill tcpi_data_segs_out, the last field read here.
  static_assert(offsetof(tcp_info, tcpi_notsent_bytes) < offsetof(tcp_info, tcpi_data_segs_out));
  if (length < offsetof(tcp_info, tcpi_data_segs_out) + sizeof(info.tcpi_data_segs_out) ||
      info.tcpi_state != kTcpEstablished) {
    return std::nullopt;
  }
  LinkState state;
  state.round_trip = std::chrono::milliseconds(info.tcpi_rtt / 1000);
  state.since_sent = std::chrono::milliseconds(info.tcpi_last_data_sent);
  state.since_acknowledged = std::chrono::milliseconds(info.tcpi_last_ack_recv);
  state.unacknowledged = info.tcpi_unacked;
  state.unacknowledged_bytes = std::uint64_t{info.tcpi_unacked} * info.tcpi_snd_mss;
  state.unsent_bytes = info.tcpi_notsent_bytes;
  state.backoff = info.tcpi_backoff;
  state.segments_sent = info.tcpi_data_segs_out;
  state.segments_resent = info.tcpi_total_retrans;
  return state;
}

PathVerdict JudgePath(const std::optional<LinkState>& state, std::chrono::milliseconds recent) {
  if (!state || state->since_sent > recent) return PathVerdict::kUnknown;
  if (state->unacknowledged == 0) return PathVerdict::kAcknowledged;
  // A long path's acknowledgements come a round trip later: within two of them is on time.
  const auto expected = std::max(kAckExpectedWithin, 2 * state->round_trip);
  if (state->backoff == 0 && state->since_acknowledged < expected) {
    return PathVerdict::kAcknowledged;  // acknowledgements keep coming: data merely in flight
  }
  return PathVerdict::kUnacknowledged;
}

std::string ExplainSilence(const std::optional<LinkState>& state, std::chrono::milliseconds recent,
                           const std::string& sender, bool busy_path) {
  switch (JudgePath(state, recent)) {
    case PathVerdict::kAcknowledged: {
      if (ProvesPeerStuck(state, recent, busy_path)) {
        return "its host acknowledges what " + sender +
               " sends it, so the network carries packets both ways: the process is stopped "
               "(e.g. by SIGSTOP), hung or starved of CPU";
      }
      // One direction may be fine and the other lossy or queued (a link saturated one way):
      // the acknowledgements then prove little.
      return "its host acknowledges what " + sender +
             " sends it, but what it sends back may be lost or held in a queue on the way (a "
             "lossy or saturated link), or the process is stopped (e.g. by SIGSTOP), hung or "
             "starved of CPU" +
             LossNote(*state);
    }
    case PathVerdict::kUnacknowledged: {
      // The resends of the data now unacknowledged (one per timeout, and a tail probe) say
      // nothing of the path before: a cut link resends them too.
      LinkState before = *state;
      before.segments_resent -= std::min<std::uint64_t>(before.segments_resent, state->backoff + 1);
      return "nothing " + sender + " sent it for " + FormatSeconds(state->since_acknowledged) +
             " was acknowledged: its host is down, or the network between them is cut, drops "
             "the packets, or holds them in a queue for longer than PS_HEARTBEAT_TIMEOUT (a "
             "link saturated by the job's own data: too slow for the job)" +
             LossNote(before);
    }
    case PathVerdict::kUnknown:
      break;
  }
  return "";
}

bool ProvesPeerStuck(const std::optional<LinkState>& state, std::chrono::milliseconds recent,
                     bool busy_path) {
  return !busy_path && JudgePath(state, recent) == PathVerdict::kAcknowledged &&
         LossNote(*state).empty();
}

std::string LossNote(const LinkState& state) {
  const std::uint64_t resent = state.segments_resent;
  const std::uint64_t sent = std::max(state.segments_sent, resent);
  if (resent < kNotableResentSegments || resent * 100 < kNotableResentPercent * sent) return "";
  return "; " + std::to_string(resent) + " of the " + std::to_string(sent) +
         " packets sent on this connection (" + std::to_string(resent * 100 / sent) +
         "%) had to be resent: the path loses packets (a lossy link, or one so saturated that "
         "its queues overflow)";
}

}  // namespace ps
