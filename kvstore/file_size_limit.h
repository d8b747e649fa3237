#pragma once
// RLIMIT_FSIZE (ulimit -f, set by some batch systems): a file grown past it raises SIGXFSZ,
// which ends the process unless the signal is ignored. The files the store makes (shared-memory
// segments, checkpoint files) are checked against it first, so going past it is an error that
// names the limit, not a process killed mid-job.
#include <sys/resource.h>

#include <cstdint>
#include <string>

#include "ps/error.h"

namespace ps {

// Throws ps::Error when a file of `bytes` bytes is past the process's file-size limit; `what`
// names the file ("a shared-memory segment", "checkpoint file /ckpt/...").
inline void CheckFileSizeLimit(std::uint64_t bytes, const std::string& what) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  if (bytes <= limit.rlim_cur) return;
  throw Error(what + " would be " + std::to_string(bytes) +
              " bytes, past this process's file-size limit (ulimit -f: " +
              std::to_string(limit.rlim_cur) + " bytes): raise the limit");
}

}  // namespace ps
