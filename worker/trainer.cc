#include "worker/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>

#include "kvstore/checkpoint.h"
#include "ps/src/log_text.h"
#include "worker/checkpoint_dir_lock.h"
#include "worker/device.h"
#include "worker/errors.h"
#include "worker/run_record.h"

namespace ps::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// printf-style formatting into a std::string (log lines and JSON numbers).
template <typename... Args>
std::string Format(const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string out(static_cast<std::size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, fmt, args...);
  return out;
}

// "4,7" -> {4, 7}; throws ConfigError naming the flag.
std::vector<std::uint64_t> ParseEpochList(const std::string& text) {
  std::vector<std::uint64_t> epochs;
  std::size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::uint64_t value = 0;
    const char* first = text.data() + start;
    const char* last = text.data() + comma;
    const auto [end, ec] = std::from_chars(first, last, value);
    if (ec != std::errc() || end != last || value == 0) {
      throw ConfigError("--lr-step-epochs '" + text +
                        "' is invalid: expected epochs >= 1 separated by commas, e.g. 4,7");
    }
    if (!epochs.empty() && value <= epochs.back()) {
      throw ConfigError("--lr-step-epochs '" + text +
                        "' is invalid: the epochs must increase, e.g. 4,7");
    }
    epochs.push_back(value);
    start = comma + 1;
  }
  return epochs;
}

}  // namespace

void ValidateConfig(const TrainConfig& c) {
  if (c.model != "mlp" && c.model != "cnn") {
    throw ConfigError("unknown --model '" + c.model + "': use " + kModelNames);
  }
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda" &&
      !c.device.starts_with("cuda:")) {
    throw ConfigError("unknown --device '" + c.device + "': use auto, cpu, cuda or cuda:N");
  }
  if (c.kvstore != "local" && c.kvstore != "dist_sync" && c.kvstore != "dist_async") {
    throw ConfigError("unknown --kvstore '" + c.kvstore + "': use local, dist_sync or dist_async");
  }
  if (c.batch_size < 1) throw ConfigError("--batch-size must be >= 1");
  if (c.epochs < 1) throw ConfigError("--epochs must be >= 1");
  if (c.data_dir.empty()) {
    throw ConfigError(std::string("--data-dir is empty: name the directory of the Fashion-MNIST "
                                  "files (default ") +
                      kDefaultDataDir + ")");
  }
  if (!(c.lr > 0.0f) || std::isinf(c.lr)) throw ConfigError("--lr must be a finite number > 0");
  if (!(c.momentum >= 0.0f && c.momentum < 1.0f)) throw ConfigError("--momentum must be in [0, 1)");
  if (!(c.weight_decay >= 0.0f)) throw ConfigError("--wd must be >= 0");
  if (c.log_interval < 1) throw ConfigError("--log-interval must be >= 1");
  if (c.checkpoint_every < 1) throw ConfigError("--checkpoint-every must be >= 1");
  if (c.num_examples < 0) throw ConfigError("--num-examples must be >= 0 (0: the whole set)");
  if (std::error_code error; !c.checkpoint_dir.empty() &&
                             std::filesystem::exists(c.checkpoint_dir, error) &&
                             !std::filesystem::is_directory(c.checkpoint_dir, error)) {
    throw ConfigError("--checkpoint-dir " + c.checkpoint_dir +
                      " is not a directory: name a directory (made if missing)");
  }
  if (c.resume && c.checkpoint_dir.empty()) {
    throw ConfigError("--resume needs --checkpoint-dir, the directory to resume from");
  }
  static const std::vector<std::string> kOptimizers{"sgd", "nag", "adam", "adagrad", "rmsprop"};
  if (std::find(kOptimizers.begin(), kOptimizers.end(), c.optimizer) == kOptimizers.end()) {
    throw ConfigError("unknown --optimizer '" + c.optimizer +
                      "': use sgd, nag, adam, adagrad or rmsprop");
  }
  if (!c.update_on_kvstore && c.kvstore == "dist_async") {
    throw ConfigError(
        "--no-update-on-kvstore needs --kvstore dist_sync or local: dist_async applies each "
        "push as it arrives, so the servers must run the optimizer (--update-on-kvstore, the "
        "default; MXNet refuses it too)");
  }
  if (!c.update_on_kvstore && c.optimizer != "sgd") {
    throw ConfigError(
        "--no-update-on-kvstore runs SGD on the worker: use --update-on-kvstore "
        "for --optimizer " +
        c.optimizer);
  }
  if (c.lr_scheduler != "none" && c.lr_scheduler != "factor" && c.lr_scheduler != "multifactor" &&
      c.lr_scheduler != "cosine") {
    throw ConfigError("unknown --lr-scheduler '" + c.lr_scheduler +
                      "': use none, factor, multifactor or cosine");
  }
  if (c.warmup_epochs < 0) throw ConfigError("--warmup-epochs must be >= 0");
  // What the optimizer's own rules below would say in updates, said in the flags given.
  if ((c.lr_scheduler == "factor" || c.lr_scheduler == "multifactor") && c.lr_step_epochs.empty()) {
    throw ConfigError("--lr-scheduler " + c.lr_scheduler + " needs --lr-step-epochs (" +
                      (c.lr_scheduler == "factor"
                           ? std::string("E: the rate drops every E epochs")
                           : std::string("E1,E2,...: the epochs after which the rate drops")) +
                      ")");
  }
  if (!c.lr_step_epochs.empty() && c.lr_scheduler != "factor" && c.lr_scheduler != "multifactor") {
    throw ConfigError("--lr-step-epochs " + c.lr_step_epochs +
                      " needs --lr-scheduler factor or "
                      "multifactor (it is " +
                      c.lr_scheduler + ", which has no steps): drop one of them");
  }
  if (c.warmup_epochs > 0 && c.warmup_epochs >= c.epochs) {
    throw ConfigError("--warmup-epochs " + std::to_string(c.warmup_epochs) +
                      " must be below --epochs " + std::to_string(c.epochs) +
                      (c.lr_scheduler == "cosine"
                           ? " with --lr-scheduler cosine (it decays over the epochs after the "
                             "warm-up)"
                           : ": the job would end before the rate reaches --lr"));
  }
  // A step at or past the last epoch never happens: the flag would be ignored.
  if ((c.lr_scheduler == "factor" || c.lr_scheduler == "multifactor") &&
      !c.lr_step_epochs.empty()) {
    const std::vector<std::uint64_t> steps = ParseEpochList(c.lr_step_epochs);
    if (steps.back() >= static_cast<std::uint64_t>(c.epochs)) {
      throw ConfigError("--lr-step-epochs " + c.lr_step_epochs + ": epoch " +
                        std::to_string(steps.back()) + " is not below --epochs " +
                        std::to_string(c.epochs) +
                        ", so the rate never drops there: give steps below it, or more --epochs");
    }
  }
  // The optimizer's own rules below, said in flags where a flag alone breaks them.
  if ((c.lr_scheduler == "factor" || c.lr_scheduler == "multifactor") &&
      !(c.lr_factor > 0.0f && c.lr_factor <= 1.0f)) {
    throw ConfigError("--lr-factor " + Format("%g", c.lr_factor) +
                      " must be in (0, 1]: the rate is multiplied by it at each step");
  }
  if (!(c.warmup_begin_lr >= 0.0f) || std::isinf(c.warmup_begin_lr)) {
    throw ConfigError("--warmup-begin-lr must be a finite number >= 0");
  }
  if (c.warmup_epochs > 0 && c.warmup_begin_lr > c.lr) {
    throw ConfigError("--warmup-begin-lr " + Format("%g", c.warmup_begin_lr) + " is above --lr " +
                      Format("%g", c.lr) +
                      ": a warm-up rises to --lr from a lower rate (MXNet refuses it too)");
  }
  if (c.lr_scheduler == "cosine" && !(c.final_lr >= 0.0f && c.final_lr <= c.lr)) {
    throw ConfigError("--final-lr " + Format("%g", c.final_lr) + " must be in [0, --lr " +
                      Format("%g", c.lr) + "]: cosine decays from --lr down to it");
  }
  // The schedule itself is checked by the optimizer's own rules, in updates.
  try {
    ValidateOptimizerConfig(MakeOptimizerConfig(c, 1000, 1.0f));
  } catch (const Error& e) {
    throw ConfigError(std::string("the optimizer flags do not fit together: ") + e.what());
  }
  if (!c.checkpoint_dir.empty() && !c.update_on_kvstore) {
    throw ConfigError(
        "--checkpoint-dir needs --update-on-kvstore: checkpoints keep the optimizer state the "
        "servers hold, and --no-update-on-kvstore keeps momentum on the workers");
  }
  for (const auto& [flag, type] : {std::pair<const char*, const std::string&>{
                                       "--gradient-compression", c.gradient_compression},
                                   {"--pull-compression", c.pull_compression}}) {
    if (type != "none" && type != "2bit" && type != "1bit" && type != "fp16") {
      throw ConfigError(std::string("unknown ") + flag + " '" + type +
                        "': use none, 2bit, 1bit or fp16");
    }
    if (type != "none" && c.kvstore == "local") {
      throw ConfigError(std::string(flag) +
                        " needs --kvstore dist_sync or dist_async: a local store sends nothing "
                        "to compress (MXNet refuses it too)");
    }
  }
  if (!(c.compression_threshold > 0.0f) || std::isinf(c.compression_threshold)) {
    throw ConfigError("--compression-threshold must be a finite number > 0");
  }
}

