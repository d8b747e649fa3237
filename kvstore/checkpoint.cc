#include "kvstore/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <system_error>
#include <vector>

#include "kvstore/file_size_limit.h"
#include "kvstore/fnv1a.h"
#include "ps/error.h"
#include "ps/src/internal.h"
#include "ps/src/log_text.h"

namespace ps::checkpoint {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'C', 'K', 'P', 'T', '\0', '\1'};
constexpr std::uint32_t kFormatVersion = 1;
constexpr char kResidualMagic[8] = {'P', 'S', 'R', 'E', 'S', 'I', 'D', '\1'};
static_assert(sizeof(kResidualMagic) == sizeof(kMagic));  // CheckedChecksum's shortest file
constexpr std::uint32_t kResidualFormatVersion = 1;
constexpr const char* kManifestName = "MANIFEST";
constexpr const char* kManifestHeader = "ps-checkpoint 1";

std::string SystemError(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Where AtomicFile writes `name` until it commits it.
std::string TemporaryName(const std::string& name, pid_t pid) {
  return "." + name + ".tmp." + std::to_string(pid);
}

// A file that appears under its final name only when Commit() succeeds: written to a temporary
// name in the same directory, flushed to disk, renamed over the final name, and the directory
// flushed. Destroyed uncommitted, it removes the temporary file. Writes go out in pieces of
// at most kIoPieceBytes, each checksummed, written and flushed to disk (fdatasync) before
// `progress` is called: no single step waits for more than a piece, the last flush included.
// (Outside the anonymous namespace: DataFileWriter, in the header, holds one.)
}  // namespace

class AtomicFile {
 public:
  AtomicFile(const std::string& dir, const std::string& name, IoProgress progress = {})
      : final_(dir + "/" + name),
        temporary_(dir + "/" + TemporaryName(name, getpid())),
        dir_(dir),
        progress_(std::move(progress)) {
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(SystemError("cannot create", temporary_));
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temporary_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void Write(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const std::size_t piece = std::min(bytes, kIoPieceBytes);
      CheckFileSizeLimit(size_ + piece, "checkpoint file " + final_);
      checksum_.Add(p, piece);
      for (std::size_t done = 0; done < piece;) {
        const ssize_t written = ::write(fd_, p + done, piece - done);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) throw Error(SystemError("cannot write", temporary_));
        done += static_cast<std::size_t>(written);
      }
      p += piece;
      bytes -= piece;
      size_ += piece;
      unflushed_ += piece;
      if (unflushed_ >= kIoPieceBytes) Flush();
    }
  }
  template <class T>
  void WriteValue(const T& value) {
    Write(&value, sizeof(value));
  }
  std::uint64_t checksum() const { return checksum_.value(); }
  std::uint64_t size() const { return size_; }

  void Commit() {
    Flush();
    if (::fsync(fd_) != 0) throw Error(SystemError("cannot flush", temporary_));
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw Error(SystemError("cannot close", temporary_));
    }
    fd_ = -1;
    if (::rename(temporary_.c_str(), final_.c_str()) != 0) {
      throw Error(SystemError("cannot rename " + temporary_ + " to", final_));
    }
    committed_ = true;
    // The rename is durable only once the directory is.
    const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0) {
      ::fsync(dir_fd);
      ::close(dir_fd);
    }
  }

 private:
  std::string final_;
  std::string temporary_;
  std::string dir_;
  // Flushes what was written to disk, then counts it as progress.
  void Flush() {
    if (unflushed_ > 0 && ::fdatasync(fd_) != 0) {
      throw Error(SystemError("cannot flush", temporary_));
    }
    unflushed_ = 0;
    if (progress_) progress_();
  }

  IoProgress progress_;
  int fd_ = -1;
  bool committed_ = false;
  std::uint64_t size_ = 0;
  std::uint64_t unflushed_ = 0;  // bytes written since the last flush to disk
  Fnv1a checksum_;
};

namespace {

void MakeDirectory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw Error("cannot create the checkpoint directory " + dir + ": " + error.message());
}

