#include "eagle3/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "eagle3/safetensors.h"
#include "eagle3/status.h"
#include "nlohmann/json.hpp"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;

absl::Status CheckTensors(std::span<const NamedTensor> tensors, const std::string& path) {
  std::set<std::string_view> names;
  for (const NamedTensor& t : tensors) {
    const std::string where = absl::StrCat("tensor '", t.name, "' for '", path, "'");
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("empty tensor name for '", path, "'"));
    }
    if (t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is reserved for safetensors metadata"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate ", where));
    }
    if (!t.tensor.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is ", t.tensor.ToString(), "; only host tensors can be written"));
    }
    if (!t.tensor.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is not contiguous (strides ", t.tensor.strides().ToString(), ")"));
    }
    for (int i = 0; i < t.tensor.rank(); ++i) {
      if (t.tensor.dim(i) < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " has negative shape ", t.tensor.shape().ToString()));
      }
    }
    if (t.tensor.data() == nullptr && t.tensor.numel() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has null data"));
    }
  }
  return absl::OkStatus();
}

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Where the output goes: `path`, or the file its final symbolic link names (the link is kept, as
// writing through it in place would), with the existing file's status when there is one.
struct OutputTarget {
  std::string path;
  bool exists = false;
  struct stat st = {};
};

absl::StatusOr<OutputTarget> ResolveOutput(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("output path is empty");
  OutputTarget target;
  target.path = path;
  struct stat lst = {};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOENT) return target;
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat output '", path, "'"));
  }
  if (S_ISLNK(lst.st_mode)) {
    std::error_code ec;
    const fs::path resolved = fs::canonical(path, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", path, "' is a symbolic link that does not resolve: ", ec.message()));
    }
    target.path = resolved.string();
    if (::stat(target.path.c_str(), &target.st) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat output '", path, "' (", target.path, ")"));
    }
  } else {
    target.st = lst;
  }
  target.exists = true;
  return target;
}

// The (device, inode) of every file `inputs` name; a directory stands for itself and every regular
// file directly in it (a checkpoint directory: config.json, shards, tokenizer.json).
std::set<std::pair<dev_t, ino_t>> InputIds(std::span<const std::string> inputs) {
  std::set<std::pair<dev_t, ino_t>> ids;
  for (const std::string& input : inputs) {
    struct stat st = {};
    if (input.empty() || ::stat(input.c_str(), &st) != 0) continue;
    ids.insert({st.st_dev, st.st_ino});
    if (!S_ISDIR(st.st_mode)) continue;
    std::error_code ec;
    for (fs::directory_iterator it(input, ec), end; !ec && it != end; it.increment(ec)) {
      struct stat entry = {};
      if (::stat(it->path().c_str(), &entry) == 0 && S_ISREG(entry.st_mode)) ids.insert({entry.st_dev, entry.st_ino});
    }
  }
  return ids;
}

