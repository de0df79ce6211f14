// The example programs' command lines (issue 19): --help / -h of eagle3-decode, eagle3-inspect and
// every subcommand answers at once with the usage and exit 0; wrong model directories and
// --weights bf16 on the CPU are refused first, in the flags' terms; check --json, accuracy's
// --tokens-max report and eagle3-decode's JSON settings and times parse; the default --models-dir
// follows $EAGLE3_MODELS_DIR and an installed layout.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "tool_run.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kModels = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models";
const std::string kTarget = kModels + "/tiny-v2-code";
const std::string kDraft = kModels + "/tiny-v2-code-eagle3";

TEST(InspectCliTest, HelpOfEveryProgramAndSubcommandPrintsUsageAndExitsZero) {
  ScopedTempDir dir;
  struct Case {
    std::string program, args, usage;
  };
  const std::string inspect = EAGLE3_INSPECT, decode = EAGLE3_DECODE;
  std::vector<Case> cases = {
      {decode, "--help", "usage: eagle3-decode"},
      {decode, "-h", "usage: eagle3-decode"},
      // Before any other check: a bad value or a missing one does not matter.
      {decode, "--tp 2x --help", "usage: eagle3-decode"},
      {decode, "--target /nonexistent --help", "usage: eagle3-decode"},
      {inspect, "--help", "usage: eagle3-inspect"},
      {inspect, "-h", "usage: eagle3-inspect"},
  };
  for (const std::string sub : {"target", "draft", "check", "accuracy"}) {
    cases.push_back({inspect, sub + " --help", "usage: eagle3-inspect " + sub});
    cases.push_back({inspect, sub + " -h", "usage: eagle3-inspect " + sub});
    cases.push_back({inspect, sub + " --target /nonexistent --depth 0 --help", "usage: eagle3-inspect " + sub});
  }
  for (const Case& c : cases) {
    const ToolRun run = RunTool(c.program, c.args, dir);
    EXPECT_EQ(run.exit_code, 0) << c.program << " " << c.args << "\n" << run.log;
    EXPECT_THAT(run.log, StartsWith(c.usage)) << c.args;
    EXPECT_THAT(run.log, HasSubstr("default")) << c.args;
  }
  // Each subcommand's help lists its flags with their defaults.
  EXPECT_THAT(RunTool(inspect, "accuracy --help", dir).log, HasSubstr("--tokens-max N        the most tokens of the text used; more are cut (default 512)"));
  EXPECT_THAT(RunTool(inspect, "draft --help", dir).log, HasSubstr("--topk K              tree children per node (default 4)"));
  EXPECT_THAT(RunTool(inspect, "target --help", dir).log, HasSubstr("--tp N                tensor-parallel ranks on threads (default 1)"));
  EXPECT_THAT(RunTool(inspect, "check --help", dir).log, HasSubstr("--json FILE"));
  const std::string top = RunTool(inspect, "--help", dir).log;
  EXPECT_THAT(top, Not(HasSubstr("draft runs on cpu")));
  EXPECT_THAT(top, HasSubstr("every model runs on --device"));
  // An unknown subcommand still fails.
  EXPECT_EQ(RunTool(inspect, "frobnicate", dir).exit_code, 2);
}

TEST(InspectCliTest, WrongModelDirectoriesAreReportedFirst) {
  ScopedTempDir dir;
  const std::string missing = dir.File("missing");
  const std::string empty = dir.path();  // exists, but no config.json
  const std::string decode = EAGLE3_DECODE, inspect = EAGLE3_INSPECT;

  ToolRun run = RunTool(decode, "--target " + missing + " --draft " + kDraft, dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, StartsWith("eagle3-decode: NOT_FOUND: --target " + missing + ": no such directory")) << run.log;
  run = RunTool(decode, "--target " + kTarget + " --draft " + empty, dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("--draft " + empty + ": has no config.json")) << run.log;
  EXPECT_THAT(run.log, Not(HasSubstr("prompt")));  // nothing ran before the refusal
  run = RunTool(decode, "--models-dir " + missing, dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, StartsWith("eagle3-decode: NOT_FOUND: --models-dir " + missing)) << run.log;
  EXPECT_THAT(run.log, HasSubstr("no such directory"));
  run = RunTool(decode, "--models-dir " + empty, dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("--models-dir " + empty + ": the default target")) << run.log;

  run = RunTool(inspect, "check --target " + missing + " --draft " + kDraft, dir);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.log, StartsWith("eagle3-inspect: NOT_FOUND: --target " + missing + ": no such directory")) << run.log;
  run = RunTool(inspect, "accuracy --target " + kTarget + " --draft " + empty + " --text-file " + missing, dir);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.log, HasSubstr("--draft " + empty + ": has no config.json")) << run.log;
  run = RunTool(inspect, "target --model " + empty + " --tokens 1,2 --out " + dir.File("o.safetensors"), dir);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.log, HasSubstr("--model " + empty + ": has no config.json")) << run.log;
}