// Reads in pieces of at most kIoPieceBytes, each followed by `progress`; at most `most` bytes
// and one more (so that a longer file shows as longer, without reading it all).
std::string ReadWhole(const std::string& path, const std::string& what,
                      const IoProgress& progress = {},
                      std::uint64_t most = std::numeric_limits<std::uint64_t>::max() - 1) {
  const ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(SystemError("cannot open " + what, path));
  std::string bytes;
  struct stat info {};
  if (::fstat(fd.get(), &info) == 0 && info.st_size > 0) {
    bytes.reserve(static_cast<std::size_t>(
        std::min<std::uint64_t>(static_cast<std::uint64_t>(info.st_size), most + 1)));
  }
  std::vector<char> piece(kIoPieceBytes);
  while (bytes.size() <= most) {
    const std::size_t want =
        static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), most + 1 - bytes.size()));
    const ssize_t got = ::read(fd.get(), piece.data(), want);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(SystemError("cannot read " + what, path));
    if (got == 0) break;
    bytes.append(piece.data(), static_cast<std::size_t>(got));
    if (progress) progress();
  }
  return bytes;
}

// A file's bytes end with the checksum of those before them (magic first, 8 bytes, in every
// format here). Throws ps::Error naming `file` when they are too few or the checksum does not
// match; returns it. `progress` after each piece summed.
std::uint64_t CheckedChecksum(const std::string& bytes, const std::string& file,
                              const IoProgress& progress) {
  if (bytes.size() < sizeof(kMagic) + sizeof(std::uint64_t)) {
    throw Error(file + " is too short to be one");
  }
  const std::size_t body = bytes.size() - sizeof(std::uint64_t);
  Fnv1a checksum;
  for (std::size_t at = 0; at < body; at += kIoPieceBytes) {
    checksum.Add(bytes.data() + at, std::min(kIoPieceBytes, body - at));
    if (progress) progress();
  }
  std::uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + body, sizeof(stored));
  if (checksum.value() != stored) throw Error(file + " is corrupt: its checksum does not match");
  return stored;
}

// Reads values out of a data file's bytes; any read past the end is a truncated file.
// Calls `progress` after each kIoPieceBytes read.
class Reader {
 public:
  Reader(const std::string& bytes, std::string path, IoProgress progress = {})
      : bytes_(bytes), path_(std::move(path)), progress_(std::move(progress)) {}
  void Read(void* out, std::size_t bytes) {
    if (bytes > bytes_.size() - position_) {
      throw Error("checkpoint file " + path_ +
                  " is truncated or corrupt (a record runs past "
                  "its end)");
    }
    auto* to = static_cast<char*>(out);
    while (bytes > 0) {
      const std::size_t piece = std::min(bytes, kIoPieceBytes);
      std::memcpy(to, bytes_.data() + position_, piece);
      to += piece;
      bytes -= piece;
      position_ += piece;
      if (progress_ && position_ / kIoPieceBytes != (position_ - piece) / kIoPieceBytes) {
        progress_();
      }
    }
  }
  template <class T>
  T Value() {
    T value;
    Read(&value, sizeof(value));
    return value;
  }
  std::size_t remaining() const { return bytes_.size() - position_; }
  [[noreturn]] void Corrupt(const std::string& what) const {
    throw Error("checkpoint file " + path_ + " is corrupt: " + what);
  }

 private:
  const std::string& bytes_;
  std::string path_;
  IoProgress progress_;
  std::size_t position_ = 0;
};

void WriteOptimizer(AtomicFile& file, const std::optional<OptimizerConfig>& optimizer) {
  file.WriteValue<std::uint8_t>(optimizer ? 1 : 0);
  if (!optimizer) return;
  const OptimizerConfig& c = *optimizer;
  file.WriteValue(static_cast<std::uint32_t>(c.name.size()));
  file.Write(c.name.data(), c.name.size());
  for (const float value : {c.learning_rate, c.momentum, c.weight_decay, c.rescale_grad,
                            c.clip_gradient, c.beta1, c.beta2, c.epsilon}) {
    file.WriteValue(value);
  }
}

