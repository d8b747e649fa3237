// ps-train: the training worker. Trains mlp or cnn on Fashion-MNIST through ps::KVStore.
//
// Launched like any MXNet worker: the same command for every role, the role and cluster from
// the DMLC_* environment (KVStore::Create runs the server or scheduler role when DMLC_ROLE says
// so and never returns there).
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "ps/cli/cli.h"
#include "ps/kvstore.h"
#include "ps/src/stderr_log.h"
#include "worker/dataset.h"
#include "worker/errors.h"
#include "worker/run_training.h"
#include "worker/train_config.h"

DEFINE_string(model, "mlp",
              "Model to train: mlp (784-256-128-10) or cnn (2x conv+pool, dense 128, dense 10).");
DEFINE_string(device, "auto",
              "Compute device: auto (a GPU when one is present, else the CPU), cpu, cuda or "
              "cuda:N.");
DEFINE_string(data_dir, ps::worker::kDefaultDataDir,
              "Directory holding the Fashion-MNIST *-idx?-ubyte.gz files.");
DEFINE_int32(batch_size, 64,
             "Samples per batch on each worker (the model's default: mlp 64, cnn 32).");
DEFINE_int32(epochs, 10, "Passes over each worker's shard of the training set.");
DEFINE_double(lr, 0.1,
              "Learning rate. Not given: mlp 0.1, cnn 0.05; a quarter of that with --kvstore "
              "dist_async, 5x with --gradient-compression 2bit or 1bit. The line 'ps-train: "
              "updates:' at the start shows the rate in effect.");
DEFINE_double(momentum, 0.9,
              "Momentum of sgd and nag (0 for plain SGD). Not given: 0.9, or 0 with "
              "--gradient-compression 2bit or 1bit.");
DEFINE_double(wd, 1e-4, "Weight decay.");
DEFINE_string(optimizer, "sgd", "Optimizer: sgd, nag, adam, adagrad or rmsprop.");
DEFINE_string(lr_scheduler, "cosine",
              "Learning-rate schedule, counted in updates as MXNet's: none, factor (x "
              "--lr-factor every --lr-step-epochs), multifactor (x --lr-factor at each of "
              "--lr-step-epochs) or cosine (down to --final-lr at the last epoch).");
DEFINE_double(lr_factor, 0.1, "Rate multiplier per drop (factor, multifactor).");
DEFINE_string(lr_step_epochs, "",
              "factor: E, a drop every E epochs; multifactor: E1,E2,... the epochs after which "
              "the rate drops.");
DEFINE_int32(warmup_epochs, 0, "Linear warm-up from --warmup-begin-lr over this many epochs.");
DEFINE_double(warmup_begin_lr, 0.0, "The warm-up's first rate.");
DEFINE_double(final_lr, 0.0, "cosine: the rate at the end of the last epoch.");
DEFINE_uint64(seed, 1, "Seed of the weight initialization and of the per-epoch shuffles.");
DEFINE_int32(log_interval, 100, "Print a Speedometer line every this many batches.");
DEFINE_string(metrics_out, "",
              "Also write the log records as JSON lines to this file (rank 0's), or to one file "
              "per worker when the path contains {rank}.");
DEFINE_string(kvstore, "dist_sync", "KVStore type: local, dist_sync or dist_async.");
DEFINE_string(checkpoint_dir, "",
              "Save the store (weights and optimizer state) under DIR/epoch-N every "
              "--checkpoint-every epochs and after the last; DIR/LATEST names the newest. On "
              "several hosts DIR must be shared by the servers and the workers.");
DEFINE_int32(checkpoint_every, 1, "Epochs between checkpoints (with --checkpoint-dir).");
DEFINE_bool(resume, false,
            "Start from the checkpoint --checkpoint-dir/LATEST names, at the epoch after it.");
DEFINE_int32(num_examples, 0,
             "Train on the first N training samples only (0: all 60000; more is an error).");
DEFINE_string(gradient_compression, "none",
              "Compress the pushed gradients (dist stores): none, 2bit (MXNet's), 1bit or fp16, "
              "each with error feedback. See docs/kvstore.md, \"Gradient compression\".");
DEFINE_double(compression_threshold, 0.5,
              "2bit (pushes, or pulls with --pull-compression 2bit): the magnitude a value "
              "must reach (with its residual) to be sent. Not given with 2bit: 0.02, on the "
              "scale of a batch's gradients (MXNet's 0.5, the default shown, overshoots).");
DEFINE_string(pull_compression, "none",
              "Compress the pulled weights as changes since this worker's last pull: none, 2bit, "
              "1bit or fp16.");
