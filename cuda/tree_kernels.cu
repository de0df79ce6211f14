// EAGLE-2 draft-tree construction kernels (launchers and semantics: eagle3/cuda/tree_ops.h;
// reference: src/draft_tree.cc BuildDraftTree). No abseil here: nvcc must never see it.
//
// StepKernel: rows x splits blocks; each reads its slice of one logits row once and writes a partial
// (max, Σ exp(x - max) in double, lowest NaN / +inf id, the slice's top-k as packed keys); the last
// block of a sequence to arrive combines the sequence (row normalizers, row top-k, scores, the next
// frontier). FinalizeKernel: one block per sequence picks the best N - 1 candidates and writes the
// tree. A top-k entry is the 64-bit key (ordered float bits << 32) | ~draft_id: a larger key is a
// larger logit, ties to the lower draft id, and 0 is below every real entry (an empty slot).
#include <math_constants.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "eagle3/cuda/tree_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 4;                  // consecutive elements per thread and load (one float4)
constexpr int kUnroll = 4;                 // loads in flight per thread
constexpr int64_t kMinSplitElems = 4096;   // a split never gets fewer elements (unless V is smaller)
constexpr int64_t kTargetBlocks = 528;     // 4 blocks per SM of an H100 / H200 (132 SMs)
constexpr int kFinalizeThreads = 256;
constexpr int32_t kNoBad = INT32_MAX;

static_assert(kTreeMaxSplits <= 32, "a warp lane holds one split's list in the row merge");
static_assert(kTreeMaxTopk * kTreeMaxTopk <= kThreads, "one thread per candidate of a step");

struct Split {
  int64_t elems;  // per split, a multiple of kGroup
  int32_t count;  // splits per row
};

Split SplitFor(int64_t rows, int64_t vocab) {
  int64_t splits = (kTargetBlocks + rows - 1) / rows;
  const int64_t by_size = vocab / kMinSplitElems > 1 ? vocab / kMinSplitElems : 1;
  if (splits > by_size) splits = by_size;
  if (splits > kTreeMaxSplits) splits = kTreeMaxSplits;
  if (splits < 1) splits = 1;
  int64_t elems = (vocab + splits - 1) / splits;
  elems = (elems + kGroup - 1) / kGroup * kGroup;
  return {elems, static_cast<int32_t>((vocab + elems - 1) / elems)};
}

int64_t Candidates(int64_t k, int64_t steps) { return 1 + k + (steps - 1) * k * k; }

size_t AlignUp(size_t n) { return (n + 15) / 16 * 16; }

// The workspace, carved in this order (each array 16-byte aligned).
struct Workspace {
  uint32_t* counters;    // [kTreeMaxBatch]: blocks of the sequence that arrived in this launch (left at 0)
  double* part_sum;      // [P]: Σ exp(x - part_max) over the split
  float* part_max;       // [P]
  int32_t* part_bad;     // [P]: lowest NaN / +inf id, kNoBad for none
  uint64_t* part_top;    // [P, k]: the split's top-k keys, best first
  double* cand_score;    // [B, C]: exact cumulative scores; candidate 0 is the root
  int64_t* cand_token;   // [B, C]
  int32_t* cand_parent;  // [B, C]
  int32_t* frontier;     // [B, k]: the current frontier's candidates, best first
};

