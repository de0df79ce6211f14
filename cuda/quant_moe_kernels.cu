// The routed experts of a quantized checkpoint (cuda/quant_moe_ops.h: design and numerics). No
// abseil here: nvcc must never see it.
//
// The grouped path's products are the quantized GEMV's (quant_gemv_kernels.cu); this file holds the
// kernels around them (grouping, per-job slots and pointers, SiLU-mul, the ordered combine) and the
// CUDA-core kernels of the path for views off the GEMV's layout.
//
// CUDA-core path: weight rows stream through CUDA cores: a team of 2^team_shift lanes owns one weight row (gate and
// up rows i together in step 2, down row h in step 3) and splits its columns in 16-column chunks,
// lane m taking chunks m, m + team, ...; each lane keeps two chunks' loads in flight (the raw bytes
// are fetched for both before either is decoded), decodes a chunk to f32 in registers and
// multiplies it by every pair of the job (the pairs' bf16 input rows are read through L1, where the
// block's other rows read them too). Teams are as wide as a row has chunks (up to a warp), so short
// rows (down's I columns) do not idle lanes.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core_kernels.cuh"
#include "programmatic_launch.cuh"
#include "quant_gemv_ops.h"
#include "quant_moe_ops.h"

namespace eagle3::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSortThreads = 1024;
constexpr int kJobPairs = static_cast<int>(kQuantMoeJobPairs);
constexpr int kChunk = static_cast<int>(kQuantMoeChunk);
constexpr int64_t kMaxGridY = 65535;

__device__ __forceinline__ float Bf16ToF32(uint32_t bits) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ uint16_t F32ToBf16(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// Every kernel of this file reads what the kernel before it writes (the routing, the grouping, the
// products) and streams no weights before that: it opens with PdlEnter (programmatic_launch.cuh).

// The e4m3 value of a code, exactly (NaN codes 0x7f / 0xff read as NaN, as F8E4M3ToFloat does).
__device__ __forceinline__ float E4m3ToF32(uint32_t code) {
  __nv_fp8_e4m3 v;
  v.__x = static_cast<__nv_fp8_storage_t>(code);
  return static_cast<float>(v);
}

struct RowsParams {
  const QuantMoeExpert* experts;
  int block_rows, block_cols;
  const int32_t* sorted;
  const int32_t* jobs;
  const int32_t* num_jobs;
  const uint16_t* in;  // bf16 input rows: pair p reads row p / in_div
  int64_t in_ld;
  int in_div;
  int64_t rows;  // weight rows (I for gate / up, H for down)
  int k;         // weight columns (H, I)
  bool chunked;  // QuantMoeChunked holds for the matrices read
  int team_shift;
  uint16_t* act;  // step 2's output [pairs, act_ld] bf16
  int64_t act_ld;
  float* y;  // step 3's output [pairs, y_ld] f32
  int64_t y_ld;
};

// A chunk's raw weights as fetched (chunked path), or nothing (decoded from memory by Decode).
struct RawChunk {
  uint4 bits;
  float scale;
};

// Scale of slice element (r, c) of m, as f32 (fp8: f32 scale_inv; int4: bf16).
template <bool kInt4>
__device__ __forceinline__ float ScaleAt(const QuantMoeMatrix& m, const RowsParams& p, int64_t r, int64_t c) {
  const int64_t at = (m.row_off + r) / p.block_rows * m.scales_ld + (m.col_off + c) / p.block_cols;
  if constexpr (kInt4) return Bf16ToF32(__ldg(static_cast<const uint16_t*>(m.scales) + at));
  return __ldg(static_cast<const float*>(m.scales) + at);
}

// FP8 block-scaled: a chunk is 16 codes (one 16-byte load).
struct Fp8 {
  __device__ static RawChunk Fetch(const QuantMoeMatrix& m, const RowsParams& p, int64_t r, int c0) {
    const uint8_t* row = static_cast<const uint8_t*>(m.codes) + r * m.codes_ld;
    return {__ldcs(reinterpret_cast<const uint4*>(row + c0)), ScaleAt<false>(m, p, r, c0)};
  }
  __device__ static void Decode(const RawChunk& raw, float (&w)[kChunk]) {
    const uint32_t words[4] = {raw.bits.x, raw.bits.y, raw.bits.z, raw.bits.w};
#pragma unroll
    for (int i = 0; i < kChunk; ++i) w[i] = E4m3ToF32((words[i / 4] >> (8 * (i % 4))) & 0xffu) * raw.scale;
  }
  // Columns [c0, c0 + 16) a value at a time, zeros from column k on.
  __device__ static void DecodeAt(const QuantMoeMatrix& m, const RowsParams& p, int64_t r, int c0, float (&w)[kChunk]) {
    const uint8_t* row = static_cast<const uint8_t*>(m.codes) + r * m.codes_ld;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int c = c0 + i;
      w[i] = c < p.k ? E4m3ToF32(row[c]) * ScaleAt<false>(m, p, r, c) : 0.0f;
    }
  }
};

// INT4 group: a chunk is 16 values, two packed words (one 8-byte load); value u stored as q + 8.
struct Int4 {
  __device__ static RawChunk Fetch(const QuantMoeMatrix& m, const RowsParams& p, int64_t r, int c0) {
    const uint32_t* row = static_cast<const uint32_t*>(m.codes) + r * m.codes_ld;
    const uint2 v = __ldcs(reinterpret_cast<const uint2*>(row + c0 / 8));
    return {make_uint4(v.x, v.y, 0u, 0u), ScaleAt<true>(m, p, r, c0)};
  }
  __device__ static void Decode(const RawChunk& raw, float (&w)[kChunk]) {
    const uint32_t words[2] = {raw.bits.x, raw.bits.y};
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int q = static_cast<int>((words[i / 8] >> (4 * (i % 8))) & 0xfu) - 8;
      w[i] = static_cast<float>(q) * raw.scale;
    }
  }
  __device__ static void DecodeAt(const QuantMoeMatrix& m, const RowsParams& p, int64_t r, int c0, float (&w)[kChunk]) {
    const uint32_t* row = static_cast<const uint32_t*>(m.codes) + r * m.codes_ld;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int c = c0 + i;
      if (c < p.k) {
        const int64_t v = m.nib0 + c;
        const int q = static_cast<int>((row[v / 8] >> (4 * (v % 8))) & 0xfu) - 8;
        w[i] = static_cast<float>(q) * ScaleAt<true>(m, p, r, c);
      } else {
        w[i] = 0.0f;
      }
    }
  }
};

