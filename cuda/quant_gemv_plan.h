// How the quantized small-M kernel (quant_gemv_kernels.cu) splits one product over the GPU, the
// model that chooses the split, and launchers that take a given split, so that the tests run every
// path (split K or not, one activation tile or several, any rows per block) on any device. Plain
// C++: no CUDA compiler needed to include it, and no abseil (the kernel file includes it).
//
// The kernel's geometry: a block of kQuantGemvThreads threads (8 warps); a warp owns 16 weight rows
// (one m16n8k16 tile) and a run of K; the 8 warps of a block form 8 / wk row groups of wk warps,
// which split the block's K range between them. K is cut into units of 128 columns (fp8: one scale
// block column, aligned to the global 128-column grid; int4: four 32-column chunks, aligned to the
// global 32-column grid so that each lies in one scale group), the first starting `shift` columns
// before the slice's column 0. A cluster of `split` blocks splits the units of K further and adds
// the blocks' partial sums through distributed shared memory. A block stages its activations
// (bf16) a tile of wk * part_units units at a time.
//
// Row-looped plans (row_loops >= 1) run a second kernel for short K: one warp per 16-row group and
// the whole K (wk 1, no cluster, one tile), each warp taking row_loops 16-row groups of its block in
// turn (group i of warp w: the block's rows from (i * 8 + w) * 16) with its ring of loads running on
// from one group into the next, and each group's sums written straight from the warp's fragments. A
// block holds 128 * row_loops rows and stages its activations once for all of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include <cuda_runtime_api.h>

#include "quant_gemv_ops.h"

