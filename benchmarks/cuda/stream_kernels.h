// A read-only stream of scattered byte ranges: the bandwidth ceiling beside a kernel that reads the
// same ranges and also computes (quant_moe_benchmark's BM_StreamCeiling reads exactly the bytes of
// a routed-expert round). A C-style launcher: no abseil reaches the .cu.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::bench {

// One range of the stream: `pieces` 16-byte pieces from `data` (16-byte aligned), at most
// kStreamChunkPieces of them.
struct StreamChunk {
  const void* data;
  int64_t pieces;
};

// Pieces of one chunk (64 KiB): a block takes a chunk at a time.
inline constexpr int64_t kStreamChunkPieces = 4096;

// The grid of the stream kernel with `loads` (2, 4, 8 or 16) 16-byte loads a thread in flight:
// blocks_per_sm blocks of 256 on every multiprocessor, or as many as fit. 0 where `loads` is not
// one of those or the query fails.
int StreamReadBlocks(int loads, int blocks_per_sm);

// Reads every piece of chunks[0, count) once (in device memory; read after the programmatic wait,
// as a round reads its ids) with `blocks` blocks taking chunks blockIdx.x, + blocks, ..., each
// thread `loads` (2, 4, 8 or 16) independent 16-byte loads at a time; writes sink[0, blocks * 256)
// only where the bytes' XOR has a value no random fill gives in practice, which keeps the loads
// without a store a piece. programmatic: launched with programmatic stream serialization (it lets
// the next kernel launch at once, and waits for the one before).
//   chunks: [count] device       sink: [blocks * 256] u32 device
cudaError_t LaunchStreamRead(const StreamChunk* chunks, int count, int loads, int blocks, uint32_t* sink,
                             bool programmatic, cudaStream_t stream);

}  // namespace eagle3::bench
