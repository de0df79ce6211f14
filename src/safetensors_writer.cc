#include "eagle3/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "eagle3/safetensors.h"
#include "eagle3/status.h"
#include "nlohmann/json.hpp"

namespace eagle3 {
namespace {

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

// A file created next to the destination; removed on destruction unless committed (renamed).
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (created_ && !committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  absl::Status Create() {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create '", path_, "'"));
    created_ = true;
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path_, "'"));
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  // Flushes to disk and closes, then renames over `destination`.
  absl::Status CommitTo(const std::string& destination) {
    if (::fsync(fd_) != 0)
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync '", path_, "'"));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0)
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot close '", path_, "'"));
    if (::rename(path_.c_str(), destination.c_str()) != 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("cannot rename '", path_, "' to '", destination, "'"));
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
};

}  // namespace

absl::Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                              const std::map<std::string, std::string>& metadata) {
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
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(header_text.size() >> (8 * i));

  static std::atomic<uint64_t> counter{0};
  TempFile temp(absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1)));
  EAGLE3_RETURN_IF_ERROR(temp.Create());
  EAGLE3_RETURN_IF_ERROR(temp.Write(prefix, sizeof(prefix)));
  EAGLE3_RETURN_IF_ERROR(temp.Write(header_text.data(), header_text.size()));
  for (const NamedTensor* t : order) {
    EAGLE3_RETURN_IF_ERROR(temp.Write(t->tensor.data(), t->tensor.nbytes()));
  }
  return temp.CommitTo(path);
}

}  // namespace eagle3
