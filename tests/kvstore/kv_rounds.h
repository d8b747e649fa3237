#pragma once
// Checks shared by the multi-process KVStore tests: exact dist_sync sums over rounds.
#include <string>
#include <vector>

#include <ps/kvstore.h>

#include "kv_cluster.h"

namespace ps::test {

inline std::string AllOk(const std::vector<std::string>& outcomes) {
  std::string failures;
  for (std::size_t w = 0; w < outcomes.size(); ++w) {
    if (!outcomes[w].empty())
      failures += "worker thread " + std::to_string(w) + ": " + outcomes[w] + "\n";
  }
  return failures;
}

// `keys` keys of `size` elements, plus one sliced key of `big` elements when big > 0.
inline std::vector<std::size_t> KeySizes(int keys, std::size_t size, std::size_t big) {
  std::vector<std::size_t> sizes(static_cast<std::size_t>(keys), size);
  if (big > 0) sizes.push_back(big);
  return sizes;
}

// Every round, each worker pushes (rank+1)*(round)*(k+1)+i%3 into element i of key k; with no
// optimizer the stored value is the round's sum over workers, which each worker checks.
inline void SyncSumRounds(ps::KVStore& kv, const std::vector<std::size_t>& sizes, int rounds,
                          bool use_pushpull) {
  const int rank = kv.Rank();
  const int workers = kv.NumWorkers();
  const std::size_t n = sizes.size();
  std::vector<ps::Key> keys(n);
  std::vector<std::vector<float>> init(n), grads(n), outs(n);
  std::vector<ps::Tensor> init_views, grad_views, out_views;
  for (std::size_t k = 0; k < n; ++k) {
    keys[k] = 100 + k;
    init[k].assign(sizes[k], static_cast<float>(rank + 7));  // rank 0's value must win
    grads[k].resize(sizes[k]);
    outs[k].resize(sizes[k]);
    init_views.emplace_back(init[k].data(), sizes[k]);
    grad_views.emplace_back(grads[k].data(), sizes[k]);
    out_views.emplace_back(outs[k].data(), sizes[k]);
  }
  kv.Init(keys, init_views);
  kv.Pull(keys, out_views);
  kv.WaitAll();
  for (std::size_t k = 0; k < n; ++k)
    Expect(outs[k] == std::vector<float>(sizes[k], 7.0f), "init value");
  for (int round = 1; round <= rounds; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        grads[k][i] = static_cast<float>((rank + 1) * round * static_cast<int>(k + 1) +
                                         static_cast<int>(i % 3));
      }
    }
    if (use_pushpull) {
      kv.PushPull(keys, grad_views, out_views);
    } else {
      kv.Push(keys, grad_views);
      kv.Pull(keys, out_views);  // after a push of the same key: the round's result
    }
    kv.WaitAll();
    const int rank_sum = workers * (workers + 1) / 2;
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        const float expected = static_cast<float>(rank_sum * round * static_cast<int>(k + 1) +
                                                  workers * static_cast<int>(i % 3));
        if (outs[k][i] != expected) {
          Expect(false, "round " + std::to_string(round) + " key " + std::to_string(keys[k]) +
                            " element " + std::to_string(i) + ": expected " +
                            std::to_string(expected) + ", got " + std::to_string(outs[k][i]));
        }
      }
    }
  }
}

}  // namespace ps::test
