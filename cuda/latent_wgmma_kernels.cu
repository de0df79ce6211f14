// Paged latent attention over a bf16 cache at DeepSeek's latent shape (key rows of 576, values the
// first 512), 64 query rows of one sequence per block, on Hopper's warpgroup tensor-core products
// (wgmma, sm_90a): LatentWgmmaKernel, launched by LaunchLatentKernels (latent_decode_kernels.cu)
// through LaunchLatentWgmma where the tree-kernel choice asks for it (GetLatentTreeKernelChoice,
// attention_ops.h). This file alone is built for the arch-specific sm_90a target (CMakeLists.txt:
// eagle3_cuda_sm90a); no abseil here: nvcc must never see it.
//
// Why next to LatentTreeKernel (latent_tree_kernels.cu, the same 64-row blocks on mma.sync): there
// every operand of every product passes through registers by ldmatrix (the whole query tile re-read
// from shared memory per chunk), and a chunk's products, softmax and value products are dependent
// phases behind block barriers (benchmarks/NOTES.md has what that costs). Here the tensor cores read
// the queries, the staged keys and the probabilities from shared memory themselves,
// asynchronously, so a chunk costs its products, the softmax and two barriers.
//
// Layout (latent_wgmma_layout.h states the shared-memory layout and the descriptors, and its CPU
// test checks them): a block is two warpgroups (256 threads) and one split of one 64-row tile's
// keys, in 64-key chunks, each staged by cp.async into one of two stages (the next chunk is copied
// while this one is computed). Shared memory: the queries 64 x 576 bf16 (72 KiB), two stages of 64
// keys x 576 (144 KiB), the probabilities 64 x 64, the rows' half maxima, the mask words: 226 KiB.
// - Scores: warpgroup h computes S[:, 32 h .. + 31] = Q K^T over the chunk's keys 32 h .. + 31
//   (36 k-steps of m64n32k16 into 16 accumulators a thread), masks them, and reduces each row's
//   maximum over its half; the halves meet in shared memory.
// - Softmax (fp32, online, log2 domain): both warpgroups compute the same running maximum of each
//   row from the two halves, so each writes the probabilities of its own keys (bf16, swizzled) and
//   keeps a partial sum of them per thread; the sums meet once, at the end.
// - Values: warpgroup h computes O[:, 256 h .. + 255] += P V over all 64 keys (4 k-steps of
//   m64n256k16, 128 accumulators a thread), V being the staged rows' first 512 dims read N-major.
// - Keys no row of the block allows, within the split, have their staged values zeroed before the
//   value product (such cache rows may hold anything, NaN included; 0 x NaN is NaN); keys past the
//   split are zero-filled by the copies.
// Results go where the other latent kernels' go (the output, or the split partials that
// LatentCombineKernel or the last of the tile's blocks merges; empty splits are marked).
#include <cstdint>

#include <cuda_bf16.h>
#include <math_constants.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "core_kernels.cuh"
#include "latent_common.cuh"
#include "latent_wgmma_common.cuh"
#include "latent_wgmma_layout.h"
#include "programmatic_launch.cuh"
#include "ptx.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kWgmmaThreads = kWgmmaBlockThreads;
constexpr int kWarps = kWgmmaThreads / 32;
constexpr int kRows = kWgmmaRows;
constexpr int kChunk = kWgmmaChunk;
constexpr int kDim = kWgmmaDim;
constexpr int kPieces = kDim / 8;                   // 16-byte pieces per key row
constexpr int kCopyLanes = 8;                       // copy threads per key row: 128 contiguous bytes
constexpr int kCopyKeys = kWgmmaThreads / kCopyLanes;    // keys per copy pass (two passes a chunk)
constexpr int kPiecesPerLane = kPieces / kCopyLanes;  // 9: one per panel
constexpr int kQueryBatch = 6;  // query pieces a thread loads before it stores the first
constexpr float kLazyRescale = 8.0f;  // log2 units: see the softmax
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kCopyKeys * 2 == kChunk && kPiecesPerLane * kCopyLanes == kPieces, "two copy passes a chunk");
static_assert(kPiecesPerLane == kDim / kWgmmaPanelWidth, "a lane's pieces: one per panel, the same column");
static_assert(static_cast<int>(kLatentCompactKeyDim) == kDim && static_cast<int>(kLatentCompactValueDim) ==
                  kWgmmaValueDim, "the compact kernels' shape");

