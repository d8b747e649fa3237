#pragma once
// Checkpoint files: what KVStore::SaveCheckpoint writes and LoadCheckpoint reads.
//
// A checkpoint is a directory holding one data file per server ("server-R-of-N.psckpt", the
// local store writes one as server 0 of 1) and a MANIFEST naming them with their sizes and
// checksums. Each file is written atomically (a temporary file, fsync, rename, fsync of the
// directory) and the MANIFEST last, the same way: a checkpoint is complete or absent, and a
// crash mid-save leaves the previous one intact.
//
// A data file holds, in this machine's byte order: a magic and format version, the optimizer
// that produced its state (name, hyper-parameters, state buffers per slice), then one record per
// key slice (key, offset, the key's total length, dtype, value bytes, the optimizer's update
// count and state buffers), and an FNV-1a checksum of everything before it. Loading reslices:
// a slice of the loading job is assembled from whichever saved records cover it, so a job with
// another number of servers (another slicing) loads it too.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstore/optimizer.h"
#include "ps/kvstore.h"
#include "ps/tensor.h"

namespace ps::checkpoint {

// One key slice as saved.
struct Record {
  Key key = 0;
  std::uint64_t offset = 0;  // elements into the key
  std::uint64_t total = 0;   // the key's length
  DType dtype = DType::kFloat32;
  std::vector<std::byte> value;  // length * DTypeSize(dtype) bytes
  // Optimizer state: updates applied so far and the state buffers, `buffers` of `length`
  // floats each, one after the other (empty when the slice was never updated).
  std::uint64_t count = 0;
  std::uint32_t buffers = 0;
  std::vector<float> state;

  std::uint64_t length() const { return value.size() / DTypeSize(dtype); }
};

struct Contents {
  // The optimizer whose state the records hold; nullopt: none was set.
  std::optional<OptimizerConfig> optimizer;
  std::vector<Record> records;
};

// The name of server `rank`'s file in a checkpoint of `servers` servers.
std::string DataFileName(int rank, int servers);

// Where a written file ended up and what it holds, for the manifest.
struct FileSummary {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
};

// Called after each piece of a data file's I/O (at most kIoPieceBytes, or a flush to disk):
// how a caller tells work that goes on from a file system that stopped answering.
using IoProgress = std::function<void()>;
constexpr std::size_t kIoPieceBytes = std::size_t{8} << 20;

// One key slice to write, as Record but on bytes the caller holds until Add returns.
struct RecordView {
  Key key = 0;
  std::uint64_t offset = 0;
  std::uint64_t total = 0;
  DType dtype = DType::kFloat32;
  std::span<const std::byte> value;
  std::uint64_t count = 0;
  std::uint32_t buffers = 0;
  std::span<const float> state;
};

class AtomicFile;  // checkpoint.cc

// Writes `dir`/DataFileName(rank, servers) record by record, so that a saving server needs no
// copy of what it holds; atomically: the file appears once Commit() succeeds, and a writer
// destroyed before that leaves no file. Creates `dir` (and its parents) when missing. Throws
// ps::Error naming the file and the system's reason. Add must be called `records` times.
class DataFileWriter {
 public:
  DataFileWriter(const std::string& dir, int rank, int servers,
                 const std::optional<OptimizerConfig>& optimizer, std::uint64_t records,
                 const IoProgress& progress = {});
  ~DataFileWriter();
  DataFileWriter(const DataFileWriter&) = delete;
  DataFileWriter& operator=(const DataFileWriter&) = delete;

  void Add(const RecordView& record);
  FileSummary Commit();

 private:
  std::string name_;
  std::uint64_t records_left_;
  std::unique_ptr<AtomicFile> file_;
};

// Reads and checks one data file against its manifest entry. Throws ps::Error naming the file
// when it is missing, truncated, corrupt, or not what the manifest says.
Contents ReadDataFile(const std::string& dir, const FileSummary& expected,
                      const IoProgress& progress = {});

struct Manifest {
  int servers = 0;
  std::vector<FileSummary> files;  // one per server, in rank order
  // A random number WriteManifest draws for each save (0: none, an older MANIFEST): two saves
  // of the same files still differ, so a push residual file names one save only (ManifestId).
  std::uint64_t save = 0;

