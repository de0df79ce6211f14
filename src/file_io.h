// Reading untrusted files without hanging or dying on a signal. Private to src/.
//
// Every model file (safetensors, index, config.json, tokenizer.json) is opened through
// OpenRegularFile: the open itself never blocks (O_NONBLOCK, so a FIFO with no writer or a device
// returns at once), and anything but a regular file is refused before a byte is read. Contents are
// read with pread into owned memory, never memory-mapped: a file truncated or rewritten under the
// loader then gives a short read or a changed size / modification time, reported as DataLoss,
// instead of SIGBUS.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace eagle3::file_io {

// A regular file: its identity when opened (device, inode, size, modification time) and, while
// open, a read-only descriptor, closed on destruction or Close(). Move-only.
class File {
 public:
  File() = default;
  File(int fd, std::string path, std::string_view what, const struct stat& st);
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  // Size when opened.
  uint64_t size() const { return size_; }

  // Closes the descriptor, keeping the identity for Reopen: a long-lived reader then holds no
  // descriptor between reads (many shards times many in-process ranks would exhaust them).
  void Close();

  // Opens the path again as OpenRegularFile does and checks it is the same file, unchanged:
  // DataLoss "<path>: file changed while loading: ..." when it was replaced (another inode) or its
  // size or modification time differ from when it was first opened.
  absl::StatusOr<File> Reopen() const;

  // Reads exactly `n` bytes at file offset `offset` into `out`. A short read (the file shrank) is
  // DataLoss "<path>: file changed while loading: expected <n> bytes at offset <offset>, read
  // <m> ...". Thread-safe: pread has no shared file position. Requires an open descriptor.
  absl::Status ReadAt(uint64_t offset, void* out, size_t n) const;

  // DataLoss unless the open file still has the size and modification time seen at open. Readers
  // call it after a unit of reads (a whole tensor), so a file rewritten in place, even at the same
  // size, is reported rather than loaded half old, half new. One fstat.
  absl::Status CheckUnchanged() const;

 private:
  // DataLoss naming what differs between `st` and the identity recorded at open; OK if nothing.
  absl::Status Compare(const struct stat& st) const;

  int fd_ = -1;
  std::string path_;
  std::string what_;
  uint64_t size_ = 0;
  struct timespec mtime_ = {};
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Opens `path` read-only without blocking and refuses non-regular files. `what` names the expected
// content in messages ("safetensors file", "config.json"). Errors: NotFound "<path>: no such file
// (expected a <what>)", PermissionDenied and others "<path>: cannot open <what>: <strerror>",
// FailedPrecondition "<path>: is a directory, not a regular file" (or "a FIFO", ...).
absl::StatusOr<File> OpenRegularFile(const std::string& path, std::string_view what);

// The whole file as bytes: OpenRegularFile, then refuses files over `max_bytes` (InvalidArgument
// naming both sizes), then reads it with a check that it did not change meanwhile.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                            std::string_view what);

}  // namespace eagle3::file_io
