// Paged latent attention over a bf16 cache at DeepSeek's latent shape (key rows of 576 = the
// 512-wide compressed KV + 64 RoPE dims, values the first 512), 64 query rows of one sequence per
// block, on the tensor cores: LatentTreeKernel, launched by LaunchLatentKernels
// (latent_decode_kernels.cu) through LaunchLatentTree (latent_common.cuh) for long trees (where
// LatentBlockRows, latent_plan.cc, finds it pays: see there). No abseil here: nvcc must never
// see it.
//
// Why a kernel of its own next to LatentCompactKernel (latent_compact_kernels.cu): a compact block
// holds 16 query rows (one token's heads), so a sequence of R rows reads and waits for each of its
// keys R / 16 times, and a chunk's three dependent phases (scores, softmax, values) run once per 16
// rows. Here a block holds 64 rows (4 tokens x 16 heads, 1 token x 64 heads, ...): each staged key
// serves four times the rows and each phase has four times the MMAs. LatentMmaKernel<4>
// (latent_mma_kernels.cu) had 64-row blocks too, but 8 warps whose score MMAs formed two chains 36
// deep (every k-step into the same two accumulators) and 128 accumulator registers per thread: its
// chunks were latency chains. Here 16 warps, each with four independent chains of 9 k-steps.
//
// Why mma.sync m16n8k16 (the compact kernel's instruction; fragment layouts in ptx.cuh) and not
// wgmma: the same operands through ldmatrix, in layouts this file states exactly, with no shared
// memory matrix descriptors. Its cost is shared-memory traffic (every operand passes through
// registers), which the warp tiles below keep as low as 128 registers per thread allow: the 64 x
// 512 fp32 outputs take 64 of them for the whole block, so a score tile has 16 accumulator
// registers (a 32 x 32 tile's 32 do not fit beside them without spills).
//
// Layout. A block is 16 warps and one split of one 64-row tile's keys, computed in 32-key chunks,
// each staged by cp.async into one slot of a ring of three (the chunk being computed, two in
// flight). Shared memory: queries 64 x 576 bf16, three slots of 32 key rows, the partial scores and
// the probabilities: 226 KiB of sm_90's 227 (a 64-key chunk's second stage and 64-wide partial
// scores do not fit beside the queries; hence 32-key chunks).
// - Scores: warp w takes row group w / 4 (16 rows) x the chunk's 32 keys (four n-tiles) over dim
//   quarter w % 4 (9 k-steps); the four quarters' partial tiles meet in shared memory.
// - Staging (warps 8-15, at the top of chunk c, before their scores): thread i copies 16-byte
//   pieces i % 8 + 8 j of key i / 8 of slot c + 2 (8 threads per 1152-byte row: 128 contiguous
//   bytes per instruction); keys past the split are zero-filled, not read. Its page entry was
//   loaded during chunk c - 1's scores and kept in shared memory (no register to spare).
// - Mask: which keys each token of the tile allows, one 32-bit word per token per chunk, from the
//   one statement of the rule the latent kernels share (LatentAllowByte): warp w loads token w's
//   bytes of chunk c + 1 before chunk c's scores and ballots them after.
// - Softmax: 8 threads per row, 4 keys each, fp32, online (as the compact kernel); the running max
//   and sum stay in shared memory (no register to spare).
// - Values: warp w owns output columns 32 w .. + 31 for all 64 rows (4 row groups x 4 n-tiles = 64
//   accumulator registers), A = the probabilities in bf16, B = the staged rows' first 512 dims
//   (ldmatrix .trans); B registers of keys no row allows are zeroed (such cache rows may hold
//   anything, NaN included).
// Staged rows are padded by 16 bytes (row stride 1168 bytes = 4 banks mod 32): ldmatrix is
// conflict-free. Results go where the compact kernel's go (the output, or the split partials that
// LatentCombineKernel or the last of the tile's blocks merges; empty splits are marked).
#include <cstdint>

