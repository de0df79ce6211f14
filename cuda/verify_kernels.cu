// Tree verification kernels (launcher and semantics: eagle3/cuda/verify_ops.h; reference:
// src/tree_verifier.cc). No abseil here: nvcc must never see it.
//
// Kernel 1 (RowPassKernel): rows x splits blocks, each reads its slice of one row once and writes a
// partial (max, lowest argmax, sum of exp((z - max) / T) relative to its own max, lowest NaN/+inf id).
// Kernel 2 (WalkKernel): one block per sequence combines its rows' partials, checks the sequence,
// and walks the tree; sampling reads the visited rows again through the block-wide row passes below.
#include <math_constants.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "eagle3/cuda/verify_ops.h"
#include "eagle3/philox.h"

namespace eagle3::cuda {
namespace {

constexpr int kPassThreads = 256;
constexpr int kWalkThreads = 512;
constexpr int kGroup = 8;                 // consecutive elements per thread and load (16 or 32 bytes)
constexpr int64_t kMinSplitElems = 2048;  // a split never gets fewer elements...
constexpr int64_t kMaxSplitElems = 16384; // ...nor more
constexpr int64_t kTargetBlocks = 512;    // enough blocks to fill an H100/H200 (132 SMs) a few times
constexpr int64_t kNone64 = INT64_MAX;
constexpr int kDigitBits = 4;             // radix search: 16 buckets per level, 8 levels
constexpr int kBuckets = 1 << kDigitBits;
constexpr int64_t kTile = static_cast<int64_t>(kWalkThreads) * kGroup;  // sampling tile
constexpr int kMaxTiles = static_cast<int>(kVerifyMaxVocab / kTile);

struct Split {
  int64_t elems;  // per split, a multiple of kGroup
  int64_t count;  // splits per row
};

Split SplitFor(int64_t rows, int64_t vocab) {
  const int64_t min_splits = (vocab + kMaxSplitElems - 1) / kMaxSplitElems;
  const int64_t max_splits = (vocab + kMinSplitElems - 1) / kMinSplitElems;
  const int64_t want = (kTargetBlocks + rows - 1) / rows;
  int64_t splits = want < max_splits ? want : max_splits;
  if (splits < min_splits) splits = min_splits;
  int64_t elems = (vocab + splits - 1) / splits;
  elems = (elems + kGroup - 1) / kGroup * kGroup;
  return {elems, (vocab + elems - 1) / elems};
}

// Workspace: the per-(row, split) partials, structure of arrays.
struct Partials {
  double* sum;
  int64_t* bad;
  float* max;
  int32_t* arg;
};

size_t AlignUp(size_t n) { return (n + 15) / 16 * 16; }

Partials CarvePartials(void* workspace, int64_t count) {
  char* p = static_cast<char*>(workspace);
  const size_t n = static_cast<size_t>(count);
  Partials out;
  out.sum = reinterpret_cast<double*>(p);
  p += AlignUp(n * sizeof(double));
  out.bad = reinterpret_cast<int64_t*>(p);
  p += AlignUp(n * sizeof(int64_t));
  out.max = reinterpret_cast<float*>(p);
  p += AlignUp(n * sizeof(float));
  out.arg = reinterpret_cast<int32_t*>(p);
  return out;
}

size_t PartialsBytes(int64_t count) {
  const size_t n = static_cast<size_t>(count);
  return AlignUp(n * sizeof(double)) + AlignUp(n * sizeof(int64_t)) + AlignUp(n * sizeof(float)) +
         AlignUp(n * sizeof(int32_t));
}

// ---- Element access -------------------------------------------------------------------------------

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

// v[k] = x[i + k] for i + k < end (the rest are left -inf; callers test the index). One or two
// 16-byte loads when the group is whole and the row start is 16-byte aligned.
template <typename T>
__device__ __forceinline__ void LoadGroup(const T* x, int64_t i, int64_t end, bool aligned, float (&v)[kGroup]) {
  if (aligned && i + kGroup <= end) {
    if constexpr (sizeof(T) == 2) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x + i));
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
      }
    } else {
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + i));
      const float4 b = __ldg(reinterpret_cast<const float4*>(x + i + 4));
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kGroup; ++k) v[k] = i + k < end ? ToFloat(x[i + k]) : -CUDART_INF_F;
  }
}

