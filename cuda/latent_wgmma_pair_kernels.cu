// Paged latent attention over a bf16 cache at DeepSeek's latent shape, 64 query rows of one sequence
// per block, on Hopper's warpgroup products, the two warpgroups owning alternate key chunks:
// LatentWgmmaPairKernel. Built for sm_90a with latent_wgmma_kernels.cu (CMakeLists.txt:
// eagle3_cuda_sm90a); no abseil here.
//
// Why a second wgmma kernel: in LatentWgmmaKernel both warpgroups run each chunk's phases together
// (scores, the exchange of row maxima, softmax, value products), so the tensor cores idle through
// every softmax and barrier, and its score products (32 keys a warpgroup) re-read the query tile
// for every 32 keys. Here warpgroup h scores chunks h, h + 2, ... over all 64 keys, keeps its
// probabilities in registers as the A operand of its own half of the value product, and stores them
// for the other warpgroup's half; while one runs its softmax, the other's products run
// (benchmarks/NOTES.md, "The paired-chunk kernel, step by step", has the schedule and why it is
// race-free).
//
// Layout (latent_wgmma_pair_layout.h): the queries' dims 0-511 staged, their RoPE dims in registers;
// stage 0 holds the even chunks, stage 1 the odd ones; each stage completes on an mbarrier that
// every thread's copies arrive on (cp.async.mbarrier.arrive), and each warpgroup refills the panels
// it alone read last (WgmmaPairRefills) as soon as its value product of them is done. One running
// maximum per row, in chunk order: the owner of chunk c takes chunk c - 1's from the other
// warpgroup; warpgroup 0 rescales its register probabilities to chunk c + 1's maximum before
// storing them, so both halves of the output add every chunk at the same maximum.
#include <cstdint>

#include <cuda_bf16.h>
#include <math_constants.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "core_kernels.cuh"
#include "latent_common.cuh"
#include "latent_wgmma_common.cuh"
#include "latent_wgmma_pair_layout.h"
#include "programmatic_launch.cuh"
#include "ptx.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kPairThreads = kWgmmaBlockThreads;
constexpr int kGroupThreads = 128;
constexpr int kRows = kWgmmaRows;
constexpr int kChunk = kWgmmaChunk;
constexpr int kDim = kWgmmaDim;
constexpr int kPanels = kDim / kWgmmaPanelWidth;  // 9
constexpr int kCopyKeysPerPass = kGroupThreads / 8;  // a warpgroup copies 16 keys a pass, 8 lanes a key
constexpr int kCopyPasses = kChunk / kCopyKeysPerPass;  // 4
constexpr float kLazyRescale = 8.0f;  // log2 units, as LatentWgmmaKernel
constexpr float kLog2e = 1.4426950408889634f;
// Named barriers between the warpgroups (0 is __syncthreads'), and one per warpgroup.
constexpr int kMaxA = 1;     // warpgroup 0 has published chunk 2i's maxima
constexpr int kMaxB = 2;     // warpgroup 1 has published chunk 2i + 1's maxima
constexpr int kProbsA = 3;   // warpgroup 0 has stored chunk 2i's probabilities
constexpr int kProbsB = 4;   // warpgroup 1 has stored chunk 2i + 1's probabilities
constexpr int kGroupBarrier = 5;  // + half: the warpgroup's own
static_assert(kCopyPasses * kCopyKeysPerPass == kChunk, "whole copy passes");

