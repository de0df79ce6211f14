// The small-M product (cuda/gemv_ops.h). No abseil here: nvcc must never see it.
//
// Work split: a block of 8 warps covers 4 * (8 / wk) weight rows; each warp holds 4 rows x 8 lanes,
// and the wk warps of a row group split K between their 8 * wk lanes in 16-byte chunks (lane slot s
// takes chunks s, s + 8 wk, ...), so one warp load is four fully used 128-byte row segments and the
// 8 distinct activation addresses of a warp read are one shared-memory wavefront. The activation
// rows (padded with zeros to kM rows and to whole chunks) are staged in shared memory a K tile at a
// time, laid out [kM][quad][chunk] as float4 so that those 8 reads are conflict-free. Each lane keeps
// two batches of weight chunks in flight (the first while the tile is staged). Each lane sums its
// chunks in order; the 8 lanes of a row reduce by an xor butterfly (every lane ends with the same
// bits) and the wk warps of a group add their partials in warp order: deterministic.
//
// Few rows over a long K (a MoE router's 256 x 7168, more so at 8 activation rows, where a block
// takes fewer rows) leave most multiprocessors idle even at wk = 8: the kernel then splits K
// between the `ksplit` blocks of a thread-block cluster, each streaming one contiguous part of
// every row of its block, and rank 0 adds the ranks' sums in rank order from their shared memory
// (distributed shared memory: no scratch, no second launch, the same bits every run).
//
// f32 activations against bf16 weights under GemvActivations::kKeepF32 take GemvKernel<uint16_t,
// kM> at every row count, staging the activations unrounded: kernels LaunchRows<uint16_t> already
// instantiated (its 2- to 8-row buckets had no caller before), so the mode compiles nothing new.
//
// Otherwise two to kGemvMaxRows activation rows with bf16 weights run GemvMmaKernel (below): the
// weights are the A operand of m16n8k16 tensor-core products and the (bf16-rounded) activation rows
// the B operand, so a weight element costs no CUDA-core FMAs whatever M is. The FMA kernel above
// turns issue-bound from a few rows on (each 16-byte chunk feeds 32 FMAs, 8 shared loads and the
// bf16 unpacking at M = 4; benchmarks/NOTES.md has its profile).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "core_kernels.cuh"
#include "gemv_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kLanesPerRow = 8;
constexpr int kRowsPerWarp = 32 / kLanesPerRow;
// Activation tile: within the 48 KiB a block gets without opting in, beside the partial sums (up to
// 1 KiB) and with a margin.
constexpr int kTileBytes = 46 * 1024;

struct GemvArgs {
  const void* a;
  int64_t lda, stride_a;
  bool a_bf16;   // a holds bf16 bit patterns (widened exactly)
  bool round_a;  // f32 a times bf16 b: round a to bf16 as it is staged
  bool a_quads;  // a f32 with every row of every item 16-byte aligned: staged with float4 loads
  const void* b;
  int64_t ldb, stride_b;
  float* c;
  int64_t ldc, stride_c;
  const float* bias;
  int m;
  int64_t n, k;
  float alpha, beta;
  int wk;           // warps per row group: 1, 2, 4 or 8
  int tile_chunks;  // chunks per activation tile
  int ksplit;       // GemvKernel: blocks of a cluster splitting K (1: no split)
  int64_t part_chunks;  // GemvKernel with ksplit > 1: whole chunks of K per cluster rank
  bool programmatic;  // host only: launched with the programmatic-serialization attribute
};

__device__ __forceinline__ float Bf16Bits(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// The partial last chunk of a weight row (k not a multiple of the chunk), element by element with
// zeros past k: never reading beyond the row, nor multiplying padding by whatever lies there. Read
// after the main loop, by the one lane that owns it.
template <typename W>
__device__ __forceinline__ uint4 LoadPartialChunk(const W* row, int64_t chunk, int64_t k) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(W));
  uint32_t words[4];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const int64_t i = chunk * kVec + e;
    if constexpr (sizeof(W) == 2) {
      const uint32_t v = i < k ? static_cast<uint32_t>(row[i]) : 0u;
      words[e / 2] = e % 2 == 0 ? v : words[e / 2] | (v << 16);
    } else {
      words[e] = i < k ? __float_as_uint(row[i]) : 0u;
    }
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// One 16-byte chunk of a weight row, 16 / sizeof(W) elements.
template <typename W>
struct Chunk {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(W));
  uint4 bits;

  __device__ __forceinline__ void Load(const W* row, int64_t chunk) {
    bits = __ldcs(reinterpret_cast<const uint4*>(row) + chunk);  // read once: evict first
  }

  // Element e (0 <= e < kVec) as a float.
  __device__ __forceinline__ float operator[](int e) const {
    const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
    if constexpr (sizeof(W) == 2) {
      const uint32_t word = words[e / 2];
      return e % 2 == 0 ? Bf16Bits(word & 0xffffu) : __uint_as_float(word & 0xffff0000u);
    } else {
      return __uint_as_float(words[e]);
    }
  }
};