template <typename T>
__device__ __forceinline__ bool Aligned16(const T* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// ---- Kernel 1: one read of every row ---------------------------------------------------------------

struct MaxArg {
  float max;
  int32_t arg;
};
struct MaxArgOp {
  __device__ MaxArg operator()(const MaxArg& a, const MaxArg& b) const {
    return (b.max > a.max || (b.max == a.max && b.arg < a.arg)) ? b : a;
  }
};
struct MinOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return b < a ? b : a; }
};

// The block's partial over [begin, end) of one row. A thread keeps a running max, the lowest index
// reaching it and (kSum) the sum of expf((z - max) * inv_t) rescaled when the max grows; -inf terms
// add nothing, NaN and +inf are only recorded.
template <typename T, bool kSum>
__global__ void __launch_bounds__(kPassThreads)
    RowPassKernel(const T* __restrict__ logits, int64_t ld, int64_t vocab, int64_t split_elems,
                  int64_t splits, float inv_t, Partials out) {
  const int64_t row = blockIdx.x / splits;
  const int64_t split = blockIdx.x % splits;
  const T* x = logits + row * ld;
  const int64_t begin = split * split_elems;
  const int64_t end = begin + split_elems < vocab ? begin + split_elems : vocab;
  const bool aligned = Aligned16(x);
  float m = -CUDART_INF_F;
  int32_t arg = INT32_MAX;
  double s = 0.0;
  int64_t bad = kNone64;
  for (int64_t g = begin + static_cast<int64_t>(threadIdx.x) * kGroup; g < end;
       g += static_cast<int64_t>(kPassThreads) * kGroup) {
    float v[kGroup];
    LoadGroup(x, g, end, aligned, v);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const float z = v[k];
      if (g + k >= end) break;
      if (!(z < CUDART_INF_F)) {
        bad = bad < g + k ? bad : g + k;
      } else if (z > m) {
        if (kSum) s = s * static_cast<double>(expf((m - z) * inv_t)) + 1.0;
        m = z;
        arg = static_cast<int32_t>(g + k);
      } else if (kSum && z > -CUDART_INF_F) {
        s += static_cast<double>(expf((z - m) * inv_t));
      }
    }
  }
  using MaxArgReduce = cub::BlockReduce<MaxArg, kPassThreads>;
  using SumReduce = cub::BlockReduce<double, kPassThreads>;
  using BadReduce = cub::BlockReduce<int64_t, kPassThreads>;
  __shared__ union {
    typename MaxArgReduce::TempStorage max_arg;
    typename SumReduce::TempStorage sum;
    typename BadReduce::TempStorage bad;
  } temp;
  __shared__ MaxArg block_best;
  const MaxArg best = MaxArgReduce(temp.max_arg).Reduce(MaxArg{m, arg}, MaxArgOp{});
  if (threadIdx.x == 0) block_best = best;
  __syncthreads();
  const int64_t p = blockIdx.x;
  if (kSum) {
    const float bm = block_best.max;
    const double scaled = m == -CUDART_INF_F ? 0.0 : s * static_cast<double>(expf((m - bm) * inv_t));
    const double total = SumReduce(temp.sum).Sum(scaled);
    if (threadIdx.x == 0) out.sum[p] = total;
    __syncthreads();
  }
  const int64_t lowest_bad = BadReduce(temp.bad).Reduce(bad, MinOp{});
  if (threadIdx.x == 0) {
    out.max[p] = block_best.max;
    out.arg[p] = block_best.arg;
    out.bad[p] = lowest_bad;
  }
}

// ---- Block-wide row passes of the walk kernel (every thread of the block calls them) ------------

