// Tree verification kernels (launcher and semantics: cuda/verify_ops.h; reference:
// src/tree_verifier.cc). No abseil here: nvcc must never see it.
//
// Kernel 1 (RowPassKernel): rows x splits blocks, each reads its slice of one row once (16-byte
// vectors; per chunk of them a NaN-propagating max, single elements only in rare chunks) and writes
// a partial (max, lowest argmax, sum of exp((z - max) / T) relative to its own max, lowest NaN/+inf
// id).
// Kernel 2 (WalkKernel): one block per sequence combines its rows' partials (a warp per row),
// checks the sequence (in parallel, lowest failing node per kind), and walks the tree; sampling
// reads the visited rows again through the block-wide row passes below.
#include <math_constants.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "programmatic_launch.cuh"
#include "ptx.cuh"
#include "verify_ops.h"
#include "eagle3/philox.h"

namespace eagle3::cuda {
namespace {

constexpr int kPassThreads = 256;
constexpr int kWalkThreads = 512;
constexpr int kGroup = 8;                 // consecutive elements per thread and load (16 or 32 bytes)
constexpr int64_t kMinSplitElems = 2048;  // a split never gets fewer elements...
constexpr int64_t kMaxSplitElems = 32768; // ...nor more (a block's final reduction is amortized)
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
//
// A block owns [begin, end) of one row: a scalar head up to the first 16-byte boundary, a body of
// 16-byte vectors, kUnroll of them per thread in flight (a chunk), and a scalar tail. Every thread
// meets its elements in increasing id order (head, its chunks, tail). Per chunk only the
// NaN-propagating maximum (packed bf16x2 or f32) is compared with the thread's running max: a chunk
// that beats it records itself (and, kSum, rescales the sum once); the lowest id reaching the max is
// looked up at the end, by the threads holding the block's max only, in the one chunk they
// recorded (a re-read of 64 bytes, usually by one thread). NaN / +inf turn the chunk max into NaN /
// +inf; that rare chunk is searched for the lowest bad id and the thread stops (its later ids are
// higher, and the row is an error whatever the rest holds).

constexpr int kUnroll = 4;  // 16-byte vectors per thread and chunk

template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Element k of a 16-byte vector of T, as float (k a compile-time constant after unrolling).
template <typename T>
__device__ __forceinline__ float VecElem(const uint4& v, int k) {
  if constexpr (sizeof(T) == 2) {
    const uint32_t w = Word(v, k >> 1);
    return __uint_as_float((k & 1) != 0 ? (w & 0xFFFF0000u) : (w << 16));
  } else {
    return __uint_as_float(Word(v, k));
  }
}

// A chunk: vector j of the thread's chunk at vector index c is vector c + j · kPassThreads of the
// body (-inf past its `vectors`).
template <typename T>
__device__ __forceinline__ void LoadChunk(const uint4* body, int32_t c, int32_t vectors, uint4 (&v)[kUnroll]) {
  const uint32_t w = sizeof(T) == 2 ? 0xFF80FF80u : 0xFF800000u;  // -inf
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const int32_t at = c + j * kPassThreads;
    v[j] = at < vectors ? __ldg(body + at) : make_uint4(w, w, w, w);
  }
}

// The chunk's maximum; NaN when it holds a NaN.
template <typename T>
__device__ __forceinline__ float ChunkMax(const uint4 (&v)[kUnroll]) {
  if constexpr (sizeof(T) == 2) {
    uint32_t a = MaxNaNBf16x2(v[0].x, v[0].y), b = MaxNaNBf16x2(v[0].z, v[0].w);
#pragma unroll
    for (int j = 1; j < kUnroll; ++j) {
      a = MaxNaNBf16x2(a, MaxNaNBf16x2(v[j].x, v[j].y));
      b = MaxNaNBf16x2(b, MaxNaNBf16x2(v[j].z, v[j].w));
    }
    a = MaxNaNBf16x2(a, b);
    return MaxNaN(__uint_as_float(a << 16), __uint_as_float(a & 0xFFFF0000u));
  } else {
    float a = MaxNaN(__uint_as_float(v[0].x), __uint_as_float(v[0].y));
    float b = MaxNaN(__uint_as_float(v[0].z), __uint_as_float(v[0].w));
#pragma unroll
    for (int j = 1; j < kUnroll; ++j) {
      a = MaxNaN(a, MaxNaN(__uint_as_float(v[j].x), __uint_as_float(v[j].y)));
      b = MaxNaN(b, MaxNaN(__uint_as_float(v[j].z), __uint_as_float(v[j].w)));
    }
    return MaxNaN(a, b);
  }
}

// One thread's running partial over its elements, met in increasing id order.
template <bool kSum>
struct RowState {
  float max = -std::numeric_limits<float>::infinity();
  int32_t arg = INT32_MAX;  // the lowest id reaching max when known (a head or tail element)...
  int32_t chunk = -1;       // ...else the first chunk (its vector index) reaching max
  int32_t bad = INT32_MAX;  // lowest NaN / +inf id
  double sum = 0.0;         // Σ expf((z - max) * inv_t), kSum only