// Input columns [c0, c0 + 16) of a bf16 row as floats: two 16-byte loads for a whole chunk (rows
// are 32-byte aligned), else a value at a time with zeros from column k on (the padding of the
// workspace rows is never read, so it may hold anything).
__device__ __forceinline__ void LoadInput(const uint16_t* row, int c0, int k, bool whole, float (&v)[kChunk]) {
  if (whole) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(row + c0));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(row + c0 + 8));
    const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = Bf16ToF32((words[i / 2] >> (16 * (i % 2))) & 0xffffu);
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = c0 + i < k ? Bf16ToF32(row[c0 + i]) : 0.0f;
  }
}

// Step 2 (kGateUp: gate and up rows, act out) or step 3 (down rows, y out) for job blockIdx.y and
// the block's rows (blockIdx.x).
template <typename F, bool kGateUp>
__global__ void __launch_bounds__(kThreads) QuantMoeRowsKernel(const RowsParams p) {
  PdlEnter();
  if (static_cast<int>(blockIdx.y) >= *p.num_jobs) return;  // block-uniform
  const int32_t* job = p.jobs + 3 * blockIdx.y;
  const int expert = job[0], first = job[1], count = job[2];
  const int team = 1 << p.team_shift;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int member = lane & (team - 1);
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * (32 >> p.team_shift) + (lane >> p.team_shift);
  const bool live = row < p.rows;
  const int64_t r = live ? row : p.rows - 1;  // a team past the end computes the last row, writes nothing
  const QuantMoeExpert& ex = p.experts[expert];
  const QuantMoeMatrix m0 = kGateUp ? ex.gate : ex.down;
  const QuantMoeMatrix m1 = kGateUp ? ex.up : ex.down;

  int pair[kJobPairs];
  const uint16_t* in_row[kJobPairs];
#pragma unroll
  for (int q = 0; q < kJobPairs; ++q) {
    pair[q] = q < count ? p.sorted[first + q] : 0;
    in_row[q] = p.in + static_cast<int64_t>(pair[q] / p.in_div) * p.in_ld;
  }
  float acc0[kJobPairs], acc1[kJobPairs];
#pragma unroll
  for (int q = 0; q < kJobPairs; ++q) acc0[q] = acc1[q] = 0.0f;

  const int chunks = (p.k + kChunk - 1) / kChunk;
  // One chunk: decode both matrices' weights, multiply by every pair's input.
  const auto consume = [&](int ch, const RawChunk& raw0, const RawChunk& raw1, bool fetched) {
    const int c0 = ch * kChunk;
    float w0[kChunk], w1[kChunk];
    if (fetched) {
      F::Decode(raw0, w0);
      if constexpr (kGateUp) F::Decode(raw1, w1);
    } else {
      F::DecodeAt(m0, p, r, c0, w0);
      if constexpr (kGateUp) F::DecodeAt(m1, p, r, c0, w1);
    }
    const bool whole = c0 + kChunk <= p.k;
#pragma unroll
    for (int q = 0; q < kJobPairs; ++q) {
      if (q < count) {
        float v[kChunk];
        LoadInput(in_row[q], c0, p.k, whole, v);
        float s0 = acc0[q], s1 = acc1[q];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          s0 = fmaf(w0[i], v[i], s0);
          if constexpr (kGateUp) s1 = fmaf(w1[i], v[i], s1);
        }
        acc0[q] = s0;
        acc1[q] = s1;
      }
    }
  };
  for (int ch = member; ch < chunks; ch += 2 * team) {
    const int ch1 = ch + team;
    // Fetch both chunks' raw weights before decoding either: two loads per matrix in flight.
    const bool fetch0 = p.chunked && (ch + 1) * kChunk <= p.k;
    const bool fetch1 = p.chunked && (ch1 + 1) * kChunk <= p.k;
    RawChunk a0{}, b0{}, a1{}, b1{};
    if (fetch0) {
      a0 = F::Fetch(m0, p, r, ch * kChunk);
      if constexpr (kGateUp) b0 = F::Fetch(m1, p, r, ch * kChunk);
    }
    if (fetch1) {
      a1 = F::Fetch(m0, p, r, ch1 * kChunk);
      if constexpr (kGateUp) b1 = F::Fetch(m1, p, r, ch1 * kChunk);
    }
    consume(ch, a0, b0, fetch0);
    if (ch1 < chunks) consume(ch1, a1, b1, fetch1);
  }

  // The team's lanes, added in a fixed butterfly (every lane takes part: shuffles are warp-wide).
#pragma unroll
  for (int q = 0; q < kJobPairs; ++q) {
    for (int offset = team / 2; offset > 0; offset >>= 1) {
      acc0[q] += __shfl_xor_sync(kFullMask, acc0[q], offset);
      if constexpr (kGateUp) acc1[q] += __shfl_xor_sync(kFullMask, acc1[q], offset);
    }
  }
  if (!live || member != 0) return;
#pragma unroll
  for (int q = 0; q < kJobPairs; ++q) {
    if (q < count) {
      if constexpr (kGateUp) {
        const float g = acc0[q];
        p.act[pair[q] * p.act_ld + row] = F32ToBf16(g / (1.0f + expf(-g)) * acc1[q]);
      } else {
        p.y[pair[q] * p.y_ld + row] = acc0[q];
      }
    }
  }
}

// The round's routing as the grouping reads it: pair i = tl * top_k + j (tl < tokens) has the id
// ids[(token0 + tl) * stride + j]; a pair whose id is outside [0, num_experts) records its token
// (error_code | token0 + tl) in error_flag.
struct RoundIds {
  const int32_t* ids;
  int64_t stride, token0;
  int tokens, top_k, num_experts;
  int* error_flag;
  int error_code;
  int job_pairs;  // pairs a job holds at most: 1 .. kJobPairs (QuantMoeJobPairsFor)
};

__device__ __forceinline__ int64_t PairToken(const RoundIds& r, int i) { return r.token0 + i / r.top_k; }
__device__ __forceinline__ int32_t PairId(const RoundIds& r, int i) {
  return r.ids[PairToken(r, i) * r.stride + i % r.top_k];
}
__device__ __forceinline__ bool GoodId(const RoundIds& r, int32_t e) { return e >= 0 && e < r.num_experts; }

// Step 1a's shared memory in a block of kBlockThreads threads.
template <int kBlockThreads>
struct GroupingShared {
  int cursor[kQuantMoeMaxExperts];  // counts, then each expert's next place
  int2 warp_total[kBlockThreads / 32];
  int num_jobs, placed;  // the round's jobs, and its pairs with good ids
};