OptimizerConfig MakeOptimizerConfig(const TrainConfig& c, std::uint64_t updates_per_epoch,
                                    float rescale_grad) {
  OptimizerConfig opt;
  opt.name = c.optimizer;
  opt.learning_rate = c.lr;
  opt.momentum = c.optimizer == "sgd" || c.optimizer == "nag" ? c.momentum : 0.0f;
  opt.weight_decay = c.weight_decay;
  opt.rescale_grad = rescale_grad;
  LRSchedule& s = opt.schedule;
  if (c.lr_scheduler != "none") s.type = c.lr_scheduler;
  s.factor = c.lr_factor;
  const std::vector<std::uint64_t> steps = ParseEpochList(c.lr_step_epochs);
  if (c.lr_scheduler == "factor") s.step = steps.empty() ? 0 : steps.front() * updates_per_epoch;
  if (c.lr_scheduler == "multifactor") {
    for (const std::uint64_t epoch : steps) s.steps.push_back(epoch * updates_per_epoch);
  }
  s.warmup_steps = static_cast<std::uint64_t>(c.warmup_epochs) * updates_per_epoch;
  s.warmup_begin_lr = c.warmup_begin_lr;
  s.max_update = static_cast<std::uint64_t>(c.epochs) * updates_per_epoch;
  s.final_lr = c.final_lr;
  return opt;
}

