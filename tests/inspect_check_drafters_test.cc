// eagle3-inspect check on the drafters made of DeepSeek layers, end to end: --mtp (the target's own
// MTP module) and --draft with an MLA EAGLE-3 head, each passing on a matching tiny pair and
// refused with the problem naming the tensor otherwise.
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "eagle3/deepseek_v2_config.h"
#include "eagle3/testing/deepseek_v2_config_writer.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantized_test_util.h"
#include "scoped_temp_dir.h"
#include "tool_run.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The tiny V3-style target of the quantized tests with one MTP module (layer 3), written with or
// without its MTP layer.
DeepseekV2Config WriteTarget(const std::string& dir, bool write_mtp) {
  DeepseekV2Config config = QuantTestConfig(QuantizationConfig{});
  config.num_nextn_predict_layers = 1;
  RandomCheckpointOptions options;
  options.num_shards = 2;
  options.dtype = DType::kF32;
  options.write_mtp = write_mtp;
  EXPECT_TRUE(WriteRandomDeepseekV2Checkpoint(config, dir, options).ok());
  return config;
}

TEST(InspectCheckDraftersTest, MtpModuleOfTheTarget) {
  ScopedTempDir target, dir;
  WriteTarget(target.path(), /*write_mtp=*/true);
  const std::string json = dir.File("check.json");
  ToolRun run = RunTool(EAGLE3_INSPECT, "check --target " + target.path() + " --mtp --json " + json, dir);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, HasSubstr("MTP module 0: layer 3 ('model.layers.3.*'), MoE MLP"));
  EXPECT_THAT(run.log, HasSubstr("target weights: unquantized"));
  EXPECT_THAT(run.log, HasSubstr("MTP weights: the decoder layer as the target's"));
  EXPECT_THAT(run.log, HasSubstr("pair OK: the MTP module matches the target"));
  nlohmann::json j;
  std::ifstream(json) >> j;
  EXPECT_EQ(j["settings"], nlohmann::json({{"target", target.path()}, {"mtp", true}, {"json", json}}));
  EXPECT_TRUE(j["mtp"].get<bool>());
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_FALSE(j.contains("draft"));

  // The same config with its MTP layer missing from the index.
  ScopedTempDir stripped;
  WriteTarget(stripped.path(), /*write_mtp=*/false);
  run = RunTool(EAGLE3_INSPECT, "check --target " + stripped.path() + " --mtp", dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("PROBLEM: target checkpoint: checkpoint '" + stripped.path() +
                                 "' has no MTP module 0: no tensor of its layer 3"));
  EXPECT_THAT(run.log, HasSubstr("'model.layers.3.enorm.weight'"));
  EXPECT_THAT(run.log, Not(HasSubstr("pair OK")));
}

TEST(InspectCheckDraftersTest, MlaDraft) {
  ScopedTempDir target, draft, wide, dir;
  const DeepseekV2Config config = WriteTarget(target.path(), /*write_mtp=*/false);
  RandomDraftCheckpointOptions o;
  o.dtype = DType::kF32;
  o.mla = RandomDraftCheckpointOptions::MlaShape{};
  o.aux_layer_ids = {0, 1, 2};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(config, draft.path(), o).ok());
  ToolRun run = RunTool(EAGLE3_INSPECT, "check --target " + target.path() + " --draft " + draft.path(), dir);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, HasSubstr("draft: MLA EAGLE-3 head (Eagle3DeepseekV2ForCausalLM, kimi_k2)"));
  EXPECT_THAT(run.log, HasSubstr("draft weights: unquantized"));
  EXPECT_THAT(run.log, HasSubstr("draft layer under 'midlayer.'"));
  EXPECT_THAT(run.log, HasSubstr("pair OK: the draft matches the target"));

  // A draft trained for a target of width 96.
  DeepseekV2Config wider = config;
  wider.hidden_size = 96;
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(wider, wide.path(), o).ok());
  run = RunTool(EAGLE3_INSPECT, "check --target " + target.path() + " --draft " + wide.path(), dir);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_THAT(run.log, HasSubstr("PROBLEM: fc.weight is [96, 288], expected [96, 3 taps x 64 = 192]"));
  EXPECT_THAT(run.log, HasSubstr("has no tensor 'embed_tokens.weight'"));
}

TEST(InspectCheckDraftersTest, MtpFlagIsCheckedWithTheOthers) {
  ScopedTempDir dir;
  ToolRun run = RunTool(EAGLE3_INSPECT, "check --target /x --draft /y --mtp", dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.log, HasSubstr("--draft and --mtp name two drafters; give one"));
  run = RunTool(EAGLE3_INSPECT, "check --target /x", dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.log, HasSubstr("--target and --draft (or --mtp) are required"));
  run = RunTool(EAGLE3_INSPECT, "accuracy --target /x --draft /y --text-file /z --mtp", dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.log, HasSubstr("--draft and --mtp name two drafters; give one"));
  run = RunTool(EAGLE3_INSPECT, "target --model /x --tokens 1,2 --out /z --mtp", dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.log, HasSubstr("--mtp applies to the check, draft and accuracy subcommands only"));
  run = RunTool(EAGLE3_INSPECT, "check --help", dir);
  EXPECT_THAT(run.log, HasSubstr("--mtp"));
}

}  // namespace
}  // namespace eagle3
