// eagle3-decode end to end: the default trained pair (models/) on its default text prompt — greedy
// speculative output equals plain output and drafts are accepted — text prompts from a flag and a
// file, batches (held-out prompts, a repeated prompt), the built-in random pair and the golden pair
// at TP 2, and refused inputs.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

const std::string kModels = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json RunDecode(const std::string& args, const ScopedTempDir& dir) {
  const std::string json = dir.File("out.json");
  const std::string command = std::string(EAGLE3_DECODE) + " " + args + " --json " + json + " > " + dir.File("log.txt") + " 2>&1";
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << command << "\n" << ReadFile(dir.File("log.txt"));
  std::ifstream in(json);
  return rc == 0 ? nlohmann::json::parse(in) : nlohmann::json();
}

// Runs eagle3-decode expecting failure; returns what it printed.
std::string RunFailing(const std::string& args, const ScopedTempDir& dir) {
  const std::string command = std::string(EAGLE3_DECODE) + " " + args + " > " + dir.File("fail.txt") + " 2>&1";
  EXPECT_NE(std::system(command.c_str()), 0) << command;
  return ReadFile(dir.File("fail.txt"));
}

TEST(DecodeDemoTest, DefaultTrainedPairSpeculatesOnTheDefaultPrompt) {
  ScopedTempDir dir;
  // The bare command (the models directory baked in at build time) and --models-dir must agree.
  const nlohmann::json out = RunDecode("", dir);
  ASSERT_TRUE(out.contains("plain"));
  EXPECT_THAT(out["target"].get<std::string>(), HasSubstr("tiny-v2-code"));
  EXPECT_THAT(out["prompt"]["text"].get<std::string>(), HasSubstr("def read_lines(path):"));
  EXPECT_GT(out["prompt"]["tokens"].size(), 10u);
  EXPECT_TRUE(out["greedy_outputs_agree"].get<bool>());
  EXPECT_EQ(out["plain"]["tokens"], out["speculative"]["tokens"]);
  EXPECT_EQ(out["plain"]["text"], out["speculative"]["text"]);
  EXPECT_FALSE(out["plain"]["text"].get<std::string>().empty());
  // Measured 3.33 tokens per target pass (topk 4, steps 3, 8 draft tokens, 48 new tokens).
  EXPECT_GT(out["speculative"]["mean_accepted_length"].get<double>(), 1.5);
  EXPECT_GT(out["speculative"]["acceptance_by_depth"][0].get<double>(), 0.5);
  EXPECT_NEAR(out["speedup"].get<double>(),
              out["speculative"]["tokens_per_s"].get<double>() / out["plain"]["tokens_per_s"].get<double>(), 1e-3);
  const std::string log = ReadFile(dir.File("log.txt"));
  EXPECT_THAT(log, HasSubstr("--- speculative continuation ---"));
  EXPECT_THAT(log, HasSubstr("speedup "));
  EXPECT_THAT(log, HasSubstr("boundaries [2, 4, 5]"));

  ScopedTempDir again;
  const nlohmann::json explicit_dir = RunDecode("--models-dir " + kModels, again);
  ASSERT_TRUE(explicit_dir.contains("plain"));
  EXPECT_EQ(explicit_dir["plain"]["tokens"], out["plain"]["tokens"]);
}

TEST(DecodeDemoTest, TextPromptFromAFlagAndFromAFile) {
  ScopedTempDir dir;
  const std::string prompt = "def add(a, b):\n    return";
  const nlohmann::json flag = RunDecode("--prompt '" + prompt + "' --max-new-tokens 6", dir);
  ASSERT_TRUE(flag.contains("prompt"));
  EXPECT_EQ(flag["prompt"]["text"].get<std::string>(), prompt);
  EXPECT_EQ(flag["plain"]["tokens"].size(), 6u);
  EXPECT_EQ(flag["plain"]["tokens"], flag["speculative"]["tokens"]);

  // A prompt file is read whole: the same text gives the same ids and output.
  std::ofstream(dir.File("prompt.py")) << prompt;
  const nlohmann::json file = RunDecode("--prompt-file " + dir.File("prompt.py") + " --max-new-tokens 6", dir);
  ASSERT_TRUE(file.contains("prompt"));
  EXPECT_EQ(file["prompt"]["tokens"], flag["prompt"]["tokens"]);
  EXPECT_EQ(file["plain"]["tokens"], flag["plain"]["tokens"]);
}

