#pragma once
// ps::Tensor: a non-owning view of a dense tensor in CPU or CUDA memory.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ps {

using Key = std::uint64_t;

// Element types. The numeric values travel on the wire: never renumber.
enum class DType : std::uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kUInt8 = 5,
  kUInt64 = 6,
};

// Size in bytes of one element; 0 for a value outside the enum.
std::size_t DTypeSize(DType dtype);
// "float32", ...; "invalid" for a value outside the enum.
std::string DTypeName(DType dtype);
// True for the values listed in DType.
bool IsValidDType(std::uint32_t raw);

struct Device {
  enum class Kind : std::uint8_t { kCPU = 0, kCUDA = 1 };
  Kind kind = Kind::kCPU;
  int id = 0;

  static Device CPU() { return Device{}; }
  static Device CUDA(int ordinal) { return Device{Kind::kCUDA, ordinal}; }
  bool is_cuda() const { return kind == Kind::kCUDA; }
  std::string ToString() const;
  friend bool operator==(const Device&, const Device&) = default;
};

// A view: the caller owns the memory and keeps it alive (see KVStore for the lifetime rule).
class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, std::size_t size, DType dtype, Device device = Device::CPU())
      : data_(data), size_(size), dtype_(dtype), device_(device) {}
  Tensor(float* data, std::size_t size) : Tensor(data, size, DType::kFloat32) {}
  Tensor(double* data, std::size_t size) : Tensor(data, size, DType::kFloat64) {}
  Tensor(std::int32_t* data, std::size_t size) : Tensor(data, size, DType::kInt32) {}
  Tensor(std::int64_t* data, std::size_t size) : Tensor(data, size, DType::kInt64) {}

  void* data() const { return data_; }
  std::size_t size() const { return size_; }  // elements
  std::size_t bytes() const { return size_ * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  DType dtype_ = DType::kFloat32;
  Device device_{};
};

}  // namespace ps