Workspace Carve(void* base, int64_t batch, int64_t k, int64_t steps, size_t* bytes) {
  const size_t b = static_cast<size_t>(batch);
  const size_t parts = b * static_cast<size_t>(k) * kTreeMaxSplits;
  const size_t cands = b * static_cast<size_t>(Candidates(k, steps));
  char* p = static_cast<char*>(base);
  size_t at = 0;
  auto take = [&](size_t n) {
    char* out = p == nullptr ? nullptr : p + at;
    at += AlignUp(n);
    return out;
  };
  Workspace w;
  // The counters come first and have a fixed size, so that they keep their place (and their zeros)
  // whatever the shape of the build that uses the buffer.
  w.counters = reinterpret_cast<uint32_t*>(take(kTreeMaxBatch * sizeof(uint32_t)));
  w.part_sum = reinterpret_cast<double*>(take(parts * sizeof(double)));
  w.part_max = reinterpret_cast<float*>(take(parts * sizeof(float)));
  w.part_bad = reinterpret_cast<int32_t*>(take(parts * sizeof(int32_t)));
  w.part_top = reinterpret_cast<uint64_t*>(take(parts * static_cast<size_t>(k) * sizeof(uint64_t)));
  w.cand_score = reinterpret_cast<double*>(take(cands * sizeof(double)));
  w.cand_token = reinterpret_cast<int64_t*>(take(cands * sizeof(int64_t)));
  w.cand_parent = reinterpret_cast<int32_t*>(take(cands * sizeof(int32_t)));
  w.frontier = reinterpret_cast<int32_t*>(take(b * static_cast<size_t>(k) * sizeof(int32_t)));
  if (bytes != nullptr) *bytes = at;
  return w;
}

// ---- Keys -----------------------------------------------------------------------------------------

// Ordered 32-bit key of a non-NaN float (larger float, larger key; -0 ties +0; -inf > 0).
__device__ __forceinline__ uint32_t OrderedKey(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float KeyToFloat(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? (key & 0x7FFFFFFFu) : ~key);
}
__device__ __forceinline__ uint64_t PackKey(float v, int64_t id) {
  return (static_cast<uint64_t>(OrderedKey(v)) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}
__device__ __forceinline__ float KeyValue(uint64_t key) { return KeyToFloat(static_cast<uint32_t>(key >> 32)); }
__device__ __forceinline__ int64_t KeyId(uint64_t key) { return ~static_cast<uint32_t>(key); }

// The warp's running top-k, one entry per lane: lane j < k holds the j-th best key seen by the warp
// (0 while empty); `thresh` (the same in every lane) is lane k - 1's. Each lane offers one key
// (0 for none); the rare offers above the threshold are inserted one at a time by the whole warp,
// so that an element costs one comparison, not a pass over a list.
__device__ __forceinline__ void WarpSelect(uint64_t key, int k, uint64_t& slot, uint64_t& thresh) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  uint32_t offers = __ballot_sync(0xFFFFFFFFu, key > thresh);
  while (offers != 0) {
    const int src = __ffs(offers) - 1;
    offers &= offers - 1;
    const uint64_t c = __shfl_sync(0xFFFFFFFFu, key, src);
    if (c <= thresh) continue;  // the threshold rose since the ballot (uniform branch)
    const int pos = __popc(__ballot_sync(0xFFFFFFFFu, lane < k && slot > c));
    const uint64_t up = __shfl_up_sync(0xFFFFFFFFu, slot, 1);
    if (lane < k && lane > pos) slot = up;
    if (lane == pos) slot = c;
    thresh = __shfl_sync(0xFFFFFFFFu, slot, k - 1);
  }
}

// The warp's k best keys over its lanes' descending lists (keys unique except 0), best first, into
// out[0..k) (written by lane 0). k rounds: the best head wins and its lane pops it.
constexpr int K = kTreeMaxTopk;  // register lists of the merges

__device__ __forceinline__ void WarpMergeTopK(uint64_t (&l)[K], int k, uint64_t* out) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int r = 0; r < k; ++r) {
    const uint64_t head = l[0];
    const uint32_t hi = static_cast<uint32_t>(head >> 32);
    const uint32_t max_hi = __reduce_max_sync(0xFFFFFFFFu, hi);
    const uint32_t max_lo = __reduce_max_sync(0xFFFFFFFFu, hi == max_hi ? static_cast<uint32_t>(head) : 0u);
    const uint64_t best = (static_cast<uint64_t>(max_hi) << 32) | max_lo;
    if (lane == 0) out[r] = best;
    if (best != 0 && head == best) {
#pragma unroll
      for (int j = 0; j + 1 < K; ++j) l[j] = l[j + 1];
      l[K - 1] = 0;
    }
  }
}