  // Moves the max up to z > max (finite), rescaling the sum.
  __device__ __forceinline__ void Raise(float z, float inv_t) {
    if (kSum && max > -CUDART_INF_F) sum *= static_cast<double>(expf((max - z) * inv_t));
    max = z;
  }
  // One element; true when it is NaN or +inf (the thread stops).
  __device__ __forceinline__ bool Visit(float z, int32_t i, float inv_t) {
    if (!(z < CUDART_INF_F)) {
      bad = i;
      return true;
    }
    if (z > max) {
      Raise(z, inv_t);
      arg = i;
      chunk = -1;
    }
    if (kSum && z > -CUDART_INF_F) sum += static_cast<double>(expf((z - max) * inv_t));
    return false;
  }
  // The chunk at vector index c (element k of its vector j has id first + j·stride + k); true on
  // NaN / +inf.
  template <typename T>
  __device__ __forceinline__ bool Chunk(const uint4 (&v)[kUnroll], int32_t c, int32_t first, int32_t stride,
                                        float inv_t) {
    const float cm = ChunkMax<T>(v);
    if (!(cm <= max)) {  // a new max, or NaN / +inf (NaN compares false)
      if (!(cm < CUDART_INF_F)) {
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
#pragma unroll
          for (int k = 0; k < kVec<T>; ++k) {
            if (!(VecElem<T>(v[j], k) < CUDART_INF_F)) {
              bad = first + j * stride + k;
              return true;
            }
          }
        }
      }
      Raise(cm, inv_t);
      arg = INT32_MAX;
      chunk = c;
    }
    if (kSum && max > -CUDART_INF_F) {
      // Weights in float within a 16-byte vector, vectors added in double.
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < kVec<T>; ++k) s += expf((VecElem<T>(v[j], k) - max) * inv_t);
        sum += static_cast<double>(s);
      }
    }
    return false;
  }
};

struct MaxArg {
  float max;
  int32_t arg;
};
struct MaxArgOp {  // the larger max, the lower id among equal maxima
  __device__ MaxArg operator()(const MaxArg& a, const MaxArg& b) const {
    return (b.max > a.max || (b.max == a.max && b.arg < a.arg)) ? b : a;
  }
};
struct MaxFloatOp {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct MinOp {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return b < a ? b : a; }
};

