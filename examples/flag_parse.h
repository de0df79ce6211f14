// Strict command-line values and bounded input files, shared by the example programs.
//
// A value is the whole argument or an error: "2x", "1e3", " 7", "0x10" and "+3" are not integers,
// and nothing is narrowed or saturated silently. Every message names the flag, the accepted range
// and echoes the user's own text in quotes, e.g.
//   --tp: expected an integer in [1, 64], got "2x"
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace eagle3::examples {

// Default of --max-input-bytes: the most a --prompt-file / --text-file / held-out prompts file is
// read. Far more text than any context the tools run (a byte is at most one token).
constexpr int64_t kDefaultMaxInputBytes = int64_t{1} << 20;
// Upper bound of --max-input-bytes itself.
constexpr int64_t kMaxInputBytesLimit = int64_t{1} << 32;

inline std::string Quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

inline std::string RangeText(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// The whole of `text` as a decimal integer in [lo, hi] (an optional '-', then digits).
inline absl::StatusOr<int64_t> ParseInt64(std::string_view flag, std::string_view text, int64_t lo, int64_t hi) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, 10);
  if (text.empty() || ec != std::errc() || ptr != end || value < lo || value > hi) {
    return absl::InvalidArgumentError(std::string(flag) + ": expected an integer in " + RangeText(lo, hi) +
                                      ", got " + Quoted(text));
  }
  return value;
}

inline absl::StatusOr<int> ParseInt(std::string_view flag, std::string_view text, int lo, int hi) {
  absl::StatusOr<int64_t> value = ParseInt64(flag, text, lo, hi);
  if (!value.ok()) return value.status();
  return static_cast<int>(*value);
}

// The whole of `text` as a decimal uint64 (seeds: every value in [0, 2^64) is distinct, none goes
// through a double).
inline absl::StatusOr<uint64_t> ParseUint64(std::string_view flag, std::string_view text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, 10);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return absl::InvalidArgumentError(std::string(flag) + ": expected an integer in [0, " +
                                      std::to_string(std::numeric_limits<uint64_t>::max()) + "], got " +
                                      Quoted(text));
  }
  return value;
}

// The whole of `text` as a finite decimal number whose 32-bit float value lies in the range
// (`lo`, `hi`) with the ends open or closed as given; `range` describes it in the message
// ("(0, 1]", "[0, 1e+06]"). A value that only reaches the range before rounding to a float (1e-50
// for (0, 1]) is refused too, since the float is what runs.
inline absl::StatusOr<float> ParseFloat(std::string_view flag, std::string_view text, double lo, bool lo_open,
                                        double hi, bool hi_open, std::string_view range) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, std::chars_format::general);
  const float as_float = static_cast<float>(value);
  auto in_range = [&](double v) {
    return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  };
  if (text.empty() || ec != std::errc() || ptr != end || !in_range(value) || !in_range(as_float)) {
    std::string message = std::string(flag) + ": expected a number in " + std::string(range) + ", got " + Quoted(text);
    if (ec == std::errc() && ptr == end && in_range(value)) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(as_float));
      message += std::string(" (") + buf + " as a 32-bit float)";
    }
    return absl::InvalidArgumentError(message);
  }
  return as_float;
}

// "a,b,c": at most `max_items` integers, each the whole of its item and in [lo, hi].
inline absl::StatusOr<std::vector<int64_t>> ParseIntList(std::string_view flag, std::string_view text, int64_t lo,
                                                         int64_t hi, size_t max_items) {
  std::vector<int64_t> values;
  size_t start = 0;
  for (size_t item = 1;; ++item) {
    const size_t comma = text.find(',', start);
    const std::string_view piece = text.substr(start, comma == std::string_view::npos ? std::string_view::npos
                                                                                       : comma - start);
    if (item > max_items) {
      return absl::InvalidArgumentError(std::string(flag) + ": more than " + std::to_string(max_items) +
                                        " comma-separated values");
    }
    int64_t value = 0;
    const char* end = piece.data() + piece.size();
    const auto [ptr, ec] = std::from_chars(piece.data(), end, value, 10);
    if (piece.empty() || ec != std::errc() || ptr != end || value < lo || value > hi) {
      std::string whole(text.substr(0, 200));
      if (text.size() > 200) whole += "...";
      return absl::InvalidArgumentError(std::string(flag) + ": '" + std::string(piece) + "' is not an integer in " +
                                        RangeText(lo, hi) + " (item " + std::to_string(item) + " of " +
                                        Quoted(whole) + ")");
    }
    values.push_back(value);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return values;
}

// The contents of `path` (named by `flag` in messages), at most `max_bytes` of them. A regular file
// larger than that is refused by its size before a byte is read; anything else (a pipe, a FIFO,
// /dev/zero) is read until its end or until more than `max_bytes` came, then refused. The open never
// blocks (a FIFO without a writer then reads as empty); directories are refused.
inline absl::StatusOr<std::string> ReadInputFile(std::string_view flag, const std::string& path, int64_t max_bytes) {
  const std::string who = std::string(flag) + " " + path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(who + ": cannot open the file: no such file");
    return absl::ErrnoToStatus(error, who + ": cannot open the file");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st = {};
  if (::fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, who + ": cannot stat the file");
  if (S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(who + ": is a directory, not a file");
  const std::string cap = "--max-input-bytes " + std::to_string(max_bytes) + " (a larger value reads more)";
  if (S_ISREG(st.st_mode) && st.st_size > max_bytes) {
    return absl::InvalidArgumentError(who + ": " + std::to_string(st.st_size) + " bytes, more than " + cap);
  }
  // Reads block from here on, as a pipe's reader expects.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return absl::ErrnoToStatus(errno, who + ": cannot read the file");
  }
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, who + ": cannot read the file");
    }
    if (n == 0) break;
    if (static_cast<int64_t>(text.size()) + n > max_bytes) {
      return absl::InvalidArgumentError(who + ": yields more bytes than " + cap);
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

// A model directory named by `flag` ("--target DIR"): refused before anything runs when it does not
// exist, is not a directory or has no config.json.
inline absl::Status CheckModelDir(std::string_view flag, const std::string& dir) {
  const std::string who = std::string(flag) + " " + dir;
  struct stat st = {};
  if (::stat(dir.c_str(), &st) != 0) return absl::NotFoundError(who + ": no such directory");
  if (!S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(who + ": not a directory");
  if (::stat((dir + "/config.json").c_str(), &st) != 0) {
    return absl::NotFoundError(who + ": has no config.json (not a model directory)");
  }
  return absl::OkStatus();
}

// A directory named by `flag` that must exist (--models-dir).
inline absl::Status CheckDir(std::string_view flag, const std::string& dir) {
  const std::string who = std::string(flag) + " " + dir;
  struct stat st = {};
  if (::stat(dir.c_str(), &st) != 0) return absl::NotFoundError(who + ": no such directory");
  if (!S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(who + ": not a directory");
  return absl::OkStatus();
}

}  // namespace eagle3::examples