  std::string Encode() const;
  // Throws ps::Error naming `source` when `text` is not a manifest of this format.
  static Manifest Parse(const std::string& text, const std::string& source);
};

// `dir`/MANIFEST, written atomically (the checkpoint's commit point), with a fresh `save`
// number, or read whole. After the
// commit WriteManifest removes the data files in `dir` that `manifest` does not list, as far
// as this host sees them (an earlier checkpoint's in the same directory, of a server that died
// since or of another number of servers), and returns their names; one it cannot remove stays.
// `progress` is called after each step: the directory made, the MANIFEST committed, each file
// looked at for removal.
std::vector<std::string> WriteManifest(const std::string& dir, const Manifest& manifest,
                                       const IoProgress& progress = {});
std::string ReadManifestText(const std::string& dir);

// `text` as `dir`/`name`, whole or not at all, also after a power loss: the way the data files
// and the MANIFEST are written (a temporary file in `dir`, flushed, renamed over `name`, the
// directory flushed); for the small files beside a checkpoint (ps-train's LATEST, TRAINING).
// Throws ps::Error naming the file and the system's reason.
void WriteTextFile(const std::string& dir, const std::string& name, std::string_view text);

// --- Push residuals: gradient compression's error feedback, one file per worker ---
// A worker with push compression keeps, per key, what its compressed pushes have not sent yet.
// After the MANIFEST is committed each such worker writes "worker-R.psres" beside it (R: its
// rank), atomically like the data files and closed by a checksum: every compressed key's
// residual, whole, and the MANIFEST's checksum (ManifestId). A file left by an earlier save (a
// crash between the commit and this write) names another MANIFEST, and is not used.
struct Residuals {
  std::uint64_t manifest_id = 0;
  std::string compression;  // the push compression they were kept for, e.g. "2bit threshold=0.5"
  int rank = 0;
  int workers = 0;  // in the saving job
  std::map<Key, std::vector<float>> keys;
};

std::string ResidualFileName(int rank);
// After a save by `workers` workers: removes the residual files of ranks it does not have and
// the temporaries a worker killed mid-write left (no worker writes one while the MANIFEST is
// written). Returns their names; one that cannot go stays (never used: another save's).
std::vector<std::string> RemoveStaleResidualFiles(const std::string& dir, int workers,
                                                  const IoProgress& progress = {});
std::uint64_t ManifestId(std::string_view manifest_text);
// Throws ps::Error naming the file and the system's reason. `progress` as for the data files.
void WriteResidualFile(const std::string& dir, const Residuals& residuals,
                       const IoProgress& progress = {});
// The size of a residual file of `compression_text` bytes of setting and keys of `key_sizes`
// floats: what ReadResidualFile reads at most.
std::uint64_t ResidualFileBytes(std::size_t compression_text,
                                const std::vector<std::size_t>& key_sizes);
// nullopt when `dir` holds no file for `rank`; throws ps::Error naming the file when it is not a
// regular file, longer than `most_bytes`, truncated or corrupt.
std::optional<Residuals> ReadResidualFile(const std::string& dir, int rank,
                                          std::uint64_t most_bytes,
                                          const IoProgress& progress = {});

// The saved records of several files, by key, from which a slice of any layout is assembled.
class Index {
 public:
  void Add(Contents contents);
  const std::optional<OptimizerConfig>& optimizer() const { return optimizer_; }

  // A slice of the loading job, with its value and optimizer state.
  struct Slice {
    std::vector<std::byte> value;
    std::uint64_t count = 0;   // from the saved record holding the slice's first element
    std::vector<float> state;  // buffers x length floats; empty if never updated
    std::uint32_t buffers = 0;
  };
  // Assembles [offset, offset + length) of `key`, which the loading job holds as `total`
  // elements of `dtype`. Throws CheckpointMismatchError when the key is missing, has another
  // length or dtype, or the saved records do not cover the range.
  Slice Assemble(Key key, std::uint64_t offset, std::uint64_t length, std::uint64_t total,
                 DType dtype) const;
  // Whether the records hold every element of [offset, offset + length) of `key`.
  bool Covers(Key key, std::uint64_t offset, std::uint64_t length) const;

 private:
  std::optional<OptimizerConfig> optimizer_;
  std::map<Key, std::vector<Record>> by_key_;  // each key's records sorted by offset
};

// Checks that a job's optimizer can take the state a checkpoint holds: the same optimizer
// (name and state buffers), or neither has one. Throws ps::Error saying what to change.
void CheckOptimizerMatches(const std::optional<OptimizerConfig>& saved,
                           const OptimizerConfig* current);
// Then per slice: its saved state (of `key`) must have as many buffers per element as
// `current` keeps (SGD saved with momentum and loaded without has not). `current` may be null
// only when the slice has no state (CheckOptimizerMatches saw to that). Throws ps::Error naming
// the key.
void CheckStateFits(Key key, const Index::Slice& slice, const Optimizer* current);

}  // namespace ps::checkpoint
