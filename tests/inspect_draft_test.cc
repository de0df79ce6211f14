// eagle3-inspect draft and check, end to end on the golden target + draft pair.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "eagle3/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

const std::string kTarget = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2_qlora_yarn";
const std::string kDraft = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/draft_v2";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(InspectDraftTest, WritesDraftLogitsAndAValidTree) {
  ScopedTempDir dir;
  const std::string out = dir.File("draft.safetensors");
  const std::string command = std::string(EAGLE3_INSPECT) + " draft --target " + kTarget + " --draft " + kDraft +
                              " --tokens 5,17,99,3,42,8,1,9 --topk 3 --steps 3 --draft-tokens 7 --out " + out + " > " +
                              dir.File("log.txt");
  ASSERT_EQ(std::system(command.c_str()), 0) << ReadFile(dir.File("log.txt"));
  auto file = SafetensorsFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status();
  auto logits = (*file)->View("draft_logits");
  ASSERT_TRUE(logits.ok());
  EXPECT_EQ(logits->shape(), (Shape{8, 300}));
  auto tokens = (*file)->View("tree_tokens");
  auto parents = (*file)->View("tree_parents");
  auto positions = (*file)->View("tree_positions");
  auto mask = (*file)->View("tree_mask");
  ASSERT_TRUE(tokens.ok() && parents.ok() && positions.ok() && mask.ok());
  ASSERT_EQ(tokens->numel(), 7);
  EXPECT_EQ(parents->data_as<int32_t>()[0], -1);
  EXPECT_EQ(positions->data_as<int64_t>()[0], 8);  // the root follows the 8 prompt tokens
  for (int i = 1; i < 7; ++i) {
    const int32_t parent = parents->data_as<int32_t>()[i];
    ASSERT_GE(parent, 0);
    ASSERT_LT(parent, i);
    EXPECT_EQ(positions->data_as<int64_t>()[i], positions->data_as<int64_t>()[parent] + 1);
    EXPECT_EQ(mask->data_as<uint8_t>()[i * 7 + parent], 1);
    EXPECT_EQ(mask->data_as<uint8_t>()[i * 7 + i], 1);
    EXPECT_GE(tokens->data_as<int64_t>()[i], 0);
    EXPECT_LT(tokens->data_as<int64_t>()[i], 1000);
  }
}

TEST(InspectCheckTest, AcceptsTheMatchingPairAndListsEveryProblemOfAMismatch) {
  ScopedTempDir dir;
  const std::string good = std::string(EAGLE3_INSPECT) + " check --target " + kTarget + " --draft " + kDraft + " > " +
                           dir.File("good.txt");
  ASSERT_EQ(std::system(good.c_str()), 0) << ReadFile(dir.File("good.txt"));
  EXPECT_THAT(ReadFile(dir.File("good.txt")), HasSubstr("boundaries [1, 2, 3]"));
  EXPECT_THAT(ReadFile(dir.File("good.txt")), HasSubstr("pair OK"));

  // The same draft against a target of another width and vocabulary.
  const std::string bad = std::string(EAGLE3_INSPECT) + " check --target " + std::string(EAGLE3_TEST_DATA_DIR) +
                          "/golden/v3_noaux --draft " + kDraft + " > " + dir.File("bad.txt") + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  const std::string report = ReadFile(dir.File("bad.txt"));
  EXPECT_THAT(report, HasSubstr("target_hidden_size 64 != target hidden_size 96"));
  EXPECT_THAT(report, HasSubstr("vocab_size 1000 != target vocab_size 515"));
  EXPECT_THAT(report, HasSubstr("fc.weight is [64, 192], expected [64, 3 taps x 96 = 288]"));
  EXPECT_THAT(report, HasSubstr("outside the target vocabulary [0, 515)"));

  // vLLM's convention reads the same ids one boundary earlier.
  const std::string input = std::string(EAGLE3_INSPECT) + " check --convention input --target " + kTarget +
                            " --draft " + kDraft + " > " + dir.File("input.txt");
  ASSERT_EQ(std::system(input.c_str()), 0);
  EXPECT_THAT(ReadFile(dir.File("input.txt")), HasSubstr("boundaries [0, 1, 2]"));
}


// The committed trained pair passes the check with the default taps; its draft against another
// target (a golden fixture: hidden 64, vocabulary 1000) is refused with every mismatch listed.
TEST(InspectCheckTest, ShippedPairPassesAndItsDraftOnAnotherTargetIsRefused) {
  ScopedTempDir dir;
  const std::string models = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models/";
  const std::string good = std::string(EAGLE3_INSPECT) + " check --target " + models + "tiny-v2-code --draft " +
                           models + "tiny-v2-code-eagle3 > " + dir.File("good.txt") + " 2>&1";
  ASSERT_EQ(std::system(good.c_str()), 0) << ReadFile(dir.File("good.txt"));
  EXPECT_THAT(ReadFile(dir.File("good.txt")), HasSubstr("boundaries [2, 4, 5]"));
  EXPECT_THAT(ReadFile(dir.File("good.txt")), HasSubstr("pair OK"));

  const std::string bad = std::string(EAGLE3_INSPECT) + " check --target " + kTarget + " --draft " + models +
                          "tiny-v2-code-eagle3 > " + dir.File("bad.txt") + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  const std::string report = ReadFile(dir.File("bad.txt"));
  EXPECT_THAT(report, HasSubstr("target_hidden_size 256 != target hidden_size 64"));
  EXPECT_THAT(report, HasSubstr("vocab_size 8192 != target vocab_size 1000"));
}

}  // namespace
}  // namespace eagle3