// Ordered unsigned key of a non-NaN float (larger float, larger key); -0 ties +0.
__device__ __forceinline__ uint32_t OrderedKey(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// One visited row and its processed distribution: token i keeps weight
//   w(i) = expf((z_i - max) * inv_t)  if key(z_i) > keep_key, or key == keep_key and i <= keep_limit
//   0                                 otherwise
// (keep_key = 0, keep_limit = kNone64 keeps every token: top-k and top-p off).
template <typename T>
struct RowView {
  const T* x;
  int64_t vocab;
  bool aligned;
  float max;
  float inv_t;
  uint32_t keep_key;
  int64_t keep_limit;

  __device__ bool Kept(float z, int64_t i) const {
    const uint32_t key = OrderedKey(z);
    return key > keep_key || (key == keep_key && i <= keep_limit);
  }
  __device__ double Weight(float z, int64_t i) const {
    if (z == -CUDART_INF_F || !Kept(z, i)) return 0.0;
    return static_cast<double>(expf((z - max) * inv_t));
  }
  __device__ double WeightAt(int64_t i) const { return Weight(ToFloat(x[i]), i); }
};

// Membership in a sorted list of token ids, for one thread whose queries only increase.
struct SortedCursor {
  const int64_t* ids;
  int n;
  int pos = 0;
  __device__ bool Contains(int64_t i) {
    while (pos < n && ids[pos] < i) ++pos;
    return pos < n && ids[pos] == i;
  }
};

using WalkSum = cub::BlockReduce<double, kWalkThreads>;
using WalkMax = cub::BlockReduce<int64_t, kWalkThreads>;
using WalkScan = cub::BlockScan<double, kWalkThreads>;

struct MaxOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return b > a ? b : a; }
};

union WalkTemp {
  typename WalkSum::TempStorage sum;
  typename WalkMax::TempStorage max;
  typename WalkScan::TempStorage scan;
};

// Σ w(i) over tokens i not in `excluded` (sorted), in double.
template <typename T>
__device__ double SumExcluding(const RowView<T>& row, const int64_t* excluded, int n_excluded, WalkTemp& temp,
                               double* broadcast) {
  SortedCursor cursor{excluded, n_excluded};
  double s = 0.0;
  for (int64_t g = static_cast<int64_t>(threadIdx.x) * kGroup; g < row.vocab; g += kTile) {
    float v[kGroup];
    LoadGroup(row.x, g, row.vocab, row.aligned, v);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      if (g + k < row.vocab && !cursor.Contains(g + k)) s += row.Weight(v[k], g + k);
    }
  }
  const double total = WalkSum(temp.sum).Sum(s);
  if (threadIdx.x == 0) *broadcast = total;
  __syncthreads();
  const double out = *broadcast;
  __syncthreads();
  return out;
}

// The reference's SampleResidual over r(i) = w(i) for i not in `excluded`, 0 otherwise: the smallest
// id with u · m < Σ_{j <= i} r(j), m = Σ r; if rounding leaves none, the largest id with r > 0 (-1
// when r is all zero). Phase A sums each tile of kTile tokens; phase B rescans the crossing tile
// with a block scan.
struct SampleShared {
  double tile_sum[kMaxTiles];
  int64_t result;
  int64_t last_positive;
  int crossing_tile;
  double before;  // cumulative mass before the crossing tile
  double target;  // u · m
};

