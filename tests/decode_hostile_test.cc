// eagle3-decode on hostile and broken inputs (issue 17): every flag value is parsed strictly and
// echoed back with its range, input files are read only up to --max-input-bytes (also /dev/zero and
// FIFOs), --json never replaces a device, a read-only file or an input, positions beyond the
// target's max_position_embeddings are refused unless --allow-long-context, and a tokenizer smaller
// than the model's vocabulary is reported at load instead of failing after the decode.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "tool_run.h"

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kGolden = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/";
const std::string kGoldenPair = "--target " + kGolden + "v2_qlora_yarn --draft " + kGolden + "draft_v2";

ToolRun Decode(const std::string& args, const ScopedTempDir& dir) {
  return RunTool(EAGLE3_DECODE, args, dir);
}

// Bad flag values: exit code 2 (usage), the flag, its range and the text as typed.
TEST(DecodeHostileTest, FlagValuesAreParsedStrictlyAndEchoed) {
  ScopedTempDir dir;
  const struct {
    std::string args, message;
  } cases[] = {
      {"--tp 2x", "--tp: expected an integer in [1, 64], got \"2x\""},
      {"--tp 1e3", "--tp: expected an integer in [1, 64], got \"1e3\""},
      {"--tp ' 2'", "--tp: expected an integer in [1, 64], got \" 2\""},
      {"--max-new-tokens 4294967297", "--max-new-tokens: expected an integer in [1, 1048576], got \"4294967297\""},
      {"--aux-layers 4294967297", "--aux-layers: '4294967297' is not an integer in [0, 2147483647]"},
      {"--aux-layers 1,,2", "--aux-layers: '' is not an integer in [0, 2147483647] (item 2 of \"1,,2\")"},
      {"--tokens 1,9223372036854775808", "'9223372036854775808' is not an integer in [0, 9223372036854775807]"},
      {"--tokens 5,-1", "--tokens: '-1' is not an integer in [0, 9223372036854775807]"},
      {"--seed 0.5", "--seed: expected an integer in [0, 18446744073709551615], got \"0.5\""},
      {"--seed -1", "--seed: expected an integer in [0, 18446744073709551615], got \"-1\""},
      {"--seed 18446744073709551616", "got \"18446744073709551616\""},
      {"--top-p 1e-50", "--top-p: expected a number in (0, 1], got \"1e-50\" (0 as a 32-bit float)"},
      {"--top-p 1.5", "--top-p: expected a number in (0, 1], got \"1.5\""},
      {"--top-p 0.5x", "--top-p: expected a number in (0, 1], got \"0.5x\""},
      {"--temperature nan", "--temperature: expected a number in [0, 1000], got \"nan\""},
      {"--temperature 1e39", "--temperature: expected a number in [0, 1000], got \"1e39\""},
      {"--temperature -0.1", "--temperature: expected a number in [0, 1000], got \"-0.1\""},
      {"--batch 0x10", "--batch: expected an integer in [1, 1024], got \"0x10\""},
      {"--max-input-bytes 0", "--max-input-bytes: expected an integer in [1, 4294967296], got \"0\""},
  };
  for (const auto& c : cases) {
    const ToolRun run = Decode(c.args, dir);
    EXPECT_EQ(run.exit_code, 2) << c.args << "\n" << run.log;
    EXPECT_THAT(run.log, HasSubstr(c.message)) << c.args;
  }
}

// 2^53 and 2^53 + 1 are distinct seeds (no double in between): both parse, and a sampled run with
// each completes.
TEST(DecodeHostileTest, SeedsAreExactUint64) {
  ScopedTempDir dir;
  for (const char* seed : {"9007199254740992", "9007199254740993", "18446744073709551615"}) {
    const ToolRun run = Decode("--random-pair --max-new-tokens 2 --temperature 0.8 --top-p 0.9 --seed " +
                               std::string(seed),
                           dir);
    EXPECT_EQ(run.exit_code, 0) << seed << "\n" << run.log;
  }
}

