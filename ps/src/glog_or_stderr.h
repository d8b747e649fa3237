#pragma once
// PS_LOG(severity): how the code a worker process runs (the runtime, the transport, the dist
// KVStore) logs, in place of glog's LOG(severity).
//
// A worker is the user's program, which may set glog up itself, and may do so only after it
// created its KVStore. The library must not call InitGoogleLogging there (glog aborts the
// program at the user's own call then: "You called InitGoogleLogging() twice!"), and plain LOG
// before that call makes glog open with "WARNING: Logging before InitGoogleLogging() is written
// to STDERR" in every worker. So:
//   - once glog is set up (by the program, or by the scheduler and server roles themselves),
//     PS_LOG is LOG: the program's glog settings (files, levels, sinks) apply;
//   - before that, the line goes to a sink that writes it to stderr in glog's own format
//     (ps/src/stderr_log.h), and not to glog's log (which is what prints the banner). Nothing of
//     glog's state changes, so the program may still call InitGoogleLogging at any time.
// Checked by tests/kvstore/test_worker_logging.cc and tests/install (the README's example run
// with PS_VERBOSE=1).
#include <glog/logging.h>

#include "ps/src/stderr_log.h"

namespace ps::internal {

// The sink for a line logged now: none once glog is set up, else the process's stderr sink
// (stderr_log.h: it never blocks the thread that logs).
inline google::LogSink* SinkUntilGlogIsSetUp() {
  if (google::IsGoogleLoggingInitialized()) return nullptr;
  return ProcessStderrSink();
}

}  // namespace ps::internal

// With a sink, glog sends the line to it only (the last argument: not to glog's log too).
#define PS_LOG(severity)                                                  \
  ::google::LogMessage(__FILE__, __LINE__, ::google::GLOG_##severity,     \
                       ::ps::internal::SinkUntilGlogIsSetUp(),            \
                       ::ps::internal::SinkUntilGlogIsSetUp() == nullptr) \
      .stream()