// acc[m] += sum over the chunk's elements of w[e] * a[m][e], in element order.
template <typename W, int kM>
__device__ __forceinline__ void ChunkFma(const Chunk<W>& w, const float4* tile, int tc, int cc,
                                         float (&acc)[kM]) {
  constexpr int kQuads = Chunk<W>::kVec / 4;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const float4 av = tile[(m * kQuads + q) * tc + cc];
      acc[m] = fmaf(w[4 * q + 0], av.x, acc[m]);
      acc[m] = fmaf(w[4 * q + 1], av.y, acc[m]);
      acc[m] = fmaf(w[4 * q + 2], av.z, acc[m]);
      acc[m] = fmaf(w[4 * q + 3], av.w, acc[m]);
    }
  }
}

// Loads of the activation tile a thread has in flight at once (the tile comes from L2: one round
// trip per batch), in elements.
constexpr int kStageElements = 16;

__device__ __forceinline__ float StagedValue(const GemvArgs& p, float v) {
  return p.round_a ? RoundToBf16(v) : v;
}

// Elements k .. k + kUnit - 1 of activation row m (zeros past the end of the row, and for m >= M): one
// element of any alignment, or (kUnit 4, a_quads) one aligned quad, the last one of a row read
// element by element so as never to read past k.
template <int kUnit>
__device__ __forceinline__ void LoadUnit(const GemvArgs& p, const void* a, int m, int64_t k,
                                         float (&v)[kUnit]) {
#pragma unroll
  for (int j = 0; j < kUnit; ++j) v[j] = 0.0f;
  if (m >= p.m || k >= p.k) return;
  const int64_t at = m * p.lda + k;
  if constexpr (kUnit == 1) {
    v[0] = p.a_bf16 ? Bf16Bits(static_cast<const uint16_t*>(a)[at]) : static_cast<const float*>(a)[at];
  } else {
    const float* row = static_cast<const float*>(a) + at;
    if (k + kUnit <= p.k) {
      const float4 q = *reinterpret_cast<const float4*>(row);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      for (int j = 0; j < kUnit && k + j < p.k; ++j) v[j] = row[j];
    }
  }
}

// Stages activation columns [t0 * kVec, (t0 + tc) * kVec) of item `item`'s rows into the tile, in
// units of kUnit elements.
template <int kUnit, int kVec, int kM>
__device__ __forceinline__ void StageUnits(const GemvArgs& p, int64_t item, int64_t t0, int tc,
                                           float* tile) {
  constexpr int kQuads = kVec / 4, kBatch = kStageElements / kUnit;
  const int64_t k0 = t0 * kVec;
  const int units = tc * kVec / kUnit, total = kM * units;
  const size_t a_size = p.a_bf16 ? sizeof(uint16_t) : sizeof(float);
  const void* a = static_cast<const char*>(p.a) + item * p.stride_a * static_cast<int64_t>(a_size);
  for (int base = threadIdx.x; base < total; base += kThreads * kBatch) {
    float v[kBatch][kUnit];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      const int m = i / units;
      LoadUnit<kUnit>(p, a, i < total ? m : kM, k0 + kUnit * (i - m * units), v[u]);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      if (i >= total) break;
      const int m = i / units, col = kUnit * (i - m * units);
      const int chunk = col / kVec, e = col % kVec;
      float* out = tile + ((m * kQuads + e / 4) * tc + chunk) * 4 + e % 4;
#pragma unroll
      for (int j = 0; j < kUnit; ++j) out[j] = StagedValue(p, v[u][j]);
    }
  }
}

template <int kVec, int kM>
__device__ __forceinline__ void StageTile(const GemvArgs& p, int64_t item, int64_t t0, int tc,
                                          float* tile) {
  if (p.a_quads) {
    StageUnits<4, kVec, kM>(p, item, t0, tc, tile);
  } else {
    StageUnits<1, kVec, kM>(p, item, t0, tc, tile);
  }
}