DEFINE_bool(update_on_kvstore, true,
            "Servers apply the optimizer (push gradients, pull weights). "
            "--no-update-on-kvstore: pull the summed gradients and update on the worker (dist_sync "
            "or local).");

namespace {

constexpr const char* kUsage =
    "ps-train: data-parallel training of a Fashion-MNIST classifier through the parameter "
    "server.\n\n"
    "usage: ps-train [--model mlp|cnn] [--device auto|cpu|cuda] [--data-dir DIR]\n"
    "                [--batch-size N] [--epochs N] [--optimizer NAME] [--lr X] [--momentum X]\n"
    "                [--wd X] [--lr-scheduler TYPE] [--lr-factor X] [--lr-step-epochs E,..]\n"
    "                [--warmup-epochs N] [--warmup-begin-lr X] [--final-lr X] [--seed N]\n"
    "                [--num-examples N] [--log-interval N] [--metrics-out FILE] [--kvstore TYPE]\n"
    "                [--update-on-kvstore | --no-update-on-kvstore]\n"
    "                [--gradient-compression none|2bit|1bit|fp16] [--compression-threshold X]\n"
    "                [--pull-compression none|2bit|1bit|fp16]\n"
    "                [--checkpoint-dir DIR [--checkpoint-every N] [--resume]]\n\n"
    "The role and the cluster come from the environment, as for MXNet: DMLC_ROLE, "
    "DMLC_PS_ROOT_URI,\nDMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER (see "
    "tools/launch.py).\nPS_LOCAL_RANK (launch.py sets it): this worker's index among the workers "
    "on its machine,\nwhich picks its GPU.\n";

// gflags spells a negated boolean --noflag; accept MXNet's --no-flag as well.
std::vector<std::string> NormalizeArgs(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& a : args) {
    if (a.starts_with("--no-")) a = "--no" + a.substr(5);
  }
  return args;
}

// PS_LOCAL_RANK, a non-negative integer (launch.py sets it for each worker).
int ParseLocalRank(const std::string& text) {
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    throw ps::worker::ConfigError("PS_LOCAL_RANK='" + text +
                                  "' is invalid: expected this worker's index (0, 1, ...) among "
                                  "the workers on its machine, or leave it unset");
  }
  return value;
}

// The float flags are read as doubles and used as float32: a value that float32 cannot hold
// would silently become 0, a denormal or infinity (--lr 1e-50 would read as 0, 1e39 as inf).
void CheckFloat32Flags() {
  for (const auto& [flag, value] : {std::pair<const char*, double>{"--lr", FLAGS_lr},
                                    {"--lr-factor", FLAGS_lr_factor},
                                    {"--warmup-begin-lr", FLAGS_warmup_begin_lr},
                                    {"--final-lr", FLAGS_final_lr},
                                    {"--momentum", FLAGS_momentum},
                                    {"--wd", FLAGS_wd},
                                    {"--compression-threshold", FLAGS_compression_threshold}}) {
    const double magnitude = std::fabs(value);
    if (std::isfinite(value) && (magnitude > std::numeric_limits<float>::max() ||
                                 (value != 0.0 && magnitude < std::numeric_limits<float>::min()))) {
      std::ostringstream text;
      text << flag << ' ' << value;
      throw ps::worker::ConfigError(
          text.str() +
          " is outside float32's range (magnitudes from about 1.2e-38 to 3.4e38), in which "
          "ps-train computes");
    }
  }
  // Below 1 as typed, 1 once rounded: ValidateConfig would say "must be in [0, 1)".
  if (FLAGS_momentum < 1.0 && static_cast<float>(FLAGS_momentum) >= 1.0f) {
    std::ostringstream text;
    text.precision(10);
    text << "--momentum " << FLAGS_momentum;
    throw ps::worker::ConfigError(text.str() +
                                  " reads as 1 in float32, in which ps-train computes: give at "
                                  "most 0.9999999 (momentum must stay below 1)");
  }
}

// A launched job's workers with local stores would each train alone and never register: the
// job would wait for them until its timeouts.
void RefuseLocalInAJob(const std::string& kvstore) {
  const char* workers = std::getenv("DMLC_NUM_WORKER");
  if (kvstore != "local" || workers == nullptr || *workers == '\0' ||
      std::string_view(workers) == "1") {
    return;
  }
  throw ps::worker::ConfigError(
      "--kvstore local would train this process alone, but DMLC_NUM_WORKER=" +
      std::string(workers) +
      " says it is one of a job's workers: to train together, use --kvstore dist_sync or "
      "dist_async (or run it outside the job's environment)");
}

