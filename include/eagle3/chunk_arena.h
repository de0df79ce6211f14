// ChunkArena: an Allocator for memory kept as long as a model's weights (Backend::weight_allocator).
// It takes large chunks from an upstream allocator and hands out aligned pieces of them by bumping a
// cursor, so that a model's tens of thousands of weight tensors cost one upstream allocation per
// chunk instead of one each (on a device, every upstream allocation is a driver call of its own).
//
// Memory is never handed out twice. Freeing a piece only lowers its chunk's count of live pieces;
// a chunk goes back to the upstream allocator when that count reaches zero, the chunk being filled
// included (the next piece then takes a fresh chunk). So memory returns only through the upstream's
// own free (CUDA's waits for the device), and memory that work in flight may still read is never
// reused by the arena itself. The price: a piece freed while its chunk holds live pieces leaves its
// bytes unused until those are freed too. The arena suits tensors allocated once and kept; a tensor
// freed early (a part copied into a stacked weight, then dropped) belongs to the upstream allocator.
//
// Requests of more than max_piece_bytes go to the upstream allocator alone; so does one for which
// the upstream cannot give a whole new chunk (ResourceExhausted) but can give the request itself, so
// that the arena fails no request the upstream alone would serve. A piece that does not fit what is
// left of the chunk being filled starts a new chunk; the tail left behind (less than
// max_piece_bytes) stays unused until that chunk is returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/device.h"
#include "eagle3/export.h"

namespace eagle3 {

struct ChunkArenaOptions {
  // Bytes of each chunk requested from the upstream allocator; at least max_alignment.
  size_t chunk_bytes = size_t{256} << 20;
  // Requests of more bytes bypass the chunks (upstream allocations of their own); at most
  // chunk_bytes. 0: chunk_bytes / 2.
  size_t max_piece_bytes = 0;
  // The largest alignment a request may ask for, and the alignment chunks are requested with: a
  // power of two the upstream allocator accepts (DeviceAllocator: at most 256).
  size_t max_alignment = 256;
};

// What an arena holds now (ChunkArena::stats()).
struct ChunkArenaStats {
  int64_t chunks = 0;         // chunks taken from the upstream and not yet returned
  int64_t pieces = 0;         // live pieces handed out of those chunks
  int64_t direct = 0;         // live requests passed to the upstream alone
  int64_t chunk_allocations = 0;  // chunks requested from the upstream over the arena's life
};

class EAGLE3_API ChunkArena final : public Allocator {
 public:
  // An arena over `upstream`, which must outlive it. The arena calls `upstream` under its own mutex
  // only (one call at a time). InvalidArgument, naming the option, for options outside the ranges
  // above.
  static absl::StatusOr<std::unique_ptr<ChunkArena>> Create(Allocator& upstream,
                                                            const ChunkArenaOptions& options = {});
  // Every tensor allocated from the arena must have been freed before: then every chunk has already
  // gone back to the upstream allocator. A chunk that still holds a live piece is left allocated
  // (never freed under a tensor that may still read it): its memory leaks, and a later Deallocate of
  // the piece through the destroyed arena is undefined.
  ~ChunkArena() override;
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;

  Device device() const override { return upstream_->device(); }
  // `bytes` (zero counts as one: every piece has a unique address) at `alignment`, a power of two
  // <= max_alignment (InvalidArgument otherwise, naming both). A chunk the upstream fails to give
  // for any reason but ResourceExhausted fails the request with that code.
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;
  // `ptr` from Allocate (nullptr: nothing). A piece lowers its chunk's count (the chunk goes back to
  // the upstream at zero); a request that bypassed the chunks goes back to the upstream at once.
  void Deallocate(void* ptr, size_t bytes) override;

  const ChunkArenaOptions& options() const { return options_; }
  ChunkArenaStats stats() const;

 private:
  struct Chunk {
    size_t bytes = 0;
    int64_t live = 0;  // pieces handed out and not yet freed
  };

  ChunkArena(Allocator& upstream, const ChunkArenaOptions& options);
  // A piece of the chunk being filled, or nullptr when there is none or the piece does not fit.
  void* BumpLocked(size_t bytes, size_t alignment);

  Allocator* upstream_;
  ChunkArenaOptions options_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Chunk> chunks_;  // by base address; every one holds a live piece
  uintptr_t current_ = 0;              // base of the chunk being filled; 0: none
  size_t cursor_ = 0;                  // its first byte not yet handed out
  int64_t direct_ = 0;
  int64_t chunk_allocations_ = 0;
};

}  // namespace eagle3
