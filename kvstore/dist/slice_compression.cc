#include "kvstore/dist/slice_compression.h"

#include <algorithm>
#include <cstring>

#include "kvstore/device_memory.h"

#ifdef PS_KVSTORE_CUDA
#include "kvstore/compression_cuda.h"
#endif

namespace ps {

#ifndef PS_KVSTORE_CUDA
namespace compression::gpu {
// Never made without CUDA (DeviceResidualLocked throws first); complete for unique_ptr.
class DeviceResidual {};
}  // namespace compression::gpu
#endif

SliceCompression::SliceCompression(const compression::Settings& settings, std::size_t length)
    : settings_(settings), length_(length) {}
SliceCompression::~SliceCompression() = default;

float* SliceCompression::HostResidualLocked() {
  if (residual_.empty()) residual_.assign(length_, 0.0f);
#ifdef PS_KVSTORE_CUDA
  if (device_) {  // the last pushes came from a GPU: the residual comes back with this one
    device_->Download(residual_.data());
    device_.reset();
  }
#endif
  return residual_.data();
}

void SliceCompression::ExportResidual(float* out) {
  MutexLock lock(mu_);
#ifdef PS_KVSTORE_CUDA
  if (device_) {
    device_->Download(out);
    return;
  }
#endif
  if (residual_.empty()) {
    std::fill(out, out + length_, 0.0f);
  } else {
    std::copy(residual_.begin(), residual_.end(), out);
  }
}

void SliceCompression::ImportResidual(const float* in) {
  MutexLock lock(mu_);
  // In host memory, whatever device pushed last: no CUDA call that could fail half-way through
  // a load. The next push from a GPU takes it there (DeviceResidualLocked).
  device_.reset();
  if (in != nullptr) {
    residual_.assign(in, in + length_);
  } else {
    residual_.clear();  // zeros, made at the next push
  }
}

compression::gpu::DeviceResidual& SliceCompression::DeviceResidualLocked(int device) {
#ifdef PS_KVSTORE_CUDA
  if (device_ && device_->device() == device) return *device_;
  if (device_) HostResidualLocked();  // from another GPU: through host memory
  auto moved = std::make_unique<compression::gpu::DeviceResidual>(device, length_);
  if (!residual_.empty()) moved->Upload(residual_.data());
  residual_.clear();
  residual_.shrink_to_fit();
  device_ = std::move(moved);
  return *device_;
#else
  CheckDevice(Device::CUDA(device));  // throws: this build has no CUDA
  throw Error("gradient compression of a GPU tensor needs a build with CUDA");
#endif
}

Blob SliceCompression::EncodePush(const float* grad, Device device) {
  const compression::Settings& settings = settings_;
  std::vector<std::byte> codes(compression::EncodedBytes(settings.push, length_));
  MutexLock lock(mu_);
  if (device.is_cuda()) {
#ifdef PS_KVSTORE_CUDA
    DeviceResidualLocked(device.id).Encode(settings.push, settings.threshold, grad, codes.data());
#else
    DeviceResidualLocked(device.id);
#endif
  } else {
    compression::EncodePush(settings.push, settings.threshold, grad, HostResidualLocked(), length_,
                            codes.data());
  }
  return Blob::FromVector(std::move(codes), DType::kUInt8);
}

kv::PullState SliceCompression::NextPull() {
  MutexLock lock(mu_);
  return kv::PullState{copy_state_, ++issued_};
}

std::string SliceCompression::ApplyPull(const Blob& frame, kv::PullState pull, void* target,
                                        Device device) {
  const compression::Settings& settings = settings_;
  MutexLock lock(mu_);
  const std::size_t bytes = length_ * sizeof(float);
  if (frame.dtype() == DType::kFloat32 && frame.bytes() == bytes) {
    copy_.assign(length_, 0.0f);
    std::memcpy(copy_.data(), frame.data(), bytes);
  } else if (frame.dtype() == DType::kUInt8 &&
             frame.bytes() == compression::EncodedBytes(settings.pull, length_) &&
             copy_state_ != 0 && copy_state_ == pull.base) {
    compression::ApplyDelta(settings.pull, settings.threshold, frame.data(), length_, copy_.data());
  } else {
    const bool stale = frame.dtype() == DType::kUInt8 && copy_state_ != pull.base;
    copy_state_ = 0;
    copy_.clear();
    return stale ? "a compressed pull's change arrived for a copy this worker no longer holds"
                 : "a compressed pull's reply has the wrong size";
  }
  copy_state_ = pull.next;
  CopyFromHost(target, device, copy_.data(), bytes);
  return "";
}

}  // namespace ps