__global__ void __launch_bounds__(kPairThreads, 1) LatentWgmmaPairKernel(const LatentArgs a) {
  // Before PdlWait: as LatentWgmmaKernel (no cache row, no mask byte, no `bad`).
  if (a.wait_first) PdlWait();
  PdlLaunchDependents();
  const LatentLaunchParams& p = a.p;
  LatentBlockStart start;
  if (!StartLatentBlock(a, &start)) return;
  const LatentTile& tile = start.tile;
  const int n0 = start.n0;
  const int tile_tokens = start.tile_tokens;
  const int s_begin = static_cast<int>(start.keys.begin), s_end = static_cast<int>(start.keys.end);
  const int page_size = static_cast<int>(p.page_size);
  const int chunks = (s_end - s_begin + kChunk - 1) / kChunk;
  const int pairs = (chunks + 1) / 2;

  extern __shared__ __align__(1024) uint8_t pair_shared_base[];
  uint8_t* const smem =
      pair_shared_base + (kWgmmaAtomBytes - SharedAddress(pair_shared_base) % kWgmmaAtomBytes) % kWgmmaAtomBytes;
  const uint32_t base = SharedAddress(smem);
  float* const row_max = reinterpret_cast<float*>(smem + kWgmmaPairMaxOffset);               // [2][64]
  uint64_t* const allow_words = reinterpret_cast<uint64_t*>(smem + kWgmmaPairAllowOffset);  // [2][64]
  uint64_t* const used_by_warp = reinterpret_cast<uint64_t*>(smem + kWgmmaPairUsedOffset);  // [2][4]
  const uint32_t barriers = base + kWgmmaPairBarrierOffset;  // mbarrier of stage s at + 8 s
  auto stage_bytes = [&](int s) { return smem + kWgmmaPairStageOffset + s * kWgmmaOperandBytes; };
  auto probs_bytes = [&](int s) { return smem + kWgmmaPairProbOffset + s * kWgmmaPanelBytes; };

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  // Warpgroup, read through a lane-0 shuffle so the compiler keeps it (and the descriptors built
  // from it) uniform.
  const int half = __shfl_sync(kFullMask, tid / kGroupThreads, 0);
  const int group_thread = tid % kGroupThreads;
  const int group_warp = group_thread / 32;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int r0 = 16 * group_warp + g;  // the thread's rows r0 and r0 + 8, the same in both warpgroups
  const int r1 = r0 + 8;

  if (tid == 0) {
    MbarInit(barriers, kPairThreads);
    MbarInit(barriers + 8, kPairThreads);
  }

  // Copies: of chunk c into its stage, the panels this warpgroup refills there; thread i of the
  // warpgroup copies the 16-byte piece i % 8 of each such panel of keys i / 8 + 16 k (k < 4), then
  // arrives on the stage's mbarrier once its copies complete.
  const int copy_key = group_thread / 8;
  const int copy_lane = group_thread % 8;
  // Splits start on chunk boundaries (LatentSplitKeys), so where pages hold whole chunks a chunk's
  // keys share one page entry: one load a refill instead of one a key.
  const bool chunk_in_page = page_size % kChunk == 0;
  auto issue = [&](int c) {
    const int stage = c % 2;
    uint8_t* const dst_stage = stage_bytes(stage);
    const int chunk_start = s_begin + kChunk * c;
    const int32_t chunk_page =
        chunk_in_page ? tile.pages[static_cast<uint32_t>(chunk_start) / static_cast<uint32_t>(page_size)] : 0;
#pragma unroll
    for (int pass = 0; pass < kCopyPasses; ++pass) {
      const int key = copy_key + kCopyKeysPerPass * pass;
      const int s = chunk_start + key;
      const bool valid = s < s_end;
      const uint32_t page_index = static_cast<uint32_t>(valid ? s : s_begin) / static_cast<uint32_t>(page_size);
      const int32_t page = !valid ? 0 : chunk_in_page ? chunk_page : tile.pages[page_index];
      const int in_page = s - static_cast<int>(page_index) * page_size;
      const int64_t row = static_cast<int64_t>(page) * page_size + in_page;
      const uint16_t* src = p.cache_bf16 + (valid ? row * kDim : 0) + 8 * copy_lane;
#pragma unroll
      for (int panel = 0; panel < kPanels; ++panel) {
        if (!WgmmaPairRefills(half, stage, panel)) continue;
        CpAsync16OrZero(dst_stage + WgmmaPieceOffset(key, 8 * panel + copy_lane), src + kWgmmaPanelWidth * panel,
                        valid);
      }
    }
    CpAsyncMbarArrive(barriers + 8 * stage);
  };

  // Queries: dims 0-511, rounded to bf16, into the staged panels (a 16-byte piece a store); dims
  // 512-575 of the thread's rows into registers, in the A-fragment layout of the scores' last four
  // k-steps (rows r0 / r1, dims 16 kk + 2 t4 + {0, 1} and + 8).
  const int heads = a.heads_per_tile;
  auto query_row = [&](int r) -> const float* {
    if (!LatentRowHeld(a, n0, tile_tokens, r)) return nullptr;
    const int64_t t = tile.q0 + tile.i0 + r / heads;
    return p.q + t * p.q_token_stride + (n0 + r % heads) * p.q_head_stride;
  };
  constexpr int kQueryBatch = 4;  // query pieces a thread loads before it stores the first
  StageWgmmaQueries<kWgmmaValueDim / 8, kQueryBatch>(a, tile, n0, tile_tokens, smem + kWgmmaPairQueryOffset);
  uint32_t q_rope[kWgmmaPairRegisterScoreSteps][4];
  {
    const float* q0 = query_row(r0);
    const float* q1 = query_row(r1);
#pragma unroll
    for (int kk = 0; kk < kWgmmaPairRegisterScoreSteps; ++kk) {
      const int d = kWgmmaValueDim + kWgmmaKStep * kk + 2 * t4;
      q_rope[kk][0] = q0 != nullptr ? Bf16x2Bits(q0[d], q0[d + 1]) : 0u;
      q_rope[kk][1] = q1 != nullptr ? Bf16x2Bits(q1[d], q1[d + 1]) : 0u;
      q_rope[kk][2] = q0 != nullptr ? Bf16x2Bits(q0[d + 8], q0[d + 9]) : 0u;
      q_rope[kk][3] = q1 != nullptr ? Bf16x2Bits(q1[d + 8], q1[d + 9]) : 0u;
    }
  }

  PdlWait();  // the check has completed
  if (*a.bad != 0) return;
  FenceProxyAsyncShared();  // this thread's staged queries, for the tensor cores
  __syncthreads();          // the mbarriers initialized, every thread's queries staged
  if (0 < chunks) issue(0);
  if (1 < chunks) issue(1);

  // Mask words of chunk c (its owner writes them, during its score products): bit k of
  // allow_words[(c % 2) * 64 + lt] says whether token lt sees key k; used_by_warp[(c % 2) * 4 + w]
  // ORs the words of the owner's warp w (tokens w, w + 4, ...).
  auto write_allow_words = [&](int c) {
    WriteWgmmaAllowWords<4>(a, tile, tile_tokens, s_begin, s_end, c, group_warp, allow_words, used_by_warp);
  };
  auto used_keys = [&](int c) {
    uint64_t used = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) used |= used_by_warp[(c % 2) * 4 + w];
    return used;
  };
  // Keys of chunk c within the split that no row allows: their values in this warpgroup's half of
  // the dims zeroed (such cache rows may hold anything; 0 x NaN is NaN). `used` read before any
  // barrier that lets the owner rewrite it. Returns whether anything was written.
  auto zero_unused = [&](int c, uint64_t used) {
    const int in_split = min(kChunk, s_end - (s_begin + kChunk * c));
    const uint64_t in_split_mask = in_split >= 64 ? ~uint64_t{0} : (uint64_t{1} << in_split) - 1;
    uint64_t unused = ~used & in_split_mask;
    if (unused == 0) return false;
    uint8_t* const stage = stage_bytes(c % 2);
    const int piece = group_thread % 32;  // of the half's 32 pieces a key
#pragma unroll 1
    for (int n = 0; unused != 0; unused &= unused - 1, ++n) {
      if (n % 4 != group_thread / 32) continue;
      const int key = __ffsll(static_cast<long long>(unused)) - 1;
      *reinterpret_cast<uint4*>(stage + WgmmaPieceOffset(key, 32 * half + piece)) = make_uint4(0u, 0u, 0u, 0u);
    }
    FenceProxyAsyncShared();
    return true;
  };

  const bool held0 = LatentRowHeld(a, n0, tile_tokens, r0), held1 = LatentRowHeld(a, n0, tile_tokens, r1);
  const int token0 = r0 / heads, token1 = r1 / heads;
  const float scale = p.scale * kLog2e;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F;  // the maximum o and l are taken against (log2 domain)
  float l0 = 0.0f, l1 = 0.0f;                    // this thread's share of the sums of its own chunks

  const uint64_t q_desc = WgmmaDescriptor(base + kWgmmaPairQueryOffset, kWgmmaKMajorLbo, kWgmmaKMajorSbo);
  float s[32];

  // Chunk c's copies landed (its stage's mbarrier, phase c / 2). They are generic-proxy writes the
  // tensor cores read through the async proxy: each waiter fences after seeing them land (the PTX
  // ISA asks for the fence between the two).
  auto wait_copies = [&](int c) {
    MbarWait(barriers + 8 * (c % 2), static_cast<uint32_t>(c / 2) & 1u);
    FenceProxyAsyncShared();
  };
  // Scores of chunk c (this warpgroup's), masked, in the log2 domain; returns the rows' maxima.
  auto score = [&](int c, float* max0, float* max1) {
    const uint32_t stage_base = SharedAddress(stage_bytes(c % 2));
    const uint64_t keys_desc = WgmmaDescriptor(stage_base, kWgmmaKMajorLbo, kWgmmaKMajorSbo);
    wait_copies(c);
    WgmmaFence();
#pragma unroll
    for (int i = 0; i < kWgmmaPairStagedScoreSteps; ++i) {
      WgmmaBf16M64N64(s, WgmmaDescriptorAdvance(q_desc, WgmmaScoreAStart(i)),
                      WgmmaDescriptorAdvance(keys_desc, WgmmaScoreBStart(0, i)), i > 0);
    }
#pragma unroll
    for (int kk = 0; kk < kWgmmaPairRegisterScoreSteps; ++kk) {
      WgmmaBf16M64N64RegA(s, q_rope[kk],
                          WgmmaDescriptorAdvance(keys_desc, WgmmaScoreBStart(0, kWgmmaPairStagedScoreSteps + kk)));
    }
    WgmmaCommit();
    write_allow_words(c);
    NamedBarrierSync(kGroupBarrier + half, kGroupThreads);  // the warpgroup's words written
    WgmmaWait<0>();
    const uint64_t bits0 = held0 ? allow_words[(c % 2) * kRows + token0] : 0;
    const uint64_t bits1 = held1 ? allow_words[(c % 2) * kRows + token1] : 0;
    float x0 = -CUDART_INF_F, x1 = -CUDART_INF_F;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * j + 2 * t4 + e;
        s[4 * j + e] = ((bits0 >> key) & 1u) != 0 ? s[4 * j + e] * scale : -CUDART_INF_F;
        s[4 * j + 2 + e] = ((bits1 >> key) & 1u) != 0 ? s[4 * j + 2 + e] * scale : -CUDART_INF_F;
        x0 = fmaxf(x0, s[4 * j + e]);
        x1 = fmaxf(x1, s[4 * j + 2 + e]);
      }
    }