void ApplyModelDefaults(TrainConfig& c, const std::function<bool(std::string_view)>& given) {
  // Chosen from measured runs (2 workers, 2 servers, dist_sync, CPU, 10 epochs for mlp and
  // 5 for cnn): docs/training.md, "Defaults".
  struct Defaults {
    int batch_size;  // per worker
    float lr;
    float momentum;
    float weight_decay;
    const char* scheduler;
    int warmup_epochs;
  };
  // cnn: twice the updates per epoch of batch 64 take it past 0.91 within 5 epochs.
  const Defaults d = c.model == "cnn" ? Defaults{32, 0.05f, 0.9f, 1e-4f, "cosine", 0}
                                      : Defaults{64, 0.1f, 0.9f, 1e-4f, "cosine", 0};
  // dist_async applies every worker's push at once, from weights a few pushes old: the same
  // rate overshoots (mlp: 0.8730 at 0.1, 0.8842 at 0.025 after 10 epochs).
  const float mode_scale = c.kvstore == "dist_async" ? 0.25f : 1.0f;
  // 2bit and 1bit push sign-like steps that error feedback releases all at once, which
  // momentum 0.9 amplifies tenfold (mlp: 0.10-0.51 accuracy): plain SGD instead, at half the
  // default's effective rate lr / (1 - momentum), and a threshold on the scale of a batch
  // mean's gradient (mlp 10 epochs: 0.8895, as without compression; docs/kvstore.md).
  const bool sign_like = c.gradient_compression == "2bit" || c.gradient_compression == "1bit";
  constexpr float kSignLikeRateScale = 5.0f;
  constexpr float kSignLikeThreshold = 0.02f;
  if (!given("batch_size")) c.batch_size = d.batch_size;
  if (!given("lr")) c.lr = d.lr * mode_scale * (sign_like ? kSignLikeRateScale : 1.0f);
  if (!given("momentum")) c.momentum = sign_like ? 0.0f : d.momentum;
  // The threshold is the step of 2bit pulls too: 0.5 moves every weight by 0.5 per pull.
  if ((sign_like || c.pull_compression == "2bit") && !given("compression_threshold")) {
    c.compression_threshold = kSignLikeThreshold;
  }
  if (!given("wd")) c.weight_decay = d.weight_decay;
  // Step epochs alone mean MXNet's multifactor schedule (its examples' default), not steps the
  // model's default schedule would ignore.
  if (!given("lr_scheduler")) {
    c.lr_scheduler = given("lr_step_epochs") ? "multifactor" : d.scheduler;
  }
  if (!given("warmup_epochs")) c.warmup_epochs = d.warmup_epochs;
}

void ValidateGivenFlags(const TrainConfig& c, const std::function<bool(std::string_view)>& given) {
  // A flag that nothing reads would be ignored without a word.
  if (c.checkpoint_dir.empty() && given("checkpoint_every")) {
    throw ConfigError(
        "--checkpoint-every needs --checkpoint-dir, the directory to write checkpoints to");
  }
  // 1bit's step is the mean magnitude (a scale per slice), 2bit's the threshold.
  if (given("compression_threshold") && c.gradient_compression != "2bit" &&
      c.pull_compression != "2bit") {
    throw ConfigError(
        "--compression-threshold is for 2bit compression (--gradient-compression or "
        "--pull-compression), which this job does not use: drop it or set one of them");
  }
  if (given("lr_factor") && c.lr_scheduler != "factor" && c.lr_scheduler != "multifactor") {
    throw ConfigError("--lr-factor needs --lr-scheduler factor or multifactor (it is " +
                      c.lr_scheduler + ", which has no steps): drop one of them");
  }
  if (given("final_lr") && c.lr_scheduler != "cosine") {
    throw ConfigError("--final-lr is where --lr-scheduler cosine ends (it is " + c.lr_scheduler +
                      "): drop one of them");
  }
  if (given("warmup_begin_lr") && c.warmup_epochs == 0) {
    throw ConfigError(
        "--warmup-begin-lr is where a warm-up starts, and this job has none: give "
        "--warmup-epochs, or drop it");
  }
  if (given("momentum") && c.optimizer != "sgd" && c.optimizer != "nag") {
    throw ConfigError("--momentum is for --optimizer sgd or nag; " + c.optimizer +
                      " keeps its own moments: drop it");
  }
}

namespace {

constexpr const char* kLatestName = "LATEST";

// "epoch-3": the name of the checkpoint after that many epochs.
std::string EpochName(int epoch) { return "epoch-" + std::to_string(epoch); }

// 3 for "epoch-3"; nullopt for anything else.
std::optional<int> EpochOfName(const std::string& name) {
  constexpr std::string_view kPrefix = "epoch-";
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size()) return std::nullopt;
  int epoch = -1;
  const char* end = name.data() + name.size();
  if (std::from_chars(name.data() + kPrefix.size(), end, epoch).ptr != end || epoch < 0) {
    return std::nullopt;
  }
  // As EpochName spells it: "epoch-01" or "epoch-+1" would name epoch-1's directory by another
  // name.
  if (EpochName(epoch) != name) return std::nullopt;
  return epoch;
}

// checkpoint_dir/LATEST names the newest complete checkpoint ("epoch-N"). Written after the
// checkpoint itself, by rename, so it never names a checkpoint that is not whole.
void WriteLatest(const std::string& dir, int epoch) {
  checkpoint::WriteTextFile(dir, kLatestName, EpochName(epoch) + "\n");
}

std::string EpochDir(const std::string& dir, int epoch) { return dir + "/" + EpochName(epoch); }

