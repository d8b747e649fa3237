#include "kvstore/local_kvstore.h"

#include "kvstore/call_checks.h"
#include "kvstore/checkpoint.h"
#include "kvstore/device_memory.h"

#include <unordered_set>
#include <utility>

namespace ps {
namespace {

constexpr std::string_view kStore = "local kvstore";

}  // namespace

LocalKVStore::LocalKVStore(const ParallelOptions& parallel) : parallel_(parallel) {}

LocalKVStore::~LocalKVStore() = default;

void LocalKVStore::SetOptimizer(const OptimizerConfig& config) {
  std::unique_ptr<Optimizer> optimizer;  // validated first: a bad config changes nothing
  checks::NamingCall(kStore, "SetOptimizer", [&] { optimizer = MakeOptimizer(config, parallel_); });
  MutexLock lock(mu_);
  optimizer_ = std::move(optimizer);
}

void LocalKVStore::InitImpl(std::span<const Key> keys, std::span<const Tensor> values) {
  checks::Counts(kStore, "Init", keys.size(), values.size());
  MutexLock lock(mu_);
  // Check every key first so a failing call stores nothing.
  std::unordered_set<Key> seen;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto it = store_.find(keys[i]);
    checks::InitKey(kStore, keys[i], values[i],
                    checks::DeclaredBy(it == store_.end() ? nullptr : &it->second),
                    !seen.insert(keys[i]).second);
  }
  // Copy every value before storing any: a failed GPU copy leaves the store as it was.
  std::vector<Entry> entries(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Tensor& v = values[i];
    Entry& e = entries[i];
    e.dtype = v.dtype();
    e.size = v.size();
    e.data = std::make_unique_for_overwrite<std::byte[]>(v.bytes());
    checks::NamingKey(kStore, "Init", keys[i],
                      [&] { CopyToHost(e.data.get(), v.data(), v.bytes(), v.device()); });
  }
  for (std::size_t i = 0; i < keys.size(); ++i) store_.emplace(keys[i], std::move(entries[i]));
}

std::vector<LocalKVStore::Entry*> LocalKVStore::CheckLocked(checks::Op op,
                                                            std::span<const Key> keys,
                                                            std::span<const Tensor> sends,
                                                            std::span<const Tensor> outs) {
  checks::Operation check(kStore, op, keys, sends, outs, optimizer_ != nullptr);
  std::vector<Entry*> entries;
  entries.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto it = store_.find(keys[i]);
    Entry* entry = it == store_.end() ? nullptr : &it->second;
    check.CheckKey(i, checks::DeclaredBy(entry));  // throws for an unknown key
    entries.push_back(entry);
    // A PushPull must not push when its pull cannot land: check the output's GPU exists.
    if (op != checks::Op::kPush && outs[i].device().is_cuda()) {
      checks::NamingKey(kStore, checks::OpName(op), keys[i],
                        [&] { CheckDevice(outs[i].device()); });
    }
  }
  return entries;
}

void LocalKVStore::ApplyPushLocked(std::span<Entry* const> entries, std::span<const Key> keys,
                                   std::span<const Tensor> grads) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    Entry& e = *entries[i];
    if (optimizer_) {
      optimizer_->Update(keys[i], reinterpret_cast<float*>(e.data.get()),
                         static_cast<const float*>(grads[i].data()), e.size);
    } else {
      CopyInto(e.data.get(), grads[i].data(), e.size * DTypeSize(e.dtype), parallel_);
    }
  }
}

void LocalKVStore::DoPullLocked(std::span<Entry* const> entries, std::span<const Key> keys,
                                std::span<const Tensor> outs, std::string_view op) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = *entries[i];
    const std::size_t bytes = e.size * DTypeSize(e.dtype);
    if (outs[i].device().is_cuda()) {
      checks::NamingKey(kStore, op, keys[i], [&] {
        CopyToDevice(outs[i].data(), e.data.get(), bytes, outs[i].device());
      });
    } else {
      CopyInto(outs[i].data(), e.data.get(), bytes, parallel_);
    }
  }
}

void LocalKVStore::PushImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                            int /*priority: nothing is queued here*/) {
  MutexLock lock(mu_);
  const auto entries = CheckLocked(checks::Op::kPush, keys, grads, {});
  // GPU gradients: copied to host memory before anything changes.
  const HostViews host = StageOnHost(*staging_, kStore, "Push", keys, grads);
  ApplyPushLocked(entries, keys, host.tensors);
}