namespace eagle3::cuda {

inline constexpr int kQuantGemvThreads = 256;
inline constexpr int kQuantGemvWarps = kQuantGemvThreads / 32;
inline constexpr int kQuantGemvWarpRows = 16;
// Weight rows of a block whose row groups are single warps (wk = 1).
inline constexpr int kQuantGemvBlockRows = kQuantGemvWarpRows * kQuantGemvWarps;
inline constexpr int kQuantGemvUnitColumns = 128;
// K steps a lane has in flight (a step: one 16-byte chunk of each of the lane's two weight rows), at
// most: the kernel for 17 to 32 rows keeps fewer (QuantGemvDepth).
inline constexpr int kQuantGemvDepth = 4;
inline constexpr int kQuantGemvMaxSplit = 8;  // the portable cluster size

// The m16n8k16 B operands (8 activation rows each) that one widened weight fragment is multiplied
// by: 1 for up to 8 rows, 2 for 9 to 16, 4 for 17 to 32 (kQuantGemvMaxRows). The kernel is compiled
// for each count, so that its accumulators stay in registers.
constexpr int QuantGemvRowOperands(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : 4; }

// Blocks a multiprocessor holds at once (the kernel's register budget is set for it).
inline constexpr int kQuantGemvBlocksPerSm = 2;

// Which kernels run tiled codes (Fp8BlockWeights::tiled / Int4GroupWeights::tiled). Both give the
// same bits; kGeneric is the specialized kernels' same-binary baseline (benchmarks/NOTES.md). The
// process-wide choice starts from EAGLE3_QUANT_GEMV_TILED_KERNEL ("generic"; unset or anything else:
// kSpecialized); SetQuantGemvTiledKernel (tests, benchmarks) changes it from the next launch on.
enum class QuantGemvTiledKernel {
  kSpecialized,  // the kernels compiled for tiled codes
  kGeneric,      // the row-major kernels, reading tiles behind a branch per load
};
QuantGemvTiledKernel GetQuantGemvTiledKernel();
void SetQuantGemvTiledKernel(QuantGemvTiledKernel kernel);

// The ring depth of the kernel for `operands` B operands. With 4, the two extra accumulator sets
// (and fp8's block sums) do not fit beside a 4-step ring in the registers of kQuantGemvBlocksPerSm
// blocks: the ring gives up 2 steps rather than the multiprocessor a block, which would hold the
// same bytes in flight with half the warps to hide the widening's latency.
constexpr int QuantGemvDepth(int operands) { return operands == 4 ? 2 : kQuantGemvDepth; }

// Dynamic shared memory a block may use without raising its kernel's attribute.
inline constexpr size_t kQuantGemvSharedLimit = 48 * 1024;
// The most a block may use while kQuantGemvBlocksPerSm blocks still fit a multiprocessor (228 KiB,
// 1 KiB of it reserved per block): the launchers raise the kernel's attribute for plans past
// kQuantGemvSharedLimit.
inline constexpr size_t kQuantGemvSharedMax = 112 * 1024;

// The shared memory the chooser lets a plan of m activation rows take. Up to 8 rows (the one-wave
// rule's decode shapes, whose measured plans fit the default limit) kQuantGemvSharedLimit; from 9,
// where 16 to 32 staged rows would otherwise split K into several activation tiles, each restaged
// behind a block barrier, kQuantGemvSharedMax, unless EAGLE3_QUANT_GEMV_SHARED_KIB (read once) sets
// another (in KiB, within [48, 112]; the previous rule's baseline is 48). ChooseQuantGemvPlan takes
// the larger limit only where the default one leaves several tiles, and then only for a plan of
// fewer tiles and no more blocks.
size_t QuantGemvSharedLimitFor(int64_t m);

// The wider limit EAGLE3_QUANT_GEMV_SHARED_KIB's value asks for: its whole KiB clamped to [48, 112]
// KiB; unset, empty or not a whole number (a shell's `VAR= cmd` sets it empty): kQuantGemvSharedMax.
size_t QuantGemvSharedLimitFromEnv(const char* value);

// The product as the planner sees it.
struct QuantGemvProblem {
  bool int4 = false;
  int64_t batch = 1, m = 1, n = 1, k = 1;
  // Columns of the first unit before the slice's column 0 (fp8: col0 % 128; int4: col0 % 32).
  int64_t shift = 0;
  int64_t a_bytes = 4;       // bytes per activation element: 4 (f32) or 2 (bf16)
  double weight_bytes = 0;   // quantized bytes the product streams: codes or packed words, and scales
  // Dynamic shared memory a plan may take (kQuantGemvSharedLimit .. kQuantGemvSharedMax): the
  // chooser's launches take QuantGemvSharedLimitFor(m); a launch with an explicit plan, the most.
  size_t shared_limit = kQuantGemvSharedLimit;
};

struct QuantGemvPlan {
  int wk = 1;          // warps per 16-row group: 1, 2, 4 or 8 (a block holds 128 / wk rows)
  int split = 1;       // blocks per cluster along K: 1 .. kQuantGemvMaxSplit
  int part_units = 1;  // units a warp takes from each activation tile
  int tiles = 1;       // activation tiles per block
  // 0: the K-split kernel above; >= 1: the row-looped kernel with this many 16-row groups per warp
  // (then wk 1, split 1, part_units the problem's units, tiles 1).
  int row_loops = 0;
};

// Most 16-row groups a warp of a row-looped plan takes.
inline constexpr int kQuantGemvMaxRowLoops = 64;

// Steps of K (QuantGemvUnitSteps per unit) up to which a row's whole K is short enough that the
// chooser takes a row-looped plan: past it, a warp's own run of K keeps its ring busy.
inline constexpr int kQuantGemvRowLoopMaxSteps = 8;

// 128-column units covering shift + k columns.
int64_t QuantGemvUnits(const QuantGemvProblem& problem);

// K steps per unit: 2 for fp8 (64-column steps), 1 for int4 (128-column steps).
int QuantGemvUnitSteps(bool int4);

// Shared memory a block's loop stages: one activation tile (its rows as bf16, each padded by 64
// bytes) and fp8's scale rows for the tile's units.
size_t QuantGemvStagedBytes(const QuantGemvProblem& problem, const QuantGemvPlan& plan);

// Dynamic shared memory of a block: the staged activation tile (and fp8's staged scales), or the
// partial sums of the final reduction where those are larger.
size_t QuantGemvSharedBytes(const QuantGemvProblem& problem, const QuantGemvPlan& plan);

// Whether the kernel can run `plan`: wk and split in range, the tiles covering each cluster rank's
// units, several tiles only with whole ring cycles per warp (part_units * unit steps a multiple of
// QuantGemvDepth of the problem's rows), the shared memory within the problem's shared_limit, and the
// grid within limits; a row-looped plan: 1 <= row_loops <= kQuantGemvMaxRowLoops, wk 1, split 1,
// one tile of the whole K, up to 16 activation rows (one or two B operands).
bool QuantGemvPlanValid(const QuantGemvProblem& problem, const QuantGemvPlan& plan);

// The plan of wk warps per row group and `split` cluster ranks: the rank's units in one activation
// tile where it fits, else the most units per part (whole ring cycles) whose tile fits; nullopt
// where a rank or a warp part would have no units, or no tile fits.
std::optional<QuantGemvPlan> QuantGemvPlanFor(const QuantGemvProblem& problem, int wk, int split);

// The row-looped plan of `row_loops` groups per warp; nullopt where it is not valid (too many
// activation rows, or their staged tile past the shared-memory limit).
std::optional<QuantGemvPlan> QuantGemvRowLoopPlanFor(const QuantGemvProblem& problem, int row_loops);

// The plan ChooseQuantGemvPlan takes among the K-split kernel's plans alone (row_loops 0): the
// benchmark's reference beside row-looped plans.
QuantGemvPlan ChooseQuantGemvSplitPlan(const QuantGemvProblem& problem, int sm_count);

// The plan the launchers take on a device with `sm_count` multiprocessors: for short K (at most
// kQuantGemvRowLoopMaxSteps steps) over more blocks than one wave holds, a row-looped plan
// (quant_gemv_plan.cc says how many groups); else, up to 8 rows, the one-wave rule of
// quant_gemv_plan.cc where a plan fits it, else its tail rule where a plan's waves leave few slots
// idle; otherwise the valid plan of least modelled time within kQuantGemvSharedLimit. Where that
// plan (any rule's) takes several activation tiles, the same rules within the problem's
// shared_limit may replace it, choosing among plans of fewer tiles and no more blocks, where the
// model finds the replacement faster (quant_gemv_plan.cc says why no more blocks).
QuantGemvPlan ChooseQuantGemvPlan(const QuantGemvProblem& problem, int sm_count);

// Steps of K a warp of fp8's in-block combine of several tokens takes (QuantGemvTileRowLoops):
// kQuantGemvTileRowLoopSteps in rounds of fewer than kQuantGemvTileRowLoopWideTokens tokens,
// kQuantGemvTileRowLoopWideSteps from there.
inline constexpr int kQuantGemvTileRowLoopSteps = 16;
inline constexpr int kQuantGemvTileRowLoopWideSteps = 32;
inline constexpr int64_t kQuantGemvTileRowLoopWideTokens = 4;

// The row loops of the in-block combine of `tokens` > 1 tokens (QuantGemvCombine::in_block) on a
// row-looped plan of `row_loops`: fp8's the fewest, `row_loops` times a power of two, whose warps
// take the steps above (at most kQuantGemvMaxRowLoops); int4's and any others `row_loops`.
// ChooseQuantGemvPlan's bound of 8 steps a warp was timed on the plain row loops at 3 blocks a
// multiprocessor; fp8's in-block blocks run 2 a multiprocessor and stage a gated row and scale rows
// for each item before the first product, work that fewer, longer blocks repeat less. Timed in
// direct MoE rounds of 2 to 16 tokens (benchmarks/NOTES.md): 16 steps against 8 faster at every
// size; 32 against 16 faster from 4 tokens and slower at 2 (where a V3 rank's 32-step blocks,
// 56 a token, fill under half of an H100's places for them). Int4's were timed at 4 steps and at
// 16, each slower than as planned.
int QuantGemvTileRowLoops(const QuantGemvProblem& problem, int row_loops, int64_t tokens);

// LaunchFp8BlockGemv / LaunchInt4GroupGemv (quant_gemv_ops.h: same arguments, semantics and errors)
// with `plan`, or the chosen plan
// when `plan` is nullptr. An invalid plan is refused with cudaErrorInvalidValue.
cudaError_t LaunchFp8BlockGemvPlanned(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                      const Fp8BlockWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                      const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                                      float beta, const QuantGemvPlan* plan, bool programmatic, cudaStream_t stream);

cudaError_t LaunchInt4GroupGemvPlanned(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                       const Int4GroupWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                       const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                                       float beta, const QuantGemvPlan* plan, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
