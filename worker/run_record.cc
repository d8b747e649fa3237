#include "worker/run_record.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "kvstore/checkpoint.h"
#include "worker/errors.h"

namespace ps::worker {
namespace {

std::string Path(const std::string& epoch_dir) { return epoch_dir + "/" + kRunRecordName; }

// "key value" per line; values have no newline (names and numbers).
std::map<std::string, std::string> Fields(const RunRecord& r) {
  std::ostringstream momentum;
  momentum << r.momentum;
  std::map<std::string, std::string> fields{
      {"model", r.model},
      {"optimizer", r.optimizer},
      {"momentum", momentum.str()},
      {"kvstore", r.kvstore},
      {"gradient_compression", r.gradient_compression},
      {"workers", std::to_string(r.workers)},
      {"batch_size", std::to_string(r.batch_size)},
      {"examples", std::to_string(r.examples)},
      {"updates_per_epoch", std::to_string(r.updates_per_epoch)},

      {"scheduled", r.scheduled ? "1" : "0"}};
  if (r.updates_done) fields.emplace("updates_done", std::to_string(*r.updates_done));
  if (!r.update_flags.empty()) fields.emplace("update_flags", r.update_flags);
  if (r.seed) fields.emplace("seed", std::to_string(*r.seed));
  return fields;
}

// The whole value, a finite number at least `min`: "3x2", "nan" and "-1" are damage.
template <typename T>
T Number(const std::map<std::string, std::string>& fields, const std::string& key,
         const std::string& path, T min = T{}) {
  const auto it = fields.find(key);
  T value{};
  bool valid = false;
  if (it != fields.end()) {
    const char* const end = it->second.data() + it->second.size();
    const auto [stop, error] = std::from_chars(it->second.data(), end, value);
    valid = error == std::errc() && stop == end && value >= min;  // false for nan
  }
  if (!valid) {
    throw ConfigError("--resume: " + path + " has no valid '" + key +
                      "' line: the file is damaged; delete it to resume without its checks");
  }
  return value;
}

std::string Text(const std::map<std::string, std::string>& fields, const std::string& key,
                 const std::string& path) {
  const auto it = fields.find(key);
  if (it == fields.end() || it->second.empty()) {
    throw ConfigError("--resume: " + path + " has no '" + key +
                      "' line: the file is damaged; delete it to resume without its checks");
  }
  return it->second;
}

// "2 worker(s), --batch-size 64, 4000 examples, --kvstore dist_sync"
std::string UpdateSources(const RunRecord& r) {
  return std::to_string(r.workers) + " worker(s), --batch-size " + std::to_string(r.batch_size) +
         ", " + std::to_string(r.examples) + " examples, --kvstore " + r.kvstore;
}

// "--lr 0.1 --epochs 10" -> {{"--lr", "0.1"}, {"--epochs", "10"}}, in order.
std::vector<std::pair<std::string, std::string>> FlagPairs(const std::string& flags) {
  std::vector<std::pair<std::string, std::string>> pairs;
  std::istringstream in(flags);
  std::string name, value;
  while (in >> name >> value) pairs.emplace_back(name, value);
  return pairs;
}

// The pairs of `flags` that `other` does not hold alike, as "--lr 0.1, --epochs 10".
std::string FlagsNotIn(const std::vector<std::pair<std::string, std::string>>& flags,
                       const std::vector<std::pair<std::string, std::string>>& other) {
  std::string text;
  for (const auto& pair : flags) {
    if (std::ranges::find(other, pair) != other.end()) continue;
    text += (text.empty() ? "" : ", ") + pair.first + " " + pair.second;
  }
  return text;
}

bool HasMomentumBuffers(const RunRecord& r) {
  return (r.optimizer == "sgd" || r.optimizer == "nag") && r.momentum != 0.0f;
}

}  // namespace

void WriteRunRecord(const std::string& epoch_dir, const RunRecord& record) {
  std::string text;
  for (const auto& [key, value] : Fields(record)) text += key + ' ' + value + '\n';
  checkpoint::WriteTextFile(epoch_dir, kRunRecordName, text);
}

std::optional<RunRecord> ReadRunRecord(const std::string& epoch_dir) {
  const std::string path = Path(epoch_dir);
  errno = 0;
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return std::nullopt;
    throw ConfigError("--resume: cannot read " + path + ": " + std::strerror(errno));
  }
  std::map<std::string, std::string> fields;
  std::string line;
  while (std::getline(in, line)) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string key = line.substr(0, space);
    if (!fields.emplace(key, line.substr(space + 1)).second) {
      throw ConfigError("--resume: " + path + " has two '" + key +
                        "' lines: the file is damaged; delete it to resume without its checks");
    }
  }
  RunRecord r;
  r.model = Text(fields, "model", path);
  if (r.model != "mlp" && r.model != "cnn") {  // what --model takes, or the file is damaged
    throw ConfigError("--resume: " + path +
                      " has no valid 'model' line: the file is damaged; "
                      "delete it to resume without its checks");
  }
  r.optimizer = Text(fields, "optimizer", path);
  r.kvstore = Text(fields, "kvstore", path);
  r.gradient_compression = Text(fields, "gradient_compression", path);
  r.momentum = Number<float>(fields, "momentum", path);
  r.workers = Number<int>(fields, "workers", path, 1);
  r.batch_size = Number<int>(fields, "batch_size", path, 1);
  r.examples = Number<int>(fields, "examples", path, 1);
  r.updates_per_epoch = Number<std::uint64_t>(fields, "updates_per_epoch", path);
  if (fields.contains("updates_done")) {
    r.updates_done = Number<std::uint64_t>(fields, "updates_done", path);
  }
  r.scheduled = Number<int>(fields, "scheduled", path) != 0;
  if (fields.contains("update_flags")) r.update_flags = Text(fields, "update_flags", path);
  if (fields.contains("seed")) r.seed = Number<std::uint64_t>(fields, "seed", path);
  return r;
}