// One lane's view of the work: its weight row and its chunk slot among the lanes of that row.
template <typename W>
struct LaneWork {
  const W* row;
  bool active;  // row < n
  int slot, slots;
  int64_t full_chunks, chunks;
  int tile_chunks;

  // Chunks in the tile that starts at chunk t0, and the whole ones among them.
  __device__ __forceinline__ int TileChunks(int64_t t0) const {
    return static_cast<int>(chunks - t0 < tile_chunks ? chunks - t0 : tile_chunks);
  }
  __device__ __forceinline__ int WholeChunks(int64_t t0) const {
    return static_cast<int>(full_chunks - t0 < tile_chunks ? full_chunks - t0 : tile_chunks);
  }
};

// The lane's batch of kBatch whole chunks base, base + slots, ... of the tile at t0 (those past the
// tile's whole chunks, or of an inactive lane, are not read).
template <typename W, int kBatch>
__device__ __forceinline__ void LoadBatch(const LaneWork<W>& lw, int64_t t0, int base,
                                          Chunk<W> (&w)[kBatch]) {
  const int whole = lw.WholeChunks(t0);
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    if (lw.active && base + u * lw.slots < whole) w[u].Load(lw.row, t0 + base + u * lw.slots);
  }
}

// Blocks per SM the register budget is set for: 2 (128 registers).
constexpr int kBlocksPerSm = 2;
// Chunks of a lane's batch (two batches overlap: the next is loaded while the current one is
// multiplied): with 8, a lane of a 5120-wide bf16 row has its whole share in flight at once; fewer
// where the accumulators of more rows take the registers. The 1- and 2-row kernels' batches of 8
// spill a few registers within that budget (the 4- and 8-row kernels' do not).
constexpr int BatchChunks(int m) { return m >= 8 ? 2 : m >= 4 ? 4 : 8; }
template <int kM>
constexpr int kBatchChunks = BatchChunks(kM);
// The batch of the 1- and 2-row kernels for lanes whose share of K is shorter than two deep
// batches (short K, or K split over many lanes: W_UK / W_UV, kv_a, q_b at decode): such a lane
// cannot use the deeper batch's loads in flight, and the shallow kernel does not spill.
constexpr int kShallowBatchChunks = 4;

template <typename W, int kM, int kBatch = kBatchChunks<kM>>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) GemvKernel(const GemvArgs args) {
  static_assert(kM <= kLanesPerRow, "one output row per lane of a row's lanes");
  constexpr int kVec = Chunk<W>::kVec;
  extern __shared__ float4 tile[];
  __shared__ float partial[kWarps][kRowsPerWarp][kM];

  // With a K split, this block is cluster rank `part` of its row block and sees its part of K as
  // the whole problem: a and b start at the part's first element, k is the part's length (whole
  // chunks but for the last part's tail), so the loops below are those of an unsplit block.
  GemvArgs p = args;
  int part = 0;
  int64_t row_block = blockIdx.x;
  if (args.ksplit > 1) {
    part = static_cast<int>(blockIdx.x % args.ksplit);  // the cluster rank: clusters run along x
    row_block = blockIdx.x / args.ksplit;
    const int64_t begin = part * args.part_chunks * kVec;
    p.k = begin < args.k ? min(args.k - begin, args.part_chunks * kVec) : 0;
    const int64_t a_size = args.a_bf16 ? sizeof(uint16_t) : sizeof(float);
    p.a = static_cast<const char*>(args.a) + begin * a_size;
    p.b = static_cast<const W*>(args.b) + begin;
  }

  const int64_t item = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / p.wk, warp_in_group = warp % p.wk;
  const int rows_per_block = kRowsPerWarp * (kWarps / p.wk);
  const int row_in_warp = lane / kLanesPerRow, lane_in_row = lane % kLanesPerRow;
  const int64_t row = row_block * rows_per_block + group * kRowsPerWarp + row_in_warp;
  LaneWork<W> lw;
  lw.active = row < p.n;
  lw.row = static_cast<const W*>(p.b) + item * p.stride_b + (lw.active ? row * p.ldb : 0);
  lw.slot = warp_in_group * kLanesPerRow + lane_in_row;
  lw.slots = p.wk * kLanesPerRow;
  lw.full_chunks = p.k / kVec;
  lw.chunks = (p.k + kVec - 1) / kVec;
  lw.tile_chunks = p.tile_chunks;

  float acc[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) acc[m] = 0.0f;
  // Software pipeline over the lane's chunks, tile after tile: the first batch of a tile is in
  // flight while its activations are staged, and each batch while the previous one is multiplied.
  Chunk<W> cur[kBatch] = {}, next[kBatch] = {};
  PdlLaunchDependents();
  LoadBatch<W, kBatch>(lw, 0, lw.slot, cur);
  // The weights are not written by the step, so the first batch may be read before the kernels
  // that write the activations (and c) have finished (programmatic_launch.cuh).
  PdlWait();
  int64_t t0 = 0;
  for (;; t0 += p.tile_chunks) {
    const int tc = lw.TileChunks(t0), whole = lw.WholeChunks(t0);
    StageTile<kVec, kM>(p, item, t0, tc, reinterpret_cast<float*>(tile));
    __syncthreads();
    for (int base = lw.slot; base < whole; base += kBatch * lw.slots) {
      const int next_base = base + kBatch * lw.slots;
      if (next_base < whole) {
        LoadBatch<W, kBatch>(lw, t0, next_base, next);
      } else if (t0 + p.tile_chunks < lw.chunks) {
        LoadBatch<W, kBatch>(lw, t0 + p.tile_chunks, lw.slot, next);
      }
      if (lw.active) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int cc = base + u * lw.slots;
          if (cc < whole) ChunkFma<W, kM>(cur[u], tile, tc, cc, acc);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) cur[u] = next[u];
    }
    if (t0 + p.tile_chunks >= lw.chunks) break;
    __syncthreads();  // every lane is done with this tile before the next is staged
  }
  // The partial last chunk (k not a multiple of kVec), in the last tile, still staged.
  const int partial_cc = static_cast<int>(lw.full_chunks - t0);
  if (lw.active && lw.chunks > lw.full_chunks && partial_cc % lw.slots == lw.slot) {
    Chunk<W> w;
    w.bits = LoadPartialChunk(lw.row, lw.full_chunks, p.k);
    ChunkFma<W, kM>(w, tile, lw.TileChunks(t0), partial_cc, acc);
  }

