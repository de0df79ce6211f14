#include "file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace eagle3::file_io {
namespace {

// Debian's abseil has its own string_view, so std::string_view goes through this explicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string_view KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

bool SameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

}  // namespace

File::File(int fd, std::string path, std::string_view what, const struct stat& st)
    : fd_(fd),
      path_(std::move(path)),
      what_(what),
      size_(static_cast<uint64_t>(st.st_size)),
      mtime_(st.st_mtim),
      dev_(st.st_dev),
      ino_(st.st_ino) {}

File::~File() { Close(); }

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      size_(other.size_),
      mtime_(other.mtime_),
      dev_(other.dev_),
      ino_(other.ino_) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    size_ = other.size_;
    mtime_ = other.mtime_;
    dev_ = other.dev_;
    ino_ = other.ino_;
  }
  return *this;
}

void File::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status File::Compare(const struct stat& st) const {
  if (st.st_dev != dev_ || st.st_ino != ino_) {
    return absl::DataLossError(absl::StrCat(
        path_, ": file changed while loading: replaced by another file since it was opened; "
               "reload the checkpoint once it is no longer being written"));
  }
  if (static_cast<uint64_t>(st.st_size) != size_) {
    return absl::DataLossError(absl::StrCat(path_, ": file changed while loading: it was ",
                                            size_, " bytes when opened and is now ", st.st_size));
  }
  if (!SameTime(st.st_mtim, mtime_)) {
    return absl::DataLossError(
        absl::StrCat(path_,
                     ": file changed while loading: modified after it was opened (same size, "
                     "new modification time); reload once it is no longer being written"));
  }
  return absl::OkStatus();
}

absl::Status File::CheckUnchanged() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(path_, ": cannot stat"));
  return Compare(st);
}

absl::StatusOr<File> File::Reopen() const {
  absl::StatusOr<File> file = OpenRegularFile(path_, what_);
  if (!file.ok()) return file.status();
  struct stat st;
  if (::fstat(file->fd_, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path_, ": cannot stat"));
  }
  absl::Status same = Compare(st);
  if (!same.ok()) return same;
  return file;
}

absl::Status File::ReadAt(uint64_t offset, void* out, size_t n) const {
  uint8_t* dst = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < n) {
    // Linux transfers at most about 2 GiB per call; larger reads loop.
    const ssize_t got = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat(path_, ": cannot read at offset ", offset + done));
    }
    if (got == 0) {
      struct stat st;
      const std::string now = ::fstat(fd_, &st) == 0
                                  ? absl::StrCat(" (the file is now ", st.st_size, " bytes, was ",
                                                 size_, " when opened)")
                                  : std::string();
      return absl::DataLossError(absl::StrCat(path_, ": file changed while loading: expected ", n,
                                              " bytes at offset ", offset, ", read ", done, now));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<File> OpenRegularFile(const std::string& path, std::string_view what) {
  // O_NONBLOCK: opening a FIFO without a writer (or some devices) would otherwise block forever.
  // Whether it is a regular file is decided on the opened descriptor, so no race with a rename.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file (expected a ", Sv(what), ")"));
    }
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot open ", Sv(what)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": is ", Sv(KindOf(st.st_mode)),
                                                      ", not a regular file (expected a ",
                                                      Sv(what), ")"));
  }
  // Regular files never block; clearing the flag keeps later reads plain blocking reads.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot clear O_NONBLOCK"));
  }
  return File(fd, path, what, st);
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                            std::string_view what) {
  absl::StatusOr<File> file = OpenRegularFile(path, what);
  if (!file.ok()) return file.status();
  if (file->size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", file->size(),
                                                   " bytes, over the limit of ", max_bytes,
                                                   " bytes for a ", Sv(what)));
  }
  std::string contents(static_cast<size_t>(file->size()), '\0');
  absl::Status read = file->ReadAt(0, contents.data(), contents.size());
  if (!read.ok()) return read;
  // A file that grew or was rewritten since the open would otherwise be read in part.
  read = file->CheckUnchanged();
  if (!read.ok()) return read;
  return contents;
}

}  // namespace eagle3::file_io