template <typename T>
__device__ int64_t SampleExcluding(const RowView<T>& row, const int64_t* excluded, int n_excluded, float u,
                                   WalkTemp& temp, SampleShared& sh) {
  const int tiles = static_cast<int>((row.vocab + kTile - 1) / kTile);
  int64_t last_positive = -1;
  {
    SortedCursor cursor{excluded, n_excluded};
    for (int t = 0; t < tiles; ++t) {
      const int64_t g = t * kTile + static_cast<int64_t>(threadIdx.x) * kGroup;
      double s = 0.0;
      float v[kGroup];
      LoadGroup(row.x, g, row.vocab, row.aligned, v);
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        if (g + k < row.vocab && !cursor.Contains(g + k)) {
          const double w = row.Weight(v[k], g + k);
          s += w;
          if (w > 0.0) last_positive = g + k;
        }
      }
      const double tile_sum = WalkSum(temp.sum).Sum(s);
      if (threadIdx.x == 0) sh.tile_sum[t] = tile_sum;
      __syncthreads();
    }
  }
  const int64_t last = WalkMax(temp.max).Reduce(last_positive, MaxOp{});
  if (threadIdx.x == 0) {
    sh.last_positive = last;
    sh.result = -1;
    double mass = 0.0;
    for (int t = 0; t < tiles; ++t) mass += sh.tile_sum[t];
    const double target = static_cast<double>(u) * mass;
    double before = 0.0;
    sh.crossing_tile = -1;
    for (int t = 0; t < tiles; ++t) {
      if (sh.tile_sum[t] > 0.0 && target < before + sh.tile_sum[t]) {
        sh.crossing_tile = t;
        break;
      }
      before += sh.tile_sum[t];
    }
    sh.before = before;
    sh.target = target;
  }
  __syncthreads();
  const int t = sh.crossing_tile;
  if (t < 0) {
    const int64_t out = sh.last_positive;
    __syncthreads();
    return out;
  }
  const double target = sh.target;
  const int64_t g = t * kTile + static_cast<int64_t>(threadIdx.x) * kGroup;
  float v[kGroup];
  double w[kGroup];
  LoadGroup(row.x, g, row.vocab, row.aligned, v);
  double s = 0.0;
  int64_t group_last = -1;
  {
    SortedCursor cursor{excluded, n_excluded};
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      w[k] = (g + k < row.vocab && !cursor.Contains(g + k)) ? row.Weight(v[k], g + k) : 0.0;
      s += w[k];
      if (w[k] > 0.0) group_last = g + k;
    }
  }
  double exclusive = 0.0;
  WalkScan(temp.scan).ExclusiveSum(s, exclusive);
  const double start = sh.before + exclusive;
  if (s > 0.0 && start <= target && target < start + s) {
    // The one thread whose group crosses (the scan is monotone): walk it in token-id order.
    double cumulative = start;
    int64_t pick = group_last;  // rounding inside the group: its last positive token
    for (int k = 0; k < kGroup; ++k) {
      if (w[k] <= 0.0) continue;
      cumulative += w[k];
      if (target < cumulative) {
        pick = g + k;
        break;
      }
    }
    sh.result = pick;
  }
  __syncthreads();
  int64_t out = sh.result;
  if (out < 0) {
    // No group crossed after rounding: the last positive token of the crossing tile.
    const int64_t tile_last = WalkMax(temp.max).Reduce(group_last, MaxOp{});
    if (threadIdx.x == 0) sh.result = tile_last;
    __syncthreads();
    out = sh.result;
  }
  __syncthreads();
  return out;
}

// Radix search, descending: the largest 32-bit key t with above + Σ_{eligible, key >= t} weight >=
// target, where the search starts at above = 0; returns t, the weight of eligible keys > t
// (`above`) and the number of eligible keys equal to t (`ties`). With frac > 0 the target is frac ·
// (total eligible weight). `found` is false when the total falls short of the target.
struct SearchResult {
  bool found;
  uint32_t key;
  double above;
  double ties;
  double target;  // the target searched for (frac · total when frac > 0)
};

struct SearchShared {
  double weight[kWalkThreads / 32][kBuckets];
  double count[kWalkThreads / 32][kBuckets];
  double g_weight[kBuckets];
  double g_count[kBuckets];
};

// Elem(i, z, &key, &weight) -> eligible.
template <typename T, typename Elem>
__device__ SearchResult RadixSearch(const RowView<T>& row, const Elem& elem, double target, double frac,
                                    SearchShared& sh) {
  uint32_t prefix = 0, mask = 0;
  double above = 0.0, ties = 0.0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    double gw[kBuckets], gc[kBuckets];  // Σ over keys in the prefix range with digit >= d
#pragma unroll
    for (int d = 0; d < kBuckets; ++d) gw[d] = gc[d] = 0.0;
    for (int64_t g = static_cast<int64_t>(threadIdx.x) * kGroup; g < row.vocab; g += kTile) {
      float v[kGroup];
      LoadGroup(row.x, g, row.vocab, row.aligned, v);
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        uint32_t key;
        double w;
        if (g + k < row.vocab && elem(g + k, v[k], &key, &w) && (key & mask) == prefix) {
          const uint32_t digit = (key >> shift) & (kBuckets - 1);
#pragma unroll
          for (int d = 0; d < kBuckets; ++d) {
            if (digit >= static_cast<uint32_t>(d)) {
              gw[d] += w;
              gc[d] += 1.0;
            }
          }
        }
      }
    }