__global__ void __launch_bounds__(kWgmmaThreads, 1) LatentWgmmaKernel(const LatentArgs a) {
  // Before PdlWait (the compact kernel's protocol, LaunchLatentCompact): the tile, the query rows
  // and the first page entries, every index bounded even if the metadata is bad; no cache row, no
  // mask byte, no `bad`.
  if (a.wait_first) PdlWait();
  PdlLaunchDependents();
  const LatentLaunchParams& p = a.p;
  LatentBlockStart start;
  if (!StartLatentBlock(a, &start)) return;
  const LatentTile& tile = start.tile;
  const int n0 = start.n0;
  const int tile_tokens = start.tile_tokens;
  // Key positions fit 32 bits (LatentAtCompactShape bounds max_kv_len).
  const int s_begin = static_cast<int>(start.keys.begin), s_end = static_cast<int>(start.keys.end);
  const int page_size = static_cast<int>(p.page_size);

  // The tensor cores apply the 128-byte swizzle to the addresses they compute: the panels start on
  // 1024-byte boundaries of the shared window, so the layout starts at the first one at or after
  // the dynamic base (kWgmmaSharedSlack more bytes are allocated for it).
  extern __shared__ __align__(1024) uint8_t wgmma_shared_base[];
  uint8_t* const wgmma_shared =
      wgmma_shared_base + (kWgmmaAtomBytes - SharedAddress(wgmma_shared_base) % kWgmmaAtomBytes) % kWgmmaAtomBytes;
  uint8_t* const qs = wgmma_shared + kWgmmaQueryOffset;
  float* const half_max = reinterpret_cast<float*>(wgmma_shared + kWgmmaHalfMaxOffset);  // [2][64]
  uint64_t* const allow_words = reinterpret_cast<uint64_t*>(wgmma_shared + kWgmmaAllowOffset);  // [2][64]
  uint64_t* const used_by_warp = reinterpret_cast<uint64_t*>(wgmma_shared + kWgmmaUsedOffset);  // [2][8]
  const uint32_t base = SharedAddress(wgmma_shared);
  auto stage_bytes = [&](int c) {
    return wgmma_shared + kWgmmaStageOffset + (c % kWgmmaStages) * kWgmmaOperandBytes;
  };

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  // Warpgroup: keys 32 half .. of the scores, dims 256 half .. of the values. Read through a
  // shuffle from lane 0 so that the compiler knows it is the same in every lane of the warp: the
  // descriptors built from it then stay in uniform registers.
  const int half = __shfl_sync(kFullMask, tid / 128, 0);
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int r0 = 16 * (warp % 4) + g;  // the thread's accumulator rows r0 and r0 + 8
  const int r1 = r0 + 8;

  // Copy role: thread i copies pieces i % 8 + 8 j (j < 9: one per panel) of keys i / 8 and i / 8 +
  // 32 of a chunk.
  const int copy_key = tid / kCopyLanes;
  const int copy_lane = tid % kCopyLanes;
  auto page_of = [&](int c, int key) -> int32_t {
    const int s = s_begin + kChunk * c + key;
    return s < s_end ? tile.pages[static_cast<uint32_t>(s) / static_cast<uint32_t>(page_size)] : 0;
  };
  auto issue = [&](int c, int32_t page_lo, int32_t page_hi) {
    uint8_t* const stage = stage_bytes(c);
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int key = copy_key + kCopyKeys * pass;
      const int s = s_begin + kChunk * c + key;
      const bool valid = s < s_end;
      const int32_t page = pass == 0 ? page_lo : page_hi;
      const int in_page =
          s - static_cast<int>(static_cast<uint32_t>(s) / static_cast<uint32_t>(page_size)) * page_size;
      const int64_t row = static_cast<int64_t>(page) * page_size + in_page;
      const uint16_t* src = p.cache_bf16 + (valid ? row * kDim : 0) + 8 * copy_lane;
      uint8_t* dst = stage + WgmmaPieceOffset(key, copy_lane);
#pragma unroll
      for (int j = 0; j < kPiecesPerLane; ++j) {
        CpAsync16OrZero(dst + j * kWgmmaPanelBytes, src + kWgmmaPanelWidth * j, valid);
      }
    }
  };
  const int chunks = (s_end - s_begin + kChunk - 1) / kChunk;
  int32_t next_lo = page_of(0, copy_key), next_hi = page_of(0, copy_key + kCopyKeys);

  // Queries: all 576 dims (72 pieces a row).
  StageWgmmaQueries<kPieces, kQueryBatch>(a, tile, n0, tile_tokens, qs);

  PdlWait();  // the check has completed
  if (*a.bad != 0) return;
  issue(0, next_lo, next_hi);
  CpAsyncCommit();
  if (1 < chunks) {
    next_lo = page_of(1, copy_key);
    next_hi = page_of(1, copy_key + kCopyKeys);
  }

  // Mask words: bit k of allow_words[(c % 2) * 64 + lt] says whether token lt of the tile sees key k
  // of chunk c; used_by_warp[(c % 2) * 8 + w] is the OR of warp w's tokens' words. Chunk c's are
  // written during chunk c - 1's scores (chunk 0's here). Warp w takes tokens w, w + 8, ...
  auto write_allow_words = [&](int c) {
    WriteWgmmaAllowWords<kWarps>(a, tile, tile_tokens, s_begin, s_end, c, warp, allow_words, used_by_warp);
  };
  write_allow_words(0);

  // The thread's rows: their tokens, and whether the tile holds them (rows it does not hold allow
  // no key: their words were not written).
  const int heads = a.heads_per_tile;
  const bool held0 = LatentRowHeld(a, n0, tile_tokens, r0), held1 = LatentRowHeld(a, n0, tile_tokens, r1);
  const int token0 = r0 / heads, token1 = r1 / heads;
  const float scale = p.scale * kLog2e;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  // Maxima the rows' probabilities are taken against (log2 domain), the same in both warpgroups.
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F;
  float l0 = 0.0f, l1 = 0.0f;                    // this thread's share of the rows' sums

  // Descriptors of the chunk-invariant operands; each instruction's start is an immediate offset.
  const uint64_t q_desc = WgmmaDescriptor(base + kWgmmaQueryOffset, kWgmmaKMajorLbo, kWgmmaKMajorSbo);
  const uint64_t probs_desc = WgmmaDescriptor(base + kWgmmaProbOffset, kWgmmaKMajorLbo, kWgmmaKMajorSbo);
  uint8_t* const ps = wgmma_shared + kWgmmaProbOffset;