#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
  }
  // Lane lane_in_row of the row now owns output row m = lane_in_row.
  const int m = lane_in_row;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kM; ++i) sum = i == m ? acc[i] : sum;
  const bool owner = warp_in_group == 0;  // a group's sums end in its first warp
  if (p.wk > 1) {
    if (m < kM) partial[warp][row_in_warp][m] = sum;
    __syncthreads();
    if (owner && m < kM) {
      sum = partial[warp][row_in_warp][m];
      for (int w = 1; w < p.wk; ++w) sum += partial[warp + w][row_in_warp][m];
    }
  }
  if (p.ksplit > 1) {
    // Every thread of every rank reaches both cluster barriers (no early return above). The
    // partial array, read above, now holds each of the block's rows' sums: [rows][kM].
    float* rank_sums = &partial[0][0][0];
    const int r = group * kRowsPerWarp + row_in_warp;
    if (p.wk > 1) __syncthreads();  // every group has read its warps' partials
    if (owner && m < kM) rank_sums[r * kM + m] = sum;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's sums are written
    if (part == 0 && owner && m < kM) {
      for (int q = 1; q < p.ksplit; ++q) sum += cluster.map_shared_rank(rank_sums, q)[r * kM + m];
    }
    cluster.sync();  // no rank leaves while rank 0 still reads its shared memory
    if (part != 0) return;
  }
  if (!owner || !lw.active || m >= p.m) return;
  float* out = p.c + item * p.stride_c + m * p.ldc + row;
  float v = p.alpha * sum;
  if (p.beta != 0.0f) v += p.beta * *out;
  if (p.bias != nullptr) v += p.bias[row];
  *out = v;
}

// The largest K split (a portable cluster size) and the fewest chunks each lane of a split part
// streams.
constexpr int kMaxGemvSplit = 8;
constexpr int kMinSplitLaneChunks = 4;
// Weight bytes the grid must keep in flight to stream at the copy rate (about the bandwidth times
// the DRAM latency): below it the kernel is latency-bound and a K split, whose extra blocks bring
// their own loads, pays; at or above it the split only adds its cluster barriers (at one row a
// router's 64 unsplit blocks already hold this much, and its split measured slower).
constexpr int64_t kInFlightBytesTarget = int64_t{4} << 20;

// How GemvKernel<W, kM> covers a problem: warps per row group, K split, chunks per activation tile
// and per split part.
struct GemvTiling {
  int wk = 1, ksplit = 1, tile_chunks = 0;
  int64_t part_chunks = 0;
};

