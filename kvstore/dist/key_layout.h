#pragma once
// Where a key lives. A key smaller than the big-array bound lives whole on one server picked
// by a hash of the key; a bigger one is cut into one contiguous slice per server, so its
// traffic and update work spread over all of them (MXNet's MXNET_KVSTORE_BIGARRAY_BOUND rule).
#include <cstddef>
#include <cstdint>
#include <vector>

#include <ps/tensor.h>

namespace ps {

constexpr std::size_t kDefaultBigArrayBound = 1000000;

struct KeySlice {
  int server_rank = 0;
  std::size_t offset = 0;  // elements
  std::size_t length = 0;  // elements
};

class KeyLayout {
 public:
  KeyLayout(int num_servers, std::size_t big_array_bound)
      : num_servers_(num_servers), bound_(big_array_bound) {}

  // The slices of a key of `length` elements, in offset order (empty slices left out).
  std::vector<KeySlice> Slices(Key key, std::size_t length) const;
  // The server a small key lives on.
  int ServerOf(Key key) const;

  int num_servers() const { return num_servers_; }
  std::size_t big_array_bound() const { return bound_; }

 private:
  int num_servers_;
  std::size_t bound_;
};

}  // namespace ps
