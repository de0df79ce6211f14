// eagle3-inspect on hostile and broken inputs (issue 17): configs that legally name sizes no host
// can dump are ResourceExhausted naming the keys (not an abort, and nothing that size allocated),
// flag values are strict, --text-file is read only up to --max-input-bytes, --out never replaces a
// device, a read-only file or the checkpoint being read (nor --json those or the --out file), a
// legal long --out name works, too many tokens for max_position_embeddings are refused, and
// `check` warns about taps out of layer order.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "eagle3/deepseek_v2_config.h"
#include "eagle3/safetensors.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "tool_run.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kTarget = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2_qlora_yarn";
const std::string kDraft = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/draft_v2";

ToolRun Inspect(const std::string& args, const ScopedTempDir& dir) {
  return RunTool(EAGLE3_INSPECT, args, dir);
}

// The golden target's config.json with `edit` applied, alone in `dir` (no weights: the refusal
// must come before any is needed).
void WriteEditedConfig(const ScopedTempDir& dir, void (*edit)(nlohmann::json&)) {
  nlohmann::json config = nlohmann::json::parse(ReadFile(kTarget + "/config.json"));
  edit(config);
  std::ofstream(dir.File("config.json")) << config.dump();
}

std::string Ones(int n) {
  std::string ids = "1";
  for (int i = 1; i < n; ++i) ids += ",1";
  return ids;
}

TEST(InspectHostileTest, HugeHiddenSizeOrLayersAreResourceExhausted) {
  ScopedTempDir model, dir;
  WriteEditedConfig(model, [](nlohmann::json& j) {
    j["hidden_size"] = 1 << 24;
    j["num_hidden_layers"] = 1 << 16;
  });
  const ToolRun run = Inspect("target --model " + model.path() + " --tokens 1,2,3 --out " + dir.File("o.safetensors"), dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, AllOf(HasSubstr("RESOURCE_EXHAUSTED"), HasSubstr("--tokens (3 tokens)"),
                             HasSubstr("num_hidden_layers 65536"), HasSubstr("hidden_size 16777216"),
                             HasSubstr("bytes of memory this process can use")));
  EXPECT_FALSE(fs::exists(dir.File("o.safetensors")));
}

TEST(InspectHostileTest, HugeVocabularyIsResourceExhausted) {
  ScopedTempDir model, dir;
  WriteEditedConfig(model, [](nlohmann::json& j) {
    j["vocab_size"] = 1 << 24;
    j["max_position_embeddings"] = 1 << 16;
  });
  // 30000 tokens x 2^24 logits of 4 bytes: 2 TB.
  const ToolRun run = Inspect("target --model " + model.path() + " --tokens " + Ones(30000) + " --out " +
                              dir.File("o.safetensors"),
                          dir);
  EXPECT_EQ(run.exit_code, 1) << run.log.substr(0, 2000);
  EXPECT_THAT(run.log, AllOf(HasSubstr("RESOURCE_EXHAUSTED"), HasSubstr("--tokens (30000 tokens) x vocab_size 16777216")));
}

TEST(InspectHostileTest, FlagValuesAreParsedStrictlyAndEchoed) {
  ScopedTempDir dir;
  const std::string base = "target --model " + kTarget + " --out " + dir.File("o.safetensors") + " ";
  const struct {
    std::string args, message;
  } cases[] = {
      {base + "--tokens 1,2 --tp 2x", "--tp: expected an integer in [1, 64], got \"2x\""},
      {base + "--tokens 1,2 --tp 1e3", "--tp: expected an integer in [1, 64], got \"1e3\""},
      {base + "--tokens 1,99999999999999999999",
       "--tokens: '99999999999999999999' is not an integer in [0, 9223372036854775807] (item 2 of "
       "\"1,99999999999999999999\")"},
      {"accuracy --target " + kTarget + " --draft " + kDraft + " --text-file x --aux-layers 4294967297",
       "--aux-layers: '4294967297' is not an integer in [0, 2147483647]"},
      {"accuracy --target " + kTarget + " --draft " + kDraft + " --text-file x --depth 3.0",
       "--depth: expected an integer in [1, 64], got \"3.0\""},
  };
  for (const auto& c : cases) {
    const ToolRun run = Inspect(c.args, dir);
    EXPECT_EQ(run.exit_code, 2) << c.args << "\n" << run.log;
    EXPECT_THAT(run.log, HasSubstr(c.message)) << c.args;
  }
}

TEST(InspectHostileTest, TokensBeyondMaxPositionEmbeddings) {
  ScopedTempDir dir;
  ToolRun run = Inspect("target --model " + kTarget + " --tokens " + Ones(300) + " --out " + dir.File("o.safetensors"),
                    dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, AllOf(HasSubstr("--tokens gives 300 tokens, more than max_position_embeddings 256"),
                             HasSubstr("--allow-long-context")));
  run = Inspect("target --model " + kTarget + " --tokens " + Ones(300) + " --allow-long-context --out " +
                    dir.File("o.safetensors"),
                dir);
  EXPECT_EQ(run.exit_code, 0) << run.log;
}