std::optional<OptimizerConfig> ReadOptimizer(Reader& in) {
  if (in.Value<std::uint8_t>() == 0) return std::nullopt;
  OptimizerConfig c;
  const auto name_bytes = in.Value<std::uint32_t>();
  if (name_bytes > 64) in.Corrupt("an optimizer name of " + std::to_string(name_bytes) + " bytes");
  c.name.resize(name_bytes);
  in.Read(c.name.data(), name_bytes);
  for (float* value : {&c.learning_rate, &c.momentum, &c.weight_decay, &c.rescale_grad,
                       &c.clip_gradient, &c.beta1, &c.beta2, &c.epsilon}) {
    *value = in.Value<float>();
  }
  return c;
}

// Removes the files in `dir` whose names `doomed` picks; returns their names. One that cannot
// go stays, harmless beside the MANIFEST (never listed, so never read). `progress` after each
// name looked at.
std::vector<std::string> RemoveFilesIf(const std::string& dir,
                                       const std::function<bool(const std::string&)>& doomed,
                                       const IoProgress& progress) {
  std::vector<std::string> removed;
  std::error_code error;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    std::error_code ignored;
    if (doomed(name) && std::filesystem::remove(it->path(), ignored)) removed.push_back(name);
    if (progress) progress();
  }
  return removed;
}

std::vector<std::string> RemoveUnlistedDataFiles(const std::string& dir, const Manifest& manifest,
                                                 const IoProgress& progress) {
  const auto is_data_file = [](const std::string& name) {
    int rank = -1;
    int servers = 0;
    return std::sscanf(name.c_str(), "server-%d-of-%d.psckpt", &rank, &servers) == 2 &&
           name == DataFileName(rank, servers);
  };
  const auto listed = [&](const std::string& name) {
    return std::any_of(manifest.files.begin(), manifest.files.end(),
                       [&](const FileSummary& file) { return file.name == name; });
  };
  // A data file's temporary (".server-0-of-2.psckpt.tmp.PID"), left by a server that exited
  // mid-save: every server's file of this checkpoint is committed by now.
  const auto is_stale_temporary = [&](const std::string& name) {
    const auto tmp = name.find(".psckpt.tmp.");
    return name.starts_with(".") && tmp != std::string::npos &&
           is_data_file(name.substr(1, tmp + 7 - 1));
  };
  return RemoveFilesIf(
      dir,
      [&](const std::string& name) {
        return (is_data_file(name) && !listed(name)) || is_stale_temporary(name);
      },
      progress);
}

}  // namespace

std::string DataFileName(int rank, int servers) {
  return "server-" + std::to_string(rank) + "-of-" + std::to_string(servers) + ".psckpt";
}

DataFileWriter::DataFileWriter(const std::string& dir, int rank, int servers,
                               const std::optional<OptimizerConfig>& optimizer,
                               std::uint64_t records, const IoProgress& progress)
    : name_(DataFileName(rank, servers)), records_left_(records) {
  MakeDirectory(dir);
  file_ = std::make_unique<AtomicFile>(dir, name_, progress);
  file_->Write(kMagic, sizeof(kMagic));
  file_->WriteValue(kFormatVersion);
  WriteOptimizer(*file_, optimizer);
  file_->WriteValue(records);
}

DataFileWriter::~DataFileWriter() = default;

void DataFileWriter::Add(const RecordView& record) {
  if (records_left_ == 0) throw Error("checkpoint file " + name_ + ": more records than declared");
  --records_left_;
  file_->WriteValue(record.key);
  file_->WriteValue(record.offset);
  file_->WriteValue(record.total);
  file_->WriteValue(static_cast<std::uint8_t>(record.dtype));
  file_->WriteValue(static_cast<std::uint64_t>(record.value.size()));
  file_->Write(record.value.data(), record.value.size());
  file_->WriteValue(record.count);
  file_->WriteValue(record.buffers);
  file_->WriteValue(static_cast<std::uint64_t>(record.state.size()));
  file_->Write(record.state.data(), record.state.size() * sizeof(float));
}

FileSummary DataFileWriter::Commit() {
  if (records_left_ != 0) {
    throw Error("checkpoint file " + name_ + ": " + std::to_string(records_left_) +
                " record(s) fewer than declared");
  }
  const std::uint64_t checksum = file_->checksum();
  file_->WriteValue(checksum);
  const std::uint64_t bytes = file_->size();
  file_->Commit();
  return FileSummary{name_, bytes, checksum};
}

