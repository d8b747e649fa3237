#include "checks.h"

#include "device_memory.h"
#include "optimizer.h"

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
}

void NamingKey(std::string_view store, std::string_view op, Key key,
               const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    throw Error(Where(store, op, key) + e.what());
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

}  // namespace ps::checks