absl::StatusOr<OutputTarget> CheckOutput(const std::string& path, std::span<const std::string> inputs) {
  EAGLE3_ASSIGN_OR_RETURN(OutputTarget target, ResolveOutput(path));
  if (!target.exists) return target;
  const std::string named =
      target.path == path ? absl::StrCat("'", path, "'") : absl::StrCat("'", path, "' (", target.path, ")");
  if (!S_ISREG(target.st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("output ", named, " is ", FileKind(target.st.st_mode),
                                                   "; refusing to replace it with a regular file"));
  }
  if (InputIds(inputs).count({target.st.st_dev, target.st.st_ino}) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", named, " is one of the input files it is computed from; refusing to overwrite it"));
  }
  // Replacing a file goes through its directory, not the file, so permission bits alone would let
  // a read-only file be replaced (and come back writable): refuse it instead, as a user who wrote
  // it protected it.
  if ((target.st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 || ::access(target.path.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("output ", named, " is read-only; refusing to replace it"));
  }
  return target;
}

// A temporary file in the destination's directory, under a short fixed-length name (any legal
// destination name fits NAME_MAX with it); removed on destruction unless committed (renamed).
class TempFile {
 public:
  explicit TempFile(std::string destination) : destination_(std::move(destination)) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (created_ && !committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  // Created with `mode` when given (an existing destination's permission bits, kept across the
  // replacement), else 0666 less the umask as for any new file.
  absl::Status Create(std::optional<mode_t> mode) {
    static std::atomic<uint64_t> counter{0};
    const fs::path dir = fs::path(destination_).parent_path();
    for (int attempt = 0; attempt < 64; ++attempt) {
      const uint64_t seed = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
                            static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                            (counter.fetch_add(1) << 40);
      char name[32];
      std::snprintf(name, sizeof(name), ".eagle3-%012llx.tmp",
                    static_cast<unsigned long long>(seed & 0xFFFFFFFFFFFFull));
      path_ = (dir / name).string();
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) break;
      if (errno != EEXIST) {
        return absl::ErrnoToStatus(
            errno, absl::StrCat("cannot create a temporary file '", path_, "' for '", destination_, "'"));
      }
    }
    if (fd_ < 0) {
      return absl::AlreadyExistsError(absl::StrCat("no free temporary name next to '", destination_, "'"));
    }
    created_ = true;
    if (mode.has_value() && ::fchmod(fd_, *mode) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot set the mode of '", path_, "'"));
    }
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path_, "' for '", destination_, "'"));
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  // Flushes to disk and closes, then renames over the destination.
  absl::Status Commit() {
    if (::fsync(fd_) != 0)
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync '", path_, "'"));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0)
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot close '", path_, "'"));
    if (::rename(path_.c_str(), destination_.c_str()) != 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("cannot rename '", path_, "' to '", destination_, "'"));
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  std::string destination_;
  std::string path_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
};

// Writes `parts` in order to a temporary next to `path` and renames it over `path`, after
// CheckOutput.
absl::Status WriteAtomically(const std::string& path, std::span<const std::string_view> parts,
                             std::span<const std::string> inputs) {
  EAGLE3_ASSIGN_OR_RETURN(const OutputTarget target, CheckOutput(path, inputs));
  TempFile temp(target.path);
  EAGLE3_RETURN_IF_ERROR(
      temp.Create(target.exists ? std::optional<mode_t>(target.st.st_mode & 07777) : std::nullopt));
  for (const std::string_view part : parts) EAGLE3_RETURN_IF_ERROR(temp.Write(part.data(), part.size()));
  return temp.Commit();
}

}  // namespace

absl::Status CheckOutputPath(const std::string& path, std::span<const std::string> inputs) {
  return CheckOutput(path, inputs).status();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents,
                                 std::span<const std::string> inputs) {
  const std::string_view parts[] = {contents};
  return WriteAtomically(path, parts, inputs);
}

absl::Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                              const std::map<std::string, std::string>& metadata,
                              std::span<const std::string> inputs) {
  EAGLE3_RETURN_IF_ERROR(CheckTensors(tensors, path));

  // Decreasing element size keeps every offset a multiple of its tensor's element size.
  std::vector<const NamedTensor*> order;
  for (const NamedTensor& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    return DTypeSize(a->tensor.dtype()) > DTypeSize(b->tensor.dtype());
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor* t : order) {
    nlohmann::json shape = nlohmann::json::array();
    for (int64_t d : t->tensor.shape().dims()) shape.push_back(d);
    const uint64_t end = offset + t->tensor.nbytes();
    header[t->name] = {{"dtype", SafetensorsDTypeName(t->tensor.dtype())},
                       {"shape", shape},
                       {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // names and metadata must be valid UTF-8
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode the safetensors header for '", path, "': ", e.what()));
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  if (header_text.size() > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header for '", path, "' would be ", header_text.size(),
                     " bytes, over the readers' cap of ", kMaxSafetensorsHeaderBytes));
  }
  char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>(static_cast<uint8_t>(header_text.size() >> (8 * i)));

  std::vector<std::string_view> parts = {std::string_view(prefix, sizeof(prefix)), header_text};
  for (const NamedTensor* t : order) {
    parts.emplace_back(static_cast<const char*>(t->tensor.data()), t->tensor.nbytes());
  }
  return WriteAtomically(path, parts, inputs);
}

}  // namespace eagle3
