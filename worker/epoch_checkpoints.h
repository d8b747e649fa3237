#pragma once
// ps-train's checkpoint directory: --checkpoint-dir holds one epoch-N directory per checkpoint
// (the store's files and the run record) and LATEST, which names the newest complete one.
#include <string>
#include <vector>

namespace ps::worker {

inline constexpr const char* kLatestName = "LATEST";

// "epoch-3": the name of the checkpoint after that many epochs.
std::string EpochName(int epoch);
// dir/epoch-N.
std::string EpochDir(const std::string& dir, int epoch);
// dir/LATEST names the newest complete checkpoint ("epoch-N"). Written after the checkpoint
// itself, by rename, so it never names a checkpoint that is not whole.
void WriteLatest(const std::string& dir, int epoch);
// The epochs the checkpoint LATEST names has finished; throws ConfigError, saying which, when
// LATEST is missing, unreadable, or names no epoch-N directory there.
int ReadLatest(const std::string& dir);
// The checkpoints in `dir`: its epoch-N directories, by N.
std::vector<int> EpochsIn(const std::string& dir);
// "epoch-1, epoch-2" (the last few of many, after "...").
std::string EpochList(const std::vector<int>& epochs);
// Makes `dir` (and its parents) if missing, and checks that this process can write into it
// (LATEST; the servers write the epochs' files there too). Throws ConfigError.
void MakeWritableDir(const std::string& dir);
// A new job (no --resume): throws ConfigError for a `dir` that holds another run's
// checkpoints.
void RefuseEarlierCheckpoints(const std::string& dir);

}  // namespace ps::worker