// Loads list[0..k) from `src` (null: an empty list) into registers; slots k.. stay empty.
__device__ __forceinline__ void LoadList(const uint64_t* src, int k, bool from_global, uint64_t (&l)[K]) {
#pragma unroll
  for (int j = 0; j < K; ++j) {
    l[j] = (src != nullptr && j < k) ? (from_global ? __ldcg(src + j) : src[j]) : 0;
  }
}

// (max, sum of exp(x - max)) pairs: the pair of the union, in double.
__device__ __forceinline__ void CombineSum(float& m, double& s, float m2, double s2) {
  const float mm = m2 > m ? m2 : m;
  if (mm == -CUDART_INF_F) return;
  const double a = m == -CUDART_INF_F ? 0.0 : s * exp(static_cast<double>(m) - static_cast<double>(mm));
  const double c = m2 == -CUDART_INF_F ? 0.0 : s2 * exp(static_cast<double>(m2) - static_cast<double>(mm));
  m = mm;
  s = a + c;
}

// ---- Step kernel ----------------------------------------------------------------------------------

struct StepArgs {
  const float* logits;
  int64_t ld;
  int64_t vocab;
  const int64_t* d2t;
  int32_t step;
  int32_t num_steps;
  int32_t k;
  int32_t rows_per_seq;  // F
  int64_t split_elems;
  int32_t splits;
  int64_t num_candidates;  // C
  Workspace ws;
  TreeBuildError* errors;
  TreeFrontier out;
};

struct CombineShared {
  uint64_t row_top[kTreeMaxTopk][kTreeMaxTopk];
  double row_lse[kTreeMaxTopk];
  int32_t row_bad[kTreeMaxTopk];
  bool row_empty[kTreeMaxTopk];
  double score[kTreeMaxTopk * kTreeMaxTopk];
  bool failed;
};

