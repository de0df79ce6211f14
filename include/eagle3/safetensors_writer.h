// Writer for the safetensors format (the inverse of eagle3/safetensors.h).
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

struct NamedTensor {
  std::string name;   // non-empty, unique, not "__metadata__"
  TensorView tensor;  // any shape and dtype, host, contiguous; data may be null only when empty
};

// What an output file may replace, shared by every writer here (and the tools' --out / --json):
// `path` may be absent, or an existing regular file that is writable and is none of `inputs`.
// Refused, naming the path: anything but a regular file (a directory, a device such as /dev/null,
// a FIFO, a socket: InvalidArgument "... is a character device; refusing to replace it with a
// regular file"); one of `inputs`, compared by device and inode so that another spelling or a hard
// link is caught too, where a directory in `inputs` stands for itself and every regular file
// directly in it (a checkpoint directory: InvalidArgument "... is one of the input files it is
// computed from"); a read-only file (no write bit, or not writable by this process:
// PermissionDenied "... is read-only"), since a rename would replace it regardless of its mode. A
// final symbolic link is followed: the file it names is replaced and the link kept. Tools call this
// before their work, so that a bad --out fails fast; the writers check again.
EAGLE3_API absl::Status CheckOutputPath(const std::string& path, std::span<const std::string> inputs = {});

// Writes `contents` to `path` atomically: CheckOutputPath, then a temporary file in the same
// directory under a short fixed-length name (".eagle3-<12 hex digits>.tmp", so any destination name
// that fits NAME_MAX works), flushed to disk and renamed over `path`. An existing file's permission
// bits are kept; a new file gets 0666 less the umask. Errors: CheckOutputPath's, or the OS error
// naming `path`.
EAGLE3_API absl::Status WriteFileAtomically(const std::string& path, std::string_view contents,
                                            std::span<const std::string> inputs = {});

// Writes `tensors` (and `metadata` as "__metadata__", omitted when empty) to `path`. The data is
// laid out in order of decreasing element size, stable otherwise, and the header is padded with
// spaces to a multiple of 8 bytes, so every tensor's offset in the file is aligned to its element
// size and readers can view it in place. The file is written as WriteFileAtomically writes, so
// readers never see a partial file and `path` obeys CheckOutputPath(path, inputs). Errors:
// InvalidArgument (duplicate/empty name, device or non-contiguous tensor) naming the tensor,
// CheckOutputPath's, or the OS error naming the file.
EAGLE3_API absl::Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                                         const std::map<std::string, std::string>& metadata = {},
                                         std::span<const std::string> inputs = {});

}  // namespace eagle3
