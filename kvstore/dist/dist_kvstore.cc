#include "dist_kvstore.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <unordered_set>

#include "checks.h"
#include "device_memory.h"
#include "optimizer.h"

namespace ps {
namespace {

constexpr std::string_view kStore = "dist kvstore";

}  // namespace

DistKVStore::DistKVStore(std::unique_ptr<Runtime> runtime, bool sync)
    : runtime_(std::move(runtime)),
      sync_(sync),
      layout_(runtime_->num_servers(), runtime_->config().big_array_bound,
              runtime_->config().chunk_bytes) {}

DistKVStore::~DistKVStore() {
  try {
    WaitAll();
  } catch (const Error& e) {
    LOG(ERROR) << "worker " << Rank() << ": an operation failed before shutdown: " << e.what();
  }
  try {
    // Destroyed while an exception unwinds: this worker failed, and the job must not end as a
    // success (or wait for a heartbeat timeout).
    runtime_->FinishWorker(
        std::uncaught_exceptions() > 0 ? "its program left the KVStore through an exception" : "");
  } catch (const Error& e) {
    LOG(ERROR) << "worker " << Rank() << ": " << e.what();
  }
}

void DistKVStore::Complete(const std::string& error) {
  std::lock_guard lock(ops_mu_);
  if (!error.empty() && first_error_.empty()) first_error_ = error;
  if (--outstanding_ == 0) ops_done_.notify_all();
}

void DistKVStore::WaitAll() {
  std::unique_lock lock(ops_mu_);
  ops_done_.wait(lock, [this] { return outstanding_ == 0; });
  if (!first_error_.empty()) {
    const std::string error = std::move(first_error_);
    first_error_.clear();
    throw Error(error);
  }
}

void DistKVStore::Barrier() { runtime_->Barrier(kWorkerGroup); }

void DistKVStore::Collective(const std::function<void()>& work) {
  std::string error;
  if (Rank() == 0) {
    try {
      work();
      WaitAll();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  runtime_->Barrier(kWorkerGroup);
  if (!error.empty()) throw Error(error);
}

void DistKVStore::SetOptimizer(const OptimizerConfig& config) {
  ValidateOptimizerConfig(config);  // every worker throws the same error, before any message
  Collective([&] {
    kv::Request request;
    request.command = kv::kSetOptimizer;
    request.optimizer = config;
    std::vector<Message> messages;
    for (int s = 0; s < runtime_->num_servers(); ++s) {
      Message msg;
      msg.meta.app_id = kv::kAppId;
      msg.meta.head = kv::kSetOptimizer;
      msg.meta.recipient = runtime_->ServerId(s);
      msg.meta.body = kv::EncodeBody(request);
      messages.push_back(std::move(msg));
    }
    Track(std::move(messages), {});
  });
  optimizer_set_ = true;
}

void DistKVStore::InitImpl(const std::vector<Key>& keys, const std::vector<Tensor>& values) {
  checks::Counts(kStore, "Init", keys.size(), values.size());
  {
    // Every worker runs the same checks, so all of them throw (or none) before any message.
    std::shared_lock lock(keys_mu_);
    std::unordered_set<Key> seen;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      checks::TensorBasics(kStore, "Init", keys[i], values[i], false);
      checks::InitDType(kStore, keys[i], values[i].dtype());
      if (keys_.contains(keys[i]) || !seen.insert(keys[i]).second) {
        throw Error(checks::Where(kStore, "Init", keys[i]) +
                    "already initialized (a key is initialized once)");
      }
    }
  }
  {
    std::unique_lock lock(keys_mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      keys_[keys[i]] =
          KeyInfo{values[i].dtype(), values[i].size(),
                  layout_.Slices(keys[i], values[i].size(), DTypeSize(values[i].dtype()))};
    }
  }
  Collective([&] { Issue(kv::kInit, keys, values, {}, 0); });
}

void DistKVStore::PushImpl(const std::vector<Key>& keys, const std::vector<Tensor>& grads,
                           int priority) {
  Issue(kv::kPush, keys, grads, {}, priority);
}

void DistKVStore::PullImpl(const std::vector<Key>& keys, const std::vector<Tensor>& outs,
                           int priority) {
  Issue(kv::kPull, keys, {}, outs, priority);
}

void DistKVStore::PushPullImpl(const std::vector<Key>& keys, const std::vector<Tensor>& grads,
                               const std::vector<Tensor>& outs, int priority) {
  checks::Counts(kStore, "PushPull", keys.size(), outs.size());
  Issue(kv::kPushPull, keys, grads, outs, priority);
}

void DistKVStore::Issue(kv::Command command, const std::vector<Key>& keys,
                        const std::vector<Tensor>& sends, const std::vector<Tensor>& outs,
                        int priority) {
  const std::string op = kv::CommandName(command);
  const bool sending = command != kv::kPull;
  const bool receiving = command == kv::kPull || command == kv::kPushPull;
  checks::Counts(kStore, op, keys.size(), sending ? sends.size() : outs.size());
  if (sending && command != kv::kInit && !sync_ && !optimizer_set_) {
    throw Error(checks::Where(kStore, op, keys.empty() ? 0 : keys[0]) +
                "dist_async applies every push at once, so it needs an optimizer: call "
                "SetOptimizer before the first Push");
  }

  // Per server, the messages being built: each carries at most chunk_bytes of values (a
  // big key's slices travel separately, so servers and this worker work on one while the
  // next is in flight), its frames, and where its pulled slices go.
  struct Outgoing {
    kv::Request request;
    std::vector<Blob> frames;
    std::vector<Destination> destinations;
    std::size_t bytes = 0;
  };
  std::map<int, std::vector<Outgoing>> per_server;
  const std::size_t chunk_bytes = layout_.chunk_bytes();
  const bool gpu_ok = DeviceCopiesBuilt();
  // Frames reference the caller's memory; this token marks them as borrowed, not owned.
  const auto borrowed = std::make_shared<int>(0);
  {
    std::shared_lock lock(keys_mu_);
    std::unordered_set<Key> seen;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const Key key = keys[i];
      const auto it = keys_.find(key);
      if (it == keys_.end()) {
        throw Error(checks::Where(kStore, op, key) + "was never initialized (call Init first)");
      }
      const KeyInfo& info = it->second;
      if (sending) checks::Matches(kStore, op, key, sends[i], info.dtype, info.size, gpu_ok);
      if (receiving) checks::Matches(kStore, op, key, outs[i], info.dtype, info.size, gpu_ok);
      if (!seen.insert(key).second) {
        throw Error(checks::Where(kStore, op, key) + "given twice in one call");
      }
      const std::size_t element = DTypeSize(info.dtype);
      // What the frames point into: the caller's memory, or a host copy of a GPU tensor.
      const std::byte* send_base = nullptr;
      std::shared_ptr<const void> send_owner = borrowed;
      if (sending) {
        send_base = static_cast<const std::byte*>(sends[i].data());
        if (sends[i].device().is_cuda()) {
          auto staged = std::make_shared<std::vector<std::byte>>(sends[i].bytes());
          CopyFromDevice(staged->data(), sends[i].data(), sends[i].bytes(), sends[i].device());
          send_base = staged->data();
          send_owner = std::move(staged);
        }
      }
      for (const KeySlice& slice : info.slices) {
        std::vector<Outgoing>& queue = per_server[slice.server_rank];
        const std::size_t slice_bytes = slice.length * element;
        if (queue.empty() || queue.back().request.slices.size() >= kv::kMaxSlicesPerMessage ||
            (queue.back().bytes > 0 && queue.back().bytes + slice_bytes > chunk_bytes)) {
          queue.emplace_back();
        }
        Outgoing& target = queue.back();
        target.bytes += slice_bytes;
        target.request.slices.push_back(kv::SliceRef{key, slice.offset, info.size});
        if (sending) {
          target.frames.emplace_back(send_owner, send_base + slice.offset * element,
                                     slice.length * element, info.dtype);
        }
        if (receiving) {
          auto* base = static_cast<std::byte*>(outs[i].data());
          target.destinations.push_back(
              {base + slice.offset * element, slice.length * element, outs[i].device()});
        }
      }
    }
  }
  // Wave w holds every server's w-th message: one request, at most one message per server.
  std::size_t waves = 0;
  for (const auto& [server, queue] : per_server) waves = std::max(waves, queue.size());
  for (std::size_t wave = 0; wave < waves; ++wave) {
    std::vector<Message> messages;
    std::vector<std::vector<Destination>> destinations;
    for (auto& [server, queue] : per_server) {
      if (wave >= queue.size()) continue;
      Outgoing& target = queue[wave];
      target.request.command = command;
      target.request.sync = sync_;
      Message msg;
      msg.meta.app_id = kv::kAppId;
      msg.meta.head = command;
      msg.meta.priority = priority;
      msg.meta.recipient = runtime_->ServerId(server);
      msg.meta.body = kv::EncodeBody(target.request);
      msg.data = std::move(target.frames);
      messages.push_back(std::move(msg));
      destinations.push_back(std::move(target.destinations));
    }
    Track(std::move(messages), std::move(destinations));
  }
}

void DistKVStore::Track(std::vector<Message> messages,
                        std::vector<std::vector<Destination>> destinations) {
  if (messages.empty()) return;
  // Which destinations belong to which server's response.
  std::map<int, std::vector<Destination>> by_node;
  for (std::size_t m = 0; m < destinations.size(); ++m) {
    by_node[messages[m].meta.recipient] = std::move(destinations[m]);
  }
  {
    std::lock_guard lock(ops_mu_);
    ++outstanding_;
  }
  runtime_->Request(
      std::move(messages), [this, by_node = std::move(by_node)](RequestResult&& result) {
        std::string error = result.error;
        for (const Message& response : result.responses) {
          if (!error.empty()) break;
          const auto it = by_node.find(response.meta.sender);
          if (it == by_node.end()) continue;
          const auto& targets = it->second;
          if (response.data.size() != targets.size()) {
            error = "malformed response from " + runtime_->Describe(response.meta.sender);
            break;
          }
          for (std::size_t j = 0; j < targets.size(); ++j) {
            if (response.data[j].bytes() != targets[j].bytes) {
              error = "response from " + runtime_->Describe(response.meta.sender) +
                      " has the wrong size";
              break;
            }
            if (!targets[j].device.is_cuda()) {
              std::memcpy(targets[j].data, response.data[j].data(), targets[j].bytes);
              continue;
            }
            try {
              CopyToDevice(targets[j].data, response.data[j].data(), targets[j].bytes,
                           targets[j].device);
            } catch (const Error& e) {
              error = e.what();
              break;
            }
          }
        }
        Complete(error);
      });
}

}  // namespace ps
