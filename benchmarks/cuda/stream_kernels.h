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

// Pieces a block reads in one pass over a chunk: 8 independent 16-byte loads a thread of 256.
inline constexpr int64_t kStreamChunkPieces = 8 * 256;

// Blocks of the stream kernel resident on the device at once (its grid): every multiprocessor full.
// 0 where the query fails.
int StreamReadBlocks();

// Reads every piece of chunks[0, count) once (in device memory; read after the programmatic wait,
// as a round reads its ids) with `blocks` blocks taking chunks blockIdx.x, + blocks, ...; writes
// sink[0, blocks * 256) only where the bytes' XOR has a value no random fill gives in practice,
// which keeps the loads without a store a piece. programmatic: launched with programmatic stream
// serialization (it lets the next kernel launch at once, and waits for the one before).
//   chunks: [count] device       sink: [blocks * 256] u32 device
cudaError_t LaunchStreamRead(const StreamChunk* chunks, int count, int blocks, uint32_t* sink, bool programmatic,
                             cudaStream_t stream);

}  // namespace eagle3::bench
