// The tensors of DeepSeek-V3's MTP modules (mtp_config.h) as the MTP drafter reads them from the
// target's own checkpoint: names, full shapes, tensor-parallel splits, and the check that a
// checkpoint holds them (docs/mla_drafts.md).
//
// Module k lives under "<tensor_prefix>model.layers.<num_hidden_layers + k>." (MtpConfig::
// LayerPrefix). Its decoder layer is described by DeepseekDecoderLayerWeights, the very function
// that describes the target's layers, so the MTP layer's attention, MoE or dense MLP, norms and
// their quantized forms (StoredForms under the target's quantization_config) are the target's.
//
// Tensor parallelism. The norms are replicated and the decoder layer is split as every target
// layer. eh_proj [H, 2H] is split by columns (row-parallel) and its partial sums all-reduced, as
// TensorRT-LLM runs it (TensorParallelMode.ROW with reduce_output); vLLM and SGLang replicate it
// (a plain nn.Linear). eagle3 splits it because a replicated bf16 eh_proj is 2 * 7168 * 14336 bytes
// = 205 MB read by every rank every draft step at V3's shape, more than twice the rest of the MTP
// layer's per-rank share at TP 8 (~90 MB: attention ~37 MB, 8 routed + 1 shared expert ~50 MB in
// fp8); split, each rank reads 2H / tp of its columns from the [enorm(e) | hnorm(h)] row it already
// holds whole, at the cost of one all-reduce of [T, H]. 2H must divide by tp (WeightSpec::RankShape).
//
// Stored forms. eh_proj and the norms are unquantized in every format (StoredForms: the engines
// build eh_proj as a plain Linear); the decoder layer's Linears follow the target's
// quantization_config like any layer.
//
// Shared with the target. The drafter runs the target's embedding (DeepseekEmbeddingName) and
// output head (lm_head.weight, or the embedding when tied), as SGLang (set_embed_and_head) and
// TensorRT-LLM do and as DeepSeek's README_WEIGHTS.md says the module's embed_tokens and
// shared_head.head are ("shares parameters with the main model"). The copies a hub checkpoint stores
// with the module (model.layers.61.embed_tokens.weight and model.layers.61.shared_head.head.weight in
// DeepSeek-V3, each [vocab, H]) are therefore not read (vLLM reads the embedding copy instead; they
// are equal in the published checkpoints): MtpSharedCopyWeights lists them so that a checkpoint
// carrying them is checked and one without them (converted or re-exported) still drafts.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/export.h"
#include "eagle3/mtp_config.h"

namespace eagle3 {

// The tensors of MTP module `module` (in [0, mtp.num_modules), a precondition) that the drafter
// reads, in the order its loader takes them, every name under mtp.LayerPrefix(module):
//   enorm.weight [H] replicated, hnorm.weight [H] replicated,
//   eh_proj.weight [H, 2H] columns (row-parallel; input [enorm(embed) | hnorm(hidden)], embeddings
//     first),
//   the decoder layer: DeepseekDecoderLayerWeights(target, mtp.LayerIndex(module)),
//   shared_head.norm.weight [H] replicated.
// `mtp` must come from MtpConfig::FromTarget(target).
EAGLE3_API std::vector<WeightSpec> MtpModuleWeights(const DeepseekV2Config& target, const MtpConfig& mtp,
                                                    int64_t module);

// Every module's MtpModuleWeights, module 0 first.
EAGLE3_API std::vector<WeightSpec> MtpWeights(const DeepseekV2Config& target, const MtpConfig& mtp);

// The copies of the target's shared tensors a hub checkpoint may store with module `module`:
// embed_tokens.weight and shared_head.head.weight under its layer prefix, each [vocab, H] split as
// the target's (vocab-parallel rows). Never read; checked when present (CheckMtpWeights).
EAGLE3_API std::vector<WeightSpec> MtpSharedCopyWeights(const DeepseekV2Config& target, const MtpConfig& mtp,
                                                        int64_t module);

// Checks that `checkpoint` (the target's) holds every module of `mtp`: each tensor of
// MtpModuleWeights present in its stored form (StoredForms under target.quantization, with its
// scales), of an accepted dtype (unquantized ones F32, F16 or BF16) and of its full shape; the
// shared copies, when present, of shape [vocab, H] and a floating-point dtype; and no other tensor
// under a module's layer prefix (an unknown one means a module eagle3 would run incompletely).
// Errors name the tensor, its file, the expected and the actual shape or dtype:
//  - NotFound "... has no MTP module <k>" naming the module's first tensor when no tensor of its
//    layer exists at all (a checkpoint converted without its MTP layer), or "MTP module <k> (layer
//    <L>) is incomplete" naming the first missing tensor;
//  - InvalidArgument for a wrong shape or dtype, or an unknown tensor in a module's layer.
EAGLE3_API absl::Status CheckMtpWeights(const Checkpoint& checkpoint, const DeepseekV2Config& target,
                                        const MtpConfig& mtp);

}  // namespace eagle3