#pragma unroll
    for (int offset = 1; offset <= 2; offset *= 2) {
      x0 = fmaxf(x0, __shfl_xor_sync(kFullMask, x0, offset));
      x1 = fmaxf(x1, __shfl_xor_sync(kFullMask, x1, offset));
    }
    *max0 = x0;
    *max1 = x1;
  };
  // The probabilities against maxima (n0_, n1_) (rows without an allowed key yet: 0), and their sums.
  auto probabilities = [&](float n0_, float n1_, float* sum0, float* sum1) {
    float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[4 * j + e] = n0_ == -CUDART_INF_F ? 0.0f : Exp2Approx(s[4 * j + e] - n0_);
        s[4 * j + 2 + e] = n1_ == -CUDART_INF_F ? 0.0f : Exp2Approx(s[4 * j + 2 + e] - n1_);
        a0 += s[4 * j + e];
        a1 += s[4 * j + 2 + e];
      }
    }
    *sum0 = a0;
    *sum1 = a1;
  };
  auto rescale_o = [&](float f0, float f1) {
    if (f0 != 1.0f || f1 != 1.0f) ScaleWgmmaRows(o, f0, f1);
  };
  // The lazy rule of LatentWgmmaKernel: keep the maximum until a chunk's exceeds it by kLazyRescale.
  auto lazy = [](float kept, float seen) { return seen > kept + kLazyRescale ? seen : kept; };
  auto factor = [](float from, float to) { return to == -CUDART_INF_F ? 1.0f : Exp2Approx(from - to); };
  // This warpgroup's half of the value product of chunk c: A = its probabilities in registers (own
  // chunk) or the other warpgroup's stored ones.
  auto values_desc = [&](int c) {
    return WgmmaDescriptor(SharedAddress(stage_bytes(c % 2)) + WgmmaValueBStart(half, 0), kWgmmaMnMajorLbo,
                           kWgmmaMnMajorSbo);
  };
  auto values_from_registers = [&](int c) {
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      pa[kk][0] = Bf16x2Bits(s[8 * kk], s[8 * kk + 1]);
      pa[kk][1] = Bf16x2Bits(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = Bf16x2Bits(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = Bf16x2Bits(s[8 * kk + 6], s[8 * kk + 7]);
    }
    const uint64_t vd = values_desc(c);
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < kWgmmaValueSteps; ++j) {
      WgmmaBf16M64N256TransBRegA(o, pa[j], WgmmaDescriptorAdvance(vd, WgmmaValueBStart(0, j)));
    }
    WgmmaCommit();
  };
  auto values_from_shared = [&](int c) {
    const uint64_t pd =
        WgmmaDescriptor(SharedAddress(probs_bytes(c % 2)), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
    const uint64_t vd = values_desc(c);
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < kWgmmaValueSteps; ++j) {
      WgmmaBf16M64N256TransB(o, WgmmaDescriptorAdvance(pd, WgmmaValueAStart(j)),
                             WgmmaDescriptorAdvance(vd, WgmmaValueBStart(0, j)));
    }
    WgmmaCommit();
  };
  // This warpgroup's half of the value product of the other's chunk c: the copies seen here too
  // (the owner waited them before its scores), this half's unused keys zeroed (`used` read before
  // the owner may rewrite it), the owner's stored probabilities awaited at `probs_barrier` (with
  // every thread's zeroing); then the panels this warpgroup read last refilled with chunk c + 2.
  auto values_of_other = [&](int c, uint64_t used, int probs_barrier) {
    wait_copies(c);
    zero_unused(c, used);
    NamedBarrierSync(probs_barrier, kPairThreads);
    values_from_shared(c);
    WgmmaWait<0>();
    if (c + 2 < chunks) issue(c + 2);
  };
  auto store_probabilities = [&](int c) {
    uint8_t* const ps = probs_bytes(c % 2);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int key = 8 * j + 2 * t4;
      *reinterpret_cast<uint32_t*>(ps + WgmmaPanelOffset(r0, key)) = Bf16x2Bits(s[4 * j], s[4 * j + 1]);
      *reinterpret_cast<uint32_t*>(ps + WgmmaPanelOffset(r1, key)) = Bf16x2Bits(s[4 * j + 2], s[4 * j + 3]);
    }
    FenceProxyAsyncShared();
  };

