#pragma once
// What ps-train records beside each checkpoint (checkpoint_dir/epoch-N/TRAINING): the flags
// that decide what the servers' files mean. The store's checkpoint holds values, optimizer
// state and update counts; whether a job can go on from them depends on ps-train's flags
// too. The learning-rate schedule counts updates, so a resumed job that makes another number
// of updates per epoch (other workers, batch size, examples or kvstore type) would find its
// schedule elsewhere than its epoch; and another model or optimizer is better named by its
// flag than by the store's error. CheckResume compares the record with the job resuming.
//
// Written by rank 0 after the checkpoint's files, read by every worker before LoadCheckpoint.
// A checkpoint without the file (from an older ps-train, or written through the API) is
// resumed without these checks.
#include <cstdint>
#include <optional>
#include <string>

namespace ps::worker {

struct RunRecord {
  std::string model;
  std::string optimizer;
  float momentum = 0.0f;  // sgd and nag keep momentum buffers when it is not 0
  std::string kvstore;
  std::string gradient_compression;
  int workers = 0;
  int batch_size = 0;
  int examples = 0;  // training samples each epoch goes through (--num-examples, or all)
  // Optimizer updates of a key per epoch: batches per worker, times the workers in dist_async
  // (each push is an update there).
  std::uint64_t updates_per_epoch = 0;
  // The servers' update count at the checkpoint: every epoch's updates since the job that
  // started the chain of resumes, each at the rate of the job that trained it. Unset in a
  // record without the line: as if one rate had trained every epoch.
  std::optional<std::uint64_t> updates_done;

  std::uint64_t UpdatesDone(int epochs_done) const {
    return updates_done.value_or(updates_per_epoch * static_cast<std::uint64_t>(epochs_done));
  }
  // Whether the job's learning rate depends on the update count (a schedule or a warm-up).
  bool scheduled = false;
  // The flags that set each update's step, as "--lr 0.1 --momentum 0.9 ..." (UpdateFlags in
  // trainer.cc); empty in a record without the line.
  std::string update_flags;
  // --seed: the weights' initialization and each epoch's shuffles; unset in a record without
  // the line.
  std::optional<std::uint64_t> seed;
};

inline constexpr const char* kRunRecordName = "TRAINING";

// Writes epoch_dir/TRAINING (checkpoint::WriteTextFile: whole or not at all). Throws
// ps::Error naming the file.
void WriteRunRecord(const std::string& epoch_dir, const RunRecord& record);
// epoch_dir/TRAINING, or nullopt when there is none. Throws ConfigError when it cannot be
// read or parsed.
std::optional<RunRecord> ReadRunRecord(const std::string& epoch_dir);
// Throws ConfigError, naming the flag to change, when the job `now` cannot go on from a
// checkpoint recorded as `saved` after `epochs_done` epochs: another model or optimizer,
// momentum buffers where there are none (or the reverse), or another number of updates per
// epoch under a schedule (the servers' count, saved.updates_done, is not where this job's
// schedule puts epoch epochs_done). `where` names the checkpoint in the message.
void CheckResume(const RunRecord& saved, const RunRecord& now, int epochs_done,
                 const std::string& where);
// A note for a job resuming from `where` with other update flags than the job that wrote it
// (the step changes at the resume, which may be meant: a lower --lr to fine-tune, more
// --epochs of a cosine schedule), naming the flags that differ; "" when none does or the
// record has no update_flags line.
std::string ResumeNote(const RunRecord& saved, const RunRecord& now, const std::string& where);
// A note for a job resuming with another --seed than the job that wrote `where` (its later
// epochs are shuffled otherwise; or `where` is another job's checkpoint); "" when the seeds
// agree or the record has no seed line.
std::string SeedNote(const RunRecord& saved, const RunRecord& now, const std::string& where);
// A note for a job resuming without the push compression `where` was trained with: the
// workers' saved residuals are not used; "" otherwise (another compression is logged by the
// store when it loads).
std::string CompressionNote(const RunRecord& saved, const RunRecord& now, const std::string& where);

}  // namespace ps::worker