// The last block of sequence b: combines its rows and writes the candidates and the next frontier.
__device__ __forceinline__ void CombineSequence(const StepArgs& a, int64_t b, CombineShared& sh) {
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid & 31;
  const int k = a.k, F = a.rows_per_seq;
  const Workspace& w = a.ws;
  for (int f = warp; f < F; f += kWarps) {
    const int64_t first = (b * F + f) * a.splits;
    uint64_t l[K];
    LoadList(lane < a.splits ? w.part_top + (first + lane) * k : nullptr, k, true, l);
    WarpMergeTopK(l, k, sh.row_top[f]);
    if (lane == 0) {
      // The splits in order: deterministic, so bit-identical rows get bit-identical normalizers.
      float m = -CUDART_INF_F;
      double s = 0.0;
      int32_t bad = kNoBad;
      for (int sp = 0; sp < a.splits; ++sp) {
        CombineSum(m, s, __ldcg(w.part_max + first + sp), __ldcg(w.part_sum + first + sp));
        const int32_t pb = __ldcg(w.part_bad + first + sp);
        bad = pb < bad ? pb : bad;
      }
      sh.row_bad[f] = bad;
      sh.row_empty[f] = m == -CUDART_INF_F;
      sh.row_lse[f] = static_cast<double>(m) + log(s);
    }
  }
  __syncthreads();
  if (tid == 0) {
    TreeBuildError e{static_cast<int64_t>(TreeBuildErrorKind::kNone), 0, 0, 0};
    for (int f = 0; f < F; ++f) {
      if (sh.row_bad[f] != kNoBad) {
        const float z = a.logits[(b * F + f) * a.ld + sh.row_bad[f]];
        e = {static_cast<int64_t>(z != z ? TreeBuildErrorKind::kNaN : TreeBuildErrorKind::kPosInf), a.step, f,
             sh.row_bad[f]};
        break;
      }
      if (sh.row_empty[f]) {
        e = {static_cast<int64_t>(TreeBuildErrorKind::kNoFiniteLogit), a.step, f, -1};
        break;
      }
    }
    sh.failed = e.kind != static_cast<int64_t>(TreeBuildErrorKind::kNone);
    if (a.step == 0 || sh.failed) a.errors[b] = e;
  }
  __syncthreads();
  if (sh.failed) return;

  const int n = F * k;
  const int64_t C = a.num_candidates;
  const int64_t base = a.step == 0 ? 1 : 1 + k + static_cast<int64_t>(a.step - 1) * k * k;
  int32_t parent = 0;
  int64_t cand = 0, id = 0, token = 0;
  double score = 0.0;
  if (tid < n) {
    const int f = tid / k, j = tid % k;
    const uint64_t key = sh.row_top[f][j];
    id = KeyId(key);
    token = a.d2t == nullptr ? id : id + a.d2t[id];
    parent = a.step == 0 ? 0 : w.frontier[b * k + f];
    const double parent_score = a.step == 0 ? 0.0 : w.cand_score[b * C + parent];
    score = parent_score + (static_cast<double>(KeyValue(key)) - sh.row_lse[f]);
    cand = base + tid;
    w.cand_score[b * C + cand] = score;
    w.cand_token[b * C + cand] = token;
    w.cand_parent[b * C + cand] = parent;
    sh.score[tid] = score;
  }
  if (a.step == 0 && tid == 0) w.cand_score[b * C] = 0.0;  // the root
  __syncthreads();  // the frontier reads above precede the writes below
  if (a.step + 1 >= a.num_steps || tid >= n) return;
  // Rank among the step's candidates: higher score first, then lower candidate index.
  int rank = 0;
  for (int u = 0; u < n && rank < k; ++u) {
    const double su = sh.score[u];
    rank += (su > score || (su == score && u < tid)) ? 1 : 0;
  }
  if (rank >= k) return;
  const int64_t o = b * k + rank;
  w.frontier[o] = static_cast<int32_t>(cand);
  const TreeFrontier& out = a.out;
  if (out.candidates != nullptr) out.candidates[o] = static_cast<int32_t>(cand);
  if (out.draft_ids != nullptr) out.draft_ids[o] = id;
  if (out.tokens != nullptr) out.tokens[o] = token;
  if (out.parents != nullptr) out.parents[o] = parent;
  const int32_t parent_row = a.step == 0 ? 0 : tid / k;
  if (out.parent_rows != nullptr) out.parent_rows[o] = parent_row;
  if (out.parent_global_rows != nullptr) out.parent_global_rows[o] = static_cast<int32_t>(b * F) + parent_row;
  if (out.depths != nullptr) out.depths[o] = a.step + 1;
  if (out.scores != nullptr) out.scores[o] = static_cast<float>(score);
}

