// DistKVStore's push residuals in checkpoints: with push compression each worker keeps, per
// key slice, what its compressed pushes have not sent yet (error feedback). A checkpoint
// without them resumes close to, not bit-identical with, a job that never stopped; with them
// the resumed pushes carry exactly what the stopped job's would have. See checkpoint.h.
#include <glog/logging.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kvstore/checkpoint.h"
#include "kvstore/dist/dist_kvstore.h"
#include "ps/src/internal.h"

namespace ps {

void DistKVStore::SaveResiduals(const std::string& dir) {
  if (compression_.push == compression::Codec::kNone) return;
  checkpoint::Residuals residuals;
  residuals.compression = compression::DescribePush(compression_);
  residuals.rank = Rank();
  residuals.workers = NumWorkers();
  const std::string path = dir + "/" + checkpoint::ResidualFileName(Rank());
  try {
    // As the MANIFEST: a file system that stops answering ends the job, not holds it.
    Runtime::SlowWork work = runtime_->BeginSlowWork("writing this worker's push residuals " + path,
                                                     Runtime::SlowWorkThread::kCaller);
    // Committed by worker 0 before every worker learned that the save succeeded.
    residuals.manifest_id = checkpoint::ManifestId(checkpoint::ReadManifestText(dir));
    {
      SharedLock lock(keys_mu_);
      for (const auto& [key, info] : keys_) {
        if (info.compression.empty()) continue;
        std::vector<float>& whole = residuals.keys[key];
        whole.resize(info.size);
        for (std::size_t s = 0; s < info.slices.size(); ++s) {
          info.compression[s]->ExportResidual(whole.data() + info.slices[s].offset);
        }
      }
    }
    checkpoint::WriteResidualFile(dir, residuals, [&work] { work.Progress(); });
  } catch (const std::exception& e) {  // ps::Error, or std::bad_alloc for the copy
    // The model and the optimizer state are saved: the job goes on, and a job resumed from
    // this checkpoint starts this worker's residuals at zero.
    PS_LOG(WARNING) << "worker " << Rank() << ": SaveCheckpoint: " << dir
                    << " is saved, but not this worker's push residuals (" << e.what()
                    << "): a job resumed from it starts them at zero, close to but not "
                       "bit-identical with one that never stopped";
  }
  // SaveCheckpoint returns once every worker's file is written (or given up on): a job that
  // ends after it (ps-train then points LATEST at the checkpoint) leaves them all.
  Barrier();
}

void DistKVStore::LoadResiduals(const std::string& dir) {
  if (compression_.push == compression::Codec::kNone) {
    std::error_code ignored;
    if (std::filesystem::exists(dir + "/" + checkpoint::ResidualFileName(Rank()), ignored)) {
      PS_LOG(WARNING) << "worker " << Rank() << ": LoadCheckpoint: " << dir
                      << " holds push residuals of this worker, but this store has no push "
                         "compression (yet): they are not used (call SetGradientCompression "
                         "before LoadCheckpoint to go on with them)";
    }
    return;
  }
  std::string why_not;  // why the saved residuals are not used; "" when they are
  std::optional<checkpoint::Residuals> saved = ReadUsableResiduals(dir, why_not);
  // Every compressed slice gets the saved residual, or zeros: what a job starting from the
  // checkpoint's weights holds. Zeros need no memory, so a failure (out of memory for a saved
  // one) leaves every slice at zero, not some restored and some as they were.
  std::vector<Key> unsaved;
  try {
    unsaved = ImportResiduals(saved ? &*saved : nullptr);
    residuals_loaded_ = saved.has_value();
  } catch (const std::exception& e) {
    why_not = e.what();
    saved.reset();
    unsaved.clear();
    ImportResiduals(nullptr);
  }
  if (!why_not.empty()) {
    PS_LOG(WARNING) << "worker " << Rank() << ": LoadCheckpoint: this worker's push residuals "
                    << "start at zero: " << why_not
                    << " (the job goes on close to, not bit-identical with, the saved one)";
  } else if (!unsaved.empty()) {
    PS_LOG(WARNING) << "worker " << Rank() << ": LoadCheckpoint: " << unsaved.size()
                    << " key(s), key " << unsaved.front()
                    << " the first, have no saved push residual of their size: they start "
                       "at zero";
  }
  if (saved && saved->workers != NumWorkers() && Rank() == 0) {
    PS_LOG(WARNING) << "worker 0: LoadCheckpoint: " << dir << "'s push residuals were saved by "
                    << saved->workers << " worker(s), this job has " << NumWorkers()
                    << ": each worker takes the residuals of its rank, if saved";
  }
}

std::optional<checkpoint::Residuals> DistKVStore::ReadUsableResiduals(const std::string& dir,
                                                                      std::string& why_not) {
  const std::string current = compression::DescribePush(compression_);
  std::optional<checkpoint::Residuals> saved;
  try {
    std::vector<std::size_t> sizes;  // the most a file of this job's model can hold
    {
      SharedLock lock(keys_mu_);
      for (const auto& [key, info] : keys_) {
        if (!info.compression.empty()) sizes.push_back(info.size);
      }
    }
    constexpr std::size_t kMostSettingBytes = 256;  // DescribePush's text, with room
    Runtime::SlowWork work = runtime_->BeginSlowWork(
        "reading this worker's push residuals in " + dir, Runtime::SlowWorkThread::kCaller);
    const std::uint64_t id = checkpoint::ManifestId(checkpoint::ReadManifestText(dir));
    saved = checkpoint::ReadResidualFile(dir, Rank(),
                                         checkpoint::ResidualFileBytes(kMostSettingBytes, sizes),
                                         [&work] { work.Progress(); });
    if (!saved) {
      why_not = dir + " holds none of worker " + std::to_string(Rank()) +
                " (saved without push compression, or by fewer workers)";
    } else if (saved->manifest_id != id) {
      why_not = dir + "/" + checkpoint::ResidualFileName(Rank()) +
                " belongs to another save than its MANIFEST (one into that directory that "
                "stopped before writing it, a save by more workers, or a file copied in)";
    } else if (saved->compression != current) {
      why_not =
          "they were kept for " + saved->compression + ", this job compresses with " + current;
    }
  } catch (const std::exception& e) {  // ps::Error, or std::bad_alloc
    why_not = e.what();
  }
  if (!why_not.empty()) saved.reset();
  return saved;
}

std::vector<Key> DistKVStore::ImportResiduals(const checkpoint::Residuals* from) {
  std::vector<Key> unsaved;
  SharedLock lock(keys_mu_);
  for (const auto& [key, info] : keys_) {
    if (info.compression.empty()) continue;
    const std::vector<float>* whole = nullptr;
    if (from != nullptr) {
      const auto it = from->keys.find(key);
      if (it != from->keys.end() && it->second.size() == info.size) whole = &it->second;
      if (whole == nullptr) unsaved.push_back(key);
    }
    for (std::size_t s = 0; s < info.slices.size(); ++s) {
      info.compression[s]->ImportResidual(whole != nullptr ? whole->data() + info.slices[s].offset
                                                           : nullptr);
    }
  }
  return unsaved;
}

}  // namespace ps
