#include "worker/train_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <vector>

#include "worker/errors.h"
#include "worker/format.h"
#include "worker/model.h"

namespace ps::worker {
namespace {

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

// Names, counts and paths.
void ValidateBasics(const TrainConfig& c) {
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
}

// The optimizer and where it runs.
void ValidateOptimizer(const TrainConfig& c) {
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
}

// The learning-rate schedule, in the epochs the flags give.
void ValidateSchedule(const TrainConfig& c) {
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
}

// What needs the servers' optimizer or a distributed store: checkpoints and compression.
void ValidateStoreFeatures(const TrainConfig& c) {
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

}  // namespace

void ValidateConfig(const TrainConfig& c) {
  ValidateBasics(c);
  ValidateOptimizer(c);
  ValidateSchedule(c);
  ValidateStoreFeatures(c);
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

}  // namespace ps::worker