#include <cuda_bf16.h>
#include <math_constants.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "core_kernels.cuh"
#include "latent_common.cuh"
#include "programmatic_launch.cuh"
#include "ptx.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kTreeThreads = 512;
constexpr int kTreeWarps = kTreeThreads / 32;
constexpr int kRows = 64;
constexpr int kDim = static_cast<int>(kLatentCompactKeyDim);
constexpr int kValueDim = static_cast<int>(kLatentCompactValueDim);
constexpr int kChunk = 32;                                  // keys per chunk = per staged slot
constexpr int kSlots = 3;                                   // ring: computed + two in flight
constexpr int kStride = kDim + 8;                           // bf16 per staged row
constexpr int kQuarterSteps = kDim / 64;                    // k-steps of 16 dims per dim quarter
constexpr int kCopyThreads = 256;                           // warps 8-15 stage the keys
constexpr int kFirstCopyWarp = kTreeWarps - kCopyThreads / 32;
constexpr int kPieces = kDim / 8;                           // 16-byte pieces per key row
constexpr int kLanesPerKey = kCopyThreads / kChunk;         // copy threads per key row
constexpr int kPiecesPerLane = kPieces / kLanesPerKey;
constexpr int kRedStride = kChunk + 4;                      // floats per partial score row
constexpr int kPStride = kChunk + 8;                        // bf16 per probability row (80 bytes)
constexpr int kRowThreads = kTreeThreads / kRows;           // softmax threads per row
constexpr int kRowKeys = kChunk / kRowThreads;              // keys per softmax thread
constexpr int kWarpColumns = kValueDim / kTreeWarps;        // value columns per warp
static_assert(kDim % 64 == 0 && kValueDim <= kDim, "whole dim quarters; values lead the row");
static_assert(kPieces % kLanesPerKey == 0, "every copy thread copies as many pieces");
static_assert(kRowKeys == 4 && kRowThreads == 8, "a softmax thread reads one float4 per quarter");
static_assert(kWarpColumns == 32 && kChunk == 32, "two 16-column B loads, two k-steps per chunk");

constexpr size_t kTreeSharedBytes =
    2 * static_cast<size_t>(kStride) * (kRows + kSlots * kChunk) + 4 * static_cast<size_t>(4 * kRows * kRedStride) +
    2 * static_cast<size_t>(kRows * kPStride) +
    4 * static_cast<size_t>(3 * kRows + kTreeWarps + 2 * kRows + kCopyThreads);
static_assert(kRows / 16 * 4 == kTreeWarps, "score warps: four row groups x four dim quarters");
static_assert(kTreeSharedBytes <= 227 * 1024, "sm_90's opt-in shared memory per block");
static_assert((2 * kStride * (kRows + kSlots * kChunk) + 4 * 4 * kRows * kRedStride + 2 * kRows * kPStride +
               4 * 3 * kRows) % 16 == 0,
              "used_by_warp is read as uint4");