// --batch 3 without a prompt: the first three held-out prompts decoded together, each prompt's
// greedy speculative output equal to its plain output.
TEST(DecodeDemoTest, BatchOfHeldoutPromptsAgreesPerPrompt) {
  ScopedTempDir dir;
  const nlohmann::json out = RunDecode("--batch 3 --max-new-tokens 12", dir);
  ASSERT_TRUE(out.contains("prompts"));
  EXPECT_EQ(out["batch"].get<int>(), 3);
  ASSERT_EQ(out["prompts"].size(), 3u);
  for (const nlohmann::json& p : out["prompts"]) {
    EXPECT_EQ(p["prompt_tokens"].get<int>(), 96);  // held-out prompts are longer, cut to --prompt-tokens
    EXPECT_EQ(p["plain"].size(), 12u);
    EXPECT_EQ(p["plain"], p["speculative"]);
  }
  EXPECT_NE(out["prompts"][0]["plain"], out["prompts"][1]["plain"]);  // different prompts
  EXPECT_EQ(out["prompt"]["tokens"].size(), 96u);
  EXPECT_EQ(out["plain"]["tokens"], out["prompts"][0]["plain"]);
  EXPECT_TRUE(out["greedy_outputs_agree"].get<bool>());
  EXPECT_GT(out["speculative"]["mean_accepted_length"].get<double>(), 1.5);
  const std::string log = ReadFile(dir.File("log.txt"));
  EXPECT_THAT(log, HasSubstr("heldout_prompts.jsonl"));
  EXPECT_THAT(log, HasSubstr("prompt 2: 96 prompt tokens"));
  EXPECT_THAT(log, HasSubstr("greedy outputs identical for all 3 prompts"));

  // The reference loop decodes the same batch to the same tokens.
  ScopedTempDir host;
  const nlohmann::json host_out = RunDecode("--batch 3 --max-new-tokens 12 --loop host", host);
  ASSERT_TRUE(host_out.contains("prompts"));
  EXPECT_EQ(host_out["prompts"], out["prompts"]);
}

// A batch repeats a given prompt (here the random pair's default ids): every sequence decodes alike.
TEST(DecodeDemoTest, RandomPairBatchRepeatsThePrompt) {
  ScopedTempDir dir;
  const nlohmann::json out = RunDecode("--random-pair --batch 2 --max-new-tokens 8", dir);
  ASSERT_TRUE(out.contains("prompts"));
  EXPECT_EQ(out["batch"].get<int>(), 2);
  ASSERT_EQ(out["prompts"].size(), 2u);
  EXPECT_EQ(out["prompts"][0], out["prompts"][1]);
  EXPECT_EQ(out["prompts"][0]["plain"], out["prompts"][0]["speculative"]);
  EXPECT_EQ(out["prompts"][0]["prompt_tokens"].get<size_t>(), out["prompt"]["tokens"].size());
}

// Fewer held-out prompts than the batch: the file is cycled through; an empty file is refused,
// naming it.
TEST(DecodeDemoTest, BatchLargerThanTheHeldoutFileRepeatsItsPrompts) {
  ScopedTempDir dir;
  for (const char* model : {"tiny-v2-code", "tiny-v2-code-eagle3"}) {
    std::filesystem::create_directory_symlink(std::filesystem::absolute(kModels + "/" + model), dir.File(model));
  }
  std::ofstream(dir.File("heldout_prompts.jsonl")) << "{\"text\": \"def f(x):\\n    return x\"}\n";
  const nlohmann::json out = RunDecode("--models-dir " + dir.path() + " --batch 2 --max-new-tokens 4", dir);
  ASSERT_EQ(out["prompts"].size(), 2u);
  EXPECT_EQ(out["prompts"][0], out["prompts"][1]);
  std::ofstream(dir.File("heldout_prompts.jsonl"), std::ios::trunc) << "\n";
  EXPECT_THAT(RunFailing("--models-dir " + dir.path() + " --batch 2 --max-new-tokens 2", dir),
              HasSubstr(dir.File("heldout_prompts.jsonl") + " holds no prompt"));
}

TEST(DecodeDemoTest, AWiringFaultStillDecodesTheSameGreedyOutput) {
  ScopedTempDir dir;
  // Taps shifted by one layer: drafts are worse, the verified output is the same.
  const nlohmann::json shifted = RunDecode("--aux-layers 2,4,5 --max-new-tokens 16", dir);
  ASSERT_TRUE(shifted.contains("plain"));
  EXPECT_EQ(shifted["plain"]["tokens"], shifted["speculative"]["tokens"]);
  EXPECT_THAT(ReadFile(dir.File("log.txt")), HasSubstr("boundaries [3, 5, 6]"));
  EXPECT_THAT(RunFailing("--aux-layers 1,3 --max-new-tokens 2", dir),
              HasSubstr("--aux-layers: DraftModelOptions::aux_layer_ids_override [1, 3]"));
}