// The block's partial over [begin, end) of one row: max, lowest argmax, (kSum) the sum of
// expf((z - max) * inv_t) relative to the block's max, lowest NaN / +inf id (with a bad id the
// others are left -inf / none / 0). -inf adds nothing.
template <typename T, bool kSum>
__global__ void __launch_bounds__(kPassThreads)
    RowPassKernel(const T* __restrict__ logits, int64_t ld, int32_t vocab, int32_t split_elems, int32_t splits,
                  float inv_t, Partials out) {
  PdlEnter();
  constexpr int kV = kVec<T>;
  const int64_t row = blockIdx.x / splits;
  const int32_t split = static_cast<int32_t>(blockIdx.x % splits);
  const T* x = logits + row * ld;
  const int32_t begin = split * split_elems;
  const int32_t end = begin + split_elems < vocab ? begin + split_elems : vocab;
  // begin is a multiple of kGroup (>= kV): the head is the row's own misalignment.
  const int32_t misaligned = static_cast<int32_t>((reinterpret_cast<uintptr_t>(x) & 15u) / sizeof(T));
  const int32_t head_end = begin + ((kV - misaligned) & (kV - 1));
  const int32_t body = head_end < end ? head_end : end;
  const int32_t vectors = (end - body) / kV;
  const int32_t tail = body + vectors * kV;
  const uint4* vx = reinterpret_cast<const uint4*>(x + body);
  constexpr int32_t kStride = kPassThreads * kV;  // ids between a chunk's vectors
  const int tid = static_cast<int>(threadIdx.x);
  RowState<kSum> st;
  bool stop = tid < body - begin && st.Visit(ToFloat(x[begin + tid]), begin + tid, inv_t);
  for (int32_t c = tid; !stop && c < vectors; c += kPassThreads * kUnroll) {
    uint4 v[kUnroll];
    LoadChunk<T>(vx, c, vectors, v);
    stop = st.template Chunk<T>(v, c, body + c * kV, kStride, inv_t);
  }
  if (!stop && tid < end - tail) st.Visit(ToFloat(x[tail + tid]), tail + tid, inv_t);

  using FloatReduce = cub::BlockReduce<float, kPassThreads>;
  using IntReduce = cub::BlockReduce<int32_t, kPassThreads>;
  using SumReduce = cub::BlockReduce<double, kPassThreads>;
  __shared__ union {
    typename FloatReduce::TempStorage f;
    typename IntReduce::TempStorage i;
    typename SumReduce::TempStorage s;
  } temp;
  __shared__ float block_max;
  const int64_t p = blockIdx.x;
  if (__syncthreads_or(st.bad != INT32_MAX)) {  // an error row: only the lowest bad id matters
    const int32_t lowest = IntReduce(temp.i).Reduce(st.bad, MinOp{});
    if (tid == 0) {
      out.max[p] = -CUDART_INF_F;
      out.arg[p] = INT32_MAX;
      out.bad[p] = lowest;
      if (kSum) out.sum[p] = 0.0;
    }
    return;
  }
  const float m = FloatReduce(temp.f).Reduce(st.max, MaxFloatOp{});
  if (tid == 0) block_max = m;
  __syncthreads();
  const float bm = block_max;
  if (st.max == bm && st.chunk >= 0) {
    // The lowest id of the recorded chunk reaching the max (every earlier element is lower).
    uint4 v[kUnroll];
    LoadChunk<T>(vx, st.chunk, vectors, v);
    const int32_t first = body + st.chunk * kV;
#pragma unroll
    for (int j = kUnroll - 1; j >= 0; --j) {
#pragma unroll
      for (int k = kV - 1; k >= 0; --k) {
        if (VecElem<T>(v[j], k) == bm) st.arg = first + j * kStride + k;
      }
    }
  }
  const int32_t arg = IntReduce(temp.i).Reduce(st.max == bm ? st.arg : INT32_MAX, MinOp{});
  if (kSum) {
    __syncthreads();  // temp is reused
    const double scaled =
        st.max == -CUDART_INF_F ? 0.0 : st.sum * static_cast<double>(expf((st.max - bm) * inv_t));
    const double total = SumReduce(temp.s).Sum(scaled);
    if (tid == 0) out.sum[p] = total;
  }
  if (tid == 0) {
    out.max[p] = bm;
    out.arg[p] = arg;
    out.bad[p] = kNone64;
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
  // Whether every token is kept (top-k and top-p off): Weight(z, i) is then expf((z - max) ·
  // inv_t) for every z (0 for -inf).
  __device__ bool KeepsAll() const { return keep_key == 0u && keep_limit == kNone64; }
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
  // Whether none of [i, i + kGroup) is listed (the cursor stays usable for ids >= i).
  __device__ bool NoneInGroup(int64_t i) {
    while (pos < n && ids[pos] < i) ++pos;
    return pos == n || ids[pos] >= i + kGroup;
  }
};

using WalkSum = cub::BlockReduce<double, kWalkThreads>;
using WalkMax = cub::BlockReduce<int64_t, kWalkThreads>;
using WalkScan = cub::BlockScan<double, kWalkThreads>;

struct MaxOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return b > a ? b : a; }
};

// kUnroll tiles' sums (ResidualTiles reduces them together).
struct TileSums {
  double v[kUnroll];
};
struct TileSumsOp {
  __device__ TileSums operator()(const TileSums& a, const TileSums& b) const {
    TileSums out;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) out.v[u] = a.v[u] + b.v[u];
    return out;
  }
};
using WalkTileSum = cub::BlockReduce<TileSums, kWalkThreads>;

