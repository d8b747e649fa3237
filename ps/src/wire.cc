#include "wire.h"

#include <limits>

#include "ps.pb.h"

namespace ps::wire {
namespace {

bool ValidRole(int raw) { return raw >= 1 && raw <= 3; }

}  // namespace

std::string EncodeHeader(const Meta& meta, const std::vector<Blob>& data) {
  ps::pb::Header header;
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
  }
  return header.SerializeAsString();
}

DecodeResult DecodeHeader(const void* bytes, std::size_t size) {
  DecodeResult result;
  if (size > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    result.error = "header of " + std::to_string(size) + " bytes is too large";
    return result;
  }
  ps::pb::Header header;
  if (!header.ParseFromArray(bytes, static_cast<int>(size))) {
    result.error = "header of " + std::to_string(size) + " bytes is not a valid protobuf";
    return result;
  }
  if (header.version() != kProtocolVersion) {
    result.error = "protocol version " + std::to_string(header.version()) + ", expected " +
                   std::to_string(kProtocolVersion) + " (mixed builds of ps?)";
    return result;
  }
  if (!ps::pb::Control_IsValid(header.control())) {
    result.error = "unknown control command " + std::to_string(header.control());
    return result;
  }
  if (header.sender() < kNoNode || header.recipient() < kNoNode) {
    result.error = "negative node id";
    return result;
  }
  if (header.data_size() > static_cast<int>(kMaxDataFrames)) {
    result.error = std::to_string(header.data_size()) + " data frames, at most " +
                   std::to_string(kMaxDataFrames) + " allowed";
    return result;
  }
  if (header.nodes_size() > static_cast<int>(kMaxNodes) || header.body().size() > kMaxBodyBytes) {
    result.error = "node table or body too large";
    return result;
  }
  if (header.barrier_group() < 0 || header.barrier_group() > kAllGroups) {
    result.error = "barrier group " + std::to_string(header.barrier_group()) + " out of range";
    return result;
  }

  DecodedHeader decoded;
  for (const auto& desc : header.data()) {
    if (!IsValidDType(desc.dtype())) {
      result.error = "unknown dtype " + std::to_string(desc.dtype());
      return result;
    }
    const DType dtype = static_cast<DType>(desc.dtype());
    if (desc.count() > kMaxFrameBytes / DTypeSize(dtype)) {
      result.error = "data frame of " + std::to_string(desc.count()) + " elements is absurd";
      return result;
    }
    decoded.data.push_back(DataDesc{dtype, desc.count()});
  }
  for (const auto& node : header.nodes()) {
    if (!ValidRole(node.role()) || node.port() < 0 || node.port() > 65535 || node.id() < kNoNode ||
        node.rank() < -1) {
      result.error = "invalid node entry for " + node.host();
      return result;
    }
    if (!node.ipc_endpoint().empty() && node.ipc_endpoint().rfind("ipc://@", 0) != 0) {
      result.error = "invalid ipc endpoint for " + node.host();
      return result;
    }
    decoded.meta.nodes.push_back(NodeInfo{node.id(), static_cast<Role>(node.role()), node.host(),
                                          node.port(), node.rank(), node.host_id(),
                                          node.ipc_endpoint()});
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
  meta.body = header.body();
  meta.barrier_group = header.barrier_group();
  meta.error = header.error();
  meta.priority = header.priority();
  result.header = std::move(decoded);
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

}  // namespace ps::wire