Contents ReadDataFile(const std::string& dir, const FileSummary& expected,
                      const IoProgress& progress) {
  const std::string path = dir + "/" + expected.name;
  if (::access(path.c_str(), F_OK) != 0) {
    throw Error("checkpoint file " + path +
                " is missing (the MANIFEST lists it; on several hosts the checkpoint directory "
                "must be one that every server sees)");
  }
  const std::string bytes = ReadWhole(path, "checkpoint file", progress, expected.bytes);
  if (bytes.size() != expected.bytes) {
    throw Error("checkpoint file " + path + " has " + std::to_string(bytes.size()) +
                " bytes, the MANIFEST says " + std::to_string(expected.bytes) +
                ": it is truncated or was replaced");
  }
  if (CheckedChecksum(bytes, "checkpoint file " + path, progress) != expected.checksum) {
    throw Error("checkpoint file " + path + " is corrupt: its checksum does not match");
  }
  Reader in(bytes, path, progress);
  char magic[sizeof(kMagic)];
  in.Read(magic, sizeof(magic));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) in.Corrupt("not a ps checkpoint file");
  if (const auto version = in.Value<std::uint32_t>(); version != kFormatVersion) {
    in.Corrupt("format version " + std::to_string(version) + ", this build reads " +
               std::to_string(kFormatVersion));
  }
  Contents contents;
  contents.optimizer = ReadOptimizer(in);
  const auto records = in.Value<std::uint64_t>();
  for (std::uint64_t r = 0; r < records; ++r) {
    Record record;
    record.key = in.Value<Key>();
    record.offset = in.Value<std::uint64_t>();
    record.total = in.Value<std::uint64_t>();
    const auto dtype = in.Value<std::uint8_t>();
    if (!IsValidDType(dtype)) in.Corrupt("unknown dtype " + std::to_string(dtype));
    record.dtype = static_cast<DType>(dtype);
    const auto value_bytes = in.Value<std::uint64_t>();
    if (value_bytes > in.remaining() || value_bytes % DTypeSize(record.dtype) != 0) {
      in.Corrupt("a value of " + std::to_string(value_bytes) + " bytes");
    }
    record.value.resize(value_bytes);
    in.Read(record.value.data(), value_bytes);
    if (record.offset > record.total || record.length() > record.total - record.offset) {
      in.Corrupt("key " + std::to_string(record.key) + " has a slice outside its length");
    }
    record.count = in.Value<std::uint64_t>();
    record.buffers = in.Value<std::uint32_t>();
    const auto floats = in.Value<std::uint64_t>();
    if (floats > in.remaining() / sizeof(float) ||
        (floats != 0 && floats != std::uint64_t{record.buffers} * record.length())) {
      in.Corrupt("key " + std::to_string(record.key) + " has optimizer state of the wrong size");
    }
    record.state.resize(floats);
    in.Read(record.state.data(), floats * sizeof(float));
    contents.records.push_back(std::move(record));
  }
  if (in.remaining() != sizeof(std::uint64_t)) in.Corrupt("bytes after its last record");
  return contents;
}

std::string Manifest::Encode() const {
  std::string text = std::string(kManifestHeader) + "\nservers " + std::to_string(servers) + "\n";
  if (save != 0) {
    char number[17];
    std::snprintf(number, sizeof(number), "%016llx", static_cast<unsigned long long>(save));
    text += std::string("save ") + number + "\n";
  }
  for (const FileSummary& file : files) {
    char checksum[17];
    std::snprintf(checksum, sizeof(checksum), "%016llx",
                  static_cast<unsigned long long>(file.checksum));
    text += "file " + file.name + " " + std::to_string(file.bytes) + " " + checksum + "\n";
  }
  return text;
}