// Step 1a, by every thread of a block of kBlockThreads: the round's pairs grouped by expert into
// sorted[0, s.placed) (expert-major, experts in ascending order) and the job list
// jobs[0, 3 s.num_jobs) (expert, first, count: each expert's pairs in runs of up to r.job_pairs);
// sorted and jobs may be shared or global memory, and are complete when it returns. A pair with a
// bad id is left out and, with `record`, its token recorded.
// Within an expert, a round of up to kQuantMoeFoldPairs pairs keeps its pairs in index order: the
// same grouping on every run, in the grouping kernel and in the slots kernel that folds it in. A
// larger round takes the order its atomics give, which results do not depend on: the jobs depend
// only on the counts, and a pair's place only decides which row of which of its expert's jobs
// holds it, while every later step computes a row by itself (the GEMVs sum an activation row in a
// chain of its own whichever row of its operand holds it, quant_gemv_kernels.cu; SiLU-mul is per
// row; the combine adds a token's slots in k order, finding each through slot_of).
template <int kBlockThreads>
__device__ void GroupPairs(const RoundIds& r, bool record, GroupingShared<kBlockThreads>& s, int32_t* sorted,
                           int32_t* jobs) {
  static_assert(kQuantMoeFoldPairs <= kBlockThreads, "the ordered placement takes one pair per thread");
  const int pairs = r.tokens * r.top_k;
  // Pairs in index order within an expert (below): then each thread has at most one pair,
  // threadIdx.x, whose expert it keeps (-1: none, or a bad id).
  const bool ordered = pairs <= kQuantMoeFoldPairs;
  int32_t my_expert = -1;
  for (int e = threadIdx.x; e < r.num_experts; e += kBlockThreads) s.cursor[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += kBlockThreads) {
    const int32_t e = PairId(r, i);
    if (GoodId(r, e)) {
      atomicAdd(&s.cursor[e], 1);
      my_expert = e;
    } else if (record) {
      RecordDeviceError(r.error_flag, r.error_code, PairToken(r, i));
    }
  }
  __syncthreads();
  // Exclusive scan of (pairs, jobs) over the experts: thread i owns experts [i per, (i + 1) per).
  const int per = (r.num_experts + kBlockThreads - 1) / kBlockThreads;
  const int e0 = threadIdx.x * per, e1 = min(e0 + per, r.num_experts);
  int2 mine = make_int2(0, 0);
  for (int e = e0; e < e1; ++e) {
    mine.x += s.cursor[e];
    mine.y += (s.cursor[e] + r.job_pairs - 1) / r.job_pairs;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int2 inclusive = mine;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int x = __shfl_up_sync(kFullMask, inclusive.x, offset);
    const int y = __shfl_up_sync(kFullMask, inclusive.y, offset);
    if (lane >= offset) {
      inclusive.x += x;
      inclusive.y += y;
    }
  }
  if (lane == 31) s.warp_total[warp] = inclusive;
  __syncthreads();
  int2 before = make_int2(inclusive.x - mine.x, inclusive.y - mine.y);
  for (int w = 0; w < warp; ++w) {
    before.x += s.warp_total[w].x;
    before.y += s.warp_total[w].y;
  }
  if (threadIdx.x == kBlockThreads - 1) {
    s.num_jobs = before.y + mine.y;
    s.placed = before.x + mine.x;
  }
  __syncthreads();  // every count read
  for (int e = e0; e < e1; ++e) {
    const int count = s.cursor[e];
    for (int start = 0; start < count; start += r.job_pairs) {
      int32_t* entry = jobs + 3 * before.y++;
      entry[0] = e;
      entry[1] = before.x + start;
      entry[2] = min(r.job_pairs, count - start);
    }
    s.cursor[e] = before.x;
    before.x += count;
  }
  __syncthreads();
  if (ordered) {
    // The warps take their pairs' places in turn; within a warp, the pairs of an expert rank by
    // lane.
    const int i = static_cast<int>(threadIdx.x);
    const int32_t e = my_expert;
    const unsigned same = __match_any_sync(kFullMask, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    for (int w = 0; 32 * w < pairs; ++w) {
      if (warp == w) {
        const int base = e >= 0 ? s.cursor[e] : 0;
        __syncwarp();  // every lane has read its expert's place before the expert's first lane moves it
        if (e >= 0) {
          sorted[base + rank] = i;
          if (rank == 0) s.cursor[e] = base + __popc(same);
        }
      }
      __syncthreads();
    }
  } else {
    for (int i = threadIdx.x; i < pairs; i += kBlockThreads) {
      const int32_t e = PairId(r, i);
      if (GoodId(r, e)) sorted[atomicAdd(&s.cursor[e], 1)] = i;
    }
    __syncthreads();
  }
}

// Step 1a as a kernel of its own, one block: the grouping into the workspace.
__global__ void __launch_bounds__(kSortThreads)
    QuantMoeSortKernel(const RoundIds r, int32_t* __restrict__ sorted, int32_t* __restrict__ jobs,
                       int32_t* __restrict__ num_jobs) {
  PdlEnter();
  __shared__ GroupingShared<kSortThreads> s;
  GroupPairs(r, /*record=*/true, s, sorted, jobs);
  if (threadIdx.x == 0) *num_jobs = s.num_jobs;
}

// Grouped step 2, block (j, q) per job and row q < r.job_pairs of its slot (blocks of jobs past the
// job count exit):
// block (j, 0) writes job j's item pointers (gate-up items 2j, 2j + 1; down item j) and its
// pairs' slot rows and its pair count as the GEMVs' item rows; block (j, q < count) writes row q of
// job j's slot of x: bf16(x of pair q's token). The GEMVs take each item's rows (QuantGemvItems::
// rows), so rows past the count are neither written nor read. One block per row, eight columns per
// thread and load: the copy is latency-bound at decode sizes, not bandwidth-bound.
// kFold: step 1a folded in (a round of at most kQuantMoeFoldPairs pairs, launched without the
// grouping kernel): every block groups the round in its shared memory (GroupPairs: the same
// grouping in every block) and block (0, 0) writes the grouping to the workspace (jobs and
// num_jobs for SiLU-mul and the down GEMV, sorted as the grouping kernel leaves it) and records the
// bad ids. Otherwise the grouping kernel has written it.
template <bool kFold>
__global__ void __launch_bounds__(kThreads)
    QuantMoeSlotsKernel(const float* __restrict__ x, int64_t x_stride, int64_t hidden, const RoundIds r,
                        const QuantMoeExpert* __restrict__ experts, bool int4, QuantMoeWorkspace ws, int64_t x_ld) {
  PdlEnter();
  const int j = static_cast<int>(blockIdx.x), q = static_cast<int>(blockIdx.y);
  const bool first_block = j == 0 && q == 0;
  const int32_t* sorted = ws.sorted;
  const int32_t* jobs = ws.jobs;
  int job_count;
  if constexpr (kFold) {
    __shared__ GroupingShared<kThreads> s;
    __shared__ int32_t fold_sorted[kQuantMoeFoldPairs], fold_jobs[3 * kQuantMoeFoldPairs];  // a job has a pair
    GroupPairs(r, /*record=*/first_block, s, fold_sorted, fold_jobs);
    job_count = s.num_jobs;
    if (first_block) {
      for (int i = threadIdx.x; i < s.placed; i += kThreads) ws.sorted[i] = fold_sorted[i];
      for (int i = threadIdx.x; i < 3 * job_count; i += kThreads) ws.jobs[i] = fold_jobs[i];
      if (threadIdx.x == 0) *ws.num_jobs = job_count;
    }
    sorted = fold_sorted;
    jobs = fold_jobs;
  } else {
    job_count = *ws.num_jobs;
  }
  // Written even with no jobs: the gate-up GEMV must never see a stale count.
  if (first_block && threadIdx.x == 0) *ws.gate_up_items = 2 * job_count;
  if (j >= job_count) return;  // block-uniform
  const int expert = jobs[3 * j], first = jobs[3 * j + 1], count = jobs[3 * j + 2];
  uint16_t* slot = ws.x + static_cast<int64_t>(j) * kJobPairs * x_ld;
  if (q == 0) {
    if (threadIdx.x == 0) {
      const QuantMoeExpert& e = experts[expert];
      // int4: the slice's first row of scales, as Int4GroupWeights::scale; fp8: the scale tensor's
      // block (0, 0), as Fp8BlockWeights::scale_inv (the GEMV adds row_off and col_off).
      const auto scales = [&](const QuantMoeMatrix& m) -> const void* {
        return int4 ? static_cast<const void*>(static_cast<const uint16_t*>(m.scales) + m.row_off * m.scales_ld)
                    : m.scales;
      };
      ws.gate_up_a[2 * j] = ws.gate_up_a[2 * j + 1] = slot;
      ws.gate_up_codes[2 * j] = e.gate.codes;
      ws.gate_up_codes[2 * j + 1] = e.up.codes;
      ws.gate_up_scales[2 * j] = scales(e.gate);
      ws.gate_up_scales[2 * j + 1] = scales(e.up);
      ws.down_codes[j] = e.down.codes;
      ws.down_scales[j] = scales(e.down);
      ws.gate_up_rows[2 * j] = ws.gate_up_rows[2 * j + 1] = count;
      ws.down_rows[j] = count;
    }
    if (threadIdx.x < count) ws.slot_of[sorted[first + threadIdx.x]] = j * kJobPairs + threadIdx.x;
  }
  if (q >= count) return;  // block-uniform
  const float* row = x + static_cast<int64_t>(sorted[first + q] / r.top_k) * x_stride;
  uint16_t* out = slot + static_cast<int64_t>(q) * x_ld;
  // Whole 8-column pieces with 16-byte loads and stores where the row allows (the slot rows are
  // 32-byte aligned: a 256-byte aligned buffer, rows of RoundUp16(hidden) bf16), the rest one by one.
  const int64_t pieces = reinterpret_cast<uintptr_t>(row) % 16 == 0 ? hidden / 8 : 0;
  const auto pack = [](float a, float b) {
    return static_cast<uint32_t>(F32ToBf16(a)) | (static_cast<uint32_t>(F32ToBf16(b)) << 16);
  };
  for (int64_t v = threadIdx.x; v < pieces; v += kThreads) {
    const float4 lo = *reinterpret_cast<const float4*>(row + 8 * v);
    const float4 hi = *reinterpret_cast<const float4*>(row + 8 * v + 4);
    *reinterpret_cast<uint4*>(out + 8 * v) =
        make_uint4(pack(lo.x, lo.y), pack(lo.z, lo.w), pack(hi.x, hi.y), pack(hi.z, hi.w));
  }
  for (int64_t c = 8 * pieces + threadIdx.x; c < hidden; c += kThreads) out[c] = F32ToBf16(row[c]);
}

// Grouped step 3b, block j per job: act rows q < count of job j's slot = bf16(silu(gate) * up), from
// the gate-up GEMV's items 2j (gate) and 2j + 1 (up), [8, inter] each (rows past the job's count
// are not written by it, and not read by the down GEMV). Rounds of more than one token keep it
// rather than the down GEMV's gated staging (QuantMoeShape::fold_silu): that stages each job's rows
// once per block of down rows (several per job at every plan the down product takes), which repeats
// the reads and the exponentials as often; at one token (one row a job) the repeats cost less than
// this kernel's launch.
__global__ void __launch_bounds__(kThreads)
    QuantMoeSiluMulKernel(const float* __restrict__ gate_up, int64_t inter, const int32_t* __restrict__ jobs,
                          const int32_t* __restrict__ num_jobs, uint16_t* __restrict__ act, int64_t act_ld) {
  PdlEnter();
  const int64_t j = blockIdx.x;
  if (j >= *num_jobs) return;
  const int64_t count = jobs[3 * j + 2];
  const float* gate = gate_up + 2 * j * kJobPairs * inter;
  const float* up = gate + kJobPairs * inter;
  for (int64_t i = threadIdx.x; i < count * inter; i += kThreads) {
    const int64_t q = i / inter, c = i - q * inter;
    const float g = gate[i];
    act[(j * kJobPairs + q) * act_ld + c] = F32ToBf16(g / (1.0f + expf(-g)) * up[i]);
  }
}

// Step 1b: x rows of the round rounded to bf16 (round to nearest, ties to even).
__global__ void QuantMoeRoundKernel(const float* __restrict__ x, int64_t x_stride, int64_t hidden,
                                    uint16_t* __restrict__ xb, int64_t xb_ld) {
  PdlEnter();
  const int64_t t = blockIdx.y;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < hidden;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    xb[t * xb_ld + c] = F32ToBf16(x[t * x_stride + c]);
  }
}

