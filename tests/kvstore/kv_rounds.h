#pragma once
// Checks shared by the multi-process KVStore tests: exact dist_sync sums over rounds.
#include <optional>
#include <string>
#include <vector>

#include "ps/kvstore.h"
#include "tests/kvstore/kv_cluster.h"

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

// Where the tensors handed to the store live. Host memory by default (the views are the host
// vectors themselves); a GPU test overrides it to hand the store device copies.
class Placement {
 public:
  virtual ~Placement() = default;
  // The tensor the store gets for `host` (kept for the whole run).
  virtual ps::Tensor View(std::vector<float>& host) { return {host.data(), host.size()}; }
  // Before a call reads `view`: bring it up to date with `host`.
  virtual void Upload(const std::vector<float>& /*host*/, const ps::Tensor& /*view*/) {}
  // After WaitAll: bring `host` up to date with what the store wrote into `view`.
  virtual void Download(std::vector<float>& /*host*/, const ps::Tensor& /*view*/) {}
};

// Every round, each worker pushes (rank+1)*(round)*(k+1)+i%3 into element i of key k; with no
// optimizer the stored value is the round's sum over workers, which each worker checks.
inline void SyncSumRounds(ps::KVStore& kv, const std::vector<std::size_t>& sizes, int rounds,
                          bool use_pushpull, Placement&& placement = Placement()) {
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
    init_views.push_back(placement.View(init[k]));
    grad_views.push_back(placement.View(grads[k]));
    out_views.push_back(placement.View(outs[k]));
    placement.Upload(init[k], init_views[k]);
  }
  kv.Init(keys, init_views);
  kv.Pull(keys, out_views);
  kv.WaitAll();
  for (std::size_t k = 0; k < n; ++k) {
    placement.Download(outs[k], out_views[k]);
    Expect(outs[k] == std::vector<float>(sizes[k], 7.0f), "init value");
  }
  for (int round = 1; round <= rounds; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        grads[k][i] = static_cast<float>((rank + 1) * round * static_cast<int>(k + 1) +
                                         static_cast<int>(i % 3));
      }
      placement.Upload(grads[k], grad_views[k]);
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
      placement.Download(outs[k], out_views[k]);
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

// Whether `text` contains `part` (for Expect in worker threads).
inline bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The message of the ps::Error `call` throws, or "(no error)" when it throws none.
template <class Call>
std::string ErrorOf(Call call) {
  try {
    call();
  } catch (const ps::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The kind of the ps::Error that `call` throws (std::nullopt: none): what a caller that
// catches by type (DisagreementError, ...) would see.
template <class Call>
std::optional<ps::ErrorKind> ErrorKindOf(Call call) {
  try {
    call();
  } catch (const ps::Error& e) {
    return e.kind();
  }
  return std::nullopt;
}

}  // namespace ps::test