Manifest Manifest::Parse(const std::string& text, const std::string& source) {
  const auto bad = [&](const std::string& what) {
    return Error("checkpoint manifest " + source + " is not valid: " + what);
  };
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kManifestHeader) {
    throw bad("it does not start with '" + std::string(kManifestHeader) + "'");
  }
  Manifest manifest;
  std::string word;
  if (!std::getline(in, line) || !(std::istringstream(line) >> word >> manifest.servers) ||
      word != "servers") {
    throw bad("no 'servers N' line");
  }
  if (manifest.servers <= 0 || manifest.servers > 65536) {
    throw bad("'" + PrintableText(line, 80) + "' names no server count in 1..65536");
  }
  while (std::getline(in, line)) {
    if (line.starts_with("save ") && manifest.save == 0 && manifest.files.empty()) {
      const std::string number = line.substr(5);
      if (number.size() != 16 ||
          std::from_chars(number.data(), number.data() + number.size(), manifest.save, 16).ptr !=
              number.data() + number.size()) {
        throw bad("malformed line '" + PrintableText(line, 200) + "'");
      }
      continue;
    }
    std::istringstream fields(line);
    FileSummary file;
    std::string checksum;
    if (!(fields >> word >> file.name >> file.bytes >> checksum) || word != "file" ||
        file.name.find('/') != std::string::npos || checksum.size() != 16 ||
        std::from_chars(checksum.data(), checksum.data() + checksum.size(), file.checksum, 16)
                .ptr != checksum.data() + checksum.size()) {
      throw bad("malformed line '" + PrintableText(line, 200) + "'");
    }
    manifest.files.push_back(std::move(file));
  }
  if (manifest.files.size() != static_cast<std::size_t>(manifest.servers)) {
    throw bad(std::to_string(manifest.files.size()) + " files listed for " +
              std::to_string(manifest.servers) + " servers");
  }
  return manifest;
}

std::vector<std::string> WriteManifest(const std::string& dir, const Manifest& manifest,
                                       const IoProgress& progress) {
  MakeDirectory(dir);
  if (progress) progress();
  Manifest numbered = manifest;
  std::random_device random;
  while (numbered.save == 0) {
    numbered.save = (std::uint64_t{random()} << 32) ^ std::uint64_t{random()};
  }
  const std::string text = numbered.Encode();
  AtomicFile file(dir, kManifestName, progress);
  file.Write(text.data(), text.size());
  file.Commit();
  if (progress) progress();
  return RemoveUnlistedDataFiles(dir, manifest, progress);
}

std::string ResidualFileName(int rank) { return "worker-" + std::to_string(rank) + ".psres"; }

std::vector<std::string> RemoveStaleResidualFiles(const std::string& dir, int workers,
                                                  const IoProgress& progress) {
  const auto stale = [&](const std::string& name) {
    int rank = -1;
    if (std::sscanf(name.c_str(), "worker-%d.psres", &rank) == 1 &&
        name == ResidualFileName(rank)) {
      return rank >= workers;
    }
    return name.starts_with(".worker-") && name.find(".psres.tmp.") != std::string::npos;
  };
  return RemoveFilesIf(dir, stale, progress);
}

std::uint64_t ResidualFileBytes(std::size_t compression_text,
                                const std::vector<std::size_t>& key_sizes) {
  std::uint64_t bytes = sizeof(kResidualMagic) + sizeof(kResidualFormatVersion) +
                        sizeof(std::uint64_t) + 2 * sizeof(std::uint32_t) + sizeof(std::uint64_t) +
                        compression_text + sizeof(std::uint64_t) +
                        sizeof(std::uint64_t);  // ... the keys ..., the checksum
  for (const std::size_t size : key_sizes) {
    bytes += sizeof(Key) + sizeof(std::uint64_t) + size * sizeof(float);
  }
  return bytes;
}

std::uint64_t ManifestId(std::string_view manifest_text) {
  Fnv1a checksum;
  checksum.Add(manifest_text.data(), manifest_text.size());
  return checksum.value();
}

