#include "worker/run_training.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/checkpoint_dir_lock.h"
#include "worker/device.h"
#include "worker/epoch_checkpoints.h"
#include "worker/errors.h"
#include "worker/metrics_log.h"
#include "worker/run_record.h"
#include "worker/trainer.h"

namespace ps::worker {

namespace {

// The training set, cut to --num-examples.
Dataset LoadTrainingSet(const TrainConfig& config) {
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
  return train;
}

// Rank 0: makes --checkpoint-dir, checks it can be written, and takes its lock into `lock`; a
// new job also refuses a directory with another run's checkpoints. A resume from a directory
// not there is left to ReadLatest, which names it.
void LockCheckpointDir(const TrainConfig& config, std::optional<CheckpointDirLock>& lock,
                       std::ostream& log) {
  std::error_code missing;
  if (config.checkpoint_dir.empty() ||
      (config.resume && !std::filesystem::exists(config.checkpoint_dir, missing))) {
    return;
  }
  MakeWritableDir(config.checkpoint_dir);
  lock.emplace(config.checkpoint_dir);
  if (!lock->warning().empty()) log << "ps-train: note: " << lock->warning() << "\n" << std::flush;
  if (!config.resume) RefuseEarlierCheckpoints(config.checkpoint_dir);
}

// What a resumed job says about the checkpoint it went on from (epoch-`first_epoch`, with its
// record `saved`, if any) and how this job differs from the one that wrote it (`record`).
void LogResumed(const TrainConfig& config, int rank, int first_epoch,
                const std::optional<RunRecord>& saved, const RunRecord& record, std::ostream& log) {
  const std::string dir = EpochDir(config.checkpoint_dir, first_epoch);
  log << "ps-train: resumed from " << dir << " (" << first_epoch << " epoch(s) done"
      << (saved ? ""
                : "; it has no " + std::string(kRunRecordName) +
                      " record, so the workers, --batch-size and schedule it was trained "
                      "with were not checked")
      << ")\n"
      << std::flush;
  if (saved && first_epoch < config.epochs) {  // notes about training still to come
    for (const std::string& note : {ResumeNote(*saved, record, dir), SeedNote(*saved, record, dir),
                                    CompressionNote(*saved, record, dir)}) {
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

// Where a job starts: after `first_epoch` epochs, with the servers' update count at
// `updates_before`.
struct Resumed {
  int first_epoch = 0;
  std::uint64_t updates_before = 0;
};

// --resume: checks the checkpoint LATEST names against this job (`record`), loads it into the
// store and the model, and notes what differs.
Resumed Resume(const TrainConfig& config, KVStore& kv, KVTrainer& trainer, const RunRecord& record,
               std::ostream& log) {
  const int first_epoch = ReadLatest(config.checkpoint_dir);
  const std::string dir = EpochDir(config.checkpoint_dir, first_epoch);
  // Every worker reads it, so that all refuse alike before the collective load.
  const std::optional<RunRecord> saved = ReadRunRecord(dir);
  if (saved) CheckResume(*saved, record, first_epoch, dir);
  // Without a record: as if the same job had written it (record's count is not set yet).
  const std::uint64_t updates_before = (saved ? *saved : record).UpdatesDone(first_epoch);
  try {
    kv.LoadCheckpoint(dir);
  } catch (const ps::Error& e) {
    const std::string_view what = e.what();
    const std::string latest = config.checkpoint_dir + "/" + kLatestName;
    // Keys missing or of other sizes: the checkpoint holds another model's parameters.
    // Otherwise, where the checkpoint is damaged (ps-train names one in LATEST only once it is
    // whole, so it changed since), an earlier one may still serve.
    std::string why;
    if (e.kind() == ps::ErrorKind::kCheckpointMismatch) {
      why = ", which holds the parameters of another model than this job's --model " +
            config.model + ": resume with the --model it was written with";
    } else {
      std::vector<int> earlier = EpochsIn(config.checkpoint_dir);
      std::erase_if(earlier, [first_epoch](int epoch) { return epoch >= first_epoch; });
      why =
          "; it was whole when ps-train named it there, so if it is damaged, it was damaged "
          "since" +
          (earlier.empty() ? std::string(", and no earlier checkpoint is left to go on from")
                           : ": to go on from an earlier one (" + EpochList(earlier) +
                                 "), write its name into LATEST (echo " +
                                 EpochName(earlier.back()) + " > " + latest + ")");
    }
    ps::ThrowError(e.kind(), std::string(what) + " (--resume: " + latest + " names " +
                                 EpochName(first_epoch) + why + ")");
  }
  trainer.PullWeights();
  LogResumed(config, kv.Rank(), first_epoch, saved, record, log);
  return Resumed{first_epoch, updates_before};
}

// Saves the store into checkpoint_dir/epoch-`done`; rank 0 then writes `record` beside it and
// points LATEST at it.
void SaveEpoch(const std::string& checkpoint_dir, int done, KVStore& kv, const RunRecord& record,
               std::ostream& log) {
  const std::string dir = EpochDir(checkpoint_dir, done);
  kv.SaveCheckpoint(dir);
  if (kv.Rank() != 0) return;
  WriteRunRecord(dir, record);
  WriteLatest(checkpoint_dir, done);
  log << "ps-train: checkpoint saved to " << dir << "\n" << std::flush;
}

}  // namespace

TrainSummary RunTraining(const TrainConfig& config, KVStore& kv, std::ostream& log) {
  ValidateConfig(config);
  const int rank = kv.Rank();
  const int workers = kv.NumWorkers();
  // A resumed job adds its lines after those of the epochs before.
  MetricsLog metrics(log, config.metrics_out, rank, config.resume);
  // Several workers on one machine spread over its GPUs.
  std::unique_ptr<Backend> backend =
      CreateBackend(config.device, config.local_rank >= 0 ? config.local_rank : rank);
  const Dataset train = LoadTrainingSet(config);
  // Found out now, not after the first epoch; after the checks above, so that a run they refuse
  // leaves no directory behind.
  std::optional<CheckpointDirLock> lock;  // held for the whole job
  if (rank == 0) LockCheckpointDir(config, lock, log);
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
  const std::string update_flags = UpdateFlags(config);
  if (rank == 0) {  // the defaults depend on the kvstore and the compression: what they came to
    log << "ps-train: updates: --optimizer " << config.optimizer << " " << update_flags << "\n"
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
                   .update_flags = update_flags,
                   .seed = config.seed};
  const Resumed resumed = config.resume ? Resume(config, kv, trainer, record, log) : Resumed{};
  const int first_epoch = resumed.first_epoch;
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
      record.updates_done =
          resumed.updates_before +
          record.updates_per_epoch * static_cast<std::uint64_t>(done - first_epoch);
      SaveEpoch(config.checkpoint_dir, done, kv, record, log);
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