__global__ void __launch_bounds__(kTreeThreads, 1) LatentTreeKernel(const LatentArgs a) {
  // Before PdlWait (see LaunchLatentTree): the tile, the query rows and the first page entries,
  // every index bounded even if the metadata is bad; no cache row, no mask byte, no `bad`.
  if (a.wait_first) PdlWait();
  // Lets the next kernel's blocks start where this kernel leaves room: the combine's, or, where this
  // kernel merges the splits itself (a.fold_combine), the weight-streaming GEMV's.
  PdlLaunchDependents();
  const LatentLaunchParams& p = a.p;
  LatentBlockStart start;
  if (!StartLatentBlock(a, &start)) return;
  const LatentTile& tile = start.tile;
  const LatentKeyRange keys = start.keys;
  const int heads_per_tile = a.heads_per_tile;
  const int n0 = start.n0;
  const int tile_tokens = start.tile_tokens;
  // Key positions fit 32 bits (LatentTreeApplies bounds max_kv_len).
  const int s_begin = static_cast<int>(keys.begin), s_end = static_cast<int>(keys.end);
  const int page_size = static_cast<int>(p.page_size);

  extern __shared__ float4 tree_shared[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(tree_shared);                  // [64][kStride]
  uint16_t* ks = qs + kRows * kStride;                                      // [slots][32][kStride]
  float* red = reinterpret_cast<float*>(ks + kSlots * kChunk * kStride);    // [4][64][kRedStride]
  uint16_t* ps = reinterpret_cast<uint16_t*>(red + 4 * kRows * kRedStride);  // [64][kPStride]
  float* row_alpha = reinterpret_cast<float*>(ps + kRows * kPStride);       // [64]
  float* row_m = row_alpha + kRows;                                         // [64]
  float* row_l = row_m + kRows;                                             // [64]
  unsigned* used_by_warp = reinterpret_cast<unsigned*>(row_l + kRows);      // [16]
  unsigned* allow_words = used_by_warp + kTreeWarps;                        // [2][64]
  int32_t* next_pages = reinterpret_cast<int32_t*>(allow_words + 2 * kRows);  // [256]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int mat = lane / 8;  // the ldmatrix matrix this lane addresses
  const int mrow = lane % 8;

  // Copy role (warps 8-15): slot u holds keys s_begin + 32 u .. + 31 in ring entry u % kSlots.
  const bool copier = warp >= kFirstCopyWarp;
  const int copy_key = (tid % kCopyThreads) / kLanesPerKey;
  const int copy_piece = tid % kLanesPerKey;
  auto page_of = [&](int u) -> int32_t {
    const int s = s_begin + kChunk * u + copy_key;
    return copier && s < s_end ? tile.pages[static_cast<uint32_t>(s) / static_cast<uint32_t>(page_size)] : 0;
  };
  auto issue = [&](int u, int32_t page) {
    const int s = s_begin + kChunk * u + copy_key;
    const bool valid = s < s_end;
    const int in_page = s - static_cast<int>(static_cast<uint32_t>(s) / static_cast<uint32_t>(page_size)) * page_size;
    const int64_t row = static_cast<int64_t>(page) * page_size + in_page;
    // One base address per row, the pieces at constant offsets from it (an index per piece would
    // cost a 64-bit address register each).
    const uint16_t* src = p.cache_bf16 + (valid ? row * kDim : 0) + 8 * copy_piece;
    uint16_t* dst = ks + ((u % kSlots) * kChunk + copy_key) * kStride + 8 * copy_piece;
#pragma unroll
    for (int j = 0; j < kPiecesPerLane; ++j) {
      CpAsync16OrZero(dst + 8 * kLanesPerKey * j, src + 8 * kLanesPerKey * j, valid);
    }
  };
  const int chunks = (s_end - s_begin + kChunk - 1) / kChunk;
  const int32_t page_a = page_of(0), page_b = page_of(1), page_c = page_of(2);

  // Queries: warp w stages rows w, w + 16, w + 32, w + 48, lanes along the dims, rounded to bf16.
  // Block row r is token i0 + r / H of the tile, head n0 + r % H (H = heads_per_tile). Two rows at
  // a time: 18 loads per row per lane in flight before their stores.
  auto row_held = [&](int r) {
    return r < heads_per_tile * a.tokens_per_tile && r / heads_per_tile < tile_tokens &&
           n0 + r % heads_per_tile < p.heads;
  };
#pragma unroll
  for (int pair = 0; pair < kRows / kTreeWarps; pair += 2) {
    float v[2][kDim / 64], w[2][kDim / 64];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp + kTreeWarps * (pair + h);
      const int64_t t = tile.q0 + tile.i0 + r / heads_per_tile;
      const bool held = row_held(r) && t >= 0 && t < p.tokens;
      const float* src = held ? p.q + t * p.q_token_stride + (n0 + r % heads_per_tile) * p.q_head_stride : nullptr;
#pragma unroll
      for (int j = 0; j < kDim / 64; ++j) {
        v[h][j] = held ? src[2 * lane + 64 * j] : 0.0f;
        w[h][j] = held ? src[2 * lane + 64 * j + 1] : 0.0f;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp + kTreeWarps * (pair + h);
#pragma unroll
      for (int j = 0; j < kDim / 64; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(qs + r * kStride + 2 * lane + 64 * j) =
            __floats2bfloat162_rn(v[h][j], w[h][j]);
      }
    }
  }

  PdlWait();  // the check has completed
  if (*a.bad != 0) return;
  // Slots 0 and 1 in flight, one commit group each; iteration c issues slot c + 2 from the page
  // entry in next_pages (each copy thread's own: no barrier), loaded during chunk c - 1's scores.
  if (copier) issue(0, page_a);
  CpAsyncCommit();
  if (copier && 1 < chunks) issue(1, page_b);
  CpAsyncCommit();
  if (copier) next_pages[tid % kCopyThreads] = page_c;

  // Mask words: bit k of allow_words[c % 2][lt] says whether token lt of the tile sees key k of
  // chunk c; written during chunk c - 1 (chunk 0: here). Warp w takes token w (a token per warp at
  // >= 4 heads), then w + 16, ...
  const int prefix = static_cast<int>(tile.kv - tile.n);  // checked: 0 <= n <= kv
  auto allow_byte = [&](int lt, int s) -> uint8_t {
    const int64_t allow_tokens = tile_tokens, allow_end = s_end, allow_prefix = prefix;
    return *LatentAllowByte{allow_tokens, allow_end, tile, p, allow_prefix}(lt, s);
  };
  auto write_allow_word = [&](int c, int lt, uint8_t byte) {
    const unsigned word = __ballot_sync(kFullMask, byte != 0);
    if (lane == 0) allow_words[(c % 2) * kRows + lt] = word;
  };
  auto write_later_allow_words = [&](int c) {
#pragma unroll 1
    for (int lt = warp + kTreeWarps; lt < tile_tokens; lt += kTreeWarps) {
      write_allow_word(c, lt, allow_byte(lt, s_begin + kChunk * c + lane));
    }
  };
  if (warp < tile_tokens) write_allow_word(0, warp, allow_byte(warp, s_begin + lane));
  write_later_allow_words(0);

  // Softmax role: row sr, keys sk .. sk + 3 of each chunk.
  const int sr = tid / kRowThreads;
  const int sk = kRowKeys * (tid % kRowThreads);
  const int sr_token = sr / heads_per_tile;
  const bool sr_valid = row_held(sr);
  // The row's running max and sum live in row_m / row_l (registers are the accumulators').
  if (sk == 0) {
    row_m[sr] = -CUDART_INF_F;  // no allowed key yet
    row_l[sr] = 0.0f;
  }

  // Score role: rows 16 row_group .. + 15, dims quarter * 144 .. + 143.
  const int quarter = warp % 4;
  const int row_group = warp / 4;
  const uint16_t* const q_frag =
      qs + (16 * row_group + (mat % 2) * 8 + mrow) * kStride + (mat / 2) * 8 + quarter * (kDim / 4);
  const int k_frag = ((mat / 2) * 8 + mrow) * kStride + (mat % 2) * 8 + quarter * (kDim / 4);

  // Value role: columns vcol .. + 31 of rows 16 j + g and 16 j + g + 8 (j = row group).
  const int vcol = kWarpColumns * warp;
  float o[4][4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) o[j][nt][0] = o[j][nt][1] = o[j][nt][2] = o[j][nt][3] = 0.0f;
  }

#pragma unroll 1
  for (int c = 0; c < chunks; ++c) {
    const uint16_t* const slot = ks + (c % kSlots) * kChunk * kStride;
    CpAsyncWait<1>();  // slot c (c + 1 may still be in flight)
    __syncthreads();   // ... staged by every copier; chunk c - 1's ring entry and buffers are free
    // Slot c + 2 into chunk c - 1's ring entry: two chunks ahead of its use.
    if (copier && c + 2 < chunks) issue(c + 2, next_pages[tid % kCopyThreads]);
    CpAsyncCommit();
    // Loads whose results are used after the scores: slot c + 3's page entry, chunk c + 1's mask.
    const int32_t page = page_of(c + 3);
    const uint8_t next_byte =
        c + 1 < chunks && warp < tile_tokens ? allow_byte(warp, s_begin + kChunk * (c + 1) + lane) : 0;

    {
      float sacc[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.0f;
#pragma unroll
      for (int i = 0; i < kQuarterSteps; ++i) {
        unsigned qa[4], kb_lo[4], kb_hi[4];  // keys 0-15, 16-31: b0, b1 of two n-tiles each
        LdMatrixX4(qa, q_frag + 16 * i);
        LdMatrixX4(kb_lo, slot + k_frag + 16 * i);
        LdMatrixX4(kb_hi, slot + k_frag + 16 * kStride + 16 * i);
        MmaBf16(sacc[0], qa, kb_lo[0], kb_lo[1]);
        MmaBf16(sacc[1], qa, kb_lo[2], kb_lo[3]);
        MmaBf16(sacc[2], qa, kb_hi[0], kb_hi[1]);
        MmaBf16(sacc[3], qa, kb_hi[2], kb_hi[3]);
      }
      float* part = red + (quarter * kRows + 16 * row_group) * kRedStride;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int key = 8 * nt + 2 * t4;
        *reinterpret_cast<float2*>(part + g * kRedStride + key) = make_float2(sacc[nt][0], sacc[nt][1]);
        *reinterpret_cast<float2*>(part + (g + 8) * kRedStride + key) = make_float2(sacc[nt][2], sacc[nt][3]);
      }
    }
    if (c + 1 < chunks) {
      if (warp < tile_tokens) write_allow_word(c + 1, warp, next_byte);
      write_later_allow_words(c + 1);
    }
    if (copier) next_pages[tid % kCopyThreads] = page;
    __syncthreads();  // partial scores written

    // Online softmax of row sr over its 8 threads (consecutive lanes).
    {
      const float m_run = row_m[sr];  // read by all 8 threads before thread 0 writes it below
      const float* dots = red + sr * kRedStride + sk;
      float4 dot = *reinterpret_cast<const float4*>(dots);
#pragma unroll
      for (int q4 = 1; q4 < 4; ++q4) {
        const float4 v = *reinterpret_cast<const float4*>(dots + q4 * kRows * kRedStride);
        dot.x += v.x;
        dot.y += v.y;
        dot.z += v.z;
        dot.w += v.w;
      }
      float sc[kRowKeys] = {dot.x, dot.y, dot.z, dot.w};
      // Words of tokens past the tile's were not written: rows the tile does not hold allow nothing.
      const unsigned bits = sr_valid ? allow_words[(c % 2) * kRows + sr_token] & (0xfu << sk) : 0u;
      float chunk_max = -CUDART_INF_F;
#pragma unroll
      for (int k = 0; k < kRowKeys; ++k) {
        sc[k] = ((bits >> (sk + k)) & 1u) != 0 ? p.scale * sc[k] : -CUDART_INF_F;
        chunk_max = fmaxf(chunk_max, sc[k]);
      }
#pragma unroll
      for (int offset = kRowThreads / 2; offset >= 1; offset /= 2) {
        chunk_max = fmaxf(chunk_max, __shfl_xor_sync(kFullMask, chunk_max, offset));
      }
      const float new_max = fmaxf(m_run, chunk_max);
      float alpha = 1.0f;  // no allowed key yet: m = -inf, l = 0 stay
      if (new_max != -CUDART_INF_F) {
#pragma unroll
        for (int k = 0; k < kRowKeys; ++k) sc[k] = __expf(sc[k] - new_max);
        alpha = __expf(m_run - new_max);
      } else {
#pragma unroll
        for (int k = 0; k < kRowKeys; ++k) sc[k] = 0.0f;
      }
      float psum = (sc[0] + sc[1]) + (sc[2] + sc[3]);
#pragma unroll
      for (int offset = kRowThreads / 2; offset >= 1; offset /= 2) psum += __shfl_xor_sync(kFullMask, psum, offset);
      __nv_bfloat162* prob = reinterpret_cast<__nv_bfloat162*>(ps + sr * kPStride + sk);
      prob[0] = __floats2bfloat162_rn(sc[0], sc[1]);
      prob[1] = __floats2bfloat162_rn(sc[2], sc[3]);
      if (sk == 0) {
        row_alpha[sr] = alpha;
        row_m[sr] = new_max;
        row_l[sr] = row_l[sr] * alpha + psum;
      }
      const unsigned warp_bits = __reduce_or_sync(kFullMask, bits);
      if (lane == 0) used_by_warp[warp] = warp_bits;
    }
    __syncthreads();  // probabilities, alpha and key bits written

    unsigned used = 0;  // keys of the chunk some row allows (block-uniform)
#pragma unroll
    for (int u = 0; u < kTreeWarps / 4; ++u) {  // 16-byte broadcast reads: 4 wavefronts, not 16
      const uint4 words = reinterpret_cast<const uint4*>(used_by_warp)[u];
      used |= words.x | words.y | words.z | words.w;
    }
    if (used == 0) continue;  // every alpha is 1
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float alpha_lo = row_alpha[16 * j + g], alpha_hi = row_alpha[16 * j + g + 8];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        o[j][nt][0] *= alpha_lo;
        o[j][nt][1] *= alpha_lo;
        o[j][nt][2] *= alpha_hi;
        o[j][nt][3] *= alpha_hi;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      const unsigned keep0 = LatentKeepKeyPair(used, 16 * kk + 2 * t4);
      const unsigned keep1 = LatentKeepKeyPair(used, 16 * kk + 8 + 2 * t4);
      const uint16_t* v_rows = slot + (16 * kk + (mat % 2) * 8 + mrow) * kStride + (mat / 2) * 8 + vcol;
      unsigned vb_lo[4], vb_hi[4];  // columns vcol + 0-15, + 16-31: b0, b1 of two n-tiles each
      LdMatrixX4Trans(vb_lo, v_rows);
      LdMatrixX4Trans(vb_hi, v_rows + 16);
      vb_lo[0] &= keep0;
      vb_lo[1] &= keep1;
      vb_lo[2] &= keep0;
      vb_lo[3] &= keep1;
      vb_hi[0] &= keep0;
      vb_hi[1] &= keep1;
      vb_hi[2] &= keep0;
      vb_hi[3] &= keep1;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        unsigned pa[4];
        LdMatrixX4(pa, ps + (16 * j + (mat % 2) * 8 + mrow) * kPStride + 16 * kk + (mat / 2) * 8);
        MmaBf16(o[j][0], pa, vb_lo[0], vb_lo[1]);
        MmaBf16(o[j][1], pa, vb_lo[2], vb_lo[3]);
        MmaBf16(o[j][2], pa, vb_hi[0], vb_hi[1]);
        MmaBf16(o[j][3], pa, vb_hi[2], vb_hi[3]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // row_m, row_l final
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * j + g + 8 * half;
      if (!row_held(row)) continue;
      const int64_t t = tile.q0 + tile.i0 + row / heads_per_tile;
      const int n = n0 + row % heads_per_tile;
      const LatentRowOut dst = LatentRowDestination(a, t, n, row_m[row], row_l[row], warp == 0 && t4 == 0);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = vcol + 8 * nt + 2 * t4;
        dst.values[col] = o[j][nt][2 * half] * dst.factor;
        dst.values[col + 1] = o[j][nt][2 * half + 1] * dst.factor;
      }
    }
  }
  if (a.fold_combine) {
    LatentFoldCombine<kTreeThreads, kRows>(a, tile, n0, tile_tokens, reinterpret_cast<float*>(tree_shared));
  }
}

}  // namespace

bool LatentTreeApplies(const LatentLaunchParams& p, int rows) {
  return rows == kRows && LatentAtCompactShape(p);
}

int LatentTreeRows() { return kRows; }

int LatentTreeChunk() { return kChunk; }

size_t LatentTreeSharedBytes() { return kTreeSharedBytes; }

cudaError_t LaunchLatentTree(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream) {
  const cudaError_t error = cudaFuncSetAttribute(LatentTreeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kTreeSharedBytes));
  if (error != cudaSuccess) return error;
  return LaunchKernel(programmatic, LatentTreeKernel, grid, dim3(kTreeThreads), kTreeSharedBytes, stream, a);
}

}  // namespace eagle3::cuda
