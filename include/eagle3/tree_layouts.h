// Converters between DraftTree and the tree layouts that engines hand to their attention and
// verification kernels, both ways. Every layout holds one sequence; a batch is the concatenation the
// engine's own kernels expect (noted per layout). Conventions were read from the engines' sources:
//
// SGLang: sgl-kernel/csrc/speculative/eagle_utils.cu (build_tree_efficient,
//   build_tree_efficient_partial_packed, VerifyTreeGreedy) and python/sglang/srt/speculative/
//   build_eagle_tree.py (TreeMaskMode, shapes). Node i of a sequence is draft_tokens[i] (0 = the
//   verified root); retrive_index[i] = batch_index * N + i; retrive_next_token[i] = first child or -1;
//   retrive_next_sibling[i] = next sibling or -1 (SGLang links siblings in node order); positions[i] =
//   seq_len + depth(i), where seq_len counts the tokens already in the KV cache (the root's position).
//   tree_mask, by TreeMaskMode:
//     FULL_MASK (0):            bool [N, seq_len + N] row-major: the seq_len cached columns are all
//                               true, column seq_len + j is true iff node j is node i or its ancestor;
//                               the batch concatenates these blocks.
//     QLEN_ONLY (1):            bool [N, N], the tree block alone.
//     QLEN_ONLY_BITPACKING (2): per row 1, 2 or 4 bytes (N <= 8, <= 16, <= 32; SGLang's uint8 /
//                               uint16 / uint32 dtypes), little-endian: node j is bit j % 8 of byte
//                               j / 8, i.e. bit j of the row read as a little-endian integer.
//
// FlashInfer: the custom mask of BatchPrefillWith{Paged,Ragged}KVCacheWrapper.plan /
//   single_prefill_with_kv_cache: bool [qo_len, kv_len] with qo_len = N and kv_len = prefix_len + N
//   (the cached tokens first, then the tree's own tokens), true = attend, flattened row-major and
//   packed by flashinfer.quantization.packbits(..., bitorder="little"): element e is bit e % 8 (least
//   significant first) of byte e / 8, ceil(N * kv_len / 8) bytes. The batch form segment_packbits
//   packs each request on its own, so per-request outputs are concatenated. The unpacked mask is the
//   same array as SGLang's FULL_MASK block (SGLang hands that one to FlashInfer).
//
// TensorRT-LLM: the EAGLE/Medusa buffers of cpp/tensorrt_llm/kernels/speculativeDecoding/
//   eagleDecodingKernels.h and tensorrt_llm/runtime/medusa_utils.py (get_packed_mask):
//   packed_mask [N, W] int32 (W = ceil(max_decoding_tokens / 32)), node j of row i is bit j % 32 of
//   word j / 32, least significant first (DraftTree::PackedMask's order); paths [num_paths, path_len]
//   int32, one root-to-leaf list of node indices per leaf starting with 0, padded with -1, rows in
//   lexicographic order of the index lists (as TensorRT-LLM's tests list them), unused rows all -1;
//   position_offsets [N] = depth.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/draft_tree.h"
#include "eagle3/export.h"