// The checkpoints in `dir`: its epoch-N directories, by N.
std::vector<int> EpochsIn(const std::string& dir) {
  std::vector<int> epochs;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::optional<int> epoch = EpochOfName(entry.path().filename().string());
    if (epoch && entry.is_directory(error)) epochs.push_back(*epoch);
  }
  std::sort(epochs.begin(), epochs.end());
  return epochs;
}

// "epoch-1, epoch-2" (the last few of many, after "...").
std::string EpochList(const std::vector<int>& epochs) {
  constexpr std::size_t kShown = 4;
  const std::size_t first = epochs.size() > kShown ? epochs.size() - kShown : 0;
  std::string text = first > 0 ? "..." : "";
  for (std::size_t i = first; i < epochs.size(); ++i) {
    text += (text.empty() ? "" : ", ") + EpochName(epochs[i]);
  }
  return text;
}

// The epochs the checkpoint LATEST names has finished; throws, saying which, when LATEST is
// missing, unreadable, or names no epoch-N.
int ReadLatest(const std::string& dir) {
  const std::string path = dir + "/" + kLatestName;
  if (std::error_code error; std::filesystem::is_directory(path, error)) {
    throw ConfigError("--resume: " + path +
                      " is a directory: it must be a file naming a checkpoint such as epoch-3");
  }
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) {
      if (const std::vector<int> epochs = EpochsIn(dir); !epochs.empty()) {
        throw ConfigError("--resume: " + path + " is missing, though " + dir + " holds " +
                          EpochList(epochs) +
                          ": write the name of the one to go on from into it (echo " +
                          EpochName(epochs.back()) + " > " + path + ")");
      }
      throw ConfigError("--resume: no checkpoint in " + dir + " (" + path +
                        " is missing; a job with --checkpoint-dir writes it after its first "
                        "checkpoint)");
    }
    throw ConfigError("--resume: cannot read " + path + ": " + std::strerror(errno));
  }
  std::string name;
  in >> name;
  const std::optional<int> epoch = EpochOfName(name);
  if (!epoch) {
    throw ConfigError("--resume: " + path + " holds '" + PrintableText(name, 40) + "'" +
                      ", not the name of a checkpoint such as epoch-3: write into it the name "
                      "of one of the epoch-N directories in " +
                      dir);
  }
  if (std::error_code error; !std::filesystem::is_directory(EpochDir(dir, *epoch), error)) {
    const std::vector<int> epochs = EpochsIn(dir);
    throw ConfigError("--resume: " + path + " names " + name + ", but " + EpochDir(dir, *epoch) +
                      " does not exist: " +
                      (epochs.empty()
                           ? "no checkpoint is left in " + dir
                           : (epochs.size() == 1 ? "write " : "write the name of one of ") +
                                 EpochList(epochs) + " into it"));
  }
  return *epoch;
}

// Makes `dir` (and its parents) if missing, and checks that this process can write into it
// (LATEST; the servers write the epochs' files there too).
void MakeWritableDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw ConfigError("--checkpoint-dir " + dir + ": cannot create it: " + error.message());
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError("--checkpoint-dir " + dir +
                      ": cannot write into it: " + std::strerror(errno));
  }
}

// A new job (no --resume): refuses a `dir` that holds another run's checkpoints.
void RefuseEarlierCheckpoints(const std::string& dir) {
  // A job started again without --resume would write its epochs over the first job's and move
  // LATEST back, leaving a mix of two runs.
  std::ifstream latest(dir + "/" + kLatestName);
  std::string name;
  if (latest >> name) {
    throw ConfigError("--checkpoint-dir " + dir + " holds checkpoints already (" + kLatestName +
                      " names " + PrintableText(name, 40) +
                      "): add --resume to go on from there, or name an empty directory; a new "
                      "job would write over them");
  }
  // LATEST lost (deleted, a copy without it): the epochs are still another run's.
  if (const std::vector<int> epochs = EpochsIn(dir); !epochs.empty()) {
    throw ConfigError("--checkpoint-dir " + dir + " holds checkpoints already (" +
                      EpochList(epochs) + ", and no " + kLatestName +
                      "): to go on from one, write its name into " + dir + "/" + kLatestName +
                      " and add --resume, or name an empty directory; a new job would write "
                      "over them");
  }
}

// The flags that set each update's step, for the run record: those the optimizer and the
// schedule read, in flag syntax.
std::string UpdateFlags(const TrainConfig& c) {
  std::ostringstream out;
  out << "--lr " << c.lr;
  if (c.optimizer == "sgd" || c.optimizer == "nag") out << " --momentum " << c.momentum;
  out << " --wd " << c.weight_decay << " --lr-scheduler " << c.lr_scheduler;
  if (c.lr_scheduler == "factor" || c.lr_scheduler == "multifactor") {
    out << " --lr-factor " << c.lr_factor << " --lr-step-epochs "
        << (c.lr_step_epochs.empty() ? "''" : c.lr_step_epochs);
  } else if (c.lr_scheduler == "cosine") {
    out << " --final-lr " << c.final_lr << " --epochs " << c.epochs;
  }
  if (c.warmup_epochs > 0) {
    out << " --warmup-epochs " << c.warmup_epochs << " --warmup-begin-lr " << c.warmup_begin_lr;
  }
  return out.str();
}

}  // namespace

// ---- MetricsLog ----

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

// ---- KVTrainer ----