// Step 4: out[t] (+)= sum_j weights[t, j] y[t, j], slots in order; a token with a bad id keeps its row.
__global__ void QuantMoeCombineKernel(const int32_t* __restrict__ ids, int64_t ids_stride,
                                      const float* __restrict__ weights, int64_t weights_stride, int64_t token0,
                                      int top_k, int num_experts, const float* __restrict__ y,
                                      const int32_t* __restrict__ slot_of, int64_t hidden, float* __restrict__ out,
                                      int64_t out_stride, bool accumulate) {
  PdlEnter();
  const int64_t tl = blockIdx.y, t = token0 + tl;
  const int32_t* id = ids + t * ids_stride;
  for (int j = 0; j < top_k; ++j) {
    if (id[j] < 0 || id[j] >= num_experts) return;  // recorded by the grouping (step 1a)
  }
  const int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= hidden) return;
  float* o = out + t * out_stride + h;
  float acc = accumulate ? *o : 0.0f;  // without accumulate out is write-only (may hold NaN)
  for (int j = 0; j < top_k; ++j) {
    const int64_t pair = tl * top_k + j;
    const int64_t row = slot_of != nullptr ? slot_of[pair] : pair;  // grouped path: the pair's slot row
    acc += weights[t * weights_stride + j] * y[row * hidden + h];
  }
  *o = acc;
}