namespace eagle3 {

// ---- Shared forms ----------------------------------------------------------------------------------

// bool [N, prefix_len + N] row-major: prefix columns 1, then the tree's ancestor-or-self mask. SGLang's
// FULL_MASK block and FlashInfer's unpacked custom mask.
EAGLE3_API std::vector<uint8_t> PrefixedTreeMask(const DraftTree& tree, int64_t prefix_len);

// numpy.packbits(bits, bitorder="little"): bit e is bit e % 8 of byte e / 8; nonzero = 1.
EAGLE3_API std::vector<uint8_t> PackBitsLittle(std::span<const uint8_t> bits);
// The inverse: the first num_bits bits (0 or 1) of `packed`. InvalidArgument when `packed` is not
// exactly ceil(num_bits / 8) bytes.
EAGLE3_API absl::StatusOr<std::vector<uint8_t>> UnpackBitsLittle(std::span<const uint8_t> packed, int64_t num_bits);

// A tree from its mask: mask(i, j) = 1 iff node j is node i or an ancestor of node i; the parent of i
// is its deepest proper ancestor. `mask` is [N, prefix_len + N] row-major with the prefix columns all
// 1 (prefix_len = 0: the bare [N, N] block). InvalidArgument, naming the row, unless every row is its
// parent's row plus itself. Siblings come out in node order.
EAGLE3_API absl::StatusOr<DraftTree> TreeFromAncestorMask(std::span<const int64_t> tokens, std::span<const uint8_t> mask,
                                                          int64_t prefix_len = 0);

// ---- SGLang ----------------------------------------------------------------------------------------

enum class SGLangTreeMaskMode : int {
  kFullMask = 0,
  kQLenOnly = 1,
  kQLenOnlyBitPacking = 2,
};

struct SGLangTree {
  std::vector<int64_t> draft_tokens;          // [N]
  std::vector<int64_t> retrive_index;         // [N] batch_index * N + i
  std::vector<int64_t> retrive_next_token;    // [N] first child, -1 for a leaf
  std::vector<int64_t> retrive_next_sibling;  // [N] next sibling, -1 for the last
  std::vector<int64_t> positions;             // [N] seq_len + depth
  std::vector<uint8_t> tree_mask;             // by mode, see the top of this file
};

// InvalidArgument for a negative seq_len / batch_index, or kQLenOnlyBitPacking with N > 32.
EAGLE3_API absl::StatusOr<SGLangTree> ToSGLang(const DraftTree& tree, int64_t seq_len, SGLangTreeMaskMode mode,
                                               int64_t batch_index = 0);

// The tree named by SGLang's linked lists (sibling order kept); InvalidArgument naming the node when
// the lists do not form a tree whose parents precede their children.
//   draft_tokens, retrive_next_token, retrive_next_sibling: [N] each
EAGLE3_API absl::StatusOr<DraftTree> FromSGLang(std::span<const int64_t> draft_tokens,
                                                std::span<const int64_t> retrive_next_token,
                                                std::span<const int64_t> retrive_next_sibling);

// The tree named by one sequence's SGLang tree_mask in `mode` (seq_len is used by kFullMask only).
EAGLE3_API absl::StatusOr<DraftTree> FromSGLangMask(std::span<const int64_t> draft_tokens,
                                                    std::span<const uint8_t> tree_mask, int64_t seq_len,
                                                    SGLangTreeMaskMode mode);

// ---- FlashInfer -----------------------------------------------------------------------------------

// packbits(PrefixedTreeMask(tree, prefix_len), bitorder="little"): ceil(N * (prefix_len + N) / 8) bytes.
EAGLE3_API std::vector<uint8_t> FlashInferPackedCustomMask(const DraftTree& tree, int64_t prefix_len);

// The tree named by a packed FlashInfer custom mask of N = tokens.size() queries over
// prefix_len + N keys.
EAGLE3_API absl::StatusOr<DraftTree> FromFlashInferPackedMask(std::span<const int64_t> tokens,
                                                              std::span<const uint8_t> packed, int64_t prefix_len);

// ---- TensorRT-LLM ---------------------------------------------------------------------------------

struct TrtllmTree {
  int32_t num_paths = 0;                  // rows of `paths`
  int32_t path_len = 0;                   // columns of `paths`
  int32_t mask_words = 0;                 // int32 words per packed mask row
  std::vector<int32_t> paths;             // [num_paths, path_len], -1 padded
  std::vector<int32_t> packed_mask;       // [N, mask_words]
  std::vector<int32_t> position_offsets;  // [N] depth
};

// max_decoding_tokens: rows of `paths` and the mask word count, as TensorRT-LLM sizes its buffers
// (0: the number of leaves and N). max_path_len: columns of `paths` (0: max depth + 1).
// InvalidArgument when the tree does not fit.
EAGLE3_API absl::StatusOr<TrtllmTree> ToTrtllm(const DraftTree& tree, int32_t max_decoding_tokens = 0,
                                               int32_t max_path_len = 0);

// The tree named by TensorRT-LLM paths (siblings in node order); InvalidArgument naming the row when
// a path does not start at 0, a node gets two parents, or a node lies on no path.
//   tokens: [N]    paths: [num_paths, path_len], -1 padded
EAGLE3_API absl::StatusOr<DraftTree> FromTrtllmPaths(std::span<const int64_t> tokens, std::span<const int32_t> paths,
                                                     int32_t path_len);

// The tree named by a TensorRT-LLM packed mask.   tokens: [N]    packed_mask: [N, mask_words]
EAGLE3_API absl::StatusOr<DraftTree> FromTrtllmPackedMask(std::span<const int64_t> tokens,
                                                          std::span<const int32_t> packed_mask, int32_t mask_words);

}  // namespace eagle3
