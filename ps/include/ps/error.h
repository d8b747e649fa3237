#pragma once
// The exceptions the library throws for anything a user or a peer can cause: ps::Error, and
// for the failures a caller may act on, subclasses it can catch by type. A failure met on
// another node (a server, the scheduler, another worker's part of a collective) keeps its
// kind on the way to the caller: it travels with the error's text.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ps {

// What an Error reports, for the subclasses below (its wire value too: append only).
enum class ErrorKind : std::uint8_t {
  kOther = 0,
  kDisagreement = 1,        // DisagreementError
  kCheckpointMismatch = 2,  // CheckpointMismatchError
};
inline constexpr std::uint8_t kErrorKinds = 3;

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  ErrorKind kind() const { return kind_; }

 protected:
  Error(const std::string& what, ErrorKind kind) : std::runtime_error(what), kind_(kind) {}

 private:
  ErrorKind kind_ = ErrorKind::kOther;
};

// The members of a collective call (Init, SetOptimizer, SetGradientCompression, Barrier, the
// checkpoint calls) called different things: other arguments or settings (the workers were
// started with other flags?) or another call. Thrown on every member.
class DisagreementError : public Error {
 public:
  explicit DisagreementError(const std::string& what) : Error(what, ErrorKind::kDisagreement) {}
};

// LoadCheckpoint: the checkpoint holds other parameters than this job's keys (a key missing, of
// another size or type): another model's checkpoint. Thrown on every worker.
class CheckpointMismatchError : public Error {
 public:
  explicit CheckpointMismatchError(const std::string& what)
      : Error(what, ErrorKind::kCheckpointMismatch) {}
};

// Throws `what` as the exception of `kind`: how a failure that came from another node, or is
// told again in other words, keeps its type.
[[noreturn]] inline void ThrowError(ErrorKind kind, const std::string& what) {
  switch (kind) {
    case ErrorKind::kDisagreement:
      throw DisagreementError(what);
    case ErrorKind::kCheckpointMismatch:
      throw CheckpointMismatchError(what);
    case ErrorKind::kOther:
      break;
  }
  throw Error(what);
}

}  // namespace ps
