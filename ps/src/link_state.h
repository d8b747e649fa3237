#pragma once
// LinkState: what a node's own TCP connection to a peer tells of the path to it (TCP_INFO), so
// that a silent peer can be told apart:
//   - its kernel acknowledges what this node sends: the network carries packets both ways, and
//     the peer's process is stopped (SIGSTOP), hung or starved of CPU;
//   - nothing sent is acknowledged: its host is down, or the network between the two is cut,
//     drops the packets, or queues them behind the job's own data for longer than the timeout
//     (a link too slow for the job), which the connection's resent packets help tell.
// The connection read must be one this node sends on (a send socket's), and it must have sent
// something recently: an idle connection knows nothing of the path now.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ps {

struct LinkState {
  std::chrono::milliseconds round_trip{0};          // TCP's smoothed estimate
  std::chrono::milliseconds since_sent{0};          // since this side last sent data
  std::chrono::milliseconds since_acknowledged{0};  // since the peer's kernel last acknowledged
  std::uint32_t unacknowledged = 0;                 // segments sent and not yet acknowledged
  std::uint64_t unacknowledged_bytes = 0;           // about: those segments at full size
  std::uint64_t unsent_bytes = 0;                   // in the send buffer, not sent yet
  std::uint32_t backoff = 0;  // retransmission timeouts in a row, now (0: none pending)
  std::uint64_t segments_sent = 0;
  std::uint64_t segments_resent = 0;
};

// TCP_INFO of connected TCP socket `fd`; nullopt for any other descriptor.
std::optional<LinkState> ReadLinkState(int fd);

enum class PathVerdict {
  kUnknown,         // no TCP connection (ipc, not connected), or nothing sent lately
  kAcknowledged,    // the peer's kernel acknowledges what this side sends
  kUnacknowledged,  // what this side sent has gone unacknowledged for a while
};
// What `state` says of a path on which this side has sent within `recent`.
PathVerdict JudgePath(const std::optional<LinkState>& state, std::chrono::milliseconds recent);

// Why a peer is silent, for the end of a sentence about its silence, from `state`, the
// connection on which `sender` ("the scheduler", "this node") sends to it, judged as by
// JudgePath over `recent`: "its host acknowledges what the scheduler sends it, ...: the
// process is stopped ..." or "nothing the scheduler sent it for 8.0 s was acknowledged: ...";
// "" when the connection tells nothing. Acknowledgements prove the process stuck only on a
// clean path: with packets resent (LossNote), or `busy_path` (the caller saw the link carry
// much else meanwhile), the way back may be what fails, and the text says both.
std::string ExplainSilence(const std::optional<LinkState>& state, std::chrono::milliseconds recent,
                           const std::string& sender, bool busy_path = false);

// Whether `state` proves the peer's process stopped, hung or starved: its kernel acknowledges
// (JudgePath over `recent`) over a clean path, no packets resent, and not `busy_path`.
bool ProvesPeerStuck(const std::optional<LinkState>& state, std::chrono::milliseconds recent,
                     bool busy_path);

// "; 12 of the 80 packets sent to it (15%) had to be resent: the network loses packets" when
// the connection lost a notable share of what it sent, else "".
std::string LossNote(const LinkState& state);

}  // namespace ps