KVTrainer::KVTrainer(const TrainConfig& config, KVStore& kv, Model& model)
    : config_(config),
      kv_(kv),
      model_(model),
      backend_(model.backend()),
      on_device_(model.backend().kind() != DeviceKind::kCPU),
      push_from_device_(on_device_ && config.gradient_compression != "none") {
  std::size_t offset = 0;
  for (const Param* p : model_.params()) {
    offsets_.push_back(offset);
    offset += p->size();
  }
  if (on_device_) push_staging_ = HostArray<float>(backend_, offset);
  // Pulled values need their own buffer on a GPU, and summed gradients always do (they must
  // not overwrite the gradients being pushed).
  if (on_device_ || !config_.update_on_kvstore) pull_staging_ = HostArray<float>(backend_, offset);
  for (int i = 0; i < model_.num_param_layers(); ++i) marks_.push_back(backend_.NewMark());
  layer_keys_.resize(marks_.size());
  pull_pending_.resize(marks_.size(), false);
  push_pending_.resize(marks_.size(), false);
  if (!config_.update_on_kvstore) {
    local_optimizer_ = std::make_unique<SgdOptimizer>(
        model_, SgdOptions{config_.lr, config_.momentum, config_.weight_decay});
  }
}

KVTrainer::~KVTrainer() {
  // Pulls into the buffers (a step that threw, or weights never brought in) and copies into the
  // staging buffers may still be in flight: they must finish before the buffers go.
  try {
    kv_.WaitAll();
  } catch (const std::exception&) {  // already failed: the store reports it to its next caller
  }
  try {
    backend_.Synchronize();
  } catch (const std::exception&) {  // the device failed: nothing left to wait for
  }
}

Tensor KVTrainer::PushSource(std::size_t i) {
  Param& p = *model_.params()[i];
  float* data = on_device_ ? push_staging_.data() + offsets_[i] : p.grad.data();
  return Tensor(data, p.size());
}

Tensor KVTrainer::PullTarget(std::size_t i) {
  Param& p = *model_.params()[i];
  float* data = pull_staging_.size() > 0 ? pull_staging_.data() + offsets_[i] : p.value.data();
  return Tensor(data, p.size());
}

void KVTrainer::Start(std::uint64_t batches_per_epoch) {
  const std::vector<Param*>& params = model_.params();
  std::vector<Key> keys;
  std::vector<Tensor> values;
  // Init reads host memory: on a GPU the initial values go through the push staging buffer.
  for (std::size_t i = 0; i < params.size(); ++i) {
    keys.push_back(static_cast<Key>(i));
    float* data = params[i]->value.data();
    if (on_device_) {
      data = push_staging_.data() + offsets_[i];
      backend_.CopyToHost(data, params[i]->value.data(), params[i]->size() * sizeof(float));
    }
    values.emplace_back(data, params[i]->size());
  }
  kv_.Init(keys, values);
  const bool async = kv_.Type() == "dist_async";
  // A key is updated once per round in dist_sync, once per push of any worker in dist_async;
  // updating on the worker, once per batch.
  updates_per_epoch_ =
      batches_per_epoch *
      (config_.update_on_kvstore && async ? static_cast<std::uint64_t>(kv_.NumWorkers()) : 1);
  // Workers disagree when they were started with other flags: say which ones matter.
  try {
    if (config_.update_on_kvstore) {
      // Each worker pushes its batch-mean gradient, scaled by 1/num_workers: a synchronous
      // round sums num_workers of them into their mean, and in dist_async each push moves the
      // weights by its share, so one learning rate means the same step per sample in both
      // modes.
      kv_.SetOptimizer(MakeOptimizerConfig(config_, updates_per_epoch_,
                                           1.0f / static_cast<float>(kv_.NumWorkers())));
    }
  } catch (const ps::DisagreementError& e) {
    throw ps::DisagreementError(
        "the workers' optimizer settings differ: start every worker with the same --lr, "
        "--momentum, --wd, --optimizer, --lr-scheduler flags, --epochs, --batch-size, "
        "--num-examples, --gradient-compression and --update-on-kvstore or "
        "--no-update-on-kvstore (they set the optimizer, where it runs and its schedule's "
        "length; 2bit and 1bit compression change the default --lr and --momentum); " +
        std::string(e.what()));
  }
  if (!config_.update_on_kvstore) {
    try {
      // The collective the others' SetOptimizer pairs with: a worker started with the other
      // --update-on-kvstore fails here, on every worker, instead of in its first round. Only
      // the mode is compared: each worker's own SGD settings stay its own.
      kv_.Barrier();
    } catch (const ps::DisagreementError& e) {
      throw ps::DisagreementError(
          "this worker updates the weights itself (--no-update-on-kvstore), another worker "
          "set an optimizer on the servers (--update-on-kvstore): start every worker with the "
          "same of the two; " +
          std::string(e.what()));
    }
    local_schedule_ = MakeOptimizerConfig(config_, updates_per_epoch_, 1.0f);
  }
  if (config_.gradient_compression != "none" || config_.pull_compression != "none") {
    kv_.SetGradientCompression({.type = config_.gradient_compression,
                                .threshold = config_.compression_threshold,
                                .pull_type = config_.pull_compression});
  }
  PullWeights();  // everyone starts from the stored (rank 0's) weights
}

void KVTrainer::PullWeights() {
  const std::vector<Param*>& params = model_.params();
  std::vector<Key> keys;
  std::vector<Tensor> outs;
  for (std::size_t i = 0; i < params.size(); ++i) {
    keys.push_back(static_cast<Key>(i));
    outs.emplace_back(on_device_ ? pull_staging_.data() + offsets_[i] : params[i]->value.data(),
                      params[i]->size());
  }
  kv_.Pull(keys, outs);
  kv_.WaitAll();
  if (on_device_) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      backend_.CopyToDevice(params[i]->value.data(), pull_staging_.data() + offsets_[i],
                            params[i]->size() * sizeof(float));
    }
  }
  std::fill(pull_pending_.begin(), pull_pending_.end(), false);  // these values are newer
  std::fill(push_pending_.begin(), push_pending_.end(), false);  // WaitAll waited for them
}

