#pragma once
// ps-train's training log: Speedometer lines, epoch and test records, the final line.
#include <fstream>
#include <ostream>
#include <string>

#include "worker/sgd_trainer.h"

namespace ps::worker {

// Writes the training log: human lines to `log`, and, when a path is given, the same records
// as JSON lines to a file.
class MetricsLog {
 public:
  // Throws ConfigError when metrics_path cannot be opened; each record that cannot be written
  // later (a full disk) throws std::runtime_error naming the file: the metrics are not lost
  // silently. `append`: add to the file (a resumed job, after the lines of the epochs before).
  MetricsLog(std::ostream& log, const std::string& metrics_path, int rank, bool append = false);
  void Batch(int epoch, int batch, double samples_per_sec, double loss, double accuracy);
  void EpochEnd(int epoch, const EpochResult& train);
  void TestAccuracy(int epoch, double accuracy);
  void Final(double test_accuracy, double samples_per_sec);

 private:
  void Json(const std::string& record);

  std::ostream& log_;  // not owned
  std::ofstream json_;
  std::string json_path_;  // empty: no JSON lines from this worker
  int rank_;
};

}  // namespace ps::worker