#pragma unroll
    for (int d = 0; d < kBuckets; ++d) {
      for (int offset = 16; offset > 0; offset >>= 1) {
        gw[d] += __shfl_xor_sync(0xffffffffu, gw[d], offset);
        gc[d] += __shfl_xor_sync(0xffffffffu, gc[d], offset);
      }
      if (lane == 0) {
        sh.weight[warp][d] = gw[d];
        sh.count[warp][d] = gc[d];
      }
    }
    __syncthreads();
    if (threadIdx.x < kBuckets) {
      double w = 0.0, c = 0.0;
      for (int i = 0; i < kWalkThreads / 32; ++i) {
        w += sh.weight[i][threadIdx.x];
        c += sh.count[i][threadIdx.x];
      }
      sh.g_weight[threadIdx.x] = w;
      sh.g_count[threadIdx.x] = c;
    }
    __syncthreads();
    if (shift == 32 - kDigitBits && frac > 0.0) target = frac * sh.g_weight[0];
    int digit = -1;
    for (int d = kBuckets - 1; d >= 0; --d) {
      if (above + sh.g_weight[d] >= target) {
        digit = d;
        break;
      }
    }
    if (digit < 0) {
      __syncthreads();
      return {false, 0, 0.0, 0.0, target};
    }
    const double next_w = digit + 1 < kBuckets ? sh.g_weight[digit + 1] : 0.0;
    const double next_c = digit + 1 < kBuckets ? sh.g_count[digit + 1] : 0.0;
    above += next_w;
    ties = sh.g_count[digit] - next_c;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= static_cast<uint32_t>(kBuckets - 1) << shift;
    __syncthreads();  // the buckets are rewritten by the next level
  }
  return {true, prefix, above, ties, target};
}

// The id of the n-th smallest (n >= 1) token among those with key == `key` and (with
// `within_limit`) id <= limit: a count search over inverted ids.
template <typename T>
__device__ int64_t NthTieId(const RowView<T>& row, uint32_t key, int64_t limit, double n, SearchShared& sh) {
  auto elem = [key, limit](int64_t i, float z, uint32_t* k, double* w) {
    *k = ~static_cast<uint32_t>(i);
    *w = 1.0;
    return OrderedKey(z) == key && i <= limit;
  };
  const SearchResult r = RadixSearch(row, elem, n, 0.0, sh);
  return static_cast<int64_t>(~r.key);
}

// Narrows `row` to top-k, then top-p (TreeVerifier::ProcessedDistribution's order and ties).
template <typename T>
__device__ void ApplyTopKTopP(RowView<T>& row, int32_t top_k, float top_p, SearchShared& sh) {
  if (top_k > 0 && top_k < row.vocab) {
    auto elem = [](int64_t, float z, uint32_t* k, double* w) {
      *k = OrderedKey(z);
      *w = 1.0;
      return true;
    };
    const SearchResult r = RadixSearch(row, elem, static_cast<double>(top_k), 0.0, sh);
    const double need = static_cast<double>(top_k) - r.above;
    const int64_t limit = need < r.ties ? NthTieId(row, r.key, kNone64, need, sh) : kNone64;
    row.keep_key = r.key;
    row.keep_limit = limit;
  }
  if (top_p < 1.0f) {
    const RowView<T> k_row = row;
    auto elem = [k_row](int64_t i, float z, uint32_t* k, double* w) {
      *k = OrderedKey(z);
      *w = k_row.Weight(z, i);
      return *w > 0.0;
    };
    const SearchResult r = RadixSearch(row, elem, 0.0, static_cast<double>(top_p), sh);
    if (!r.found) return;  // only by rounding: keep the top-k set
    // The reference adds the tied tokens (equal logits, equal weight) one at a time, lowest id
    // first, until the mass reaches top_p: replay that on the tie weight.
    const uint32_t bits = (r.key & 0x80000000u) != 0 ? (r.key & 0x7FFFFFFFu) : ~r.key;
    const double tie_weight = static_cast<double>(expf((__uint_as_float(bits) - row.max) * row.inv_t));
    double mass = r.above, n = 0.0;
    while (n < r.ties && mass < r.target) {
      mass += tie_weight;
      n += 1.0;
    }
    const int64_t tie_limit = r.key == row.keep_key ? row.keep_limit : kNone64;
    row.keep_limit = n < r.ties ? NthTieId(row, r.key, tie_limit, n, sh) : tie_limit;
    row.keep_key = r.key;
  }
}

// ---- Kernel 2: one block per sequence ------------------------------------------------------------

struct WalkParams {
  const int32_t* row_offsets;
  const int64_t* tokens;
  const int32_t* first_child;
  const int32_t* next_sibling;
  int64_t ld;
  int64_t vocab;
  int64_t splits;
  int32_t max_nodes;
  bool sampling;
  float inv_t;
  int32_t top_k;
  float top_p;
  uint64_t seed;
  uint64_t offset;
  Partials partials;
  int32_t* num_accepted;
  int32_t* accepted_nodes;
  int64_t* out_tokens;
  VerifyError* errors;
};