void KVTrainer::SettleWeights() {
  for (std::size_t layer = 0; layer < pull_pending_.size(); ++layer) {
    BringInLayer(layer);
    SettlePush(layer);  // nothing stays in flight past the epoch
  }
}

void KVTrainer::BringInLayer(std::size_t layer) {
  if (!pull_pending_[layer]) return;
  pull_pending_[layer] = false;  // a Wait that throws fails the step: no second try
  const auto start = Clock::now();
  if (StagesPushes()) {
    // The layer's gradients went from push_staging_, which only their next copy rewrites
    // (OnGradientsReady waits for the push first): the weights are all this pass needs, and
    // with replication they come back a replica's round trip before the push's answer.
    push_pending_[layer] = true;  // still in flight, whether the wait returns or throws
    kv_.WaitPulls(layer_keys_[layer]);
  } else {
    // The push's source is the gradient itself, which the backward pass rewrites before any
    // hook runs.
    kv_.Wait(layer_keys_[layer]);
  }
  pull_wait_seconds_ += Seconds(start);
  if (!on_device_) return;  // pulled into the parameters themselves
  // Queued, not waited for: this layer's forward comes after the copy on the stream, and the
  // staging buffer is written again only by this layer's next pull, which its gradients' mark
  // orders after it. Key i is parameter i.
  for (const Key key : layer_keys_[layer]) {
    const auto i = static_cast<std::size_t>(key);
    Param& p = *model_.params()[i];
    backend_.CopyToDeviceAsync(p.value.data(), pull_staging_.data() + offsets_[i],
                               p.size() * sizeof(float));
  }
}

void KVTrainer::SettlePush(std::size_t layer) {
  if (!push_pending_[layer]) return;
  push_pending_[layer] = false;
  const auto start = Clock::now();
  kv_.Wait(layer_keys_[layer]);
  pull_wait_seconds_ += Seconds(start);
}

void KVTrainer::OnGradientsReady(int layer_index, const std::vector<Param*>& params) {
  // Staged gradients take one copy on the way out, into the pinned staging buffer, queued
  // behind the layer's backward; the layer's last push from there is answered first.
  if (StagesPushes()) {
    SettlePush(static_cast<std::size_t>(layer_index));
    for (const Param* p : params) {
      backend_.CopyToHostAsync(push_staging_.data() + offsets_[static_cast<std::size_t>(p->index)],
                               p->grad.data(), p->size() * sizeof(float));
    }
  }
  Backend::StreamMark& ready = *marks_[static_cast<std::size_t>(layer_index)];
  ready.Record();
  pending_.push_back({layer_index, params, &ready});
  PushReadyLayers(false);
}

void KVTrainer::PushReadyLayers(bool wait) {
  while (!pending_.empty()) {
    if (wait) {
      pending_.front().ready->Wait();
    } else if (!pending_.front().ready->Reached()) {
      return;  // the device is still on it: the next hook or the end of the step pushes it
    }
    // Off the queue first: a push that throws must not be sent again by the next call.
    const PendingLayer next = std::move(pending_.front());
    pending_.pop_front();
    PushLayer(next.layer_index, next.params);
  }
}

void KVTrainer::PushLayer(int layer_index, const std::vector<Param*>& params) {
  std::vector<Key> keys;
  std::vector<Tensor> grads;
  std::vector<Tensor> outs;
  for (Param* p : params) {
    const auto i = static_cast<std::size_t>(p->index);
    keys.push_back(static_cast<Key>(i));
    grads.push_back(push_from_device_ ? Tensor(p->grad.data(), p->size(), DType::kFloat32,
                                               Device::CUDA(backend_.ordinal()))
                                      : PushSource(i));
    outs.push_back(PullTarget(i));
  }
  // Later layers finish first; the first layer's keys get the highest priority.
  kv_.Push(keys, grads, -layer_index);
  kv_.Pull(keys, outs, -layer_index);
  if (config_.update_on_kvstore) {
    layer_keys_[static_cast<std::size_t>(layer_index)] = std::move(keys);
    pull_pending_[static_cast<std::size_t>(layer_index)] = true;
  }
}

void KVTrainer::FinishStep() {
  // Updating on the kvstore, the next forward pass brings each layer's weights in.
  if (config_.update_on_kvstore) return;
  kv_.WaitAll();
  // The copies into the model are queued, not waited for: the next step's calls come after
  // them, and pull_staging_ is written again only by pulls that its marks order after them.
  const std::vector<Param*>& params = model_.params();
  // Update locally from the sum of all workers' gradients (dist_sync or local), scaled to
  // their mean.
  const float scale = 1.0f / static_cast<float>(kv_.NumWorkers());
  for (std::size_t i = 0; i < params.size(); ++i) {
    backend_.CopyToDeviceAsync(params[i]->grad.data(), pull_staging_.data() + offsets_[i],
                               params[i]->size() * sizeof(float));
    if (scale != 1.0f) backend_.Scale(params[i]->size(), scale, params[i]->grad.data());
  }
  local_optimizer_->set_learning_rate(LearningRateAt(local_schedule_, ++local_updates_));
  local_optimizer_->Step();
}