#pragma unroll 1
  for (int c = 0; c < chunks; ++c) {
    uint8_t* const stage = stage_bytes(c);
    const uint32_t stage_base = SharedAddress(stage);
    CpAsyncWait<0>();         // this thread's copies of chunk c
    FenceProxyAsyncShared();  // ... visible to the tensor cores
    __syncthreads();          // every copy of chunk c; both warpgroups past chunk c - 1's value product

    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
    const uint64_t keys_desc =
        WgmmaDescriptor(stage_base + WgmmaScoreBStart(half, 0), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
    WgmmaFence();
#pragma unroll
    for (int i = 0; i < kWgmmaScoreSteps; ++i) {
      WgmmaBf16M64N32(s, WgmmaDescriptorAdvance(q_desc, WgmmaScoreAStart(i)),
                      WgmmaDescriptorAdvance(keys_desc, WgmmaScoreBStart(0, i)), i > 0);
    }
    WgmmaCommit();
    // While the score products run: chunk c + 1's copies into the stage chunk c - 1 left (each
    // copy's page lookup and address arithmetic would otherwise delay the products) and its mask
    // words.
    if (c + 1 < chunks) issue(c + 1, next_lo, next_hi);
    CpAsyncCommit();
    if (c + 2 < chunks) {
      next_lo = page_of(c + 2, copy_key);
      next_hi = page_of(c + 2, copy_key + kCopyKeys);
    }
    if (c + 1 < chunks) write_allow_words(c + 1);
    WgmmaWait<0>();

    // Masked scores of the thread's rows over its 8 keys (32 half + 8 j + 2 t4 + e), log2 domain.
    const uint64_t bits0 = held0 ? allow_words[(c % 2) * kRows + token0] : 0;
    const uint64_t bits1 = held1 ? allow_words[(c % 2) * kRows + token1] : 0;
    float max0 = -CUDART_INF_F, max1 = -CUDART_INF_F;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = kWgmmaHalfKeys * half + 8 * j + 2 * t4 + e;
        s[4 * j + e] = ((bits0 >> key) & 1u) != 0 ? s[4 * j + e] * scale : -CUDART_INF_F;
        s[4 * j + 2 + e] = ((bits1 >> key) & 1u) != 0 ? s[4 * j + 2 + e] * scale : -CUDART_INF_F;
        max0 = fmaxf(max0, s[4 * j + e]);
        max1 = fmaxf(max1, s[4 * j + 2 + e]);
      }
    }
