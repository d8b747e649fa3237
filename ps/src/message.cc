#include "ps/message.h"

#include <cstring>
#include <sstream>

#include "ps/src/log_text.h"

namespace ps {

std::string ControlName(Control control) {
  switch (control) {
    case Control::kNone:
      return "app";
    case Control::kRegister:
      return "register";
    case Control::kRegisterReply:
      return "register-reply";
    case Control::kBarrier:
      return "barrier";
    case Control::kBarrierRelease:
      return "barrier-release";
    case Control::kHeartbeat:
      return "heartbeat";
    case Control::kTerminate:
      return "terminate";
    case Control::kError:
      return "error";
    case Control::kNodeDead:
      return "node-dead";
    case Control::kWorkerDone:
      return "worker-done";
    case Control::kNodeFailed:
      return "node-failed";
    case Control::kNodeJoined:
      return "node-joined";
    case Control::kConnectionReset:
      return "connection-reset";
    case Control::kStalled:
      return "stalled";
    case Control::kWaitProbe:
      return "wait-probe";
    case Control::kPeerUnreachable:
      return "peer-unreachable";
  }
  return "unknown";
}

std::string NodeInfo::Describe() const {
  std::string text = RoleName(role);
  if (rank >= 0) text += " " + std::to_string(rank);
  text += " (node " + std::to_string(id) + " at " + host + ":" + std::to_string(port) + ")";
  return text;
}

Blob Blob::Copy(const void* data, std::size_t bytes, DType dtype) {
  std::vector<std::byte> copy(bytes);
  if (bytes > 0) std::memcpy(copy.data(), data, bytes);
  return FromVector(std::move(copy), dtype);
}

std::string Message::DebugString() const {
  std::ostringstream out;
  out << ControlName(meta.control) << (meta.request ? " request" : " response") << " "
      << meta.sender << "->" << meta.recipient << " app=" << meta.app_id << " ts=" << meta.timestamp
      << " head=" << meta.head << " body=" << meta.body.size() << "B";
  if (!meta.nodes.empty()) out << " nodes=" << meta.nodes.size();
  if (meta.barrier_group != 0) out << " group=" << meta.barrier_group;
  if (!meta.error.empty()) out << " error=\"" << PrintableText(meta.error) << "\"";
  for (const Blob& blob : data)
    out << " [" << DTypeName(blob.dtype()) << " x" << blob.count() << "]";
  return out.str();
}

}  // namespace ps
