#pragma once
// Where a key lives. A key smaller than the big-array bound lives whole on one server picked
// by a hash of the key; a bigger one is cut into contiguous slices, at least one per server and
// none larger than the chunk size, dealt round-robin over the servers, so its traffic and update
// work spread over all of them (MXNet's MXNET_KVSTORE_BIGARRAY_BOUND rule) and its slices travel
// as separate messages that the servers and the worker process while the next one is in flight
// (BytePS-style pipelining). With server weights (PS_SERVER_WEIGHTS) the hash and the deal
// follow them: a server of weight w holds about w / (sum of weights) of every big key, in
// smaller slices where needed, and that share of the small keys.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ps/tensor.h"

namespace ps {

constexpr std::size_t kDefaultBigArrayBound = 1000000;
constexpr std::size_t kDefaultChunkBytes = std::size_t{4} << 20;

struct KeySlice {
  int server_rank = 0;
  std::size_t offset = 0;  // elements
  std::size_t length = 0;  // elements
};

class KeyLayout {
 public:
  // `weights`: empty (all servers alike) or one positive integer per server rank.
  KeyLayout(int num_servers, std::size_t big_array_bound,
            std::size_t chunk_bytes = kDefaultChunkBytes, std::vector<std::uint32_t> weights = {});

  // The slices of a key of `length` elements of `element_bytes` each, in offset order.
  std::vector<KeySlice> Slices(Key key, std::size_t length, std::size_t element_bytes) const;
  // The server a small key lives on.
  int ServerOf(Key key) const;

  int num_servers() const { return num_servers_; }
  std::size_t big_array_bound() const { return bound_; }
  std::size_t chunk_bytes() const { return chunk_bytes_; }

 private:
  int num_servers_;
  std::size_t bound_;
  std::size_t chunk_bytes_;
  std::vector<std::uint32_t> weights_;  // empty: all alike
  std::uint64_t total_weight_ = 0;
  std::uint32_t least_weight_ = 0;
};

}  // namespace ps