union WalkTemp {
  typename WalkTileSum::TempStorage tiles;
  typename WalkSum::TempStorage sum;
  typename WalkMax::TempStorage max;
  typename WalkScan::TempStorage scan;
};

// Σ w(i) over tokens i not in `excluded` (sorted), in double.
template <typename T>
__device__ double SumExcluding(const RowView<T>& row, const int64_t* excluded, int n_excluded, WalkTemp& temp,
                               double* broadcast) {
  SortedCursor cursor{excluded, n_excluded};
  const bool keeps_all = row.KeepsAll();
  double s = 0.0;
  // kUnroll tiles per step, their loads in flight together; a whole group with nothing excluded or
  // filtered skips the per-token tests (same terms, same order).
  for (int64_t g0 = static_cast<int64_t>(threadIdx.x) * kGroup; g0 < row.vocab; g0 += kUnroll * kTile) {
    float v[kUnroll][kGroup];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) LoadGroup(row.x, g0 + u * kTile, row.vocab, row.aligned, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = g0 + u * kTile;
      if (keeps_all && g + kGroup <= row.vocab && cursor.NoneInGroup(g)) {
#pragma unroll
        for (int k = 0; k < kGroup; ++k) s += static_cast<double>(expf((v[u][k] - row.max) * row.inv_t));
        continue;
      }
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        if (g + k < row.vocab && !cursor.Contains(g + k)) s += row.Weight(v[u][k], g + k);
      }
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
// when r is all zero). Phase A (ResidualTiles, which also gives the walk its residual mass, so a
// correction after rejections reuses it) sums each tile of kTile tokens; phase B rescans the
// crossing tile with a block scan.
struct SampleShared {
  double tile_sum[kMaxTiles];
  double mass;  // Σ tile_sum
  int64_t result;
  int64_t last_positive;
  int crossing_tile;
  double before;  // cumulative mass before the crossing tile
  double target;  // u · m
};

// Phase A: the residual's tile sums sh.tile_sum[t] = Σ r(i) over tile t, its last positive id
// sh.last_positive (-1 if none) and its mass sh.mass = Σ_t tile_sum[t] (tile order), returned.
template <typename T>
__device__ double ResidualTiles(const RowView<T>& row, const int64_t* excluded, int n_excluded, WalkTemp& temp,
                                SampleShared& sh) {
  const int tiles = static_cast<int>((row.vocab + kTile - 1) / kTile);
  int64_t last_positive = -1;
  {
    // kUnroll tiles per step: their loads in flight together, one block reduction.
    SortedCursor cursor{excluded, n_excluded};
    const bool keeps_all = row.KeepsAll();
    for (int t0 = 0; t0 < tiles; t0 += kUnroll) {
      float v[kUnroll][kGroup];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        LoadGroup(row.x, (t0 + u) * kTile + static_cast<int64_t>(threadIdx.x) * kGroup, row.vocab, row.aligned, v[u]);
      }
      TileSums s;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t g = (t0 + u) * kTile + static_cast<int64_t>(threadIdx.x) * kGroup;
        s.v[u] = 0.0;
        if (keeps_all && g + kGroup <= row.vocab && cursor.NoneInGroup(g)) {  // as SumExcluding
#pragma unroll
          for (int k = 0; k < kGroup; ++k) {
            const double w = static_cast<double>(expf((v[u][k] - row.max) * row.inv_t));
            s.v[u] += w;
            if (w > 0.0) last_positive = g + k;
          }
          continue;
        }
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          if (g + k < row.vocab && !cursor.Contains(g + k)) {
            const double w = row.Weight(v[u][k], g + k);
            s.v[u] += w;
            if (w > 0.0) last_positive = g + k;
          }
        }
      }
      const TileSums sums = WalkTileSum(temp.tiles).Reduce(s, TileSumsOp{});
      if (threadIdx.x == 0) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (t0 + u < tiles) sh.tile_sum[t0 + u] = sums.v[u];
        }
      }
      __syncthreads();
    }
  }
  const int64_t last = WalkMax(temp.max).Reduce(last_positive, MaxOp{});
  if (threadIdx.x == 0) {
    sh.last_positive = last;
    double mass = 0.0;
    for (int t = 0; t < tiles; ++t) mass += sh.tile_sum[t];
    sh.mass = mass;
  }
  __syncthreads();
  return sh.mass;  // rewritten only by thread 0 of a later call, after its barriers
}