// The config the flags give, before the model's defaults and the checks.
ps::worker::TrainConfig ConfigFromFlags() {
  ps::worker::TrainConfig config;
  config.model = FLAGS_model;
  config.device = FLAGS_device;
  config.data_dir = FLAGS_data_dir;
  config.kvstore = FLAGS_kvstore;
  config.update_on_kvstore = FLAGS_update_on_kvstore;
  config.batch_size = FLAGS_batch_size;
  config.epochs = FLAGS_epochs;
  config.lr = static_cast<float>(FLAGS_lr);
  config.optimizer = FLAGS_optimizer;
  config.lr_scheduler = FLAGS_lr_scheduler;
  config.lr_factor = static_cast<float>(FLAGS_lr_factor);
  config.lr_step_epochs = FLAGS_lr_step_epochs;
  config.warmup_epochs = FLAGS_warmup_epochs;
  config.warmup_begin_lr = static_cast<float>(FLAGS_warmup_begin_lr);
  config.final_lr = static_cast<float>(FLAGS_final_lr);
  config.momentum = static_cast<float>(FLAGS_momentum);
  config.weight_decay = static_cast<float>(FLAGS_wd);
  config.seed = FLAGS_seed;
  config.log_interval = FLAGS_log_interval;
  config.metrics_out = FLAGS_metrics_out;
  config.checkpoint_dir = FLAGS_checkpoint_dir;
  config.checkpoint_every = FLAGS_checkpoint_every;
  config.resume = FLAGS_resume;
  config.num_examples = FLAGS_num_examples;
  config.gradient_compression = FLAGS_gradient_compression;
  config.compression_threshold = static_cast<float>(FLAGS_compression_threshold);
  config.pull_compression = FLAGS_pull_compression;
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = NormalizeArgs(argc, argv);
  if (std::any_of(args.begin(), args.end(), ps::cli::IsHelpFlag)) {
    // This program's flags only (not those of the linked libraries), as it spells them.
    ps::cli::PrintFlagHelp(std::cout, kUsage, "train_main.cc", ps::cli::FlagSpelling::kDashes);
    return 0;
  }
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  int n = argc;
  char** ptr = arg_ptrs.data();
  gflags::SetUsageMessage(kUsage);
  gflags::SetVersionString(ps::cli::Version());
  ps::cli::ParseFlags(&n, &ptr);
  ps::internal::SetUpLogging(argv[0]);
  // A file grown past RLIMIT_FSIZE (ulimit -f) fails its write (EFBIG), reported like a full
  // disk, instead of SIGXFSZ ending the process.
  ::signal(SIGXFSZ, SIG_IGN);
  if (n > 1) {
    std::fprintf(stderr, "ps-train: error: unexpected argument '%s' (see --help)\n", ptr[1]);
    return 1;
  }

  ps::worker::TrainConfig config = ConfigFromFlags();

  std::string error;  // the caught failure's words
  try {
    CheckFloat32Flags();
    // Empty means unset, as for every other variable.
    if (const char* local_rank = std::getenv("PS_LOCAL_RANK");
        local_rank != nullptr && *local_rank != '\0') {
      config.local_rank = ParseLocalRank(local_rank);
    }
    // Flags first, so a typo fails fast on every role; then the store (servers and the
    // scheduler stay inside Create), then devices and data, which only workers need.
    // Settings the user did not give take the model's defaults (docs/training.md, "Defaults").
    const auto given = [](std::string_view flag) {
      return !gflags::GetCommandLineFlagInfoOrDie(std::string(flag).c_str()).is_default;
    };
    ps::worker::ApplyModelDefaults(config, given);
    ps::worker::ValidateGivenFlags(config, given);
    ps::worker::ValidateConfig(config);
    RefuseLocalInAJob(config.kvstore);
    std::unique_ptr<ps::KVStore> kv = ps::KVStore::Create(config.kvstore);
    try {
      ps::worker::RunTraining(config, *kv, std::cout);
    } catch (const std::exception& e) {
      kv->ReportFailure(e.what());  // the job ends naming this worker and why, at once
      throw;
    }
    if (!std::cout.flush()) {  // a write failed (a full disk): the log did not all get through
      std::fprintf(stderr,
                   "ps-train: error: cannot write the standard output: the training log, its "
                   "final accuracy included, is incomplete\n");
      return 1;
    }
    return 0;
  } catch (const ps::worker::DataError& e) {
    error = std::string(e.what()) + " (check --data-dir)";
  } catch (const std::bad_alloc&) {
    error =
        "out of memory for the data set, the model or its buffers: lower --batch-size or "
        "--num-examples, or give the process more memory";
  } catch (const std::exception& e) {
    error = e.what();
  }
  ps::internal::FlushStderrLog();  // the log lines before it, then the last word
  std::fprintf(stderr, "ps-train: error: %s\n", error.c_str());
  return 1;
}