EpochResult KVTrainer::TrainEpoch(const Dataset& data, const ShardSampler& sampler, int epoch,
                                  MetricsLog& log) {
  const auto start = Clock::now();
  const std::vector<int> order = sampler.EpochOrder(epoch);
  const auto batch = static_cast<std::size_t>(sampler.batch_size());
  std::vector<float> images(batch * data.sample_size());
  std::vector<std::int32_t> labels(batch);
  const GradReadyHook hook = [this](int layer, const std::vector<Param*>& params) {
    OnGradientsReady(layer, params);
  };
  const WeightsNeededHook weights = [this](int layer, const std::vector<Param*>&) {
    BringInLayer(static_cast<std::size_t>(layer));
  };
  EpochResult result;
  BatchStats interval;  // Speedometer: statistics since the last log line
  auto interval_start = Clock::now();
  for (int b = 0; b < sampler.batches_per_epoch(); ++b) {
    GatherBatch(data, std::span<const int>(order.data() + b * batch, batch), images, labels);
    const auto step_start = Clock::now();
    pull_wait_seconds_ = 0.0;
    const BatchStats stats =
        model_.TrainStep(images.data(), labels.data(), static_cast<int>(batch), hook, weights);
    PushReadyLayers(true);  // the compute ends when the device has every gradient
    const auto computed = Clock::now();
    FinishStep();
    if (config_.stop_on_divergence && !std::isfinite(stats.loss_sum)) {
      // Training on would only spread NaN through the weights: stop and say what to change.
      const long long step = static_cast<long long>(epoch) * sampler.batches_per_epoch() + b + 1;
      const char* loss = std::isnan(stats.loss_sum) ? "nan" : "infinite";  // no "-nan"
      throw DivergenceError(std::string("training diverged: the loss is ") + loss + " at epoch " +
                            std::to_string(epoch) + ", batch " + std::to_string(b + 1) + " (step " +
                            std::to_string(step) + "): lower the learning rate (--lr " +
                            Format("%g", config_.lr) + " now; try " + Format("%g", config_.lr / 2) +
                            ")");
    }
    // The forward pass's waits for weights count as waiting, not computing.
    result.compute_seconds +=
        std::chrono::duration<double>(computed - step_start).count() - pull_wait_seconds_;
    result.wait_seconds += Seconds(computed) + pull_wait_seconds_;
    ++result.batches;
    result.train += stats;
    interval += stats;
    if ((b + 1) % config_.log_interval == 0) {
      const double elapsed = Seconds(interval_start);
      log.Batch(epoch, b + 1, elapsed > 0.0 ? interval.samples / elapsed : 0.0,
                interval.mean_loss(), interval.accuracy());
      interval = BatchStats{};
      interval_start = Clock::now();
    }
  }
  SettleWeights();  // the model holds the epoch's last weights (evaluation, checkpoints)
  backend_.Synchronize();
  result.seconds = Seconds(start);
  return result;
}

// ---- RunTraining ----