#pragma unroll
    for (int offset = 1; offset <= 2; offset *= 2) {
      max0 = fmaxf(max0, __shfl_xor_sync(kFullMask, max0, offset));
      max1 = fmaxf(max1, __shfl_xor_sync(kFullMask, max1, offset));
    }
    if (t4 == 0) {
      half_max[half * kRows + r0] = max0;
      half_max[half * kRows + r1] = max1;
    }
    __syncthreads();  // both halves' maxima; both warpgroups' score products are done with the stage

    // The maximum the probabilities are taken against: the running one until the chunk's exceeds it
    // by more than kLazyRescale (then the chunk's), so the accumulators are rescaled only then; the
    // result is exact either way (probabilities, sums and values share the maximum used), and a
    // probability stays below 2^kLazyRescale.
    const float seen0 = fmaxf(half_max[r0], half_max[kRows + r0]);
    const float seen1 = fmaxf(half_max[r1], half_max[kRows + r1]);
    const float new0 = seen0 > m0 + kLazyRescale ? seen0 : m0;
    const float new1 = seen1 > m1 + kLazyRescale ? seen1 : m1;
    // No allowed key yet: m = -inf and l = 0 stay, the probabilities are 0.
    const float alpha0 = new0 == -CUDART_INF_F ? 1.0f : Exp2Approx(m0 - new0);
    const float alpha1 = new1 == -CUDART_INF_F ? 1.0f : Exp2Approx(m1 - new1);
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p00 = new0 == -CUDART_INF_F ? 0.0f : Exp2Approx(s[4 * j] - new0);
      const float p01 = new0 == -CUDART_INF_F ? 0.0f : Exp2Approx(s[4 * j + 1] - new0);
      const float p10 = new1 == -CUDART_INF_F ? 0.0f : Exp2Approx(s[4 * j + 2] - new1);
      const float p11 = new1 == -CUDART_INF_F ? 0.0f : Exp2Approx(s[4 * j + 3] - new1);
      sum0 += p00 + p01;
      sum1 += p10 + p11;
      const int key = kWgmmaHalfKeys * half + 8 * j + 2 * t4;
      *reinterpret_cast<__nv_bfloat162*>(ps + WgmmaPanelOffset(r0, key)) = __floats2bfloat162_rn(p00, p01);
      *reinterpret_cast<__nv_bfloat162*>(ps + WgmmaPanelOffset(r1, key)) = __floats2bfloat162_rn(p10, p11);
    }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
    m0 = new0;
    m1 = new1;
    if (__any_sync(kFullMask, alpha0 != 1.0f || alpha1 != 1.0f)) ScaleWgmmaRows(o, alpha0, alpha1);

    // Keys within the split that no row of the block allows: their staged values zeroed (64 threads
    // a key, one 16-byte piece of its 512 value dims each).
    uint64_t used = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) used |= used_by_warp[(c % 2) * kWarps + w];
    const int in_split = min(kChunk, s_end - (s_begin + kChunk * c));
    const uint64_t in_split_mask = in_split >= 64 ? ~uint64_t{0} : (uint64_t{1} << in_split) - 1;
    uint64_t unused = ~used & in_split_mask;
    if (unused != 0) {
      const int piece = tid % 64;
#pragma unroll 1
      for (int n = 0; unused != 0; unused &= unused - 1, ++n) {
        if (n % (kWgmmaThreads / 64) != tid / 64) continue;
        const int key = __ffsll(static_cast<long long>(unused)) - 1;
        *reinterpret_cast<uint4*>(stage + (piece / 8) * kWgmmaPanelBytes + key * kWgmmaRowBytes + (piece % 8) * 16) =
            make_uint4(0u, 0u, 0u, 0u);
      }
    }
    FenceProxyAsyncShared();  // the probabilities and zeroed values, for the tensor cores
    __syncthreads();          // both halves' probabilities

    const uint64_t values_desc =
        WgmmaDescriptor(stage_base + WgmmaValueBStart(half, 0), kWgmmaMnMajorLbo, kWgmmaMnMajorSbo);
    WgmmaFence();  // o was rescaled by ordinary code
#pragma unroll
    for (int j = 0; j < kWgmmaValueSteps; ++j) {
      WgmmaBf16M64N256TransB(o, WgmmaDescriptorAdvance(probs_desc, WgmmaValueAStart(j)),
                             WgmmaDescriptorAdvance(values_desc, WgmmaValueBStart(0, j)));
    }
    WgmmaCommit();
    WgmmaWait<0>();  // before the next chunk's barrier frees the probabilities and this stage
  }
  CpAsyncWait<0>();

  StoreWgmmaRows(a, tile, n0, half, r0, held0, held1, m0, m1, l0, l1, o, half_max);
  if (a.fold_combine) {
    LatentFoldCombine<kWgmmaThreads, kRows>(a, tile, n0, tile_tokens, reinterpret_cast<float*>(wgmma_shared_base));
  }
}

}  // namespace

cudaError_t LatentWgmmaImage() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, LatentWgmmaKernel);
}

cudaError_t LaunchLatentWgmma(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream) {
  const cudaError_t error = cudaFuncSetAttribute(LatentWgmmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kWgmmaLaunchSharedBytes));
  if (error != cudaSuccess) return error;
  return LaunchKernel(programmatic, LatentWgmmaKernel, grid, dim3(kWgmmaThreads), kWgmmaLaunchSharedBytes, stream,
                      a);
}

}  // namespace eagle3::cuda