// k_vec: weight elements per 16-byte chunk. work_vec: elements per unit of a lane's work, as the
// rules below count it (each wants a lane to keep so many units): k_vec, except for bf16 weights
// under kKeepF32, whose units are the f32 weights' (4 elements): their lanes stage and multiply
// f32 activations element for element as the f32 path's lanes do, so they take the f32 weights'
// warps and K split for the shape (the split rule was placed on the f32 router: NOTES.md).
GemvTiling ChooseTiling(int k_m, int k_vec, int work_vec, int64_t n, int64_t k, int64_t batch,
                        int sm_count) {
  GemvTiling t;
  const int64_t chunks = (k + k_vec - 1) / k_vec;
  const int64_t work_units = (k + work_vec - 1) / work_vec;
  const int64_t budget = kTileBytes / (k_m * k_vec * static_cast<int64_t>(sizeof(float)));
  t.tile_chunks = static_cast<int>(chunks < budget ? chunks : budget);
  const int64_t tile_units = static_cast<int64_t>(t.tile_chunks) * k_vec / work_vec;
  // Warps per row: the most that keep the grid within one wave of resident blocks (fewer, longer
  // blocks keep more of each lane's chunks in flight and pay the tile staging and the reduction
  // less often) and leave each lane two chunks of a tile; past 4 activation rows at most 4, so
  // that the tile a block stages stays small beside the weight bytes it streams. (Choosing wk for
  // the least loaded busiest multiprocessor instead, which takes more, smaller blocks, was slower
  // at every shape measured: benchmarks/NOTES.md.)
  const int max_wk = k_m >= 8 ? 4 : kWarps;
  const int64_t wave = static_cast<int64_t>(kBlocksPerSm) * sm_count;
  const auto blocks_for = [&](int wk) {
    const int64_t rows_per_block = kRowsPerWarp * (kWarps / wk);
    return (n + rows_per_block - 1) / rows_per_block;
  };
  while (t.wk < max_wk && 2 * t.wk * kLanesPerRow * 2 <= tile_units && blocks_for(2 * t.wk) * batch <= wave) {
    t.wk *= 2;
  }
  // K split over a cluster while the grid keeps fewer than kInFlightBytesTarget bytes in flight
  // (each lane two batches of kBatchChunks chunks), the grid, doubled, still fits one wave, and
  // each lane of a part keeps at least kMinSplitLaneChunks chunks (fewer would leave the split's
  // cluster barriers and staging as the cost).
  const int64_t blocks = blocks_for(t.wk);
  const int64_t in_flight_per_block = int64_t{kThreads} * 2 * BatchChunks(k_m) * 16;
  while (2 * t.ksplit <= kMaxGemvSplit && t.ksplit * blocks * batch * in_flight_per_block < kInFlightBytesTarget &&
         2 * t.ksplit * blocks * batch <= wave &&
         work_units / (2 * t.ksplit) >= static_cast<int64_t>(kMinSplitLaneChunks) * t.wk * kLanesPerRow) {
    t.ksplit *= 2;
  }
  t.part_chunks = (chunks + t.ksplit - 1) / t.ksplit;
  if (t.ksplit > 1) t.tile_chunks = static_cast<int>(t.part_chunks < budget ? t.part_chunks : budget);
  return t;
}

// Elements per unit of a lane's work (ChooseTiling's work_vec): the f32 weights' chunk for bf16
// weights under kKeepF32.
int WorkVec(GemvType b_type, GemvActivations activations) {
  return b_type == GemvType::kF32 || activations == GemvActivations::kKeepF32 ? 4 : 8;
}

template <typename W, int kM>
cudaError_t Launch(GemvArgs p, int work_vec, int64_t batch, int sm_count, cudaStream_t stream) {
  constexpr int kVec = Chunk<W>::kVec;
  const GemvTiling t = ChooseTiling(kM, kVec, work_vec, p.n, p.k, batch, sm_count);
  p.wk = t.wk;
  p.ksplit = t.ksplit;
  p.tile_chunks = t.tile_chunks;
  p.part_chunks = t.part_chunks;
  const int64_t rows_per_block = kRowsPerWarp * (kWarps / p.wk);
  const int64_t blocks = (p.n + rows_per_block - 1) / rows_per_block * p.ksplit;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(kM) * kVec * sizeof(float) * p.tile_chunks;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(batch));
  auto kernel = GemvKernel<W, kM>;
  if constexpr (kBatchChunks<kM> > kShallowBatchChunks) {
    const int64_t lanes = static_cast<int64_t>(kLanesPerRow) * p.wk;  // a row's lanes in one split part
    if ((p.part_chunks + lanes - 1) / lanes < 2 * kBatchChunks<kM>) kernel = GemvKernel<W, kM, kShallowBatchChunks>;
  }
  return LaunchKernelInClusters(p.programmatic, static_cast<unsigned>(p.ksplit), kernel, grid, dim3(kThreads), smem,
                                stream, p);
}