void LocalKVStore::PullImpl(std::span<const Key> keys, std::span<const Tensor> outs,
                            int /*priority*/) {
  MutexLock lock(mu_);
  const auto entries = CheckLocked(checks::Op::kPull, keys, {}, outs);
  DoPullLocked(entries, keys, outs, "Pull");
}

void LocalKVStore::PushPullImpl(std::span<const Key> keys, std::span<const Tensor> grads,
                                std::span<const Tensor> outs, int /*priority*/) {
  MutexLock lock(mu_);
  // Both halves are checked before anything is written; the pull sees this push's result.
  const auto entries = CheckLocked(checks::Op::kPushPull, keys, grads, outs);
  const HostViews host = StageOnHost(*staging_, kStore, "PushPull", keys, grads);
  ApplyPushLocked(entries, keys, host.tensors);
  DoPullLocked(entries, keys, outs, "PushPull");
}

void LocalKVStore::WaitImpl(std::span<const Key> keys) { CheckWaited("Wait", keys); }

void LocalKVStore::WaitPullsImpl(std::span<const Key> keys) { CheckWaited("WaitPulls", keys); }

void LocalKVStore::CheckWaited(std::string_view op, std::span<const Key> keys) {
  MutexLock lock(mu_);
  checks::WaitedKeys(kStore, op, keys,
                     [this](Key key) PS_REQUIRES(mu_) { return store_.contains(key); });
}

void LocalKVStore::SaveCheckpoint(const std::string& dir) {
  checks::NamingCall(kStore, "SaveCheckpoint", [&] { SaveCheckpointTo(dir); });
}

void LocalKVStore::LoadCheckpoint(const std::string& dir) {
  checks::NamingCall(kStore, "LoadCheckpoint", [&] { LoadCheckpointFrom(dir); });
}

void LocalKVStore::SaveCheckpointTo(const std::string& dir) {
  if (dir.empty()) throw Error("the directory is empty");
  MutexLock lock(mu_);
  // Written from the store's own buffers (the lock keeps them still): no copy of the values.
  checkpoint::DataFileWriter writer(
      dir, 0, 1, optimizer_ ? std::optional(optimizer_->config()) : std::nullopt, store_.size());
  for (const auto& [key, entry] : store_) {
    checkpoint::RecordView record;
    record.key = key;
    record.total = entry.size;
    record.dtype = entry.dtype;
    record.value = {entry.data.get(), entry.size * DTypeSize(entry.dtype)};
    std::optional<Optimizer::SavedState> state;
    if (optimizer_) state = optimizer_->ExportState(key);
    if (state) {
      record.count = state->count;
      record.buffers = static_cast<std::uint32_t>(optimizer_->num_buffers());
      record.state = state->buffers;
    }
    writer.Add(record);
  }
  checkpoint::Manifest manifest;
  manifest.servers = 1;
  manifest.files.push_back(writer.Commit());
  checkpoint::WriteManifest(dir, manifest);
}

void LocalKVStore::LoadCheckpointFrom(const std::string& dir) {
  if (dir.empty()) throw Error("the directory is empty");
  const auto manifest =
      checkpoint::Manifest::Parse(checkpoint::ReadManifestText(dir), dir + "/MANIFEST");
  checkpoint::Index index;
  for (const auto& file : manifest.files) index.Add(checkpoint::ReadDataFile(dir, file));
  MutexLock lock(mu_);
  // Assembled and checked whole before anything changes: the keys and their sizes first, so
  // that a checkpoint of another model is named as such, whatever the optimizer.
  std::vector<std::pair<Key, checkpoint::Index::Slice>> loaded;
  for (const auto& [key, entry] : store_) {
    loaded.emplace_back(key, index.Assemble(key, 0, entry.size, entry.size, entry.dtype));
  }
  checkpoint::CheckOptimizerMatches(index.optimizer(),
                                    optimizer_ ? &optimizer_->config() : nullptr);
  for (const auto& [key, slice] : loaded) checkpoint::CheckStateFits(key, slice, optimizer_.get());
  for (auto& [key, slice] : loaded) {
    Entry& entry = store_.at(key);
    std::copy(slice.value.begin(), slice.value.end(), entry.data.get());
    if (optimizer_ && (slice.count > 0 || !slice.state.empty())) {
      optimizer_->ImportState(key, {entry.size, slice.count, std::move(slice.state)});
    }
  }
}

}  // namespace ps
