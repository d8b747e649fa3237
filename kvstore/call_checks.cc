#include "kvstore/call_checks.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "kvstore/device_memory.h"
#include "kvstore/optimizer.h"

namespace ps::checks {

std::string Where(std::string_view store, std::string_view op, Key key) {
  return std::string(store) + ": " + std::string(op) + " key " + std::to_string(key) + ": ";
}

void Counts(std::string_view store, std::string_view op, std::size_t keys, std::size_t tensors) {
  if (keys != tensors) {
    throw Error(std::string(store) + ": " + std::string(op) + ": " + std::to_string(keys) +
                " keys but " + std::to_string(tensors) + " tensors (need one tensor per key)");
  }
}

namespace {

// The most elements of `dtype` a tensor on `device` can hold: what the machine's memory holds
// for host memory; for a GPU's, what a process can address (47 bits on x86-64 and arm64).
std::size_t MostElements(DType dtype, Device device) {
  static constexpr std::uint64_t kAddressable = std::uint64_t{1} << 47;
  // Read once (a system call; this check runs for every tensor of every call).
  static const std::uint64_t host_bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return kAddressable;
    return std::min(kAddressable,
                    static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page));
  }();
  const std::uint64_t bytes = device.is_cuda() ? kAddressable : host_bytes;
  return static_cast<std::size_t>(bytes / DTypeSize(dtype));
}

[[noreturn]] void ThrowUnknownKey(std::string_view store, std::string_view op, Key key) {
  throw Error(Where(store, op, key) + "unknown key (never initialized: call Init first)");
}

}  // namespace

void TensorBasics(std::string_view store, std::string_view op, Key key, const Tensor& t) {
  if (t.device().is_cuda() && !DeviceCopiesBuilt()) {
    throw Error(Where(store, op, key) + "a tensor in GPU memory (" + t.device().ToString() +
                ") needs a build with CUDA, and this one has none: rebuild where CMake finds the "
                "CUDA toolkit (PS_WITH_CUDA=ON), or pass host memory");
  }
  if (DTypeSize(t.dtype()) == 0) {
    throw Error(Where(store, op, key) + "invalid dtype value " +
                std::to_string(static_cast<unsigned>(t.dtype())));
  }
  if (t.size() != 0 && t.data() == nullptr) {
    throw Error(Where(store, op, key) + "null data pointer for " + std::to_string(t.size()) +
                " elements");
  }
  // A size no buffer can have (a byte count, or -1, passed for the element count) would be
  // read past its end, or wrap around in bytes(): refused before anything is sent.
  const std::size_t most = MostElements(t.dtype(), t.device());
  if (t.size() > most) {
    throw Error(Where(store, op, key) + "a tensor of " + std::to_string(t.size()) + " " +
                DTypeName(t.dtype()) + " elements is larger than " +
                (t.device().is_cuda()
                     ? "any buffer can be"
                     : "this machine's memory (" + std::to_string(most) + " elements)") +
                ": pass the tensor's element count");
  }
}

void NamingKey(std::string_view store, std::string_view op, Key key,
               const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    throw Error(Where(store, op, key) + e.what());
  }
}

void NamingCall(std::string_view store, std::string_view op, const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    ThrowError(e.kind(), std::string(store) + ": " + std::string(op) + ": " + e.what());
  }
}

void WaitedKeys(std::string_view store, std::string_view op, std::span<const Key> keys,
                const std::function<bool(Key)>& known) {
  for (const Key key : keys) {
    if (!known(key)) {
      ThrowUnknownKey(store, op, key);
    }
  }
}

void Matches(std::string_view store, std::string_view op, Key key, const Tensor& t, DType dtype,
             std::size_t size) {
  TensorBasics(store, op, key, t);
  if (t.dtype() != dtype) {
    throw Error(Where(store, op, key) + "dtype mismatch: expected " + DTypeName(dtype) +
                " (as initialized), given " + DTypeName(t.dtype()));
  }
  if (t.size() != size) {
    throw Error(Where(store, op, key) + "size mismatch: expected " + std::to_string(size) +
                " elements (as initialized), given " + std::to_string(t.size()));
  }
}

void InitDType(std::string_view store, Key key, DType dtype) {
  if (!IsSummableDType(dtype)) {
    throw Error(Where(store, "Init", key) + "dtype " + DTypeName(dtype) +
                " is not supported (supported: float32, float64, int32, int64)");
  }
}

void InitKey(std::string_view store, Key key, const Tensor& value,
             const std::optional<Declared>& existing, bool repeated) {
  TensorBasics(store, "Init", key, value);
  InitDType(store, key, value.dtype());
  if (existing) {
    throw Error(Where(store, "Init", key) + "already initialized (holds " +
                std::to_string(existing->size) + " " + DTypeName(existing->dtype) +
                " elements; a key is initialized once)");
  }
  if (repeated) throw Error(Where(store, "Init", key) + "given twice in one call");
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kPush:
      return "Push";
    case Op::kPull:
      return "Pull";
    case Op::kPushPull:
      return "PushPull";
  }
  return "?";
}

Operation::Operation(std::string_view store, Op op, std::span<const Key> keys,
                     std::span<const Tensor> sends, std::span<const Tensor> outs, bool optimizer,
                     std::pmr::memory_resource* memory)
    : store_(store),
      op_(op),
      keys_(keys),
      sends_(op == Op::kPull ? std::span<const Tensor>() : sends),
      outs_(op == Op::kPush ? std::span<const Tensor>() : outs),
      optimizer_(optimizer),
      seen_(memory) {
  if (op != Op::kPull) Counts(store, OpName(op), keys.size(), sends.size());
  if (op != Op::kPush) Counts(store, OpName(op), keys.size(), outs.size());
}

void Operation::CheckKey(std::size_t i, const std::optional<Declared>& declared) {
  const Key key = keys_[i];
  const std::string_view op = OpName(op_);
  if (!declared) {
    ThrowUnknownKey(store_, op, key);
  }
  if (keys_.size() > 1 && !seen_.insert(key).second) {
    throw Error(Where(store_, op, key) + "given twice in one call (a key may appear once)");
  }
  if (!sends_.empty()) Matches(store_, op, key, sends_[i], declared->dtype, declared->size);
  if (!outs_.empty()) Matches(store_, op, key, outs_[i], declared->dtype, declared->size);
  if (!sends_.empty() && optimizer_ && declared->dtype != DType::kFloat32) {
    throw Error(Where(store_, op, key) + "optimizers update float32 keys only, this key holds " +
                DTypeName(declared->dtype));
  }
}

}  // namespace ps::checks