template <typename T>
__global__ void __launch_bounds__(kWalkThreads) WalkKernel(const T* __restrict__ logits, WalkParams p) {
  __shared__ float s_max[kVerifyMaxNodes];
  __shared__ int32_t s_arg[kVerifyMaxNodes];
  __shared__ double s_sum[kVerifyMaxNodes];
  __shared__ int64_t s_bad[kVerifyMaxNodes];
  __shared__ int32_t s_child[kVerifyMaxNodes];      // children of the current node, sibling order
  __shared__ int64_t s_child_token[kVerifyMaxNodes];
  __shared__ double s_child_weight[kVerifyMaxNodes];
  __shared__ bool s_dup[kVerifyMaxNodes];           // token repeats an earlier sibling's
  __shared__ double s_suffix[kVerifyMaxNodes + 1];  // Σ weight of first occurrences at >= j
  __shared__ int64_t s_excluded[kVerifyMaxNodes];   // the children's distinct tokens, sorted
  __shared__ int s_num_children, s_num_excluded;
  __shared__ VerifyError s_error;
  __shared__ double s_broadcast;
  __shared__ WalkTemp temp;
  __shared__ SampleShared sample;
  __shared__ SearchShared search;

  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t base = p.row_offsets[b];
  const int64_t n = p.row_offsets[b + 1] - base;
  if (n < 1 || n > p.max_nodes) {
    if (tid == 0) {
      p.errors[b] = VerifyError{static_cast<int64_t>(VerifyErrorKind::kBadTree), -1, n};
      p.num_accepted[b] = -1;
    }
    return;
  }
  const int64_t* tokens = p.tokens + base;
  const int32_t* first_child = p.first_child + base;
  const int32_t* next_sibling = p.next_sibling + base;

  // Combine the rows' split partials (splits are in token order: the first split reaching the
  // max holds the lowest argmax).
  for (int i = tid; i < n; i += kWalkThreads) {
    const int64_t first = (base + i) * p.splits;
    float m = -CUDART_INF_F;
    int32_t arg = INT32_MAX;
    int64_t bad = kNone64;
    for (int64_t s = 0; s < p.splits; ++s) {
      const float pm = p.partials.max[first + s];
      if (pm > m) {
        m = pm;
        arg = p.partials.arg[first + s];
      }
      const int64_t pb = p.partials.bad[first + s];
      bad = pb < bad ? pb : bad;
    }
    double sum = 0.0;
    if (p.sampling && m > -CUDART_INF_F) {
      for (int64_t s = 0; s < p.splits; ++s) {
        const float pm = p.partials.max[first + s];
        if (pm > -CUDART_INF_F) sum += p.partials.sum[first + s] * static_cast<double>(expf((pm - m) * p.inv_t));
      }
    }
    s_max[i] = m;
    s_arg[i] = arg;
    s_sum[i] = sum;
    s_bad[i] = bad;
  }
  __syncthreads();

  // Checks, in the reference's order.
  if (tid == 0) {
    VerifyError e{static_cast<int64_t>(VerifyErrorKind::kNone), 0, 0};
    for (int i = 0; i < n && e.kind == 0; ++i) {
      const int32_t fc = first_child[i], ns = next_sibling[i];
      if (!(fc == -1 || (fc > i && fc < n)) || !(ns == -1 || (ns >= 1 && ns < n))) {
        e = VerifyError{static_cast<int64_t>(VerifyErrorKind::kBadTree), i, 0};
      }
    }
    for (int i = 1; i < n && e.kind == 0; ++i) {
      if (tokens[i] < 0 || tokens[i] >= p.vocab) {
        e = VerifyError{static_cast<int64_t>(VerifyErrorKind::kTokenOutOfRange), i, tokens[i]};
      }
    }
    for (int i = 0; i < n && e.kind == 0; ++i) {
      if (s_bad[i] != kNone64) {
        const float z = ToFloat(logits[(base + i) * p.ld + s_bad[i]]);
        e = VerifyError{static_cast<int64_t>(isnan(z) ? VerifyErrorKind::kNaN : VerifyErrorKind::kPosInf), i,
                        s_bad[i]};
      } else if (s_max[i] == -CUDART_INF_F) {
        e = VerifyError{static_cast<int64_t>(VerifyErrorKind::kNoFiniteLogit), i, 0};
      }
    }
    s_error = e;
    p.errors[b] = e;
    if (e.kind != 0) p.num_accepted[b] = -1;
  }
  __syncthreads();
  if (s_error.kind != 0) return;

  int32_t* out_nodes = p.accepted_nodes + static_cast<int64_t>(b) * p.max_nodes;
  int64_t* out_tokens = p.out_tokens + static_cast<int64_t>(b) * p.max_nodes;
  int node = 0, k = 0;

  if (!p.sampling) {
    // Greedy: the first child (sibling order) whose token is the parent's argmax.
    if (tid != 0) return;
    for (int step = 0; step < n; ++step) {
      const int64_t target = s_arg[node];
      int child = first_child[node];
      for (int guard = 0; child != -1 && tokens[child] != target && guard < n; ++guard) {
        child = next_sibling[child];
      }
      out_tokens[k] = target;
      if (child == -1 || tokens[child] != target) break;
      out_nodes[k++] = child;
      node = child;
    }
    p.num_accepted[b] = k;
    return;
  }

  const bool filtered = (p.top_k > 0 && p.top_k < p.vocab) || p.top_p < 1.0f;
  for (int step = 0; step < n; ++step) {
    const T* x = logits + (base + node) * p.ld;
    RowView<T> row{x, p.vocab, Aligned16(x), s_max[node], p.inv_t, 0u, kNone64};
    double total = s_sum[node];
    if (filtered) {
      ApplyTopKTopP(row, p.top_k, p.top_p, search);
      total = SumExcluding(row, s_excluded, 0, temp, &s_broadcast);
    }
    if (tid == 0) {
      int c = first_child[node], count = 0;
      for (; c != -1 && count < n; c = next_sibling[c]) {
        s_child[count] = c;
        s_child_token[count] = tokens[c];
        ++count;
      }
      s_num_children = count;
    }
    __syncthreads();
    const int num_children = s_num_children;
    for (int j = tid; j < num_children; j += kWalkThreads) {
      bool dup = false;
      for (int l = 0; l < j; ++l) dup = dup || s_child_token[l] == s_child_token[j];
      s_dup[j] = dup;
      s_child_weight[j] = row.WeightAt(s_child_token[j]);
    }
    __syncthreads();
    if (tid == 0) {
      s_suffix[num_children] = 0.0;
      int m = 0;
      for (int j = num_children - 1; j >= 0; --j) {
        s_suffix[j] = s_suffix[j + 1] + (s_dup[j] ? 0.0 : s_child_weight[j]);
      }
      for (int j = 0; j < num_children; ++j) {
        if (s_dup[j]) continue;
        int at = m++;
        for (; at > 0 && s_excluded[at - 1] > s_child_token[j]; --at) s_excluded[at] = s_excluded[at - 1];
        s_excluded[at] = s_child_token[j];
      }
      s_num_excluded = m;
    }
    __syncthreads();

    // Sibling order. Before any child of positive weight is rejected the residual mass is the row
    // total; afterwards it is R (the row without every child's token) plus the untried distinct
    // children, a sum of positive terms (no cancellation; exactly w(x) when only x is left).
    int accepted = -1;
    bool have_rest = false;
    double rest = 0.0, rejected = 0.0;
    for (int j = 0; j < num_children; ++j) {
      if (s_dup[j]) continue;  // r(x) = 0 on its second try: rejected whatever the coin
      const float u = PhiloxCoin(p.seed, p.offset, static_cast<uint32_t>(b), static_cast<uint32_t>(s_child[j]));
      double mass = total;
      if (rejected > 0.0) {
        if (!have_rest) {
          rest = SumExcluding(row, s_excluded, s_num_excluded, temp, &s_broadcast);
          have_rest = true;
        }
        mass = rest + s_suffix[j];
      }
      if (static_cast<double>(u) < s_child_weight[j] / mass) {
        accepted = j;
        break;
      }
      rejected += s_child_weight[j];
    }
    if (accepted >= 0) {
      if (tid == 0) {
        out_nodes[k] = s_child[accepted];
        out_tokens[k] = s_child_token[accepted];
      }
      ++k;
      node = s_child[accepted];
      __syncthreads();  // the child arrays are rewritten for the next node
      continue;
    }
    // Every child rejected (or a leaf): the correction / bonus token from the residual.
    const float u0 = PhiloxCoin(p.seed, p.offset, static_cast<uint32_t>(b), 0u);
    const int64_t token = SampleExcluding(row, s_excluded, s_num_excluded, u0, temp, sample);
    if (tid == 0) {
      out_tokens[k] = token;
      p.num_accepted[b] = k;
    }
    return;
  }
  if (tid == 0) p.num_accepted[b] = k;  // only for a malformed tree (a sibling cycle)
}

