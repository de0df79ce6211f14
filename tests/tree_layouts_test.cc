#include "eagle3/tree_layouts.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

void ExpectSameTree(const DraftTree& got, const DraftTree& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.parents, want.parents);
  EXPECT_EQ(got.depths, want.depths);
  EXPECT_EQ(got.first_child, want.first_child);
  EXPECT_EQ(got.next_sibling, want.next_sibling);
}

DraftTree RandomTree(std::mt19937_64& rng, int n) {
  std::vector<int64_t> tokens(n);
  std::vector<int32_t> parents(n, -1);
  for (int i = 0; i < n; ++i) {
    tokens[i] = static_cast<int64_t>(rng() % 100000);
    // Mostly shallow, sometimes a long chain: both shapes occur in EAGLE trees.
    if (i > 0) parents[i] = rng() % 3 == 0 ? i - 1 : static_cast<int32_t>(rng() % i);
  }
  auto tree = DraftTree::FromParents(tokens, parents);
  EXPECT_TRUE(tree.ok()) << tree.status();
  return *tree;
}

TEST(TreeLayoutsTest, RandomTreesRoundTripThroughEveryLayout) {
  std::mt19937_64 rng(20250611);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 70);
    const DraftTree tree = RandomTree(rng, n);
    const int64_t seq_len = static_cast<int64_t>(rng() % 20);
    SCOPED_TRACE("trial " + std::to_string(trial) + " N " + std::to_string(n) + " seq_len " + std::to_string(seq_len));

    // SGLang: the linked lists and every mask mode.
    auto sg = ToSGLang(tree, seq_len, SGLangTreeMaskMode::kFullMask, 3);
    ASSERT_TRUE(sg.ok()) << sg.status();
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(sg->retrive_index[i], 3 * n + i);
      EXPECT_EQ(sg->positions[i], seq_len + tree.depths[i]);
    }
    auto from_lists = FromSGLang(sg->draft_tokens, sg->retrive_next_token, sg->retrive_next_sibling);
    ASSERT_TRUE(from_lists.ok()) << from_lists.status();
    ExpectSameTree(*from_lists, tree);
    auto from_full = FromSGLangMask(sg->draft_tokens, sg->tree_mask, seq_len, SGLangTreeMaskMode::kFullMask);
    ASSERT_TRUE(from_full.ok()) << from_full.status();
    ExpectSameTree(*from_full, tree);

    auto qlen = ToSGLang(tree, seq_len, SGLangTreeMaskMode::kQLenOnly);
    ASSERT_TRUE(qlen.ok());
    EXPECT_EQ(qlen->tree_mask, tree.DenseMask());
    auto from_qlen = FromSGLangMask(tree.tokens, qlen->tree_mask, seq_len, SGLangTreeMaskMode::kQLenOnly);
    ASSERT_TRUE(from_qlen.ok()) << from_qlen.status();
    ExpectSameTree(*from_qlen, tree);

    auto bits = ToSGLang(tree, seq_len, SGLangTreeMaskMode::kQLenOnlyBitPacking);
    if (n > 32) {
      ExpectInvalid(bits.status(), "at most 32 nodes");
    } else {
      ASSERT_TRUE(bits.ok()) << bits.status();
      const size_t row_bytes = n <= 8 ? 1 : (n <= 16 ? 2 : 4);
      EXPECT_EQ(bits->tree_mask.size(), n * row_bytes);
      auto from_bits = FromSGLangMask(tree.tokens, bits->tree_mask, seq_len, SGLangTreeMaskMode::kQLenOnlyBitPacking);
      ASSERT_TRUE(from_bits.ok()) << from_bits.status();
      ExpectSameTree(*from_bits, tree);
    }

    // FlashInfer: the packed custom mask is packbits of SGLang's FULL_MASK block.
    const std::vector<uint8_t> packed = FlashInferPackedCustomMask(tree, seq_len);
    EXPECT_EQ(packed.size(), static_cast<size_t>((n * (seq_len + n) + 7) / 8));
    EXPECT_EQ(packed, PackBitsLittle(sg->tree_mask));
    auto unpacked = UnpackBitsLittle(packed, n * (seq_len + n));
    ASSERT_TRUE(unpacked.ok());
    EXPECT_EQ(*unpacked, sg->tree_mask);
    auto from_fi = FromFlashInferPackedMask(tree.tokens, packed, seq_len);
    ASSERT_TRUE(from_fi.ok()) << from_fi.status();
    ExpectSameTree(*from_fi, tree);

    // TensorRT-LLM: paths and packed mask, natural and padded sizes.
    for (const int32_t pad : {0, 9}) {
      const int32_t max_tokens = pad == 0 ? 0 : n + pad;
      const int32_t max_path = pad == 0 ? 0 : tree.max_depth() + 1 + pad;
      auto trt = ToTrtllm(tree, max_tokens, max_path);
      ASSERT_TRUE(trt.ok()) << trt.status();
      EXPECT_EQ(trt->path_len, pad == 0 ? tree.max_depth() + 1 : max_path);
      EXPECT_EQ(trt->mask_words, (std::max(n, max_tokens) + 31) / 32);
      EXPECT_EQ(trt->position_offsets, tree.depths);
      auto from_paths = FromTrtllmPaths(tree.tokens, trt->paths, trt->path_len);
      ASSERT_TRUE(from_paths.ok()) << from_paths.status();
      ExpectSameTree(*from_paths, tree);
      auto from_mask = FromTrtllmPackedMask(tree.tokens, trt->packed_mask, trt->mask_words);
      ASSERT_TRUE(from_mask.ok()) << from_mask.status();
      ExpectSameTree(*from_mask, tree);
      // One row per leaf; every row starts at the root and ends at a leaf.
      int leaves = 0;
      for (int i = 0; i < n; ++i) leaves += tree.first_child[i] == -1;
      int used_rows = 0;
      for (int r = 0; r < trt->num_paths; ++r) {
        const int32_t* row = trt->paths.data() + r * trt->path_len;
        if (row[0] == -1) continue;
        ++used_rows;
        EXPECT_EQ(row[0], 0);
        int last = 0;
        while (last + 1 < trt->path_len && row[last + 1] != -1) ++last;
        EXPECT_EQ(tree.first_child[row[last]], -1) << "row " << r << " ends at a leaf";
      }
      EXPECT_EQ(used_rows, leaves);
    }
  }
}