// GemvMmaKernel: block (x, item) computes 8 / wk groups of 16 weight rows of item `item` for all M
// (<= 8) activation rows, one m16n8k16 tile of C^T (rows x activation rows) per group. The wk warps
// of a group split each activation tile (256 wk elements of k, staged in shared memory as bf16) in
// 32-element blocks, 8 per warp (all in flight while the tile is staged), and add their C
// fragments in warp order at the end: deterministic. In a 32-block, lane (g, c) = (lane / 4,
// lane % 4) loads 16 bytes of weight rows g and g + 8 at k = 8c .. 8c + 7 and the activation row g
// at the same k from the tile; the first product takes k 8c + 0..3, the second 8c + 4..7 (a
// permutation of the k order that A and B share: the sums are those of the natural order up to
// fp32 reassociation). Lanes of activation rows >= M feed zeros.
constexpr int kMmaRows = 16;
constexpr int kMmaBlockK = 32;
constexpr int kMmaSteps = 8;                                   // 32-blocks per warp per tile
constexpr int kMmaMaxTileK = kMmaBlockK * kMmaSteps * kWarps;  // with wk = 8: 2048
constexpr int kMmaTileStride = kMmaMaxTileK + 8;  // bf16 per staged row: +16 bytes, no bank conflicts

// 8 bf16 weights of `row` at k .. k + 7 (zeros past k_end; 16-byte aligned when whole).
__device__ __forceinline__ uint4 LoadWeights8(const uint16_t* row, int64_t k, int64_t k_end) {
  if (k + 8 <= k_end) return __ldcs(reinterpret_cast<const uint4*>(row + k));
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (k + e < k_end) w[e / 2] |= static_cast<uint32_t>(row[k + e]) << (16 * (e % 2));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void __launch_bounds__(kThreads) GemvMmaKernel(GemvArgs p) {
  __shared__ __align__(16) uint16_t tile[kGemvMaxRows * kMmaTileStride];
  __shared__ float partial[kWarps][kMmaRows][kGemvMaxRows];
  const int64_t item = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int group = warp / p.wk, part = warp % p.wk;
  const int tile_k = kMmaBlockK * kMmaSteps * p.wk;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / p.wk) + group) * kMmaRows;
  const uint16_t* b = static_cast<const uint16_t*>(p.b) + item * p.stride_b;
  // Rows past n read row n - 1 (in bounds; their results are not written).
  const uint16_t* lo_row = b + min(row0 + g, p.n - 1) * p.ldb;
  const uint16_t* hi_row = b + min(row0 + g + 8, p.n - 1) * p.ldb;
  const size_t a_size = p.a_bf16 ? sizeof(uint16_t) : sizeof(float);
  const char* a = static_cast<const char*>(p.a) + item * p.stride_a * static_cast<int64_t>(a_size);

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  PdlLaunchDependents();
  for (int64_t k0 = 0; k0 < p.k; k0 += tile_k) {
    // This warp's weights of the tile, in flight while the activations are staged.
    uint4 wlo[kMmaSteps], whi[kMmaSteps];
#pragma unroll
    for (int s = 0; s < kMmaSteps; ++s) {
      const int64_t k = k0 + (s * p.wk + part) * kMmaBlockK + 8 * c;
      wlo[s] = k < p.k ? LoadWeights8(lo_row, k, p.k) : make_uint4(0u, 0u, 0u, 0u);
      whi[s] = k < p.k ? LoadWeights8(hi_row, k, p.k) : make_uint4(0u, 0u, 0u, 0u);
    }
    // The first tile's weights are in flight before the activations' writers have finished (as in
    // GemvKernel); every thread passes here once (k >= 1).
    if (k0 == 0) PdlWait();
    // Activation rows [M][tk32] as bf16 (rounded when a is f32, exact when bf16): the tile's
    // columns up to the last 32-block that holds any k, zeros past k.
    const int64_t tk = p.k - k0 < tile_k ? p.k - k0 : tile_k;
    const int tk32 = static_cast<int>((tk + kMmaBlockK - 1) / kMmaBlockK * kMmaBlockK);
    if (p.a_quads) {  // f32 rows 16-byte aligned: quads (the last quad of a row may be partial)
      const int quads = tk32 / 4, total = p.m * quads;
      for (int base = threadIdx.x; base < total; base += kThreads * 4) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int i = base + u * kThreads, m = i / quads, kk = 4 * (i % quads);
          v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (i < total && kk < tk) {
            const float* src = reinterpret_cast<const float*>(a) + m * p.lda + k0 + kk;
            if (kk + 4 <= tk) {
              v[u] = *reinterpret_cast<const float4*>(src);
            } else {
              v[u].x = src[0];
              if (kk + 1 < tk) v[u].y = src[1];
              if (kk + 2 < tk) v[u].z = src[2];
            }
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int i = base + u * kThreads;
          if (i < total) {
            uint16_t* out = tile + (i / quads) * kMmaTileStride + 4 * (i % quads);
            const uint2 packed = make_uint2(
                __bfloat16_as_ushort(__float2bfloat16_rn(v[u].x)) |
                    (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v[u].y))) << 16),
                __bfloat16_as_ushort(__float2bfloat16_rn(v[u].z)) |
                    (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v[u].w))) << 16));
            *reinterpret_cast<uint2*>(out) = packed;
          }
        }
      }
    } else {
      const int total = p.m * tk32;
      for (int base = threadIdx.x; base < total; base += kThreads * 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int i = base + u * kThreads, m = i / tk32, kk = i % tk32;
          v[u] = 0.0f;
          if (i < total && kk < tk) {
            const int64_t at = m * p.lda + k0 + kk;
            v[u] = p.a_bf16 ? Bf16Bits(reinterpret_cast<const uint16_t*>(a)[at])
                            : reinterpret_cast<const float*>(a)[at];
          }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int i = base + u * kThreads;
          if (i < total) {
            tile[(i / tk32) * kMmaTileStride + i % tk32] = __bfloat16_as_ushort(__float2bfloat16_rn(v[u]));
          }
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kMmaSteps; ++s) {
      const int kb = (s * p.wk + part) * kMmaBlockK;  // warp-uniform
      if (k0 + kb >= p.k) break;
      uint4 x = make_uint4(0u, 0u, 0u, 0u);  // activation rows >= M: zeros
      if (g < p.m) x = *reinterpret_cast<const uint4*>(tile + g * kMmaTileStride + kb + 8 * c);
      const unsigned a1[4] = {wlo[s].x, whi[s].x, wlo[s].y, whi[s].y};
      const unsigned a2[4] = {wlo[s].z, whi[s].z, wlo[s].w, whi[s].w};
      MmaBf16(acc, a1, x.x, x.y);
      MmaBf16(acc, a2, x.z, x.w);
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
  // acc holds C^T at (row g, activation 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1).
  partial[warp][g][2 * c] = acc[0];
  partial[warp][g][2 * c + 1] = acc[1];
  partial[warp][g + 8][2 * c] = acc[2];
  partial[warp][g + 8][2 * c + 1] = acc[3];
  __syncthreads();
  const int groups = kWarps / p.wk;
  for (int i = threadIdx.x; i < groups * kMmaRows * kGemvMaxRows; i += kThreads) {
    const int grp = i / (kMmaRows * kGemvMaxRows), r = i / kGemvMaxRows % kMmaRows, m = i % kGemvMaxRows;
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * groups + grp) * kMmaRows + r;
    if (m >= p.m || row >= p.n) continue;
    float sum = 0.0f;
    for (int w = 0; w < p.wk; ++w) sum += partial[grp * p.wk + w][r][m];
    float* out = p.c + item * p.stride_c + m * p.ldc + row;
    float v = p.alpha * sum;
    if (p.beta != 0.0f) v += p.beta * *out;
    if (p.bias != nullptr) v += p.bias[row];
    *out = v;
  }
}