template <typename T>
cudaError_t Launch(const TreeVerifyLaunchParams& params, cudaStream_t stream) {
  const Split split = SplitFor(params.total_rows, params.vocab);
  const bool sampling = params.temperature != 0.0f;
  const float inv_t = sampling ? 1.0f / params.temperature : 1.0f;
  const Partials partials = CarvePartials(params.workspace, params.total_rows * split.count);
  const T* logits = static_cast<const T*>(params.logits);
  const unsigned blocks = static_cast<unsigned>(params.total_rows * split.count);
  if (sampling) {
    RowPassKernel<T, true><<<blocks, kPassThreads, 0, stream>>>(logits, params.ld, params.vocab, split.elems,
                                                                split.count, inv_t, partials);
  } else {
    RowPassKernel<T, false><<<blocks, kPassThreads, 0, stream>>>(logits, params.ld, params.vocab, split.elems,
                                                                 split.count, inv_t, partials);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  WalkParams w{params.row_offsets, params.tokens, params.first_child, params.next_sibling, params.ld,
               params.vocab, split.count, params.max_nodes, sampling, inv_t, params.top_k, params.top_p,
               params.seed, params.offset, partials, params.num_accepted, params.accepted_nodes,
               params.out_tokens, params.errors};
  WalkKernel<T><<<static_cast<unsigned>(params.batch), kWalkThreads, 0, stream>>>(logits, w);
  return cudaGetLastError();
}

}  // namespace