int TeamShift(int64_t k) {
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  int shift = 0;
  while (shift < 5 && (int64_t{1} << shift) < chunks) ++shift;
  return shift;
}

size_t Round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// One grouped product of a round: `items` (their codes and scales from arrays or by id), the rest
// shared (`layout`); m activation rows an item (at most; QuantGemvItems::rows), item i's output rows
// in a slot of kJobPairs rows of n at c + i * kJobPairs * n.
cudaError_t RoundProduct(const QuantMoeShape& shape, const QuantGemvItems& items, int64_t max_items,
                         const QuantMoeGemvLayout& layout, const void* a, GemvType a_type, int64_t lda,
                         int64_t stride_a, float* c, int64_t m, int64_t n, int64_t k, bool programmatic,
                         cudaStream_t stream) {
  const int64_t stride_c = kQuantMoeJobPairs * n;
  if (shape.format == QuantMoeFormat::kInt4Group) {
    Int4GroupWeights b;
    b.ld = layout.codes_ld;
    b.tiled = layout.tiled;
    b.scale_ld = layout.scales_ld;
    b.col0 = layout.col_off;
    b.group_size = shape.block_cols;
    return LaunchInt4GroupGemvGrouped(a, a_type, lda, stride_a, b, c, n, stride_c, nullptr, items, max_items, m, n, k,
                                      1.0f, 0.0f, programmatic, stream);
  }
  Fp8BlockWeights b;
  b.ld = layout.codes_ld;
  b.tiled = layout.tiled;
  b.scale_ld = layout.scales_ld;
  b.row0 = layout.row_off;
  b.col0 = layout.col_off;
  return LaunchFp8BlockGemvGrouped(a, a_type, lda, stride_a, b, c, n, stride_c, nullptr, items, max_items, m, n, k,
                                   1.0f, 0.0f, programmatic, stream);
}

// Grouped steps 2 and 3 of one round (fold: step 1a too; otherwise sorted and jobs written): slots
// and item pointers, the gate-up GEMV, SiLU-mul (or, shape.fold_silu, in the down GEMV's staging),
// the down GEMV; y holds every job's slot rows after it. combine: step 4 as the down GEMV's epilogue
// (its counters nullptr: not folded).
cudaError_t GroupedProducts(const float* x, int64_t x_stride, const RoundIds& round, const QuantMoeExpert* experts,
                            const QuantMoeShape& shape, int64_t max_jobs, const QuantMoeWorkspace& ws, bool fold,
                            const QuantGemvCombine& combine, bool programmatic, cudaStream_t stream) {
  const int64_t hidden = shape.hidden, inter = shape.inter;
  const int64_t x_ld = QuantMoeRoundUp16(hidden), act_ld = QuantMoeRoundUp16(inter);
  const bool int4 = shape.format == QuantMoeFormat::kInt4Group;
  const unsigned job_blocks = static_cast<unsigned>(max_jobs);
  const auto slots = fold ? QuantMoeSlotsKernel<true> : QuantMoeSlotsKernel<false>;
  if (const cudaError_t error =
          LaunchKernel(programmatic, slots, dim3(job_blocks, static_cast<unsigned>(round.job_pairs)), dim3(kThreads),
                       0, stream, x, x_stride, hidden, round, experts, int4, ws, x_ld);
      error != cudaSuccess) {
    return error;
  }

  // An item's rows are its job's, at most the round's job_pairs.
  const auto product = [&](const QuantGemvItems& items, int64_t max_items, const QuantMoeGemvLayout& layout,
                           const void* a, GemvType a_type, int64_t lda, int64_t stride_a, float* c, int64_t n,
                           int64_t k) {
    return RoundProduct(shape, items, max_items, layout, a, a_type, lda, stride_a, c, round.job_pairs, n, k,
                        programmatic, stream);
  };
  QuantGemvItems gate_up;
  gate_up.a = ws.gate_up_a;
  gate_up.a_aligned16 = true;  // slot rows: a 256-byte aligned buffer, rows of RoundUp16(hidden) bf16
  gate_up.codes = ws.gate_up_codes;
  gate_up.scales = ws.gate_up_scales;
  gate_up.count = ws.gate_up_items;
  gate_up.rows = ws.gate_up_rows;
  if (const cudaError_t error =
          product(gate_up, 2 * max_jobs, shape.gate_up, nullptr, GemvType::kBF16, x_ld, 0, ws.gate_up, inter, hidden);
      error != cudaSuccess) {
    return error;
  }
  QuantGemvItems down;
  down.codes = ws.down_codes;
  down.scales = ws.down_scales;
  down.count = ws.num_jobs;
  down.rows = ws.down_rows;
  down.combine = combine;
  if (shape.fold_silu && round.job_pairs == 1) {
    // Job j's gate rows (item 2j of the gate-up product) start 2 kJobPairs rows of inter after job
    // j - 1's, its up rows (item 2j + 1) kJobPairs rows after them.
    down.silu_up_offset = kQuantMoeJobPairs * inter;
    return product(down, max_jobs, shape.down, ws.gate_up, GemvType::kF32, inter, 2 * kQuantMoeJobPairs * inter, ws.y,
                   hidden, inter);
  }
  if (const cudaError_t error = LaunchKernel(programmatic, QuantMoeSiluMulKernel, dim3(job_blocks), dim3(kThreads), 0,
                                            stream, ws.gate_up, inter, ws.jobs, ws.num_jobs, ws.act, act_ld);
      error != cudaSuccess) {
    return error;
  }
  return product(down, max_jobs, shape.down, ws.act, GemvType::kBF16, act_ld, kQuantMoeJobPairs * act_ld, ws.y, hidden,
                 inter);
}