// The residual sample: `tiles_ready` when ResidualTiles ran last on this row and exclusion set.
template <typename T>
__device__ int64_t SampleExcluding(const RowView<T>& row, const int64_t* excluded, int n_excluded, float u,
                                   bool tiles_ready, WalkTemp& temp, SampleShared& sh) {
  const int tiles = static_cast<int>((row.vocab + kTile - 1) / kTile);
  if (!tiles_ready) ResidualTiles(row, excluded, n_excluded, temp, sh);
  if (threadIdx.x == 0) {
    sh.result = -1;
    const double target = static_cast<double>(u) * sh.mass;
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
  const uint64_t* seed_offset;  // when set: {seed, offset} on the device, read instead
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
  __shared__ int64_t s_tokens[kVerifyMaxNodes];  // the tree
  __shared__ int32_t s_first_child[kVerifyMaxNodes];
  __shared__ int32_t s_next_sibling[kVerifyMaxNodes];
  __shared__ int s_first_error[3];  // lowest node with a bad tree entry, token, logits row
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

  PdlEnter();
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const uint64_t philox_seed = p.seed_offset != nullptr ? p.seed_offset[0] : p.seed;
  const uint64_t philox_offset = p.seed_offset != nullptr ? p.seed_offset[1] : p.offset;
  const int64_t base = p.row_offsets[b];
  const int64_t n = p.row_offsets[b + 1] - base;
  if (n < 1 || n > p.max_nodes) {
    if (tid == 0) {
      p.errors[b] = VerifyError{static_cast<int64_t>(VerifyErrorKind::kBadTree), -1, n};
      p.num_accepted[b] = -1;
    }
    return;
  }
  // The tree, in shared memory (the checks and the walk read it many times).
  for (int i = tid; i < n; i += kWalkThreads) {
    s_tokens[i] = p.tokens[base + i];
    s_first_child[i] = p.first_child[base + i];
    s_next_sibling[i] = p.next_sibling[base + i];
  }
  if (tid < 3) s_first_error[tid] = INT_MAX;
  const int64_t* tokens = s_tokens;
  const int32_t* first_child = s_first_child;
  const int32_t* next_sibling = s_next_sibling;

  // Combine the rows' split partials, one warp per row (splits are in token order: MaxArgOp's
  // lowest id is the first split reaching the max).
  const int lane = tid & 31;
  for (int i = tid >> 5; i < n; i += kWalkThreads / 32) {
    const int64_t first = (base + i) * p.splits;
    MaxArg best{-CUDART_INF_F, INT32_MAX};
    int64_t bad = kNone64;
    for (int64_t s = lane; s < p.splits; s += 32) {
      best = MaxArgOp{}(best, MaxArg{p.partials.max[first + s], p.partials.arg[first + s]});
      const int64_t pb = p.partials.bad[first + s];
      bad = pb < bad ? pb : bad;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const MaxArg other{__shfl_xor_sync(0xffffffffu, best.max, offset), __shfl_xor_sync(0xffffffffu, best.arg, offset)};
      best = MaxArgOp{}(best, other);
      const int64_t ob = __shfl_xor_sync(0xffffffffu, bad, offset);
      bad = ob < bad ? ob : bad;
    }
    double sum = 0.0;
    if (p.sampling && best.max > -CUDART_INF_F) {
      for (int64_t s = lane; s < p.splits; s += 32) {
        const float pm = p.partials.max[first + s];
        if (pm > -CUDART_INF_F) sum += p.partials.sum[first + s] * static_cast<double>(expf((pm - best.max) * p.inv_t));
      }
      for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) {
      s_max[i] = best.max;
      s_arg[i] = best.arg;
      s_sum[i] = sum;
      s_bad[i] = bad;
    }
  }
  __syncthreads();

  // Checks, in the reference's order: the lowest failing node of each kind, in parallel.
  for (int i = tid; i < n; i += kWalkThreads) {
    const int32_t fc = first_child[i], ns = next_sibling[i];
    if (!(fc == -1 || (fc > i && fc < n)) || !(ns == -1 || (ns >= 1 && ns < n))) atomicMin(&s_first_error[0], i);
    if (i >= 1 && (tokens[i] < 0 || tokens[i] >= p.vocab)) atomicMin(&s_first_error[1], i);
    if (s_bad[i] != kNone64 || s_max[i] == -CUDART_INF_F) atomicMin(&s_first_error[2], i);
  }
  __syncthreads();
  if (tid == 0) {
    VerifyError e{static_cast<int64_t>(VerifyErrorKind::kNone), 0, 0};
    if (const int i = s_first_error[0]; i != INT_MAX) {
      e = VerifyError{static_cast<int64_t>(VerifyErrorKind::kBadTree), i, 0};
    } else if (const int i = s_first_error[1]; i != INT_MAX) {
      e = VerifyError{static_cast<int64_t>(VerifyErrorKind::kTokenOutOfRange), i, tokens[i]};
    } else if (const int i = s_first_error[2]; i != INT_MAX) {
      if (s_bad[i] != kNone64) {
        const float z = ToFloat(logits[(base + i) * p.ld + s_bad[i]]);
        e = VerifyError{static_cast<int64_t>(isnan(z) ? VerifyErrorKind::kNaN : VerifyErrorKind::kPosInf), i,
                        s_bad[i]};
      } else {
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
      const float u = PhiloxCoin(philox_seed, philox_offset, static_cast<uint32_t>(b), static_cast<uint32_t>(s_child[j]));
      double mass = total;
      if (rejected > 0.0) {
        if (!have_rest) {
          rest = ResidualTiles(row, s_excluded, s_num_excluded, temp, sample);  // reused by the sample
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
    const float u0 = PhiloxCoin(philox_seed, philox_offset, static_cast<uint32_t>(b), 0u);
    const int64_t token = SampleExcluding(row, s_excluded, s_num_excluded, u0, have_rest, temp, sample);
    if (tid == 0) {
      out_tokens[k] = token;
      p.num_accepted[b] = k;
    }
    return;
  }
  if (tid == 0) p.num_accepted[b] = k;  // only for a malformed tree (a sibling cycle)
}

template <typename T>
cudaError_t Launch(const TreeVerifyLaunchParams& params, bool programmatic, cudaStream_t stream) {
  const Split split = SplitFor(params.total_rows, params.vocab);
  const bool sampling = params.temperature != 0.0f;
  const float inv_t = sampling ? 1.0f / params.temperature : 1.0f;
  const Partials partials = CarvePartials(params.workspace, params.total_rows * split.count);
  const T* logits = static_cast<const T*>(params.logits);
  const unsigned blocks = static_cast<unsigned>(params.total_rows * split.count);
  // vocab <= kVerifyMaxVocab: in-row ids fit int32.
  const auto vocab = static_cast<int32_t>(params.vocab);
  const auto elems = static_cast<int32_t>(split.elems);
  const auto count = static_cast<int32_t>(split.count);
  if (const cudaError_t e = LaunchKernel(programmatic, sampling ? RowPassKernel<T, true> : RowPassKernel<T, false>,
                                         dim3(blocks), dim3(kPassThreads), 0, stream, logits, params.ld, vocab, elems,
                                         count, inv_t, partials);
      e != cudaSuccess) {
    return e;
  }
  WalkParams w{params.row_offsets, params.tokens, params.first_child, params.next_sibling, params.ld,
               params.vocab, split.count, params.max_nodes, sampling, inv_t, params.top_k, params.top_p,
               params.seed, params.offset, params.seed_offset, partials, params.num_accepted, params.accepted_nodes,
               params.out_tokens, params.errors};
  return LaunchKernel(programmatic, WalkKernel<T>, dim3(static_cast<unsigned>(params.batch)), dim3(kWalkThreads), 0,
                      stream, logits, w);
}

}  // namespace

size_t TreeVerifyWorkspaceBytes(int64_t total_rows, int64_t vocab) {
  if (total_rows <= 0 || vocab <= 0) return 0;
  // SplitFor gives rows · splits <= rows · ceil(V / kMaxSplitElems) + kTargetBlocks + rows.
  const int64_t bound =
      total_rows * ((vocab + kMaxSplitElems - 1) / kMaxSplitElems) + kTargetBlocks + total_rows;
  return PartialsBytes(bound);
}

cudaError_t LaunchTreeVerify(const TreeVerifyLaunchParams& p, bool programmatic, cudaStream_t stream) {
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
  return p.logits_type == VerifyLogitsType::kF32 ? Launch<float>(p, programmatic, stream)
                                                 : Launch<uint16_t>(p, programmatic, stream);
}

}  // namespace eagle3::cuda