size_t TreeVerifyWorkspaceBytes(int64_t total_rows, int64_t vocab) {
  if (total_rows <= 0 || vocab <= 0) return 0;
  // SplitFor gives rows · splits <= rows · ceil(V / kMaxSplitElems) + kTargetBlocks + rows.
  const int64_t bound =
      total_rows * ((vocab + kMaxSplitElems - 1) / kMaxSplitElems) + kTargetBlocks + total_rows;
  return PartialsBytes(bound);
}

cudaError_t LaunchTreeVerify(const TreeVerifyLaunchParams& p, cudaStream_t stream) {
  if (p.batch < 0) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const bool sizes_ok = p.total_rows >= p.batch && p.total_rows <= (int64_t{1} << 31) / 64 &&
                        p.max_nodes >= 1 && p.max_nodes <= kVerifyMaxNodes && p.vocab >= 1 &&
                        p.vocab <= kVerifyMaxVocab && p.ld >= p.vocab;
  const bool pointers_ok = p.row_offsets != nullptr && p.tokens != nullptr && p.first_child != nullptr &&
                           p.next_sibling != nullptr && p.logits != nullptr && p.workspace != nullptr &&
                           p.num_accepted != nullptr && p.accepted_nodes != nullptr &&
                           p.out_tokens != nullptr && p.errors != nullptr;
  const bool sampling_ok = std::isfinite(p.temperature) && p.temperature >= 0.0f && p.top_k >= 0 &&
                           p.top_p > 0.0f && p.top_p <= 1.0f;
  const bool type_ok = p.logits_type == VerifyLogitsType::kF32 || p.logits_type == VerifyLogitsType::kBf16;
  if (!sizes_ok || !pointers_ok || !sampling_ok || !type_ok ||
      (reinterpret_cast<uintptr_t>(p.workspace) & 15u) != 0 ||
      p.workspace_bytes < TreeVerifyWorkspaceBytes(p.total_rows, p.vocab)) {
    return cudaErrorInvalidValue;
  }
  if (p.total_rows * SplitFor(p.total_rows, p.vocab).count > INT32_MAX) return cudaErrorInvalidValue;
  return p.logits_type == VerifyLogitsType::kF32 ? Launch<float>(p, stream) : Launch<uint16_t>(p, stream);
}

}  // namespace eagle3::cuda
