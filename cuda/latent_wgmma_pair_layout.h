// Shared-memory layout of the paired-chunk warpgroup latent kernel (latent_wgmma_pair_kernels.cu):
// the panels, swizzle and descriptors of latent_wgmma_layout.h, arranged for two warpgroups that
// own alternate key chunks. Plain integer arithmetic, no CUDA.
//
// The queries' first eight panels (dims 0-511) are staged; the ninth (the RoPE dims 512-575) is held
// in registers as the A operand of the scores' last four k-steps, which frees the room of the second
// probability buffer. Each stage holds one 64-key chunk (nine panels): stage 0 the even chunks,
// which warpgroup 0 scores, stage 1 the odd ones (warpgroup 1). Each warpgroup stores its chunk's
// probabilities (bf16, one K-major panel) for the other, which multiplies them into its half of the
// value dims.
#pragma once

#include <cstdint>

#include "latent_wgmma_layout.h"

namespace eagle3::cuda {

inline constexpr int kWgmmaPairStagedQueryPanels = kWgmmaValueDim / kWgmmaPanelWidth;  // 8
inline constexpr int kWgmmaPairStagedScoreSteps = kWgmmaValueDim / kWgmmaKStep;          // 32
inline constexpr int kWgmmaPairRegisterScoreSteps = kWgmmaScoreSteps - kWgmmaPairStagedScoreSteps;  // 4

inline constexpr uint32_t kWgmmaPairQueryOffset = 0;
inline constexpr uint32_t kWgmmaPairStageOffset = kWgmmaPairStagedQueryPanels * kWgmmaPanelBytes;
inline constexpr uint32_t kWgmmaPairProbOffset = kWgmmaPairStageOffset + 2 * kWgmmaOperandBytes;  // [2] panels
inline constexpr uint32_t kWgmmaPairMaxOffset = kWgmmaPairProbOffset + 2 * kWgmmaPanelBytes;      // f32 [2][64]
inline constexpr uint32_t kWgmmaPairAllowOffset = kWgmmaPairMaxOffset + 2 * kWgmmaRows * 4;       // u64 [2][64]
inline constexpr uint32_t kWgmmaPairUsedOffset = kWgmmaPairAllowOffset + 2 * kWgmmaRows * 8;      // u64 [2][4]
inline constexpr uint32_t kWgmmaPairBarrierOffset = kWgmmaPairUsedOffset + 2 * 4 * 8;             // u64 [2]
inline constexpr uint32_t kWgmmaPairSharedBytes = kWgmmaPairBarrierOffset + 2 * 8;
inline constexpr uint32_t kWgmmaPairLaunchSharedBytes = kWgmmaPairSharedBytes + kWgmmaSharedSlack;

static_assert(kWgmmaPairLaunchSharedBytes <= 227 * 1024, "sm_90's opt-in shared memory per block");
static_assert(kWgmmaPairStageOffset % kWgmmaAtomBytes == 0 && kWgmmaPairProbOffset % kWgmmaAtomBytes == 0,
              "every panel starts on the swizzle's period");

// Panels a warpgroup refills in the stage of its own chunk (after its value product of it) and in
// the other's (after its value product of that one): the panels it alone read last. Warpgroup 0
// reads dims 0-255 (panels 0-3) of both stages for values, and every panel of stage 0 for scores
// (done before the maxima meet); warpgroup 1 likewise with panels 4-7 and stage 1. Panel 8 is read
// by the owner's scores only.
EAGLE3_HOST_DEVICE constexpr bool WgmmaPairRefills(int half, int stage, int panel) {
  const bool own_values = panel / 4 == half && panel < 8;
  return own_values || (panel == 8 && stage == half);
}

}  // namespace eagle3::cuda