// A grouped round whose pairs are its jobs (QuantMoeShape::direct_one_token, direct_max_tokens):
// the gate-up GEMV over items 2j, 2j + 1 = pair j's gate and up (pair j = t * top_k + i: token t's
// slot i), found from ids[j] in the expert table, reading token t's f32 row of x (rounded to bf16
// as the slots kernel rounds it) into rows 8 i of ws.gate_up; then the down GEMV over items j, gated
// from those rows, into rows 8 j of ws.y, with the combine as its epilogue (pair j's row 8 j). A
// round of one token plans its products as GroupedProducts plans them (the same item counts and
// sizes): the same bits. A round of several tokens (ids token-major, round.stride == top_k) reads
// an expert that two of its tokens chose once for each; its products are planned for one row an
// item, so their fp32 sums may be ordered otherwise than the grouped path's jobs of 8 rows.
cudaError_t DirectRound(const float* x, int64_t x_stride, const RoundIds& round, const QuantMoeExpert* experts,
                        const QuantMoeShape& shape, const QuantMoeWorkspace& ws, QuantGemvCombine combine,
                        bool programmatic, cudaStream_t stream) {
  const int64_t hidden = shape.hidden, inter = shape.inter, top_k = round.top_k, pairs = round.tokens * top_k;
  const bool int4 = shape.format == QuantMoeFormat::kInt4Group;
  const auto indexed = [&](int per_id, const QuantMoeGemvLayout& layout, std::initializer_list<size_t> roles) {
    QuantGemvIndexedItems ix;
    ix.ids = round.ids + round.token0 * round.stride;
    if (round.tokens > 1) ix.token_items = per_id * top_k;
    ix.table = experts;
    ix.entry_bytes = static_cast<int64_t>(sizeof(QuantMoeExpert));
    ix.num_entries = round.num_experts;
    ix.per_id = per_id;
    int r = 0;
    for (const size_t role : roles) {
      ix.codes_at[r] = static_cast<int64_t>(role + offsetof(QuantMoeMatrix, codes));
      ix.scales_at[r] = static_cast<int64_t>(role + offsetof(QuantMoeMatrix, scales));
      ++r;
    }
    // int4: the slice's first row of scales, as the slots kernel points the items at it.
    ix.scales_skip = int4 ? layout.row_off * layout.scales_ld * static_cast<int64_t>(sizeof(uint16_t)) : 0;
    ix.error_flag = round.error_flag;
    ix.error_code = round.error_code;
    ix.error_index = round.token0;
    return ix;
  };
  // One activation row an item (f32: the token's row, or the gated rows of the gate-up product).
  const auto product = [&](const QuantGemvItems& items, int64_t max_items, const QuantMoeGemvLayout& layout,
                           const void* a, int64_t stride_a, float* c, int64_t n, int64_t k) {
    return RoundProduct(shape, items, max_items, layout, a, GemvType::kF32, k, stride_a, c, 1, n, k, programmatic,
                        stream);
  };
  QuantGemvItems gate_up;
  gate_up.indexed = indexed(2, shape.gate_up, {offsetof(QuantMoeExpert, gate), offsetof(QuantMoeExpert, up)});
  gate_up.indexed.a_by_token = round.tokens > 1;
  QuantGemvItems down;
  down.indexed = indexed(1, shape.down, {offsetof(QuantMoeExpert, down)});
  // The ids were final before the gate-up GEMV, which waits before it lets this launch start: the
  // down GEMV's first weight loads overlap the gate-up GEMV's end.
  down.indexed.ids_final = true;
  down.silu_up_offset = kQuantMoeJobPairs * inter;
  combine.slot_of = nullptr;
  combine.pair_rows = kQuantMoeJobPairs;
  combine.in_block = shape.combine_in_block;
  down.combine = combine;
  if (int4 && shape.chain_round && shape.combine_in_block && ws.chain_sync != nullptr && round.tokens == 1) {
    // Both GEMVs as one kernel where their plans allow (else the two launches below).
    const auto grouped = [&](const QuantGemvItems& items, int64_t max_items, const QuantMoeGemvLayout& layout,
                             const void* a, int64_t stride_a, float* c, int64_t n, int64_t k) {
      Int4GroupedProduct d;
      d.a = a;
      d.a_type = GemvType::kF32;
      d.lda = k;
      d.batch_stride_a = stride_a;
      d.b.ld = layout.codes_ld;
      d.b.tiled = layout.tiled;
      d.b.scale_ld = layout.scales_ld;
      d.b.col0 = layout.col_off;
      d.b.group_size = shape.block_cols;
      d.c = c;
      d.ldc = n;
      d.batch_stride_c = kQuantMoeJobPairs * n;  // as RoundProduct places item i's rows
      d.items = items;
      d.max_items = max_items;
      d.m = 1;
      d.n = n;
      d.k = k;
      return d;
    };
    const cudaError_t chained = LaunchInt4GroupGemvChain(
        grouped(gate_up, 2 * top_k, shape.gate_up, x, 0, ws.gate_up, inter, hidden),
        grouped(down, top_k, shape.down, ws.gate_up, 2 * kQuantMoeJobPairs * inter, ws.y, hidden, inter),
        ws.chain_sync, programmatic, stream);
    if (chained != cudaErrorNotSupported) return chained;
  }
  if (const cudaError_t error = product(gate_up, 2 * pairs, shape.gate_up, x, round.tokens > 1 ? x_stride : 0,
                                        ws.gate_up, inter, hidden);
      error != cudaSuccess) {
    return error;
  }
  return product(down, pairs, shape.down, ws.gate_up, 2 * kQuantMoeJobPairs * inter, ws.y, hidden, inter);
}

// Ints of the tile counters, rounded up to a 128-byte line: the chain's counters start on a line.
int64_t TileCounterInts(int64_t hidden) { return ((hidden + 15) / 16 + 31) / 32 * 32; }