// /dev/zero, an oversized regular file and a FIFO without a writer: refused at the cap (or read
// as empty), never read until memory runs out, never hanging.
TEST(DecodeHostileTest, PromptFilesAreReadUpToTheCap) {
  ScopedTempDir dir;
  ToolRun run = Decode("--prompt-file /dev/zero --max-input-bytes 4096", dir);
  EXPECT_EQ(run.exit_code, 2) << run.log;
  EXPECT_THAT(run.log, HasSubstr("--prompt-file /dev/zero: yields more bytes than --max-input-bytes 4096"));

  const std::string big = dir.File("big.txt");
  std::ofstream(big) << std::string(5000, 'x');
  run = Decode("--prompt-file " + big + " --max-input-bytes 4096", dir);
  EXPECT_EQ(run.exit_code, 2) << run.log;
  EXPECT_THAT(run.log, HasSubstr("--prompt-file " + big + ": 5000 bytes, more than --max-input-bytes 4096"));

  const std::string fifo = dir.File("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  run = Decode("--prompt-file " + fifo, dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("the prompt is empty"));

  run = Decode("--prompt-file " + dir.path(), dir);
  EXPECT_EQ(run.exit_code, 2) << run.log;
  EXPECT_THAT(run.log, HasSubstr("is a directory"));
}

// --json refuses a device node, a read-only file and the prompt file it was computed from, before
// decoding, and leaves them as they were.
TEST(DecodeHostileTest, JsonOutputRefusesWhatItMustNotReplace) {
  ScopedTempDir dir;
  ToolRun run = Decode("--random-pair --max-new-tokens 2 --json /dev/null", dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("--json: output '/dev/null' is a character device"));

  const std::string read_only = dir.File("read_only.json");
  std::ofstream(read_only) << "keep";
  ASSERT_EQ(::chmod(read_only.c_str(), 0444), 0);
  run = Decode("--random-pair --max-new-tokens 2 --json " + read_only, dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("is read-only"));
  EXPECT_EQ(ReadFile(read_only), "keep");

  const std::string prompt = dir.File("prompt.py");
  std::ofstream(prompt) << "def f(x):\n    return";
  run = Decode("--prompt-file " + prompt + " --max-new-tokens 2 --json " + prompt, dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("is one of the input files"));
  EXPECT_EQ(ReadFile(prompt), "def f(x):\n    return");
}

// The golden target has max_position_embeddings 256: prompt + new tokens beyond are refused with
// the count, the limit and the way out; --allow-long-context runs them.
TEST(DecodeHostileTest, PositionsBeyondMaxPositionEmbeddings) {
  ScopedTempDir dir;
  std::string ids = "1";
  for (int i = 1; i < 250; ++i) ids += ",1";
  ToolRun run = Decode(kGoldenPair + " --tokens " + ids + " --max-new-tokens 10", dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, AllOf(HasSubstr("prompt 0 (--tokens) has 250 tokens"), HasSubstr("--max-new-tokens 10"),
                             HasSubstr("260 positions, more than max_position_embeddings 256"),
                             HasSubstr("--allow-long-context")));
  run = Decode(kGoldenPair + " --tokens " + ids + " --max-new-tokens 10 --allow-long-context", dir);
  EXPECT_EQ(run.exit_code, 0) << run.log;
}

// A target whose tokenizer has fewer ids than its vocab_size (as real padded vocabularies do) runs:
// the difference is reported at load, and a continuation holding an id the tokenizer lacks is
// shown as ids, naming the id and the tokenizer's size, instead of failing after the decode.
TEST(DecodeHostileTest, TokenizerSmallerThanTheVocabulary) {
  ScopedTempDir target, draft, dir;
  auto config = DeepseekV2Config::FromFile(kGolden + "v2_qlora_yarn");
  ASSERT_TRUE(config.ok()) << config.status();
  config->vocab_size = 16384;  // the tokenizer below has 8192 ids
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*config, target.path()).ok());
  std::filesystem::copy_file(std::string(EAGLE3_TEST_DATA_DIR) + "/../../models/tiny-v2-code/tokenizer.json",
                             target.File("tokenizer.json"));
  RandomDraftCheckpointOptions draft_options;
  draft_options.num_attention_heads = 8;
  draft_options.num_key_value_heads = 4;
  draft_options.aux_layer_ids = {0, 1, 2};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft.path(), draft_options).ok());
  const ToolRun run = Decode("--target " + target.path() + " --draft " + draft.path() +
                             " --tokens 9000,1,2 --max-new-tokens 8",
                         dir);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, AllOf(HasSubstr("has 8192 ids, fewer than vocab_size 16384"),
                             HasSubstr("the prompt holds id 9000, which"), HasSubstr("(8192 ids) cannot decode")));
}

}  // namespace
}  // namespace eagle3