__global__ void __launch_bounds__(kThreads, 3) StepKernel(StepArgs a) {
  PdlEnter();
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid & 31;
  const int64_t p = blockIdx.x;
  const int64_t row = p / a.splits;
  const int64_t split = p % a.splits;
  const int64_t b = row / a.rows_per_seq;
  const Workspace& w = a.ws;
  const int k = a.k;
  const bool skip = a.step > 0 && a.errors[b].kind != static_cast<int64_t>(TreeBuildErrorKind::kNone);

  __shared__ uint64_t warp_top[kWarps][kTreeMaxTopk];
  __shared__ float warp_max[kWarps];
  __shared__ double warp_sum[kWarps];
  __shared__ int32_t warp_bad[kWarps];
  __shared__ CombineShared combine;
  __shared__ bool last;

  if (!skip) {
    const float* x = a.logits + row * a.ld;
    const int64_t begin = split * a.split_elems;
    const int64_t end = begin + a.split_elems < a.vocab ? begin + a.split_elems : a.vocab;
    const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
    float m = -CUDART_INF_F;
    double s = 0.0;
    int32_t bad = kNoBad;
    uint64_t slot = 0, thresh = 0;
    // kUnroll coalesced float4 loads in flight per thread, then their elements in order.
    constexpr int64_t kTile = static_cast<int64_t>(kThreads) * kGroup * kUnroll;
    for (int64_t t = begin; t < end; t += kTile) {
      float v[kUnroll][kGroup];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t g = t + (static_cast<int64_t>(u) * kThreads + tid) * kGroup;
        if (aligned && g + kGroup <= end) {
          const float4 q = __ldg(reinterpret_cast<const float4*>(x + g));
          v[u][0] = q.x, v[u][1] = q.y, v[u][2] = q.z, v[u][3] = q.w;
        } else {
#pragma unroll
          for (int e = 0; e < kGroup; ++e) v[u][e] = g + e < end ? __ldg(x + g + e) : -CUDART_INF_F;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int e = 0; e < kGroup; ++e) {
          const float z = v[u][e];
          const int64_t i = t + (static_cast<int64_t>(u) * kThreads + tid) * kGroup + e;
          const bool in = i < end;
          const bool ranked = in && z < CUDART_INF_F;  // NaN and +inf are recorded, never ranked
          if (in && !ranked) bad = bad < i ? bad : static_cast<int32_t>(i);
          WarpSelect(ranked ? PackKey(z, i) : 0, k, slot, thresh);
          if (!ranked) continue;
          if (z > m) {
            s = s * exp(static_cast<double>(m) - static_cast<double>(z)) + 1.0;
            m = z;
          } else if (z > -CUDART_INF_F) {
            s += exp(static_cast<double>(z) - static_cast<double>(m));
          }
        }
      }
    }
    // Block partial: top-k per warp then over the warps; (max, sum) and the lowest bad id.
    if (lane < k) warp_top[warp][lane] = slot;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      const float m2 = __shfl_down_sync(0xFFFFFFFFu, m, off);
      const double s2 = __shfl_down_sync(0xFFFFFFFFu, s, off);
      CombineSum(m, s, m2, s2);
    }
    bad = __reduce_min_sync(0xFFFFFFFFu, bad);
    if (lane == 0) {
      warp_max[warp] = m;
      warp_sum[warp] = s;
      warp_bad[warp] = bad;
    }
    __syncthreads();
    if (warp == 0) {
      uint64_t lw[K];
      LoadList(lane < kWarps ? warp_top[lane] : nullptr, k, false, lw);
      WarpMergeTopK(lw, k, w.part_top + p * k);
      if (lane == 0) {
        float bm = warp_max[0];
        double bs = warp_sum[0];
        int32_t bb = warp_bad[0];
        for (int i = 1; i < kWarps; ++i) {
          CombineSum(bm, bs, warp_max[i], warp_sum[i]);
          bb = warp_bad[i] < bb ? warp_bad[i] : bb;
        }
        w.part_max[p] = bm;
        w.part_sum[p] = bs;
        w.part_bad[p] = bb;
      }
    }
  }
  // Arrival: the sequence's last block combines. Thread 0 wrote this block's partial, so its fence
  // alone orders the partial before the count; the combine reads partials through L2 (__ldcg).
  __syncthreads();
  if (tid == 0) {
    const uint32_t blocks = static_cast<uint32_t>(a.rows_per_seq) * static_cast<uint32_t>(a.splits);
    __threadfence();
    last = atomicAdd(w.counters + b, 1u) == blocks - 1;
    if (last) {
      w.counters[b] = 0;  // for the next launch (stream-ordered)
      __threadfence();
    }
  }
  __syncthreads();
  if (!last || skip) return;
  CombineSequence(a, b, combine);
}

// ---- Finalize kernel ------------------------------------------------------------------------------

struct FinalizeArgs {
  int32_t k;
  int32_t num_nodes;  // N
  int64_t num_candidates;  // C
  Workspace ws;
  const TreeBuildError* errors;
  TreeBuildOutputs out;
};

__device__ __forceinline__ int32_t CandidateDepth(int64_t c, int64_t k) {
  return c == 0 ? 0 : (c <= k ? 1 : static_cast<int32_t>(2 + (c - 1 - k) / (k * k)));
}