// Carves a workspace out of `buffer` (nullptr: only counts the bytes, returned in *bytes).
QuantMoeWorkspace CarveWorkspace(char* buffer, int64_t max_tokens, int64_t top_k, int64_t max_experts, int64_t hidden,
                                 int64_t inter, size_t* bytes) {
  const int64_t pairs = max_tokens * top_k;
  const int64_t job_pairs = QuantMoeJobPairsFor(max_tokens);
  const int64_t jobs = QuantMoeMaxJobs(pairs, max_experts, job_pairs);
  const int64_t slots = QuantMoeSlotRows(pairs, max_experts, job_pairs);
  size_t at = 0;
  const auto take = [&](size_t size) {
    char* p = buffer != nullptr ? buffer + at : nullptr;
    at += Round256(size);
    return p;
  };
  QuantMoeWorkspace w;
  w.counters = reinterpret_cast<int32_t*>(take(QuantMoeWorkspaceCountersBytes(hidden)));
  w.chain_sync = buffer != nullptr ? w.counters + TileCounterInts(hidden) : nullptr;
  w.sorted = reinterpret_cast<int32_t*>(take(static_cast<size_t>(pairs) * 4));
  w.jobs = reinterpret_cast<int32_t*>(take(static_cast<size_t>(jobs) * 12 + 8));
  w.num_jobs = buffer != nullptr ? w.jobs + 3 * jobs : nullptr;
  w.gate_up_items = buffer != nullptr ? w.num_jobs + 1 : nullptr;
  w.slot_of = reinterpret_cast<int32_t*>(take(static_cast<size_t>(pairs) * 4));
  const size_t item_pointers = static_cast<size_t>(2 * jobs) * sizeof(void*);
  w.gate_up_a = reinterpret_cast<const void**>(take(item_pointers));
  w.gate_up_codes = reinterpret_cast<const void**>(take(item_pointers));
  w.gate_up_scales = reinterpret_cast<const void**>(take(item_pointers));
  w.down_codes = reinterpret_cast<const void**>(take(item_pointers / 2));
  w.down_scales = reinterpret_cast<const void**>(take(item_pointers / 2));
  w.gate_up_rows = reinterpret_cast<int32_t*>(take(static_cast<size_t>(2 * jobs) * 4));
  w.down_rows = reinterpret_cast<int32_t*>(take(static_cast<size_t>(jobs) * 4));
  w.x = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(slots * QuantMoeRoundUp16(hidden)) * 2));
  w.gate_up = reinterpret_cast<float*>(take(static_cast<size_t>(2 * slots * inter) * 4));
  w.act = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(slots * QuantMoeRoundUp16(inter)) * 2));
  w.y = reinterpret_cast<float*>(take(static_cast<size_t>(slots * hidden) * 4));
  w.max_tokens = max_tokens;
  w.top_k = top_k;
  w.max_experts = max_experts;
  w.hidden = hidden;
  w.inter = inter;
  w.max_jobs = jobs;
  if (bytes != nullptr) *bytes = at;
  return w;
}

}  // namespace

size_t QuantMoeWorkspaceCountersBytes(int64_t hidden) {
  return static_cast<size_t>(TileCounterInts(hidden) + kQuantGemvChainSyncInts) * 4;
}

size_t QuantMoeWorkspaceBytes(int64_t max_tokens, int64_t top_k, int64_t max_experts, int64_t hidden,
                              int64_t inter) {
  size_t bytes = 0;
  CarveWorkspace(nullptr, max_tokens, top_k, max_experts, hidden, inter, &bytes);
  return bytes;
}

QuantMoeWorkspace QuantMoeWorkspaceAt(void* buffer, int64_t max_tokens, int64_t top_k, int64_t max_experts,
                                      int64_t hidden, int64_t inter) {
  return CarveWorkspace(static_cast<char*>(buffer), max_tokens, top_k, max_experts, hidden, inter, nullptr);
}

