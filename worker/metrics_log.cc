#include "worker/metrics_log.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "worker/errors.h"
#include "worker/format.h"

namespace ps::worker {

MetricsLog::MetricsLog(std::ostream& log, const std::string& metrics_path, int rank, bool append)
    : log_(log), rank_(rank) {
  // "{rank}" in the path: every worker writes its own file; without it, rank 0 only.
  std::string path = metrics_path;
  const auto placeholder = path.find("{rank}");
  if (placeholder != std::string::npos) {
    path.replace(placeholder, 6, std::to_string(rank));
  } else if (rank != 0) {
    path.clear();
  }
  if (!path.empty()) {
    // A job killed while writing a record leaves a partial line: the next one starts anew.
    bool partial_line = false;
    if (append) {
      std::ifstream before(path, std::ios::binary | std::ios::ate);
      if (before && before.tellg() > 0) {
        before.seekg(-1, std::ios::end);
        partial_line = before.get() != '\n';
      }
    }
    json_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
    if (json_ && partial_line) json_ << '\n';
    if (!json_) {
      throw ConfigError("cannot write --metrics-out " + path + ": " + std::strerror(errno));
    }
    json_path_ = path;
  }
}

void MetricsLog::Json(const std::string& record) {
  if (!json_.is_open()) return;
  errno = 0;
  if (!(json_ << record << '\n' << std::flush)) {
    throw std::runtime_error("cannot write --metrics-out " + json_path_ + ": " +
                             (errno != 0 ? std::strerror(errno) : "write failed") +
                             " (the metrics written so far are in it)");
  }
}

void MetricsLog::Batch(int epoch, int batch, double samples_per_sec, double loss, double accuracy) {
  log_ << Format("Epoch[%d] Batch[%d] Speed: %.2f samples/sec loss=%.6f accuracy=%.6f\n", epoch,
                 batch, samples_per_sec, loss, accuracy)
       << std::flush;
  Json(
      Format("{\"event\":\"batch\",\"rank\":%d,\"epoch\":%d,\"batch\":%d,"
             "\"samples_per_sec\":%.2f,\"loss\":%.6f,\"accuracy\":%.6f}",
             rank_, epoch, batch, samples_per_sec, loss, accuracy));
}

void MetricsLog::EpochEnd(int epoch, const EpochResult& train) {
  // Per batch: compute, and the wait for communication that compute did not hide.
  const double batches = std::max(1, train.batches);
  const double compute_ms = 1e3 * train.compute_seconds / batches;
  const double wait_ms = 1e3 * train.wait_seconds / batches;
  log_ << Format("Epoch[%d] Train-loss=%.6f Train-accuracy=%.6f Time cost=%.3f\n", epoch,
                 train.train.mean_loss(), train.train.accuracy(), train.seconds)
       << Format("Epoch[%d] Batch-time compute_ms=%.3f wait_ms=%.3f\n", epoch, compute_ms, wait_ms)
       << std::flush;
  Json(
      Format("{\"event\":\"epoch\",\"rank\":%d,\"epoch\":%d,\"train_loss\":%.6f,"
             "\"train_accuracy\":%.6f,\"time_cost\":%.3f,\"samples_per_sec\":%.2f,"
             "\"compute_ms_per_batch\":%.3f,\"wait_ms_per_batch\":%.3f}",
             rank_, epoch, train.train.mean_loss(), train.train.accuracy(), train.seconds,
             train.samples_per_sec(), compute_ms, wait_ms));
}

void MetricsLog::TestAccuracy(int epoch, double accuracy) {
  log_ << Format("Epoch[%d] test_accuracy=%.4f\n", epoch, accuracy) << std::flush;
  Json(Format("{\"event\":\"test\",\"rank\":%d,\"epoch\":%d,\"test_accuracy\":%.6f}", rank_, epoch,
              accuracy));
}

void MetricsLog::Final(double test_accuracy, double samples_per_sec) {
  log_ << Format("final test_accuracy=%.4f samples_per_sec=%.0f\n", test_accuracy, samples_per_sec)
       << std::flush;
  Json(Format("{\"event\":\"final\",\"rank\":%d,\"test_accuracy\":%.6f,\"samples_per_sec\":%.2f}",
              rank_, test_accuracy, samples_per_sec));
}

}  // namespace ps::worker