// Warps per row group of GemvMmaKernel: the fewest (so the most rows per block: each block stages
// all M activation rows of K, which with 16 rows per block is as many bytes as the block's weights
// at M = 8) that still give one block per multiprocessor over all items.
cudaError_t LaunchMma(GemvArgs p, int64_t batch, int sm_count, cudaStream_t stream) {
  p.wk = 1;
  const auto blocks_for = [&](int wk) {
    const int64_t rows_per_block = kMmaRows * (kWarps / wk);
    return (p.n + rows_per_block - 1) / rows_per_block;
  };
  while (p.wk < kWarps && blocks_for(p.wk) * batch < static_cast<int64_t>(sm_count)) p.wk *= 2;
  const int64_t blocks = blocks_for(p.wk);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchKernel(p.programmatic, GemvMmaKernel,
                      dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(batch)),
                      dim3(kThreads), 0, stream, p);
}

template <typename W>
cudaError_t LaunchRows(const GemvArgs& p, int work_vec, int64_t batch, int sm_count, cudaStream_t stream) {
  if (p.m <= 1) return Launch<W, 1>(p, work_vec, batch, sm_count, stream);
  if (p.m <= 2) return Launch<W, 2>(p, work_vec, batch, sm_count, stream);
  if (p.m <= 4) return Launch<W, 4>(p, work_vec, batch, sm_count, stream);
  return Launch<W, 8>(p, work_vec, batch, sm_count, stream);
}