// Dynamic shared memory: scores [C] (double), then kept flags [C] (u8).
__global__ void __launch_bounds__(kFinalizeThreads) FinalizeKernel(FinalizeArgs a) {
  PdlEnter();
  const int64_t b = blockIdx.x;
  if (a.errors[b].kind != static_cast<int64_t>(TreeBuildErrorKind::kNone)) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t C = a.num_candidates, N = a.num_nodes, k = a.k;
  const Workspace& w = a.ws;
  extern __shared__ double score[];
  uint8_t* kept = reinterpret_cast<uint8_t*>(score + C);
  __shared__ int32_t cand_of[kTreeMaxNodes];
  __shared__ int32_t node_parent[kTreeMaxNodes];
  __shared__ int32_t node_depth[kTreeMaxNodes];
  using Scan = cub::BlockScan<int32_t, kFinalizeThreads>;
  __shared__ typename Scan::TempStorage scan;

  for (int64_t c = tid; c < C; c += kFinalizeThreads) score[c] = w.cand_score[b * C + c];
  __syncthreads();
  // Kept: rank < N - 1 among candidates 1..C-1 (higher score first, then lower index).
  const int32_t keep = static_cast<int32_t>(N - 1);
  for (int64_t c = 1 + tid; c < C; c += kFinalizeThreads) {
    const double sc = score[c];
    int32_t rank = 0;
    for (int64_t u = 1; u < C && rank < keep; ++u) {
      const double su = score[u];
      rank += (su > sc || (su == sc && u < c)) ? 1 : 0;
    }
    kept[c] = rank < keep ? 1 : 0;
  }
  __syncthreads();
  // Node ids in candidate order: each thread owns a contiguous chunk of candidates 1..C-1.
  const int64_t per = (C - 1 + kFinalizeThreads - 1) / kFinalizeThreads;
  const int64_t lo = 1 + tid * per;
  const int64_t hi = lo + per < C ? lo + per : C;
  int32_t count = 0;
  for (int64_t c = lo; c < hi; ++c) count += kept[c];
  int32_t before = 0;
  Scan(scan).ExclusiveSum(count, before);
  for (int64_t c = lo; c < hi; ++c) {
    // At most N - 1 are kept (ranks are distinct); the bound only guards against corrupt scores.
    if (kept[c] && 1 + before < N) cand_of[1 + before++] = static_cast<int32_t>(c);
  }
  if (tid == 0) cand_of[0] = 0;
  __syncthreads();
  const TreeBuildOutputs& out = a.out;
  const int64_t root_position = out.root_positions[b];
  for (int64_t i = tid; i < N; i += kFinalizeThreads) {
    const int32_t c = cand_of[i];
    int32_t parent = -1;
    if (i > 0) {
      // The parent candidate was kept (it outscores its child and precedes it): find its node.
      const int32_t pc = w.cand_parent[b * C + c];
      int32_t l = 0, r = static_cast<int32_t>(i);  // cand_of is increasing; pc < c
      while (l < r) {
        const int32_t mid = (l + r) / 2;
        if (cand_of[mid] < pc) {
          l = mid + 1;
        } else {
          r = mid;
        }
      }
      parent = l;
    }
    const int32_t depth = CandidateDepth(c, k);
    node_parent[i] = parent;
    node_depth[i] = depth;
    out.tokens[b * N + i] = i == 0 ? out.root_tokens[b] : w.cand_token[b * C + c];
    out.parents[b * N + i] = parent;
    if (out.depths != nullptr) out.depths[b * N + i] = depth;
    out.positions[b * N + i] = root_position + depth;
    if (out.scores != nullptr) out.scores[b * N + i] = static_cast<float>(score[c]);
  }
  __syncthreads();
  // mask[i][j] = 1 iff j is i or an ancestor of i: walk i up to j's depth.
  for (int64_t e = tid; e < N * N; e += kFinalizeThreads) {
    const int32_t i = static_cast<int32_t>(e / N), j = static_cast<int32_t>(e % N);
    int32_t at = i;
    for (int d = 0; d < kTreeMaxSteps && node_depth[at] > node_depth[j]; ++d) at = node_parent[at];
    out.mask[b * N * N + e] = at == j ? 1 : 0;
  }
}

