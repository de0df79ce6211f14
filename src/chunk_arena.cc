#include "eagle3/chunk_arena.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace eagle3 {
namespace {

bool PowerOfTwo(size_t n) { return n != 0 && (n & (n - 1)) == 0; }

// `status` with `context` before its message, its code kept.
absl::Status WithContext(const absl::Status& status, const std::string& context) {
  return absl::Status(status.code(), absl::StrCat(context, status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkArena>> ChunkArena::Create(Allocator& upstream,
                                                                const ChunkArenaOptions& options) {
  if (!PowerOfTwo(options.max_alignment)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkArena: max_alignment must be a power of two, got ", options.max_alignment));
  }
  if (options.chunk_bytes < options.max_alignment) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkArena: chunk_bytes must be at least max_alignment (",
                                                   options.max_alignment, "), got ", options.chunk_bytes));
  }
  if (options.max_piece_bytes > options.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkArena: max_piece_bytes must be at most chunk_bytes (",
                                                   options.chunk_bytes, "), got ", options.max_piece_bytes));
  }
  ChunkArenaOptions resolved = options;
  if (resolved.max_piece_bytes == 0) resolved.max_piece_bytes = resolved.chunk_bytes / 2;
  return std::unique_ptr<ChunkArena>(new ChunkArena(upstream, resolved));
}

ChunkArena::ChunkArena(Allocator& upstream, const ChunkArenaOptions& options)
    : upstream_(&upstream), options_(options) {}

// Chunks are returned as their last piece is freed, so any left here hold live pieces: they stay
// allocated (see the header).
ChunkArena::~ChunkArena() = default;

void* ChunkArena::BumpLocked(size_t bytes, size_t alignment) {
  if (current_ == 0) return nullptr;
  Chunk& chunk = chunks_.at(current_);
  // Aligned by address, so that a chunk the upstream aligned more loosely still gives aligned pieces.
  const uintptr_t start = (current_ + cursor_ + alignment - 1) & ~static_cast<uintptr_t>(alignment - 1);
  const size_t offset = start - current_;
  if (offset > chunk.bytes || chunk.bytes - offset < bytes) return nullptr;
  cursor_ = offset + bytes;
  ++chunk.live;
  return reinterpret_cast<void*>(start);
}

absl::StatusOr<void*> ChunkArena::Allocate(size_t bytes, size_t alignment) {
  if (!PowerOfTwo(alignment) || alignment > options_.max_alignment) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkArena: alignment must be a power of two <= ",
                                                   options_.max_alignment, " (ChunkArenaOptions::max_alignment), got ",
                                                   alignment));
  }
  const std::lock_guard<std::mutex> lock(mu_);
  if (bytes > options_.max_piece_bytes) {
    absl::StatusOr<void*> direct = upstream_->Allocate(bytes, alignment);
    if (!direct.ok()) {
      return WithContext(direct.status(), absl::StrCat("ChunkArena: a request of ", bytes,
                                                       " bytes (above max_piece_bytes ", options_.max_piece_bytes,
                                                       ", from the upstream allocator alone): "));
    }
    ++direct_;
    return direct;
  }
  const size_t piece = std::max<size_t>(bytes, 1);
  if (void* p = BumpLocked(piece, alignment); p != nullptr) return p;
  absl::StatusOr<void*> chunk = upstream_->Allocate(options_.chunk_bytes, options_.max_alignment);
  if (!chunk.ok()) {
    const std::string what = absl::StrCat("ChunkArena: a new chunk of ", options_.chunk_bytes, " bytes for a request of ",
                                          bytes, " bytes: ");
    if (chunk.status().code() != absl::StatusCode::kResourceExhausted) return WithContext(chunk.status(), what);
    // Too little memory left for a whole chunk may still hold the request.
    absl::StatusOr<void*> alone = upstream_->Allocate(piece, alignment);
    if (!alone.ok()) {
      return WithContext(alone.status(), absl::StrCat(what, chunk.status().message(),
                                                      "; and the request alone from the upstream allocator: "));
    }
    ++direct_;
    return alone;
  }
  ++chunk_allocations_;
  // The chunk left behind holds live pieces (it would have been returned otherwise): it stays in
  // chunks_ until they are freed, and only the cursor moves on.
  current_ = reinterpret_cast<uintptr_t>(*chunk);
  cursor_ = 0;
  chunks_.emplace(current_, Chunk{.bytes = options_.chunk_bytes});
  if (void* p = BumpLocked(piece, alignment); p != nullptr) return p;
  // Unreachable when the upstream keeps the Allocator contract (a chunk aligned to max_alignment
  // takes any piece of at most max_piece_bytes <= chunk_bytes at its start).
  upstream_->Deallocate(*chunk, options_.chunk_bytes);
  chunks_.erase(current_);
  current_ = 0;
  return absl::InternalError(absl::StrCat("ChunkArena: a piece of ", bytes, " bytes at alignment ", alignment,
                                          " does not fit a new chunk of ", options_.chunk_bytes,
                                          " bytes: the upstream allocator did not align it to ",
                                          options_.max_alignment));
}

void ChunkArena::Deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const std::lock_guard<std::mutex> lock(mu_);
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  auto it = chunks_.upper_bound(address);
  if (it != chunks_.begin()) {
    --it;
    Chunk& chunk = it->second;
    if (address - it->first < chunk.bytes) {
      if (--chunk.live > 0) return;
      upstream_->Deallocate(reinterpret_cast<void*>(it->first), chunk.bytes);
      if (it->first == current_) current_ = 0;
      chunks_.erase(it);
      return;
    }
  }
  --direct_;
  upstream_->Deallocate(ptr, bytes);
}

ChunkArenaStats ChunkArena::stats() const {
  const std::lock_guard<std::mutex> lock(mu_);
  ChunkArenaStats s;
  s.chunks = static_cast<int64_t>(chunks_.size());
  for (const auto& [base, chunk] : chunks_) s.pieces += chunk.live;
  s.direct = direct_;
  s.chunk_allocations = chunk_allocations_;
  return s;
}

}  // namespace eagle3
