#pragma once
// SliceCompression: what a worker keeps per float32 key slice when gradient compression is on
// (docs/kvstore.md, "Gradient compression"): the push residual, in host memory or on the GPU
// the gradients come from, and, for compressed pulls, its copy of the value and the state
// that names the copy to the server.
//
// Threads: every call may come from any thread (a mutex per slice): EncodePush and NextPull on
// the calling thread of Push/Pull, ApplyPull on the runtime's receive thread.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/compression.h"
#include "kvstore/dist/kv_protocol.h"
#include "ps/message.h"
#include "ps/mutex.h"
#include "ps/tensor.h"
#include "ps/thread_annotations.h"

namespace ps {

namespace compression::gpu {
class DeviceResidual;
}  // namespace compression::gpu

class SliceCompression {
 public:
  // A slice of `length` values compressed with `settings` (for its whole life: a new setting
  // gets new states).
  SliceCompression(const compression::Settings& settings, std::size_t length);
  ~SliceCompression();
  SliceCompression(const SliceCompression&) = delete;
  SliceCompression& operator=(const SliceCompression&) = delete;

  // Encodes the slice's `length` gradients at `grad` (memory of `device`) with the residual
  // into a new host buffer: a uint8 blob of EncodedBytes(push codec, length). A GPU gradient
  // is encoded on its GPU, where the residual then lives; only the codes are copied. Throws
  // ps::Error (a failed CUDA call, a GPU in a build without CUDA).
  Blob EncodePush(const float* grad, Device device);

  // The push residual (zeros before the first push) as `length` floats at `out` (a residual on
  // a GPU stays there), and set from `in` (null: zeros) in host memory, for checkpoints.
  // ImportResidual cannot fail; ExportResidual throws ps::Error when a GPU copy fails.
  void ExportResidual(float* out);
  void ImportResidual(const float* in);

  // The state a compressed pull of this slice asks the server for: from the copy's state to a
  // new one, never issued before.
  kv::PullState NextPull();
  // A compressed pull's reply for this slice: a uint8 change since pull.base, or the float32
  // full value. Brings the copy to pull.next and copies it to `target` (memory of `device`).
  // Returns "" or why the reply cannot be used (the copy is then dropped: the next pull asks
  // for the full value).
  std::string ApplyPull(const Blob& frame, kv::PullState pull, void* target, Device device);

 private:
  // The residual where a push from `device` needs it (moved there if it was elsewhere).
  float* HostResidualLocked() PS_REQUIRES(mu_);
  compression::gpu::DeviceResidual& DeviceResidualLocked(int device) PS_REQUIRES(mu_);

  const compression::Settings settings_;
  const std::size_t length_;
  Mutex mu_;
  // The residual: in host memory (pushes from the CPU) or on a GPU (pushes from it); empty and
  // null before the first push.
  std::vector<float> residual_ PS_GUARDED_BY(mu_);
  std::unique_ptr<compression::gpu::DeviceResidual> device_ PS_GUARDED_BY(mu_);
  std::vector<float> copy_ PS_GUARDED_BY(mu_);
  std::uint64_t copy_state_ PS_GUARDED_BY(mu_) = 0;  // 0: no copy
  std::uint64_t issued_ PS_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