bool ParamsOk(const TreeBuildParams& p) {
  if (p.batch < 0 || p.batch > kTreeMaxBatch || p.topk < 1 || p.topk > kTreeMaxTopk || p.num_steps < 1 || p.num_steps > kTreeMaxSteps ||
      p.vocab < 1 || p.vocab > kTreeMaxVocab || p.topk > p.vocab) {
    return false;
  }
  const int64_t max_nodes = Candidates(p.topk, p.num_steps);
  if (p.num_draft_tokens < 2 || p.num_draft_tokens > max_nodes || p.num_draft_tokens > kTreeMaxNodes) return false;
  if (p.batch == 0) return true;
  return p.workspace != nullptr && (reinterpret_cast<uintptr_t>(p.workspace) & 15u) == 0 && p.errors != nullptr &&
         p.workspace_bytes >= TreeBuildWorkspaceBytes(p.batch, p.topk, p.num_steps);
}

size_t FinalizeSharedBytes(int64_t candidates) {
  return static_cast<size_t>(candidates) * (sizeof(double) + 1);
}

}  // namespace

size_t TreeBuildWorkspaceBytes(int32_t batch, int32_t topk, int32_t num_steps) {
  if (batch < 0 || batch > kTreeMaxBatch || topk < 1 || topk > kTreeMaxTopk || num_steps < 1 || num_steps > kTreeMaxSteps) return 0;
  size_t bytes = 0;
  Carve(nullptr, batch, topk, num_steps, &bytes);
  return bytes;
}

cudaError_t LaunchTreeBuildStep(const TreeBuildParams& p, int32_t step, const float* logits, int64_t ld,
                                const int64_t* d2t, const TreeFrontier& frontier, bool programmatic,
                                cudaStream_t stream) {
  if (!ParamsOk(p) || step < 0 || step >= p.num_steps || ld < p.vocab) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  if (logits == nullptr) return cudaErrorInvalidValue;
  const int32_t F = step == 0 ? 1 : p.topk;
  const int64_t rows = static_cast<int64_t>(p.batch) * F;
  const Split split = SplitFor(rows, p.vocab);
  if (rows * split.count > INT32_MAX) return cudaErrorInvalidValue;
  StepArgs a;
  a.logits = logits;
  a.ld = ld;
  a.vocab = p.vocab;
  a.d2t = d2t;
  a.step = step;
  a.num_steps = p.num_steps;
  a.k = p.topk;
  a.rows_per_seq = F;
  a.split_elems = split.elems;
  a.splits = split.count;
  a.num_candidates = Candidates(p.topk, p.num_steps);
  a.ws = Carve(p.workspace, p.batch, p.topk, p.num_steps, nullptr);
  a.errors = p.errors;
  a.out = frontier;
  const unsigned blocks = static_cast<unsigned>(rows * split.count);
  return LaunchKernel(programmatic, StepKernel, dim3(blocks), dim3(kThreads), 0, stream, a);
}

cudaError_t LaunchTreeBuildFinalize(const TreeBuildParams& p, const TreeBuildOutputs& o, bool programmatic,
                                    cudaStream_t stream) {
  if (!ParamsOk(p)) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  if (o.root_tokens == nullptr || o.root_positions == nullptr || o.tokens == nullptr || o.parents == nullptr ||
      o.positions == nullptr || o.mask == nullptr) {
    return cudaErrorInvalidValue;
  }
  FinalizeArgs a;
  a.k = p.topk;
  a.num_nodes = p.num_draft_tokens;
  a.num_candidates = Candidates(p.topk, p.num_steps);
  a.ws = Carve(p.workspace, p.batch, p.topk, p.num_steps, nullptr);
  a.errors = p.errors;
  a.out = o;
  return LaunchKernel(programmatic, FinalizeKernel, dim3(static_cast<unsigned>(p.batch)), dim3(kFinalizeThreads),
                      FinalizeSharedBytes(a.num_candidates), stream, a);
}

}  // namespace eagle3::cuda
