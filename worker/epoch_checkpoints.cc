#include "worker/epoch_checkpoints.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include "kvstore/checkpoint.h"
#include "ps/src/log_text.h"
#include "worker/errors.h"

namespace ps::worker {
namespace {

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

}  // namespace

// "epoch-3": the name of the checkpoint after that many epochs.
std::string EpochName(int epoch) { return "epoch-" + std::to_string(epoch); }

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

}  // namespace ps::worker