TrainSummary RunTraining(const TrainConfig& config, KVStore& kv, std::ostream& log) {
  ValidateConfig(config);
  const int rank = kv.Rank();
  const int workers = kv.NumWorkers();
  // A resumed job adds its lines after those of the epochs before.
  MetricsLog metrics(log, config.metrics_out, rank, config.resume);
  // Several workers on one machine spread over its GPUs.
  std::unique_ptr<Backend> backend =
      CreateBackend(config.device, config.local_rank >= 0 ? config.local_rank : rank);
  Dataset train = LoadFashionMnist(config.data_dir, Split::kTrain);
  if (config.num_examples > train.count) {
    throw ConfigError("--num-examples " + std::to_string(config.num_examples) +
                      " is more than the " + std::to_string(train.count) + " training samples in " +
                      config.data_dir + " (0: all of them)");
  }
  if (config.num_examples > 0 && config.num_examples < train.count) {
    train.count = config.num_examples;
    train.images.resize(train.sample_size() * static_cast<std::size_t>(train.count));
    train.labels.resize(static_cast<std::size_t>(train.count));
  }
  // Found out now, not after the first epoch; after the checks above, so that a run they refuse
  // leaves no directory behind. A resume from a directory not there is refused by ReadLatest.
  std::optional<CheckpointDirLock> lock;  // held for the whole job
  std::error_code missing;
  if (rank == 0 && !config.checkpoint_dir.empty() &&
      (!config.resume || std::filesystem::exists(config.checkpoint_dir, missing))) {
    MakeWritableDir(config.checkpoint_dir);
    lock.emplace(config.checkpoint_dir);
    if (!lock->warning().empty())
      log << "ps-train: note: " << lock->warning() << "\n" << std::flush;
    if (!config.resume) RefuseEarlierCheckpoints(config.checkpoint_dir);
  }
  // Only rank 0 evaluates.
  const Dataset test = rank == 0 ? LoadFashionMnist(config.data_dir, Split::kTest) : Dataset{};
  const ShardSampler sampler(train.count, rank, workers, config.batch_size, config.seed);
  std::unique_ptr<Model> model = BuildModel(config.model, *backend, config.batch_size);
  model->InitParams(config.seed);
  log << "ps-train: rank " << rank << " of " << workers << ", model " << config.model << " ("
      << model->num_weights() << " weights in " << model->params().size() << " keys), device "
      << backend->Name() << ", kvstore " << kv.Type()
      << (config.update_on_kvstore ? ", update on kvstore" : ", update on worker") << ", "
      << sampler.batches_per_epoch() << " batches of " << config.batch_size << " per epoch\n"
      << std::flush;
  if (rank == 0) {  // the defaults depend on the kvstore and the compression: what they came to
    log << "ps-train: updates: --optimizer " << config.optimizer << " " << UpdateFlags(config)
        << "\n"
        << std::flush;
  }

  KVTrainer trainer(config, kv, *model);
  trainer.Start(static_cast<std::uint64_t>(sampler.batches_per_epoch()));
  RunRecord record{.model = config.model,
                   .optimizer = config.optimizer,
                   .momentum = config.momentum,
                   .kvstore = kv.Type(),
                   .gradient_compression = config.gradient_compression,
                   .workers = workers,
                   .batch_size = config.batch_size,
                   .examples = train.count,
                   .updates_per_epoch = trainer.updates_per_epoch(),
                   .updates_done = std::nullopt,  // set at each save
                   .scheduled = config.lr_scheduler != "none" || config.warmup_epochs > 0,
                   .update_flags = UpdateFlags(config),
                   .seed = config.seed};
  int first_epoch = 0;
  std::uint64_t updates_before = 0;  // the servers' update count where this job starts
  if (config.resume) {
    first_epoch = ReadLatest(config.checkpoint_dir);
    const std::string resumed = EpochDir(config.checkpoint_dir, first_epoch);
    // Every worker reads it, so that all refuse alike before the collective load.
    const std::optional<RunRecord> saved = ReadRunRecord(resumed);
    if (saved) CheckResume(*saved, record, first_epoch, resumed);
    // Without a record: as if the same job had written it (record's count is not set yet).
    updates_before = (saved ? *saved : record).UpdatesDone(first_epoch);
    try {
      kv.LoadCheckpoint(resumed);
    } catch (const ps::Error& e) {
      const std::string_view what = e.what();
      // Keys missing or of other sizes: the checkpoint holds another model's parameters.
      const bool other_model = e.kind() == ps::ErrorKind::kCheckpointMismatch;
      ps::ThrowError(
          e.kind(),
          std::string(what) + " (--resume: " + config.checkpoint_dir + "/" + kLatestName +
              " names " + EpochName(first_epoch) +
              (other_model ? ", which holds the parameters of another model than "
                             "this job's --model " +
                                 config.model + ": resume with the --model it was written with"
                           : "") +
              ")");
    }
    trainer.PullWeights();
    log << "ps-train: resumed from " << resumed << " (" << first_epoch << " epoch(s) done"
        << (saved ? ""
                  : "; it has no " + std::string(kRunRecordName) +
                        " record, so the workers, --batch-size and schedule it was trained "
                        "with were not checked")
        << ")\n"
        << std::flush;
    if (saved && first_epoch < config.epochs) {  // notes about training still to come
      for (const std::string& note :
           {ResumeNote(*saved, record, resumed), SeedNote(*saved, record, resumed),
            CompressionNote(*saved, record, resumed)}) {
        if (!note.empty()) log << "ps-train: note: " << note << "\n" << std::flush;
      }
    }
    // LATEST set back by hand: the later checkpoints of the run that went on from this one,
    // which rank 0 writes over.
    std::vector<int> later = rank == 0 ? EpochsIn(config.checkpoint_dir) : std::vector<int>{};
    std::erase_if(later, [&](int epoch) { return epoch <= first_epoch; });
    if (!later.empty()) {
      log << "ps-train: note: --resume: " << config.checkpoint_dir << " holds checkpoints past "
          << EpochName(first_epoch) << " (" << EpochList(later)
          << "): this job writes its own over those it reaches\n"
          << std::flush;
    }
    if (first_epoch >= config.epochs) {
      log << "ps-train: nothing left to train: the checkpoint has " << first_epoch
          << " epoch(s) done and --epochs is " << config.epochs
          << " (raise --epochs to train on); the final accuracy is the checkpoint's\n"
          << std::flush;
    }
  }
  TrainSummary summary;
  double train_seconds = 0.0;
  for (int epoch = first_epoch; epoch < config.epochs; ++epoch) {
    const EpochResult r = trainer.TrainEpoch(train, sampler, epoch, metrics);
    train_seconds += r.seconds;
    metrics.EpochEnd(epoch, r);
    if (rank == 0) {
      summary.test_accuracy = EvaluateDataset(*model, test).accuracy();
      metrics.TestAccuracy(epoch, summary.test_accuracy);
    }
    const int done = epoch + 1;
    if (!config.checkpoint_dir.empty() &&
        (done % config.checkpoint_every == 0 || done == config.epochs)) {
      kv.SaveCheckpoint(EpochDir(config.checkpoint_dir, done));
      if (rank == 0) {
        record.updates_done = updates_before + record.updates_per_epoch *
                                                   static_cast<std::uint64_t>(done - first_epoch);
        WriteRunRecord(EpochDir(config.checkpoint_dir, done), record);
        WriteLatest(config.checkpoint_dir, done);
        log << "ps-train: checkpoint saved to " << EpochDir(config.checkpoint_dir, done) << "\n"
            << std::flush;
      }
    }
  }
  // Resumed with nothing left to train: the loaded model is what the job ends with.
  if (rank == 0 && first_epoch >= config.epochs) {
    summary.test_accuracy = EvaluateDataset(*model, test).accuracy();
  }
  const int trained = std::max(config.epochs - first_epoch, 0);
  const double samples =
      static_cast<double>(workers) * sampler.batches_per_epoch() * config.batch_size * trained;
  summary.samples_per_sec = train_seconds > 0.0 ? samples / train_seconds : 0.0;
  if (rank == 0) metrics.Final(summary.test_accuracy, summary.samples_per_sec);
  kv.Barrier();  // no worker leaves while rank 0 still evaluates
  return summary;
}

}  // namespace ps::worker