#pragma unroll 1
  for (int i = 0; i < pairs; ++i) {
    const int ca = 2 * i, cb = 2 * i + 1;
    const bool has_b = cb < chunks;
    if (half == 0) {
      float x0, x1;
      score(ca, &x0, &x1);  // m0 / m1: chunk 2i - 1's maxima, read in the pair before
      const float na0 = lazy(m0, x0), na1 = lazy(m1, x1);
      if (t4 == 0) {
        row_max[r0] = na0;
        row_max[r1] = na1;
      }
      NamedBarrierArrive(kMaxA, kPairThreads);
      float sum0, sum1;
      probabilities(na0, na1, &sum0, &sum1);
      const float alpha0 = factor(m0, na0), alpha1 = factor(m1, na1);
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
      rescale_o(alpha0, alpha1);
      if (zero_unused(ca, used_keys(ca))) NamedBarrierSync(kGroupBarrier + half, kGroupThreads);
      values_from_registers(ca);
      WgmmaWait<0>();
      if (ca + 2 < chunks) issue(ca + 2);
      m0 = na0;
      m1 = na1;
      if (has_b) {
        NamedBarrierSync(kMaxB, kPairThreads);  // chunk 2i + 1's maxima and mask words
        const uint64_t used_b = used_keys(cb);
        const float nb0 = row_max[kRows + r0], nb1 = row_max[kRows + r1];
        const float beta0 = factor(na0, nb0), beta1 = factor(na1, nb1);
        if (beta0 != 1.0f || beta1 != 1.0f) {
          ScaleWgmmaRows(s, beta0, beta1);
          ScaleWgmmaRows(o, beta0, beta1);
        }
        l0 *= beta0;
        l1 *= beta1;
        m0 = nb0;
        m1 = nb1;
        store_probabilities(ca);
        NamedBarrierArrive(kProbsA, kPairThreads);
        values_of_other(cb, used_b, kProbsB);
      } else {
        store_probabilities(ca);
        NamedBarrierArrive(kProbsA, kPairThreads);
      }
    } else {
      float x0 = -CUDART_INF_F, x1 = -CUDART_INF_F;
      if (has_b) score(cb, &x0, &x1);
      NamedBarrierSync(kMaxA, kPairThreads);  // chunk 2i's maxima and mask words
      const uint64_t used_a = used_keys(ca);
      const float na0 = row_max[r0], na1 = row_max[r1];
      const float nb0 = lazy(na0, x0), nb1 = lazy(na1, x1);
      if (has_b) {  // without chunk 2i + 1 (the split's last pair) warpgroup 0 reads no maxima
        if (t4 == 0) {
          row_max[kRows + r0] = nb0;
          row_max[kRows + r1] = nb1;
        }
        NamedBarrierArrive(kMaxB, kPairThreads);
      }
      const float alpha0 = factor(m0, nb0), alpha1 = factor(m1, nb1);
      rescale_o(alpha0, alpha1);
      l0 *= alpha0;
      l1 *= alpha1;
      m0 = nb0;
      m1 = nb1;
      if (has_b) {
        float sum0, sum1;
        probabilities(nb0, nb1, &sum0, &sum1);
        l0 += sum0;
        l1 += sum1;
        if (zero_unused(cb, used_keys(cb))) NamedBarrierSync(kGroupBarrier + half, kGroupThreads);
        values_from_registers(cb);
        store_probabilities(cb);
        NamedBarrierArrive(kProbsB, kPairThreads);
        WgmmaWait<0>();
        if (cb + 2 < chunks) issue(cb + 2);
      }
      values_of_other(ca, used_a, kProbsA);
    }
  }

  StoreWgmmaRows(a, tile, n0, half, r0, held0, held1, m0, m1, l0, l1, o, row_max);
  // Past StoreWgmmaRows' block barriers no thread waits on the mbarriers any more, and every phase
  // of theirs has completed (both warpgroups waited each chunk's copies): they end here, before
  // the folded merge (whose first barrier follows) may reuse their bytes as scratch.
  if (tid == 0) {
    MbarInval(barriers);
    MbarInval(barriers + 8);
  }
  if (a.fold_combine) {
    LatentFoldCombine<kPairThreads, kRows>(a, tile, n0, tile_tokens, reinterpret_cast<float*>(pair_shared_base));
  }
}

}  // namespace

cudaError_t LaunchLatentWgmmaPair(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream) {
  // The plan's shared memory (kWgmmaLaunchSharedBytes): the folded merge's bounds were checked against it.
  static_assert(kWgmmaPairLaunchSharedBytes <= kWgmmaLaunchSharedBytes, "the layout fits the plan's bytes");
  const cudaError_t error = cudaFuncSetAttribute(LatentWgmmaPairKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kWgmmaLaunchSharedBytes));
  if (error != cudaSuccess) return error;
  return LaunchKernel(programmatic, LatentWgmmaPairKernel, grid, dim3(kPairThreads), kWgmmaLaunchSharedBytes, stream,
                      a);
}

}  // namespace eagle3::cuda
