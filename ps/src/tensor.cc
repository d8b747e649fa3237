#include "ps/tensor.h"

namespace ps {

std::size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kUInt64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
    case DType::kUInt64:
      return "uint64";
  }
  return "invalid";
}

bool IsValidDType(std::uint32_t raw) { return raw <= static_cast<std::uint32_t>(DType::kUInt64); }

std::string Device::ToString() const {
  return is_cuda() ? "cuda:" + std::to_string(id) : std::string("cpu");
}

}  // namespace ps