int RowsBucket(int64_t m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8; }

}  // namespace

int GemvKSplit(GemvType b_type, GemvActivations activations, int64_t m, int64_t n, int64_t k,
               int64_t batch, int sm_count) {
  if (m < 1 || m > kGemvMaxRows || n < 1 || k < 1 || batch < 1 || sm_count < 1) return 1;
  const bool b_bf16 = b_type == GemvType::kBF16;
  if (b_bf16 && m >= 2 && activations == GemvActivations::kRoundToBf16) return 1;  // GemvMmaKernel
  const int vec = b_bf16 ? 8 : 4;
  return ChooseTiling(RowsBucket(m), vec, WorkVec(b_type, activations), n, k, batch, sm_count).ksplit;
}

cudaError_t LaunchGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                       const void* b, GemvType b_type, int64_t ldb, int64_t batch_stride_b,
                       GemvActivations activations, float* c, int64_t ldc, int64_t batch_stride_c,
                       const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                       float beta, bool programmatic, cudaStream_t stream) {
  static_assert(kGemvMaxRows <= kLanesPerRow, "LaunchRows' largest bucket");
  if (a == nullptr || b == nullptr || c == nullptr) return cudaErrorInvalidValue;
  if (m < 1 || m > kGemvMaxRows || n < 1 || k < 1 || batch < 1 || batch > 65535) {
    return cudaErrorInvalidValue;
  }
  if ((m > 1 && (lda < k || ldc < n)) || (n > 1 && ldb < k)) return cudaErrorInvalidValue;
  if (batch > 1 && (batch_stride_a < 0 || batch_stride_b < 0 || batch_stride_c < 0)) {
    return cudaErrorInvalidValue;
  }
  if (a_type == GemvType::kBF16 &&
      (b_type != GemvType::kBF16 || activations != GemvActivations::kRoundToBf16)) {
    return cudaErrorInvalidValue;
  }
  if (!GemvWeightsAligned(b, b_type, ldb, batch_stride_b, n, batch)) return cudaErrorInvalidValue;
  const bool b_bf16 = b_type == GemvType::kBF16;
  const bool keep_f32 = activations == GemvActivations::kKeepF32;
  GemvArgs p{};
  p.a = a;
  p.lda = m > 1 ? lda : 0;
  p.stride_a = batch > 1 ? batch_stride_a : 0;
  p.a_bf16 = a_type == GemvType::kBF16;
  p.round_a = b_bf16 && !p.a_bf16 && !keep_f32;
  p.a_quads = !p.a_bf16 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && p.lda % 4 == 0 &&
              p.stride_a % 4 == 0;
  p.b = b;
  p.ldb = n > 1 ? ldb : 0;
  p.stride_b = batch > 1 ? batch_stride_b : 0;
  p.c = c;
  p.ldc = m > 1 ? ldc : 0;
  p.stride_c = batch > 1 ? batch_stride_c : 0;
  p.bias = bias;
  p.m = static_cast<int>(m);
  p.n = n;
  p.k = k;
  p.alpha = alpha;
  p.beta = beta;
  p.programmatic = programmatic;
  int device = 0, sm_count = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  if (const cudaError_t error =
          cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
      error != cudaSuccess) {
    return error;
  }
  if (b_bf16 && m >= 2 && !keep_f32) return LaunchMma(p, batch, sm_count, stream);
  const int work_vec = WorkVec(b_type, activations);
  return b_bf16 ? LaunchRows<uint16_t>(p, work_vec, batch, sm_count, stream)
                : LaunchRows<float>(p, work_vec, batch, sm_count, stream);
}

}  // namespace eagle3::cuda