TEST(TreeLayoutsTest, SGLangListsKeepTheirSiblingOrder) {
  // Siblings listed in reverse node order survive the round trip.
  const std::vector<int64_t> tokens = {5, 6, 7, 8};
  const std::vector<int64_t> next_token = {3, -1, -1, -1};
  const std::vector<int64_t> next_sibling = {-1, -1, 1, 2};
  auto tree = FromSGLang(tokens, next_token, next_sibling);
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_THAT(tree->parents, ElementsAre(-1, 0, 0, 0));
  auto back = ToSGLang(*tree, 0, SGLangTreeMaskMode::kQLenOnly);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->retrive_next_token, next_token);
  EXPECT_EQ(back->retrive_next_sibling, next_sibling);
}

// SGLang's own example (python/sglang/srt/speculative/build_eagle_tree.py,
// test_build_tree_kernel_efficient): two sequences of 8 nodes with seq_lens 5 and 10. Its expected
// lists and positions, read back into trees and written out again.
TEST(TreeLayoutsTest, SGLangPublishedExample) {
  const std::vector<int64_t> tokens0 = {29974, 29896, 29906, 29889, 29974, 29946, 29896, 29946};
  auto tree0 = FromSGLang(tokens0, std::vector<int64_t>{1, 3, 4, 5, 6, 7, -1, -1},
                          std::vector<int64_t>{-1, 2, -1, -1, -1, -1, -1, -1});
  ASSERT_TRUE(tree0.ok()) << tree0.status();
  EXPECT_THAT(tree0->parents, ElementsAre(-1, 0, 0, 1, 2, 3, 4, 5));
  auto sg0 = ToSGLang(*tree0, 5, SGLangTreeMaskMode::kFullMask, 0);
  ASSERT_TRUE(sg0.ok());
  EXPECT_THAT(sg0->positions, ElementsAre(5, 6, 6, 7, 7, 8, 8, 9));
  EXPECT_THAT(sg0->retrive_index, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(sg0->retrive_next_token, ElementsAre(1, 3, 4, 5, 6, 7, -1, -1));
  EXPECT_THAT(sg0->retrive_next_sibling, ElementsAre(-1, 2, -1, -1, -1, -1, -1, -1));
  // FULL_MASK row 3 (node 3 -> 1 -> 0): the 5 cached columns, then nodes 0, 1, 3.
  ASSERT_EQ(sg0->tree_mask.size(), 8u * 13);
  EXPECT_THAT(std::vector<uint8_t>(sg0->tree_mask.begin() + 3 * 13, sg0->tree_mask.begin() + 4 * 13),
              ElementsAre(1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0));
  // QLEN_ONLY_BITPACKING: one byte per row (N = 8); row 3 = bits {0, 1, 3}, row 7 = {0, 1, 3, 5, 7}.
  auto packed0 = ToSGLang(*tree0, 5, SGLangTreeMaskMode::kQLenOnlyBitPacking);
  ASSERT_TRUE(packed0.ok());
  EXPECT_THAT(packed0->tree_mask, ElementsAre(0x01, 0x03, 0x05, 0x0b, 0x15, 0x2b, 0x55, 0xab));

  const std::vector<int64_t> tokens1 = {13, 13, 22550, 4136, 16492, 8439, 29871, 29941};
  auto tree1 = FromSGLang(tokens1, std::vector<int64_t>{1, 2, -1, 6, -1, -1, 7, -1},
                          std::vector<int64_t>{-1, -1, 3, 4, 5, -1, -1, -1});
  ASSERT_TRUE(tree1.ok()) << tree1.status();
  auto sg1 = ToSGLang(*tree1, 10, SGLangTreeMaskMode::kQLenOnly, 1);
  ASSERT_TRUE(sg1.ok());
  EXPECT_THAT(sg1->positions, ElementsAre(10, 11, 12, 12, 12, 12, 13, 14));
  EXPECT_THAT(sg1->retrive_index, ElementsAre(8, 9, 10, 11, 12, 13, 14, 15));
  EXPECT_THAT(sg1->retrive_next_token, ElementsAre(1, 2, -1, 6, -1, -1, 7, -1));
  EXPECT_THAT(sg1->retrive_next_sibling, ElementsAre(-1, -1, 3, 4, 5, -1, -1, -1));
}

TEST(TreeLayoutsTest, FlashInferPackbitsByHand) {
  // Root with two children, 2 cached tokens: kv_len = 5, rows 11100 / 11110 / 11101, flattened
  // 15 bits, least significant first: byte 0 = e0..e7 = 1,1,1,0,0,1,1,1 = 0xe7; byte 1 = e8..e14 =
  // 1,0,1,1,1,0,1 = 0x5d.
  auto tree = DraftTree::FromParents(std::vector<int64_t>{9, 4, 2}, std::vector<int32_t>{-1, 0, 0});
  ASSERT_TRUE(tree.ok());
  EXPECT_THAT(PrefixedTreeMask(*tree, 2), ElementsAre(1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1));
  EXPECT_THAT(FlashInferPackedCustomMask(*tree, 2), ElementsAre(0xe7, 0x5d));
  // numpy.packbits([1, 0, 1, 1, 0, 0, 1, 1], bitorder="little") = 0b11001101.
  EXPECT_THAT(PackBitsLittle(std::vector<uint8_t>{1, 0, 1, 1, 0, 0, 1, 1}), ElementsAre(0xcd));
  auto back = FromFlashInferPackedMask(tree->tokens, std::vector<uint8_t>{0xe7, 0x5d}, 2);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTree(*back, *tree);
}

// TensorRT-LLM's EAGLE test (tests/unittest/trt/model/eagle/test_sample_accept_draft_tokens_plugin.py,
// case 0): 8 tokens, paths [0,1,4,6], [0,1,4,7], [0,2], [0,3,5] in a [8, 4] buffer.
TEST(TreeLayoutsTest, TensorRtLlmPublishedExample) {
  const std::vector<int32_t> paths = {0, 1, 4, 6,  0, 1,  4,  7,  0,  2,  -1, -1, 0,  3,  5,  -1,
                                      -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  const std::vector<int64_t> tokens = {0, 0, 1, 2, 3, 4, 5, 6};
  auto tree = FromTrtllmPaths(tokens, paths, 4);
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_THAT(tree->parents, ElementsAre(-1, 0, 0, 0, 1, 3, 4, 4));
  auto trt = ToTrtllm(*tree, 8, 4);
  ASSERT_TRUE(trt.ok()) << trt.status();
  EXPECT_EQ(trt->paths, paths);
  EXPECT_THAT(trt->position_offsets, ElementsAre(0, 1, 1, 1, 2, 2, 3, 3));
  // Row 6 = nodes {0, 1, 4, 6} = 0b1010011; row 5 = {0, 3, 5} = 0b101001.
  EXPECT_THAT(trt->packed_mask, ElementsAre(0x01, 0x03, 0x05, 0x09, 0x13, 0x29, 0x53, 0x93));
  auto natural = ToTrtllm(*tree);
  ASSERT_TRUE(natural.ok());
  EXPECT_EQ(natural->num_paths, 4);
  EXPECT_EQ(natural->path_len, 4);
}

TEST(TreeLayoutsTest, MalformedLayoutsAreRejected) {
  const std::vector<int64_t> tokens = {1, 2, 3, 4};
  ExpectInvalid(FromSGLang(tokens, std::vector<int64_t>{1, 2, -1, -1}, std::vector<int64_t>{-1, 2, -1, -1}).status(),
                "node 2 is listed under node 1 and again under node 0");
  ExpectInvalid(FromSGLang(tokens, std::vector<int64_t>{1, -1, -1, -1}, std::vector<int64_t>{-1, 2, -1, -1}).status(),
                "node 3 is in no child list");
  ExpectInvalid(FromSGLang(tokens, std::vector<int64_t>{1, 7, -1, -1}, std::vector<int64_t>{-1, 2, 3, -1}).status(),
                "the child list of node 1 names node 7");
  ExpectInvalid(FromSGLang(tokens, std::vector<int64_t>{3, -1, -1, 1}, std::vector<int64_t>{-1, 2, -1, -1}).status(),
                "node 1 has parent 3; parents must precede children");
  ExpectInvalid(FromSGLang(tokens, std::vector<int64_t>{1, -1}, std::vector<int64_t>{-1, 2, 3, -1}).status(),
                "4 tokens but 2 first-child");

  ExpectInvalid(FromTrtllmPaths(tokens, std::vector<int32_t>{0, 1, 2, 0, 3, 2}, 3).status(),
                "row 1 gives node 2 parent 3, an earlier row gave it parent 1");
  ExpectInvalid(FromTrtllmPaths(tokens, std::vector<int32_t>{1, 2, -1}, 3).status(), "row 0 starts at node 1");
  ExpectInvalid(FromTrtllmPaths(tokens, std::vector<int32_t>{0, 1, 2, 0, -1, 3}, 3).status(),
                "row 1 has node 3 after -1 padding");
  ExpectInvalid(FromTrtllmPaths(tokens, std::vector<int32_t>{0, 1, 2}, 3).status(), "node 3 lies on no path");
  ExpectInvalid(FromTrtllmPaths(tokens, std::vector<int32_t>{0, 1, 2, 3}, 3).status(), "not rows of path_len = 3");

  // Masks: node 2's row claims node 1 without node 1's ancestors being consistent, etc.
  ExpectInvalid(TreeFromAncestorMask(tokens, std::vector<uint8_t>{1, 0, 0, 0,  //
                                                                  1, 1, 0, 0,  //
                                                                  0, 1, 1, 0,  //
                                                                  1, 0, 0, 1})
                    .status(),
                "row 2 is not its parent's row plus itself: column 0 is 0 but 1 in row 1");
  ExpectInvalid(TreeFromAncestorMask(tokens, std::vector<uint8_t>{1, 0, 0, 0,  //
                                                                  1, 1, 1, 0,  //
                                                                  1, 0, 1, 0,  //
                                                                  1, 0, 0, 1})
                    .status(),
                "row 1 attends later node 2");
  ExpectInvalid(TreeFromAncestorMask(tokens, std::vector<uint8_t>{1, 0, 0, 0,  //
                                                                  1, 0, 0, 0,  //
                                                                  1, 0, 1, 0,  //
                                                                  1, 0, 0, 1})
                    .status(),
                "row 1 does not attend node 1 itself");
  ExpectInvalid(TreeFromAncestorMask(tokens, std::vector<uint8_t>{1, 0, 0, 0,  //
                                                                  0, 1, 0, 0,  //
                                                                  1, 0, 1, 0,  //
                                                                  1, 0, 0, 1})
                    .status(),
                "row 1 attends no earlier node, not even the root");
  ExpectInvalid(TreeFromAncestorMask(std::vector<int64_t>{1, 2}, std::vector<uint8_t>{1, 1, 1, 0, 1, 0, 1, 1}, 2)
                    .status(),
                "row 1 does not attend cached column 1");
  ExpectInvalid(TreeFromAncestorMask(tokens, std::vector<uint8_t>{1, 0, 0}).status(), "3 entries, expected [4, 0 + 4]");

  ExpectInvalid(FromSGLangMask(tokens, std::vector<uint8_t>{0x01, 0x03, 0x05, 0x19}, 0,
                               SGLangTreeMaskMode::kQLenOnlyBitPacking)
                    .status(),
                "row 3 sets bit 4, past the 4 nodes");
  ExpectInvalid(FromSGLangMask(tokens, std::vector<uint8_t>{0x01, 0x03}, 0, SGLangTreeMaskMode::kQLenOnlyBitPacking)
                    .status(),
                "2 bytes, expected 4 rows of 1 bytes");
  ExpectInvalid(FromTrtllmPackedMask(tokens, std::vector<int32_t>{1, 3, 5, 9 | (1 << 20)}, 1).status(),
                "row 3 sets bit 20, past the 4 nodes");
  ExpectInvalid(FromTrtllmPackedMask(tokens, std::vector<int32_t>{1, 3, 5}, 1).status(), "3 words as rows of 1");
  ExpectInvalid(UnpackBitsLittle(std::vector<uint8_t>{1, 2}, 17).status(), "2 bytes cannot hold exactly 17 bits");

  auto tree = DraftTree::FromParents(tokens, std::vector<int32_t>{-1, 0, 1, 2});
  ASSERT_TRUE(tree.ok());
  ExpectInvalid(ToTrtllm(*tree, 3).status(), "4 nodes exceed max_decoding_tokens = 3");
  ExpectInvalid(ToTrtllm(*tree, 0, 3).status(), "depth 3 needs paths of 4 entries, max_path_len = 3");
  ExpectInvalid(ToSGLang(*tree, -1, SGLangTreeMaskMode::kFullMask).status(), "seq_len (-1)");
  DraftTree broken = *tree;
  broken.depths[2] = 7;
  ExpectInvalid(ToSGLang(broken, 0, SGLangTreeMaskMode::kFullMask).status(), "node 2 has depth 7");
}

}  // namespace
}  // namespace eagle3
