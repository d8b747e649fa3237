#include "ps/src/wire.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "ps.pb.h"

namespace ps::wire {
namespace {

bool ValidRole(int raw) { return raw >= 1 && raw <= 3; }

// Host names, host ids and endpoints end up in ZeroMQ endpoints and in log lines: printable
// ASCII without spaces only (protobuf does not check them: they are `bytes` fields).
bool ValidName(const std::string& text) {
  constexpr std::size_t kMaxNameBytes = 255;
  return text.size() <= kMaxNameBytes &&
         std::all_of(text.begin(), text.end(), [](char c) { return c > ' ' && c < '\x7f'; });
}

}  // namespace

HeaderEncoder::HeaderEncoder() : scratch_(std::make_unique<pb::Header>()) {}
HeaderEncoder::~HeaderEncoder() = default;

const std::string& HeaderEncoder::Encode(const Meta& meta, const std::vector<Blob>& data) {
  // Clear() keeps the strings and repeated entries the last header allocated.
  pb::Header& header = *scratch_;
  header.Clear();
  header.set_version(kProtocolVersion);
  header.set_sender(meta.sender);
  header.set_recipient(meta.recipient);
  header.set_control(static_cast<ps::pb::Control>(meta.control));
  header.set_request(meta.request);
  header.set_app_id(meta.app_id);
  header.set_customer_id(meta.customer_id);
  header.set_timestamp(meta.timestamp);
  header.set_head(meta.head);
  header.set_body(meta.body);
  header.set_barrier_group(meta.barrier_group);
  header.set_error(meta.error);
  header.set_error_kind(static_cast<std::uint32_t>(meta.error_kind));
  header.set_priority(meta.priority);
  for (const Blob& blob : data) {
    auto* desc = header.add_data();
    desc->set_dtype(static_cast<std::uint32_t>(blob.dtype()));
    desc->set_count(blob.count());
  }
  for (const NodeInfo& node : meta.nodes) {
    auto* info = header.add_nodes();
    info->set_id(node.id);
    info->set_role(static_cast<ps::pb::Role>(node.role));
    info->set_host(node.host);
    info->set_port(node.port);
    info->set_rank(node.rank);
    info->set_host_id(node.host_id);
    info->set_ipc_endpoint(node.ipc_endpoint);
    info->set_connection_key(node.connection_key);
  }
  header.SerializeToString(&out_);
  return out_;
}

HeaderDecoder::HeaderDecoder() : scratch_(std::make_unique<pb::Header>()) {}
HeaderDecoder::~HeaderDecoder() = default;

std::string HeaderDecoder::Decode(const void* bytes, std::size_t size, DecodedHeader& decoded) {
  if (size > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    return "header of " + std::to_string(size) + " bytes is too large";
  }
  // Parsing clears the message first but keeps the memory of its strings and repeated fields.
  pb::Header& header = *scratch_;
  if (!header.ParseFromArray(bytes, static_cast<int>(size))) {
    return "header of " + std::to_string(size) + " bytes is not a valid protobuf";
  }
  if (header.version() != kProtocolVersion) {
    return "protocol version " + std::to_string(header.version()) + ", expected " +
           std::to_string(kProtocolVersion) + " (mixed builds of ps?)";
  }
  if (!ps::pb::Control_IsValid(header.control())) {
    return "unknown control command " + std::to_string(header.control());
  }
  if (header.sender() < kNoNode || header.recipient() < kNoNode) {
    return "negative node id";
  }
  if (header.data_size() > static_cast<int>(kMaxDataFrames)) {
    return std::to_string(header.data_size()) + " data frames, at most " +
           std::to_string(kMaxDataFrames) + " allowed";
  }
  if (header.nodes_size() > static_cast<int>(kMaxNodes) || header.body().size() > kMaxBodyBytes) {
    return "node table or body too large";
  }
  if (header.barrier_group() < 0 || header.barrier_group() > kAllGroups) {
    return "barrier group " + std::to_string(header.barrier_group()) + " out of range";
  }

  decoded.data.clear();
  decoded.meta.nodes.clear();
  for (const auto& desc : header.data()) {
    if (!IsValidDType(desc.dtype())) {
      return "unknown dtype " + std::to_string(desc.dtype());
    }
    const DType dtype = static_cast<DType>(desc.dtype());
    if (desc.count() > kMaxFrameBytes / DTypeSize(dtype)) {
      return "data frame of " + std::to_string(desc.count()) + " elements is absurd";
    }
    decoded.data.push_back(DataDesc{dtype, desc.count()});
  }
  for (const auto& node : header.nodes()) {
    if (!ValidName(node.host()) || !ValidName(node.host_id()) || !ValidName(node.ipc_endpoint()) ||
        !ValidName(node.connection_key())) {
      return "node entry with a malformed host name, host id or ipc endpoint";
    }
    if (!ValidRole(node.role()) || node.port() < 0 || node.port() > 65535 || node.id() < kNoNode ||
        node.rank() < -1) {
      return "invalid node entry for " + node.host();
    }
    if (!node.ipc_endpoint().empty() && node.ipc_endpoint().rfind("ipc://@", 0) != 0) {
      return "invalid ipc endpoint for " + node.host();
    }
    decoded.meta.nodes.push_back(NodeInfo{node.id(), static_cast<Role>(node.role()), node.host(),
                                          node.port(), node.rank(), node.host_id(),
                                          node.ipc_endpoint(), node.connection_key()});
  }
  Meta& meta = decoded.meta;
  meta.sender = header.sender();
  meta.recipient = header.recipient();
  meta.control = static_cast<Control>(header.control());
  meta.request = header.request();
  meta.app_id = header.app_id();
  meta.customer_id = header.customer_id();
  meta.timestamp = header.timestamp();
  meta.head = header.head();
  meta.body.assign(header.body());
  meta.barrier_group = header.barrier_group();
  meta.error.assign(header.error());
  // A kind this build does not know (a newer peer's) is still an error: a plain one.
  meta.error_kind = header.error_kind() < kErrorKinds ? static_cast<ErrorKind>(header.error_kind())
                                                      : ErrorKind::kOther;
  meta.priority = header.priority();
  return "";
}

std::string EncodeHeader(const Meta& meta, const std::vector<Blob>& data) {
  HeaderEncoder encoder;
  return encoder.Encode(meta, data);
}

DecodeResult DecodeHeader(const void* bytes, std::size_t size) {
  HeaderDecoder decoder;
  DecodedHeader header;
  DecodeResult result;
  result.error = decoder.Decode(bytes, size, header);
  if (result.error.empty()) result.header = std::move(header);
  return result;
}

std::string CheckFrames(const std::vector<DataDesc>& descs, const std::vector<std::size_t>& sizes) {
  if (descs.size() != sizes.size()) {
    return "header describes " + std::to_string(descs.size()) + " data frames but " +
           std::to_string(sizes.size()) + " arrived";
  }
  for (std::size_t i = 0; i < descs.size(); ++i) {
    if (descs[i].bytes() != sizes[i]) {
      return "data frame " + std::to_string(i) + " has " + std::to_string(sizes[i]) +
             " bytes, header claims " + std::to_string(descs[i].bytes());
    }
  }
  return "";
}

std::string EncodeWaitReport(std::span<const WaitEdge> edges) {
  pb::WaitReport report;
  for (const WaitEdge& edge : edges) {
    pb::WaitEdge& out = *report.add_edges();
    out.set_waiter(edge.waiter);
    out.set_waiter_stall(edge.waiter_stall);
    out.set_awaited(edge.awaited);
    out.set_awaited_stall(edge.awaited_stall);
    out.set_what(edge.what.substr(0, kMaxWaitTextBytes));
  }
  return report.SerializeAsString();
}

std::optional<std::vector<WaitEdge>> DecodeWaitReport(const std::string& body) {
  pb::WaitReport report;
  if (!report.ParseFromString(body) ||
      static_cast<std::size_t>(report.edges_size()) > kMaxWaitEdges) {
    return std::nullopt;
  }
  std::vector<WaitEdge> edges;
  edges.reserve(static_cast<std::size_t>(report.edges_size()));
  for (const pb::WaitEdge& edge : report.edges()) {
    if (edge.what().size() > kMaxWaitTextBytes) return std::nullopt;
    edges.push_back(WaitEdge{edge.waiter(), edge.waiter_stall(), edge.awaited(),
                             edge.awaited_stall(), edge.what()});
  }
  return edges;
}

namespace {
constexpr std::string_view kSeveralThreads = " threads";
constexpr std::string_view kNeverConnected = " never";

// The bodies of STALLED and PEER_UNREACHABLE: a decimal number, then `suffix` when `flag`.
struct FlaggedNumber {
  std::uint64_t number = 0;
  bool flag = false;
};
std::string EncodeFlagged(const FlaggedNumber& value, std::string_view suffix) {
  std::string body = std::to_string(value.number);
  if (value.flag) body += suffix;
  return body;
}
std::optional<FlaggedNumber> DecodeFlagged(std::string_view body, std::string_view suffix) {
  FlaggedNumber value;
  value.flag = body.ends_with(suffix);
  if (value.flag) body.remove_suffix(suffix.size());
  const auto number = DecodeStallNumber(body);
  if (!number) return std::nullopt;
  value.number = *number;
  return value;
}
}  // namespace

std::string EncodeStalled(const StalledNotice& notice) {
  return EncodeFlagged({notice.stall, notice.several_threads}, kSeveralThreads);
}

std::optional<StalledNotice> DecodeStalled(std::string_view body) {
  const auto value = DecodeFlagged(body, kSeveralThreads);
  if (!value || value->number == 0) return std::nullopt;
  return StalledNotice{value->number, value->flag};
}

std::string EncodeUnreachable(const UnreachableNotice& notice) {
  return EncodeFlagged({notice.closed_ms, notice.never_connected}, kNeverConnected);
}

std::optional<UnreachableNotice> DecodeUnreachable(std::string_view body) {
  const auto value = DecodeFlagged(body, kNeverConnected);
  if (!value) return std::nullopt;
  return UnreachableNotice{value->number, value->flag};
}

std::optional<std::uint64_t> DecodeStallNumber(std::string_view text) {
  std::uint64_t number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return number;
}

}  // namespace ps::wire
