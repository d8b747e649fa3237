#include "kvstore/dist/key_layout.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "ps/error.h"

namespace ps {
namespace {

// splitmix64's finalizer: consecutive keys (the common case: one per layer) land on
// servers that look random, so loads come out even.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

KeyLayout::KeyLayout(int num_servers, std::size_t big_array_bound, std::size_t chunk_bytes,
                     std::vector<std::uint32_t> weights)
    : num_servers_(num_servers),
      bound_(big_array_bound),
      chunk_bytes_(chunk_bytes),
      weights_(std::move(weights)) {
  if (std::all_of(weights_.begin(), weights_.end(),
                  [&](std::uint32_t weight) { return weight == weights_.front(); }) &&
      weights_.size() == static_cast<std::size_t>(num_servers_)) {
    weights_.clear();  // alike: exactly the layout without weights
  }
  if (weights_.empty()) return;
  if (weights_.size() != static_cast<std::size_t>(num_servers_) ||
      std::find(weights_.begin(), weights_.end(), 0U) != weights_.end()) {
    throw Error("server weights: need one positive weight per server rank");
  }
  total_weight_ = std::accumulate(weights_.begin(), weights_.end(), std::uint64_t{0});
  least_weight_ = *std::min_element(weights_.begin(), weights_.end());
}

int KeyLayout::ServerOf(Key key) const {
  if (weights_.empty()) {
    return static_cast<int>(Mix(key) % static_cast<std::uint64_t>(num_servers_));
  }
  std::uint64_t point = Mix(key) % total_weight_;  // a server owns a run of `weight` points
  int server = 0;
  while (point >= weights_[static_cast<std::size_t>(server)]) {
    point -= weights_[static_cast<std::size_t>(server)];
    ++server;
  }
  return server;
}

std::vector<KeySlice> KeyLayout::Slices(Key key, std::size_t length,
                                        std::size_t element_bytes) const {
  if (length < bound_) return {KeySlice{ServerOf(key), 0, length}};
  const auto servers = static_cast<std::size_t>(num_servers_);
  const std::size_t chunk_elements = std::max<std::size_t>(1, chunk_bytes_ / element_bytes);
  // With weights, enough pieces (of one element at least) that the lightest server's share
  // is about two of them, but at most 64 per server: a server whose share is smaller than
  // one of those may hold nothing of the key.
  constexpr std::size_t kMaxPiecesPerServer = 64;
  const std::size_t least_pieces =
      weights_.empty() ? servers
                       : std::min({length, (2 * total_weight_ + least_weight_ - 1) / least_weight_,
                                   kMaxPiecesPerServer * servers});
  const std::size_t pieces = std::max(least_pieces, (length + chunk_elements - 1) / chunk_elements);
  // Smooth weighted round-robin (nginx's): each piece goes to the server with the most credit,
  // which then pays the total. Alike weights give plain round-robin. Servers are visited from
  // the key's own one, so that many big keys do not all put their first (possibly one element
  // larger) piece on server 0.
  const auto start = static_cast<std::size_t>(ServerOf(key));
  std::vector<std::int64_t> credit(servers, 0);
  const auto weight = [&](std::size_t server) -> std::int64_t {
    return weights_.empty() ? 1 : weights_[server];
  };
  const auto total = static_cast<std::int64_t>(weights_.empty() ? servers : total_weight_);
  std::vector<KeySlice> slices;
  for (std::size_t p = 0; p < pieces; ++p) {
    std::size_t best = start;
    for (std::size_t i = 0; i < servers; ++i) {
      const std::size_t server = (start + i) % servers;
      credit[server] += weight(server);
      if (credit[server] > credit[best]) best = server;
    }
    credit[best] -= total;
    const std::size_t begin = length * p / pieces;
    const std::size_t end = length * (p + 1) / pieces;
    if (end > begin) slices.push_back(KeySlice{static_cast<int>(best), begin, end - begin});
  }
  return slices;
}

}  // namespace ps