void WriteResidualFile(const std::string& dir, const Residuals& residuals,
                       const IoProgress& progress) {
  AtomicFile file(dir, ResidualFileName(residuals.rank), progress);
  file.Write(kResidualMagic, sizeof(kResidualMagic));
  file.WriteValue(kResidualFormatVersion);
  file.WriteValue(residuals.manifest_id);
  file.WriteValue(static_cast<std::uint32_t>(residuals.rank));
  file.WriteValue(static_cast<std::uint32_t>(residuals.workers));
  file.WriteValue(static_cast<std::uint64_t>(residuals.compression.size()));
  file.Write(residuals.compression.data(), residuals.compression.size());
  file.WriteValue(static_cast<std::uint64_t>(residuals.keys.size()));
  for (const auto& [key, values] : residuals.keys) {
    file.WriteValue(key);
    file.WriteValue(static_cast<std::uint64_t>(values.size()));
    file.Write(values.data(), values.size() * sizeof(float));
  }
  const std::uint64_t checksum = file.checksum();
  file.WriteValue(checksum);
  file.Commit();
}

std::optional<Residuals> ReadResidualFile(const std::string& dir, int rank,
                                          std::uint64_t most_bytes, const IoProgress& progress) {
  const std::string path = dir + "/" + ResidualFileName(rank);
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return std::nullopt;
  if (!S_ISREG(status.st_mode)) throw Error("push residual file " + path + " is not a file");
  const std::string bytes = ReadWhole(path, "push residual file", progress, most_bytes);
  if (bytes.size() > most_bytes) {
    throw Error("push residual file " + path + " is larger than this job's residuals can be (" +
                std::to_string(most_bytes) + " bytes)");
  }
  CheckedChecksum(bytes, "push residual file " + path, progress);
  Reader in(bytes, path, progress);
  char magic[sizeof(kResidualMagic)];
  in.Read(magic, sizeof(magic));
  if (std::memcmp(magic, kResidualMagic, sizeof(magic)) != 0) {
    in.Corrupt("not a ps push residual file");
  }
  if (const auto version = in.Value<std::uint32_t>(); version != kResidualFormatVersion) {
    in.Corrupt("format version " + std::to_string(version) + ", this build reads " +
               std::to_string(kResidualFormatVersion));
  }
  Residuals residuals;
  residuals.manifest_id = in.Value<std::uint64_t>();
  residuals.rank = static_cast<int>(in.Value<std::uint32_t>());
  residuals.workers = static_cast<int>(in.Value<std::uint32_t>());
  if (residuals.rank != rank) {
    throw Error("push residual file " + path + " holds worker " + std::to_string(residuals.rank) +
                "'s residuals, not worker " + std::to_string(rank) + "'s (renamed or copied in)");
  }
  const auto text_bytes = in.Value<std::uint64_t>();
  if (text_bytes > in.remaining())
    in.Corrupt("a setting of " + std::to_string(text_bytes) + " bytes");
  residuals.compression.resize(text_bytes);
  in.Read(residuals.compression.data(), text_bytes);
  const auto keys = in.Value<std::uint64_t>();
  for (std::uint64_t k = 0; k < keys; ++k) {
    const Key key = in.Value<Key>();
    const auto floats = in.Value<std::uint64_t>();
    if (floats > in.remaining() / sizeof(float)) {
      in.Corrupt("key " + std::to_string(key) + " has a residual past the file's end");
    }
    std::vector<float>& values = residuals.keys[key];
    values.resize(floats);
    in.Read(values.data(), floats * sizeof(float));
  }
  if (in.remaining() != sizeof(std::uint64_t)) in.Corrupt("bytes after its last key");
  return residuals;
}

void WriteTextFile(const std::string& dir, const std::string& name, std::string_view text) {
  AtomicFile file(dir, name);
  file.Write(text.data(), text.size());
  file.Commit();
}

std::string ReadManifestText(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  struct stat status {};
  if (::stat(dir.c_str(), &status) == 0 && !S_ISDIR(status.st_mode)) {
    throw Error("no checkpoint in " + dir +
                ": it is a file, not a directory (give the "
                "directory SaveCheckpoint wrote, the one that holds " +
                kManifestName + ")");
  }
  if (::access(path.c_str(), F_OK) != 0) {
    throw Error("no checkpoint in " + dir + ": " + kManifestName +
                " is missing (SaveCheckpoint writes it last, so a save that did not finish "
                "leaves none)");
  }
  return ReadWhole(path, "checkpoint manifest");
}