cudaError_t LaunchQuantMoeExperts(const float* x, int64_t x_stride, const int32_t* ids, int64_t ids_stride,
                                  const float* weights, int64_t weights_stride, const QuantMoeExpert* experts,
                                  const QuantMoeShape& shape, int64_t tokens, const QuantMoeWorkspace& ws,
                                  float* out, int64_t out_stride, bool accumulate, int* error_flag, int error_code,
                                  bool programmatic, cudaStream_t stream) {
  const int64_t top_k = shape.top_k, hidden = shape.hidden, inter = shape.inter;
  if (tokens < 0 || top_k < 0 || hidden < 0 || inter < 0 || shape.num_experts < 0 ||
      shape.num_experts > kQuantMoeMaxExperts || shape.block_rows < 1 || shape.block_cols < 1 || x_stride < 0 ||
      ids_stride < 0 || weights_stride < 0 || out_stride < 0 || hidden > INT_MAX || inter > INT_MAX ||
      top_k > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  if (ws.max_tokens < 1 || ws.max_tokens * ws.top_k < top_k || ws.max_experts < shape.num_experts ||
      ws.hidden < hidden || ws.inter < inter || ws.max_tokens * ws.top_k > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (out == nullptr || error_flag == nullptr || ws.sorted == nullptr || ws.jobs == nullptr ||
      ws.num_jobs == nullptr || ws.x == nullptr || ws.act == nullptr || ws.y == nullptr ||
      (top_k > 0 && (ids == nullptr || weights == nullptr || x == nullptr)) ||
      (shape.num_experts > 0 && experts == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const bool grouped = shape.grouped && top_k > 0 && inter > 0 && hidden > 0;
  if (!shape.grouped && (shape.gate_up.tiled || shape.down.tiled)) return cudaErrorInvalidValue;
  if (grouped && (ws.slot_of == nullptr || ws.gate_up_items == nullptr || ws.gate_up_a == nullptr ||
                  ws.gate_up_codes == nullptr || ws.gate_up_scales == nullptr || ws.down_codes == nullptr ||
                  ws.down_scales == nullptr || ws.gate_up == nullptr ||
                  (shape.fold_combine && ws.counters == nullptr))) {
    return cudaErrorInvalidValue;
  }
  // Rounds of at most max_tokens tokens, each with the workspace's pair capacity (max_tokens *
  // top_k: a call of more pairs a token than the workspace's top_k takes fewer tokens a round; and,
  // grouped, few enough pairs that the gate-up GEMV's 2 items per job fit the grid's y limit).
  int64_t round_tokens = top_k > 0 ? std::min(ws.max_tokens, ws.max_tokens * ws.top_k / top_k) : ws.max_tokens;
  if (grouped) round_tokens = std::min(round_tokens, std::max<int64_t>(1, kMaxGridY / 2 / top_k));
  const int64_t max_jobs = QuantMoeMaxJobs(round_tokens * top_k, shape.num_experts);
  const int64_t grid_jobs = grouped ? kMaxGridY / 2 : kMaxGridY;
  if (max_jobs > grid_jobs || max_jobs > ws.max_jobs) return cudaErrorInvalidValue;
  const int64_t xb_ld = QuantMoeRoundUp16(hidden), act_ld = QuantMoeRoundUp16(inter);
  RowsParams base{};
  base.experts = experts;
  base.block_rows = static_cast<int>(std::min<int64_t>(shape.block_rows, INT_MAX));
  base.block_cols = static_cast<int>(std::min<int64_t>(shape.block_cols, INT_MAX));
  base.sorted = ws.sorted;
  base.jobs = ws.jobs;
  base.num_jobs = ws.num_jobs;
  base.act = ws.act;
  base.act_ld = act_ld;
  base.y = ws.y;
  base.y_ld = hidden;
  const bool int4 = shape.format == QuantMoeFormat::kInt4Group;
  for (int64_t t0 = 0; t0 < tokens; t0 += round_tokens) {
    const int64_t n = std::min(round_tokens, tokens - t0);
    // Grids (and the grouped GEMV's plan) are sized for this round's bound on jobs, not the
    // workspace's: at decode a round of one token has at most top_k jobs, and a plan made for the
    // workspace's hundreds would give each real item a few blocks and launch thousands that exit.
    // A grouped round's jobs hold QuantMoeJobPairsFor(n) pairs (one at decode) unless the jobs
    // that makes would not fit (then kJobPairs, which max_jobs bounds).
    int64_t job_pairs = grouped ? QuantMoeJobPairsFor(n) : kQuantMoeJobPairs;
    int64_t round_jobs = QuantMoeMaxJobs(n * top_k, shape.num_experts, job_pairs);
    if (round_jobs > grid_jobs || round_jobs > ws.max_jobs) {
      job_pairs = kQuantMoeJobPairs;
      round_jobs = QuantMoeMaxJobs(n * top_k, shape.num_experts);
    }
    const RoundIds round{ids, ids_stride, t0, static_cast<int>(n), static_cast<int>(top_k),
                         static_cast<int>(shape.num_experts), error_flag, error_code, static_cast<int>(job_pairs)};
    // A small grouped round is grouped by the slots kernel itself (kQuantMoeFoldPairs): the
    // grouping kernel's launch would sit on the critical path of every MoE layer of a decode step.
    const bool fold = grouped && shape.fold_grouping && n * top_k <= kQuantMoeFoldPairs;
    if (!fold) {
      if (const cudaError_t error = LaunchKernel(programmatic, QuantMoeSortKernel, dim3(1), dim3(kSortThreads), 0,
                                                 stream, round, ws.sorted, ws.jobs, ws.num_jobs);
          error != cudaSuccess) {
        return error;
      }
    }
    if (hidden == 0) continue;
    // A direct round (QuantMoeShape::direct_one_token): one token, or up to direct_max_tokens whose
    // ids are token-major and whose pairs each fit a job's slot of the workspace; past one token
    // only with combine_in_block and at most kQuantGemvMaxTileItems pairs a token, so that the down
    // GEMV can combine each token's pairs in its blocks (on tiled codes; else through its counters,
    // one block per tile gathering every token's pairs).
    const bool direct = grouped && shape.direct_one_token && shape.fold_silu && shape.fold_combine &&
                        (n == 1 ? job_pairs == 1
                                : n <= shape.direct_max_tokens && shape.combine_in_block && ids_stride == top_k &&
                                      top_k <= kQuantGemvMaxTileItems && n * top_k <= ws.max_jobs &&
                                      2 * n * top_k <= kMaxGridY);
    // Step 4 folded into the down GEMV (grouped path, rounds of one token or direct rounds:
    // QuantMoeShape::fold_combine): its last block of each tile of hidden rows writes the tile's
    // rows of out, or each of its blocks its token's tile (QuantGemvCombine::in_block).
    QuantGemvCombine combine;
    if (grouped && shape.fold_combine && (job_pairs == 1 || direct)) {
      combine.counters = ws.counters;
      combine.row_ld = hidden;
      combine.ids = ids;
      combine.ids_stride = ids_stride;
      combine.weights = weights;
      combine.weights_stride = weights_stride;
      combine.slot_of = ws.slot_of;
      combine.out = out;
      combine.out_stride = out_stride;
      combine.token0 = t0;
      combine.tokens = static_cast<int>(n);
      combine.top_k = static_cast<int>(top_k);
      combine.num_experts = static_cast<int>(shape.num_experts);
      combine.accumulate = accumulate;
    }
    if (direct && combine.counters != nullptr) {
      if (const cudaError_t error =
              DirectRound(x + t0 * x_stride, x_stride, round, experts, shape, ws, combine, programmatic, stream);
          error != cudaSuccess) {
        return error;
      }
      continue;
    }
    if (grouped) {
      if (const cudaError_t error = GroupedProducts(x + t0 * x_stride, x_stride, round, experts, shape, round_jobs, ws,
                                                    fold, combine, programmatic, stream);
          error != cudaSuccess) {
        return error;
      }
      if (combine.counters != nullptr) continue;
    } else if (top_k > 0) {
      const unsigned round_blocks = static_cast<unsigned>(std::min<int64_t>((hidden + 255) / 256, 64));
      if (const cudaError_t error = LaunchKernel(programmatic, QuantMoeRoundKernel,
                                                 dim3(round_blocks, static_cast<unsigned>(n)), dim3(256), 0, stream,
                                                 x + t0 * x_stride, x_stride, hidden, ws.x, xb_ld);
          error != cudaSuccess) {
        return error;
      }
      const auto rows_launch = [&](bool gate_up) {
        RowsParams p = base;
        p.in = gate_up ? ws.x : ws.act;
        p.in_ld = gate_up ? xb_ld : act_ld;
        p.in_div = gate_up ? static_cast<int>(top_k) : 1;
        p.rows = gate_up ? inter : hidden;
        p.k = static_cast<int>(gate_up ? hidden : inter);
        p.chunked = gate_up ? shape.gate_up_chunked : shape.down_chunked;
        p.team_shift = TeamShift(p.k);
        const int64_t rows_per_block = static_cast<int64_t>(kWarps) * (32 >> p.team_shift);
        const dim3 grid(static_cast<unsigned>((p.rows + rows_per_block - 1) / rows_per_block),
                        static_cast<unsigned>(round_jobs));
        const auto kernel = int4 ? (gate_up ? QuantMoeRowsKernel<Int4, true> : QuantMoeRowsKernel<Int4, false>)
                                 : (gate_up ? QuantMoeRowsKernel<Fp8, true> : QuantMoeRowsKernel<Fp8, false>);
        return LaunchKernel(programmatic, kernel, grid, dim3(kThreads), 0, stream, p);
      };
      if (inter > 0) {
        if (const cudaError_t error = rows_launch(true); error != cudaSuccess) return error;
      }
      if (const cudaError_t error = rows_launch(false); error != cudaSuccess) return error;
    }
    const dim3 grid(static_cast<unsigned>((hidden + 255) / 256), static_cast<unsigned>(n));
    if (const cudaError_t error =
            LaunchKernel(programmatic, QuantMoeCombineKernel, grid, dim3(256), 0, stream, ids, ids_stride, weights,
                         weights_stride, t0, static_cast<int>(top_k), static_cast<int>(shape.num_experts),
                         static_cast<const float*>(ws.y), grouped ? static_cast<const int32_t*>(ws.slot_of) : nullptr,
                         hidden, out, out_stride, accumulate);
        error != cudaSuccess) {
      return error;
    }
  }
  return cudaSuccess;
}

}  // namespace eagle3::cuda