TEST(InspectHostileTest, TextFilesAreReadUpToTheCap) {
  ScopedTempDir dir;
  const std::string pair = "accuracy --target " + std::string(EAGLE3_TEST_DATA_DIR) +
                           "/../../models/tiny-v2-code --draft " + std::string(EAGLE3_TEST_DATA_DIR) +
                           "/../../models/tiny-v2-code-eagle3";
  ToolRun run = Inspect(pair + " --text-file /dev/zero --max-input-bytes 4096", dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("--text-file /dev/zero: yields more bytes than --max-input-bytes 4096"));
  const std::string fifo = dir.File("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  run = Inspect(pair + " --text-file " + fifo, dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("--text-file " + fifo + " has 0 tokens"));
}

// --out: a device, a read-only file and a file of the checkpoint being read are refused before any
// work (a copy of the golden checkpoint stands in, so a failure destroys nothing shared); a legal
// 255-byte name is written.
TEST(InspectHostileTest, OutRefusesWhatItMustNotReplace) {
  ScopedTempDir dir, model;
  for (const auto& entry : fs::directory_iterator(kTarget)) {
    fs::copy_file(entry.path(), fs::path(model.path()) / entry.path().filename());
  }
  const std::string target = "target --model " + model.path() + " --tokens 1,2,3 --out ";
  ToolRun run = Inspect(target + "/dev/null", dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("--out: output '/dev/null' is a character device"));

  const std::string shard = model.File("model-00001-of-00002.safetensors");
  const std::string before = ReadFile(shard);
  run = Inspect(target + shard, dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("is one of the input files it is computed from"));
  EXPECT_EQ(ReadFile(shard), before);

  const std::string read_only = dir.File("read_only.safetensors");
  std::ofstream(read_only) << "keep";
  ASSERT_EQ(::chmod(read_only.c_str(), 0444), 0);
  run = Inspect(target + read_only, dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("is read-only"));
  EXPECT_EQ(ReadFile(read_only), "keep");

  const std::string long_name = dir.File(std::string(251, 'n') + ".st");
  run = Inspect(target + long_name, dir);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  auto dump = SafetensorsFile::Open(long_name);
  EXPECT_TRUE(dump.ok()) << dump.status();
}

// --json of target and draft: a device, a read-only file and the --out file itself (however
// spelled) are refused before any work, so that not even --out is written.
TEST(InspectHostileTest, JsonRefusesWhatItMustNotReplaceBeforeAnyWork) {
  ScopedTempDir dir;
  const std::string out = dir.File("o.safetensors");
  const std::string read_only = dir.File("read_only.json");
  std::ofstream(read_only) << "keep";
  ASSERT_EQ(::chmod(read_only.c_str(), 0444), 0);
  for (const std::string command :
       {"target --model " + kTarget, "draft --target " + kTarget + " --draft " + kDraft}) {
    const std::string json = " --tokens 1,2,3 --out " + out + " --json ";
    ToolRun run = Inspect(command + json + "/dev/null", dir);
    EXPECT_EQ(run.exit_code, 1) << run.log;
    EXPECT_THAT(run.log, HasSubstr("--json: output '/dev/null' is a character device"));

    run = Inspect(command + json + read_only, dir);
    EXPECT_EQ(run.exit_code, 1) << run.log;
    EXPECT_THAT(run.log, AllOf(HasSubstr("--json: output"), HasSubstr("is read-only")));
    EXPECT_EQ(ReadFile(read_only), "keep");

    for (const std::string same : {out, dir.path() + "/./o.safetensors"}) {
      run = Inspect(command + json + same, dir);
      EXPECT_EQ(run.exit_code, 1) << run.log;
      EXPECT_THAT(run.log, HasSubstr("--json " + same + ": names the --out file"));
    }
    EXPECT_THAT(run.log, Not(HasSubstr("wrote")));
    EXPECT_FALSE(fs::exists(out)) << command;
  }
}

// Aux ids listed out of layer order: `check` passes with a warning naming the order the draft
// receives and the one SGLang / vLLM capture.
TEST(InspectHostileTest, CheckWarnsAboutAuxIdsOutOfLayerOrder) {
  ScopedTempDir dir, draft;
  auto config = DeepseekV2Config::FromFile(kTarget);
  ASSERT_TRUE(config.ok()) << config.status();
  RandomDraftCheckpointOptions options;
  options.num_attention_heads = 8;
  options.num_key_value_heads = 4;
  options.aux_layer_ids = {2, 0, 1};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft.path(), options).ok());
  const ToolRun run = Inspect("check --target " + kTarget + " --draft " + draft.path(), dir);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, AllOf(HasSubstr("WARNING: eagle_aux_hidden_state_layer_ids [2, 0, 1] are not in layer order"),
                             HasSubstr("pair OK with 1 warning(s)")));
}

}  // namespace
}  // namespace eagle3