void Index::Add(Contents contents) {
  if (contents.optimizer) optimizer_ = contents.optimizer;
  for (Record& record : contents.records) by_key_[record.key].push_back(std::move(record));
  for (auto& [key, records] : by_key_) {
    std::sort(records.begin(), records.end(),
              [](const Record& a, const Record& b) { return a.offset < b.offset; });
  }
}

bool Index::Covers(Key key, std::uint64_t offset, std::uint64_t length) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return false;
  std::uint64_t next = offset;               // the first element not yet found
  for (const Record& record : it->second) {  // sorted by offset
    if (record.offset <= next && next < record.offset + record.length()) {
      next = record.offset + record.length();
    }
  }
  return next >= offset + length;
}

Index::Slice Index::Assemble(Key key, std::uint64_t offset, std::uint64_t length,
                             std::uint64_t total, DType dtype) const {
  const std::string where = "key " + std::to_string(key) + ": ";
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) throw CheckpointMismatchError(where + "not in the checkpoint");
  const std::vector<Record>& records = it->second;
  if (records.front().total != total || records.front().dtype != dtype) {
    throw CheckpointMismatchError(where + "the checkpoint holds " +
                                  std::to_string(records.front().total) + " x " +
                                  DTypeName(records.front().dtype) + ", this job " +
                                  std::to_string(total) + " x " + DTypeName(dtype));
  }
  const std::size_t element = DTypeSize(dtype);
  Slice slice;
  slice.value.resize(length * element);
  std::uint64_t next = offset;  // the first element not yet filled
  bool first = true;
  for (const Record& record : records) {
    const std::uint64_t begin = record.offset;
    const std::uint64_t end = record.offset + record.length();
    if (end <= next || begin > next || next >= offset + length) continue;
    const std::uint64_t upto = std::min(end, offset + length);
    std::memcpy(slice.value.data() + (next - offset) * element,
                record.value.data() + (next - begin) * element, (upto - next) * element);
    if (first) {
      slice.count = record.count;
      slice.buffers = record.buffers;
      if (!record.state.empty()) slice.state.resize(std::size_t{record.buffers} * length);
      first = false;
    }
    if (!slice.state.empty()) {
      if (record.state.empty() || record.buffers != slice.buffers) {
        throw Error(where + "its saved slices disagree on their optimizer state");
      }
      for (std::uint32_t b = 0; b < slice.buffers; ++b) {
        std::memcpy(slice.state.data() + b * length + (next - offset),
                    record.state.data() + b * record.length() + (next - begin),
                    (upto - next) * sizeof(float));
      }
    }
    next = upto;
  }
  if (next != offset + length) {
    throw CheckpointMismatchError(where + "elements [" + std::to_string(next) + ", " +
                                  std::to_string(offset + length) + ") are not in the checkpoint");
  }
  return slice;
}

void CheckOptimizerMatches(const std::optional<OptimizerConfig>& saved,
                           const OptimizerConfig* current) {
  if (!saved) return;  // values only: any optimizer may go on from them
  if (current == nullptr) {
    throw Error("the checkpoint holds " + saved->name +
                " optimizer state: call SetOptimizer before LoadCheckpoint");
  }
  if (current->name != saved->name) {
    throw Error("the checkpoint holds " + saved->name +
                " optimizer state, this job's optimizer "
                "is " +
                current->name + ": set the same optimizer before LoadCheckpoint");
  }
}

void CheckStateFits(Key key, const Index::Slice& slice, const Optimizer* current) {
  if (slice.state.empty()) return;
  const int buffers = current != nullptr ? current->num_buffers() : 0;
  if (current != nullptr && slice.buffers == static_cast<std::uint32_t>(buffers)) return;
  throw Error("key " + std::to_string(key) + ": the checkpoint keeps " +
              std::to_string(slice.buffers) + " optimizer buffer(s) per element, " +
              (current != nullptr ? current->config().name : std::string("no optimizer")) +
              " as set now keeps " + std::to_string(buffers) +
              " (e.g. SGD saved with momentum, loaded without): set the same optimizer");
}

}  // namespace ps::checkpoint