TEST(InspectCliTest, Bf16WeightsOnTheCpuAreRefusedInTheFlagsTerms) {
  ScopedTempDir dir;
  const std::string message = "--weights bf16 needs --device cuda: the CPU backend stores weights in f32";
  ToolRun run = RunTool(EAGLE3_DECODE, "--weights bf16", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr(message));
  EXPECT_THAT(run.log, Not(HasSubstr("prompt (")));
  run = RunTool(EAGLE3_INSPECT, "accuracy --target " + kTarget + " --draft " + kDraft +
                                    " --text-file /dev/null --device cpu --weights bf16", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr(message));
}

TEST(InspectCliTest, CheckWritesJson) {
  ScopedTempDir dir;
  const std::string json = dir.File("check.json");
  const ToolRun run = RunTool(EAGLE3_INSPECT, "check --target " + kTarget + " --draft " + kDraft + " --json " + json, dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["target"], kTarget);
  EXPECT_EQ(j["draft"], kDraft);
  EXPECT_EQ(j["convention"], "output");
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_FALSE(j["facts"].empty());
  EXPECT_TRUE(j["warnings"].is_array());
  EXPECT_TRUE(j["problems"].empty());
  // --json is check's only.
  EXPECT_EQ(RunTool(EAGLE3_INSPECT, "accuracy --target " + kTarget + " --draft " + kDraft +
                                        " --text-file /dev/null --json " + json, dir).exit_code, 2);
}

TEST(InspectCliTest, AccuracySaysWhenTokensMaxCutTheText) {
  ScopedTempDir dir;
  const std::string text = dir.File("text.py");
  {
    std::ofstream out(text);
    for (int i = 0; i < 20; ++i) out << "def f" << i << "(x):\n    return x + " << i << "\n\n";
  }
  const std::string json = dir.File("acc.json");
  const ToolRun run = RunTool(EAGLE3_INSPECT, "accuracy --target " + kTarget + " --draft " + kDraft + " --text-file " +
                                                  text + " --tokens-max 24 --depth 2 --out " + json, dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, HasSubstr("read 24 of "));
  EXPECT_THAT(run.log, HasSubstr("(--tokens-max 24; a larger value reads more)"));
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["tokens"], 24);
  EXPECT_EQ(j["tokens_max"], 24);
  EXPECT_GT(j["text_tokens"].get<int>(), 24);
  EXPECT_TRUE(j["truncated"].get<bool>());
  EXPECT_EQ(j["depths"].size(), 2u);
}

TEST(InspectCliTest, DecodeJsonHoldsSettingsAndTimes) {
  ScopedTempDir dir;
  const std::string json = dir.File("decode.json");
  const ToolRun run = RunTool(EAGLE3_DECODE, "--random-pair --max-new-tokens 4 --topk 2 --steps 2 --draft-tokens 4 "
                                             "--temperature 0.5 --top-p 0.9 --seed 7 --json " + json, dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  const nlohmann::json& s = j["settings"];
  EXPECT_EQ(s["device"], "cpu");
  EXPECT_EQ(s["tree"]["topk"], 2);
  EXPECT_EQ(s["tree"]["steps"], 2);
  EXPECT_EQ(s["tree"]["draft_tokens"], 4);
  EXPECT_NEAR(s["sampling"]["temperature"].get<double>(), 0.5, 1e-6);
  EXPECT_NEAR(s["sampling"]["top_p"].get<double>(), 0.9, 1e-6);
  EXPECT_EQ(s["seed"], 7);
  EXPECT_EQ(s["max_new_tokens"], 4);
  for (const std::string run_name : {"plain", "speculative"}) {
    EXPECT_GT(j["seconds"][run_name]["load"].get<double>(), 0) << run_name;
    EXPECT_GT(j["seconds"][run_name]["generate"].get<double>(), 0) << run_name;
  }
}

TEST(InspectCliTest, DefaultModelsDirFollowsTheEnvironmentAndTheInstalledLayout) {
  ScopedTempDir dir;
  const std::string decode = EAGLE3_DECODE;
  ToolRun run = RunTool("env EAGLE3_MODELS_DIR=" + dir.File("env-models") + " " + decode, "--help", dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, HasSubstr("here: " + dir.File("env-models") + ")"));
  run = RunTool("env EAGLE3_MODELS_DIR=" + dir.File("env-models") + " " + decode, "", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("--models-dir " + dir.File("env-models") + ": no such directory")) << run.log;

  // An installed layout: <prefix>/bin/eagle3-decode finds <prefix>/share/eagle3/models.
  const std::filesystem::path prefix = dir.File("prefix");
  std::filesystem::create_directories(prefix / "bin");
  std::filesystem::create_directories(prefix / "share" / "eagle3" / "models");
  std::filesystem::copy_file(decode, prefix / "bin" / "eagle3-decode");
  std::filesystem::permissions(prefix / "bin" / "eagle3-decode", std::filesystem::perms::owner_exec,
                               std::filesystem::perm_options::add);
  run = RunTool("env -u EAGLE3_MODELS_DIR " + (prefix / "bin" / "eagle3-decode").string(), "--help", dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, HasSubstr("here: " + (prefix / "share" / "eagle3" / "models").string() + ")"));
}

}  // namespace
}  // namespace eagle3