void CheckResume(const RunRecord& saved, const RunRecord& now, int epochs_done,
                 const std::string& where) {
  const std::string head = "--resume: " + where + " was written by a job ";
  if (saved.model != now.model) {
    throw ConfigError(head + "of --model " + saved.model + ", this one is --model " + now.model +
                      ": resume with --model " + saved.model +
                      ", or start the new model in another --checkpoint-dir");
  }
  if (saved.optimizer != now.optimizer) {
    throw ConfigError(head + "with --optimizer " + saved.optimizer + ", this one has --optimizer " +
                      now.optimizer + ": the checkpoint holds " + saved.optimizer +
                      "'s state; resume with --optimizer " + saved.optimizer);
  }
  if (HasMomentumBuffers(saved) != HasMomentumBuffers(now)) {
    std::ostringstream momentum;
    momentum << saved.momentum;
    const bool compression_changed = saved.gradient_compression != now.gradient_compression;
    throw ConfigError(
        head + (HasMomentumBuffers(saved) ? "with" : "without") + " momentum (--momentum " +
        momentum.str() + "), this one runs " + (HasMomentumBuffers(now) ? "with" : "without") +
        " it: resume with --momentum " + momentum.str() +
        (compression_changed ? " (--gradient-compression 2bit or 1bit sets --momentum 0 and a "
                               "5x --lr unless they are given; the checkpoint's job had "
                               "--gradient-compression " +
                                   saved.gradient_compression + ")"
                             : ""));
  }
  const std::uint64_t epoch_start = now.updates_per_epoch * static_cast<std::uint64_t>(epochs_done);
  const std::uint64_t counted = saved.UpdatesDone(epochs_done);
  if (now.scheduled && counted != epoch_start) {
    // The servers go on counting from the checkpoint's count; the schedule reads that count
    // in this job's updates per epoch.
    const double read_as =
        now.updates_per_epoch == 0
            ? 0.0
            : static_cast<double>(counted) / static_cast<double>(now.updates_per_epoch);
    std::ostringstream epochs;
    epochs.precision(3);
    epochs << read_as;
    throw ConfigError(
        head + "whose servers counted " + std::to_string(counted) + " updates in its " +
        std::to_string(epochs_done) + " epoch(s) (the last job on it made " +
        std::to_string(saved.updates_per_epoch) + " per epoch: " + UpdateSources(saved) +
        "); this one makes " + std::to_string(now.updates_per_epoch) + " per epoch (" +
        UpdateSources(now) +
        "), so its learning-rate schedule, which counts updates, would take them for " +
        epochs.str() + " epoch(s), not " + std::to_string(epochs_done) +
        ": resume with the workers, --batch-size, --num-examples and --kvstore that trained "
        "those epochs (when one rate trained them all), or with a constant rate "
        "(--lr-scheduler none --warmup-epochs 0)");
  }
}

std::string ResumeNote(const RunRecord& saved, const RunRecord& now, const std::string& where) {
  if (saved.update_flags.empty() || saved.update_flags == now.update_flags) return "";
  const auto then_pairs = FlagPairs(saved.update_flags);
  const auto now_pairs = FlagPairs(now.update_flags);
  const std::string then_text = FlagsNotIn(then_pairs, now_pairs);
  const std::string now_text = FlagsNotIn(now_pairs, then_pairs);
  return "--resume: " + where + " was trained with " +
         (then_text.empty() ? std::string("no such flag") : then_text) + "; this job has " +
         (now_text.empty() ? std::string("none of them") : now_text) +
         ": the updates' step changes from this epoch on (resume with the checkpoint's flags to "
         "go on as its job would have)";
}

std::string SeedNote(const RunRecord& saved, const RunRecord& now, const std::string& where) {
  if (!saved.seed || !now.seed || *saved.seed == *now.seed) return "";
  return "--resume: " + where + " was trained with --seed " + std::to_string(*saved.seed) +
         "; this job has --seed " + std::to_string(*now.seed) +
         ": its epochs are shuffled otherwise from here on (resume with --seed " +
         std::to_string(*saved.seed) + " to go on as its job would have; or " + where +
         " is another job's checkpoint)";
}

std::string CompressionNote(const RunRecord& saved, const RunRecord& now,
                            const std::string& where) {
  if (saved.gradient_compression == "none" || now.gradient_compression != "none") return "";
  return "--resume: " + where + " was trained with --gradient-compression " +
         saved.gradient_compression +
         "; this job has none: the workers' saved push residuals are not used (resume with "
         "--gradient-compression " +
         saved.gradient_compression + " to go on as its job would have)";
}

}  // namespace ps::worker
