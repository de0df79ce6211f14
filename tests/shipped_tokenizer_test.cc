// The tokenizer shipped with the trained pair (models/tiny-v2-code/tokenizer.json) against HF
// `tokenizers`: the ids recorded in models/heldout_prompts.jsonl (24 prompts cut from files held out
// of training, tokenized by `tokenizers` when the file was made) are exactly what Tokenizer::Encode
// gives, and decoding them returns the text. (The whole held-out split is checked with
// tools/check_tokenizer.py + EAGLE3_TOKENIZER_CHECK; see tokenizer_test.cc.)
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/tools/tokenizer.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

const std::string kModels = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models/";

TEST(ShippedTokenizerTest, HeldOutPromptsEncodeAsTokenizersDid) {
  auto tokenizer = Tokenizer::FromFile(kModels + "tiny-v2-code");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->vocab_size(), 8192);
  std::ifstream in(kModels + "heldout_prompts.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  int prompts = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line);
    const std::string text = record.at("text").get<std::string>();
    const std::vector<int64_t> want = record.at("tokens").get<std::vector<int64_t>>();
    auto got = tokenizer->Encode(text);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, want) << record.at("path");
    auto back = tokenizer->Decode(*got);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text) << record.at("path");
    ++prompts;
  }
  EXPECT_EQ(prompts, 24);
}

}  // namespace
}  // namespace eagle3
