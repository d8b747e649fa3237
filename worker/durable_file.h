#pragma once
// A small text file replaced whole or not at all, and kept across a crash: ps-train's
// checkpoint pointers (LATEST) and records (TRAINING) beside the store's own files.
#include <string>
#include <string_view>

namespace ps::worker {

// Writes `text` to `path`.tmp, flushes it to disk, renames it over `path` and flushes the
// directory, so that a reader sees the old file or the new one, also after a power loss.
// Throws std::runtime_error naming the file and the system's reason.
void WriteFileDurably(const std::string& path, std::string_view text);

}  // namespace ps::worker