TEST(DecodeDemoTest, RandomPairGreedySpeculativeEqualsPlain) {
  ScopedTempDir dir;
  const nlohmann::json out = RunDecode("--random-pair --max-new-tokens 12 --topk 3 --steps 3 --draft-tokens 6", dir);
  ASSERT_TRUE(out.contains("plain"));
  EXPECT_EQ(out["plain"]["tokens"].size(), 12u);
  EXPECT_FALSE(out["plain"].contains("text"));  // no tokenizer
  EXPECT_EQ(out["plain"]["tokens"], out["speculative"]["tokens"]);
  EXPECT_EQ(out["speculative"]["acceptance_by_depth"].size(), 3u);
  EXPECT_GE(out["speculative"]["mean_accepted_length"].get<double>(), 1.0);
}

// --min-accept-len: a random pair accepts little, so an unreachable floor pauses drafting (the
// JSON counts the pauses and the steps that drafted nothing) and greedy output stays plain greedy.
TEST(DecodeDemoTest, MinAcceptLenPausesDrafting) {
  ScopedTempDir dir;
  const nlohmann::json out = RunDecode("--random-pair --max-new-tokens 48 --min-accept-len 50", dir);
  ASSERT_TRUE(out.contains("speculative"));
  EXPECT_EQ(out["plain"]["tokens"], out["speculative"]["tokens"]);
  EXPECT_GE(out["speculative"]["acceptance_pauses"].get<int>(), 1);
  EXPECT_GE(out["speculative"]["undrafted_steps"].get<int>(), 1);
  EXPECT_THAT(RunFailing("--random-pair --min-accept-len -1", dir), HasSubstr("--min-accept-len"));
}

// --kv-cache bf16: the target's latent cache in bf16 (the CPU reference rounds as the GPU does);
// speculative greedy still equals plain greedy, and the run says which cache it used.
TEST(DecodeDemoTest, Bf16KvCacheGreedySpeculativeEqualsPlain) {
  ScopedTempDir dir;
  const nlohmann::json out = RunDecode("--kv-cache bf16 --max-new-tokens 16", dir);
  ASSERT_TRUE(out.contains("plain"));
  EXPECT_EQ(out["kv_cache"].get<std::string>(), "bf16");
  EXPECT_EQ(out["plain"]["tokens"].size(), 16u);
  EXPECT_EQ(out["plain"]["tokens"], out["speculative"]["tokens"]);
  EXPECT_GT(out["speculative"]["mean_accepted_length"].get<double>(), 1.5);
  EXPECT_THAT(ReadFile(dir.File("log.txt")), HasSubstr("bf16 KV cache"));
  EXPECT_THAT(RunFailing("--kv-cache f16", dir), HasSubstr("--kv-cache must be bf16 or f32, got 'f16'"));
}

TEST(DecodeDemoTest, GoldenPairAtTp2) {
  ScopedTempDir dir;
  const std::string golden = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/";
  const nlohmann::json out = RunDecode("--target " + golden + "v2_qlora_yarn --draft " + golden +
                                           "draft_v2 --tokens 5,17,99,3 --max-new-tokens 10 --tp 2",
                                       dir);
  ASSERT_TRUE(out.contains("plain"));
  EXPECT_EQ(out["plain"]["tokens"].size(), 10u);
  EXPECT_EQ(out["plain"]["tokens"], out["speculative"]["tokens"]);
}

TEST(DecodeDemoTest, BadFlagsAreRefused) {
  ScopedTempDir dir;
  RunFailing("--topk 0", dir);
  EXPECT_THAT(RunFailing("--batch 0", dir), HasSubstr("--batch: expected an integer in [1, 1024], got \"0\""));
  EXPECT_THAT(RunFailing("--batch two", dir), HasSubstr("--batch: expected an integer in [1, 1024], got \"two\""));
  EXPECT_THAT(RunFailing("--prompt-tokens 0", dir), HasSubstr("--prompt-tokens: expected an integer"));
  RunFailing("--target /nonexistent", dir);
  EXPECT_THAT(RunFailing("--random-pair --prompt 'x = 1'", dir), HasSubstr("the random pair has no tokenizer"));
  EXPECT_THAT(RunFailing("--prompt 'x' --tokens 1,2", dir), HasSubstr("not both"));
  EXPECT_THAT(RunFailing("--prompt-file " + dir.File("none.txt"), dir),
              HasSubstr("--prompt-file " + dir.File("none.txt") + ": cannot open"));
  // A text prompt for a target without tokenizer.json names the missing file.
  const std::string golden = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/";
  EXPECT_THAT(RunFailing("--target " + golden + "v2_qlora_yarn --draft " + golden + "draft_v2 --prompt 'x = 1'", dir),
              HasSubstr(golden + "v2_qlora_yarn/tokenizer.json: no such file"));
}

}  // namespace
}  // namespace eagle3
