// The example programs' command lines (issue 19): --help / -h of eagle3-decode, eagle3-inspect and
// every subcommand answers at once with the usage and exit 0; wrong model directories and
// --weights bf16 on the CPU are refused first, in the flags' terms; the JSON of eagle3-decode and
// of every eagle3-inspect subcommand parses and opens with the run report (tool, command, version,
// settings echoing the flags, device, seed, seconds per phase), accuracy's --tokens-max report
// included; the default --models-dir follows $EAGLE3_MODELS_DIR and an installed layout.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/safetensors.h"
#include "eagle3/version.h"
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

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// `eagle3-inspect args`, which must succeed, and the JSON it wrote to `json` (empty when it
// failed); its output goes to `log` when given.
nlohmann::json InspectJson(const std::string& args, const std::string& json,
                           const ScopedTempDir& dir, std::string* log = nullptr) {
  const ToolRun run = RunTool(EAGLE3_INSPECT, args + " --json " + json, dir);
  EXPECT_EQ(run.exit_code, 0) << args << "\n" << run.log;
  if (log != nullptr) *log = run.log;
  return run.exit_code == 0 ? ReadJson(json) : nlohmann::json::object();
}

// The run report every tool's JSON opens with: `tool` and `command` (null: none), the library's
// version, a settings object, the device (null: none ran), the seed (null: nothing drawn) and
// each of `phases` in seconds (or, per run, an object of phases).
void ExpectRunReport(const nlohmann::json& j, const std::string& tool,
                     const nlohmann::json& command, const nlohmann::json& device,
                     const nlohmann::json& seed, const std::vector<std::string>& phases) {
  for (const char* key : {"tool", "command", "version", "settings", "device", "seed", "seconds"}) {
    ASSERT_TRUE(j.contains(key)) << key << " in " << j.dump();
  }
  EXPECT_EQ(j["tool"], tool);
  EXPECT_EQ(j["command"], command);
  EXPECT_EQ(j["version"], EAGLE3_VERSION_STRING);
  EXPECT_TRUE(j["settings"].is_object()) << j.dump();
  EXPECT_EQ(j["device"], device);
  EXPECT_EQ(j["seed"], seed);
  ASSERT_TRUE(j["seconds"].is_object()) << j.dump();
  EXPECT_EQ(j["seconds"].size(), phases.size()) << j["seconds"].dump();
  for (const std::string& phase : phases) {
    ASSERT_TRUE(j["seconds"].contains(phase)) << phase << " in " << j["seconds"].dump();
    const nlohmann::json& t = j["seconds"][phase];
    // eagle3-decode times each run's phases apart.
    for (const nlohmann::json& seconds : t.is_object() ? t : nlohmann::json::array({t})) {
      EXPECT_GE(seconds.get<double>(), 0) << phase << ": " << t.dump();
    }
  }
}

const nlohmann::json kCpu = {{"backend", "cpu"}};

// The settings of a model-running inspect subcommand on the CPU with default weights and
// positions, writing `out` and `json`, plus `own`: the subcommand's.
nlohmann::json RunSettings(const std::string& out, const std::string& json, nlohmann::json own) {
  own.update({{"device", "cpu"},
              {"weights", "f32"},
              {"allow_long_context", false},
              {"out", out},
              {"json", json}});
  return own;
}

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
  for (const std::string sub : {"target", "draft", "check", "accuracy"}) {
    EXPECT_THAT(RunTool(inspect, sub + " --help", dir).log,
                HasSubstr("--json FILE           also write the run report"))
        << sub;
  }
  EXPECT_THAT(RunTool(inspect, "accuracy --help", dir).log,
              HasSubstr("--out FILE            the same JSON as --json"));
  EXPECT_THAT(RunTool(decode, "--help", dir).log, HasSubstr("--json FILE: write the run report"));
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
  const nlohmann::json j =
      InspectJson("check --target " + kTarget + " --draft " + kDraft, json, dir);
  // Reads configs and headers only: no device, nothing random.
  ExpectRunReport(j, "eagle3-inspect", "check", nullptr, nullptr, {"check"});
  EXPECT_EQ(j["settings"], nlohmann::json({{"target", kTarget},
                                           {"draft", kDraft},
                                           {"convention", "output"},
                                           {"json", json}}));
  EXPECT_EQ(j["target"], kTarget);
  EXPECT_EQ(j["draft"], kDraft);
  EXPECT_EQ(j["convention"], "output");
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_FALSE(j["facts"].empty());
  EXPECT_TRUE(j["warnings"].is_array());
  EXPECT_TRUE(j["problems"].empty());
}

// target --json: the run report and what --out received, each tensor's name, dtype and shape.
TEST(InspectCliTest, TargetWritesJson) {
  ScopedTempDir dir;
  const std::string out = dir.File("target.safetensors"), json = dir.File("target.json");
  const nlohmann::json j = InspectJson("target --model " + kTarget +
                                           " --tokens 5,17,99 --tp 2 --attention absorbed" +
                                           " --out " + out,
                                       json, dir);
  ExpectRunReport(j, "eagle3-inspect", "target", kCpu, nullptr, {"load", "forward", "write"});
  EXPECT_EQ(j["settings"], RunSettings(out, json,
                                       {{"model", kTarget},
                                        {"tokens", {5, 17, 99}},
                                        {"tp", 2},
                                        {"residual", "replicated"},
                                        {"attention", "absorbed"}}));
  EXPECT_EQ(j["out"], out);
  // Every tensor of the file, as written.
  auto file = SafetensorsFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(j["tensors"].size(), (*file)->tensors().size());
  ASSERT_EQ(j["tensors"].size(), 2u + 9u);  // tokens, logits, boundary.0..8
  const nlohmann::json three = nlohmann::json::array({3});  // {3} alone would be the number 3
  EXPECT_EQ(j["tensors"][0],
            nlohmann::json({{"name", "tokens"}, {"dtype", "i64"}, {"shape", three}}));
  EXPECT_EQ(j["tensors"][1],
            nlohmann::json({{"name", "logits"}, {"dtype", "f32"}, {"shape", {3, 8192}}}));
  for (const nlohmann::json& t : j["tensors"]) {
    auto view = (*file)->View(t["name"].get<std::string>());
    ASSERT_TRUE(view.ok()) << t.dump();
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(),
              std::vector<int64_t>(view->shape().dims().begin(), view->shape().dims().end()));
  }
  EXPECT_EQ(j["tensors"][10]["name"], "boundary.8");
}

// draft --json: as target's, with the draft's settings and phases.
TEST(InspectCliTest, DraftWritesJson) {
  ScopedTempDir dir;
  const std::string out = dir.File("draft.safetensors"), json = dir.File("draft.json");
  const nlohmann::json j = InspectJson("draft --target " + kTarget + " --draft " + kDraft +
                                           " --tokens 5,17,99,3 --topk 2 --steps 2 --draft-tokens 5"
                                           " --convention output --out " + out,
                                       json, dir);
  ExpectRunReport(j, "eagle3-inspect", "draft", kCpu, nullptr,
                  {"load", "target", "draft", "write"});
  EXPECT_EQ(j["settings"], RunSettings(out, json,
                                       {{"target", kTarget},
                                        {"draft", kDraft},
                                        {"tokens", {5, 17, 99, 3}},
                                        {"topk", 2},
                                        {"steps", 2},
                                        {"draft_tokens", 5},
                                        {"convention", "output"}}));
  EXPECT_EQ(j["out"], out);
  std::vector<std::string> names;
  for (const nlohmann::json& t : j["tensors"]) names.push_back(t["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"tokens", "draft_logits", "tree_tokens",
                                             "tree_parents", "tree_positions", "tree_mask"}));
  EXPECT_EQ(j["tensors"][5]["shape"], nlohmann::json({5, 5}));
  EXPECT_EQ(j["tensors"][1]["shape"][0], 4);
}

TEST(InspectCliTest, AccuracySaysWhenTokensMaxCutTheText) {
  ScopedTempDir dir;
  const std::string text = dir.File("text.py");
  {
    std::ofstream out(text);
    for (int i = 0; i < 20; ++i) out << "def f" << i << "(x):\n    return x + " << i << "\n\n";
  }
  const std::string out = dir.File("acc.json"), json = dir.File("acc-report.json");
  std::string log;
  const nlohmann::json j = InspectJson("accuracy --target " + kTarget + " --draft " + kDraft +
                                           " --text-file " + text + " --tokens-max 24 --depth 2" +
                                           " --out " + out,
                                       json, dir, &log);
  EXPECT_THAT(log, HasSubstr("read 24 of "));
  EXPECT_THAT(log, HasSubstr("(--tokens-max 24; a larger value reads more)"));
  // --out receives the same JSON as --json.
  EXPECT_EQ(ReadFile(out), ReadFile(json));
  ExpectRunReport(j, "eagle3-inspect", "accuracy", kCpu, nullptr,
                  {"tokenize", "load", "target", "draft"});
  EXPECT_EQ(j["settings"], RunSettings(out, json,
                                       {{"target", kTarget},
                                        {"draft", kDraft},
                                        {"text_file", text},
                                        {"tokens_max", 24},
                                        {"depth", 2},
                                        {"aux_layers", nullptr},
                                        {"max_input_bytes", 1048576},
                                        {"convention", "output"}}));
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
  const nlohmann::json j = ReadJson(json);
  ExpectRunReport(j, "eagle3-decode", nullptr, kCpu, 7, {"plain", "speculative"});
  const nlohmann::json& s = j["settings"];
  EXPECT_EQ(s["device"], "cpu");
  EXPECT_EQ(s["random_pair"], true);
  EXPECT_EQ(s["topk"], 2);
  EXPECT_EQ(s["steps"], 2);
  EXPECT_EQ(s["draft_tokens"], 4);
  EXPECT_NEAR(s["temperature"].get<double>(), 0.5, 1e-6);
  EXPECT_NEAR(s["top_p"].get<double>(), 0.9, 1e-6);
  EXPECT_EQ(s["seed"], 7);
  EXPECT_EQ(s["max_new_tokens"], 4);
  EXPECT_EQ(s["json"], json);
  // Defaults are there too.
  EXPECT_EQ(s["batch"], 1);
  EXPECT_EQ(s["tp"], 1);
  EXPECT_EQ(s["loop"], "device");
  EXPECT_EQ(s["speculate_up_to"], "all");
  EXPECT_EQ(s["weights"], "f32");
  EXPECT_EQ(s["prompt"], nullptr);
  for (const std::string run_name : {"plain", "speculative"}) {
    const nlohmann::json& t = j["seconds"][run_name];
    EXPECT_GT(t["load"].get<double>(), 0) << run_name;
    // The target's weights within the load: their checks, host reads and device copies.
    const double weights = t["target_weights"].get<double>();
    EXPECT_GT(t["target_weights_read"].get<double>(), 0) << run_name;
    EXPECT_GE(weights, t["target_weights_check"].get<double>() + t["target_weights_read"].get<double>() +
                           t["target_weights_device"].get<double>())
        << run_name;
    EXPECT_LE(weights, t["load"].get<double>()) << run_name;
    const double generate = t["generate"].get<double>(), prefill = t["prefill"].get<double>();
    EXPECT_GT(generate, 0) << run_name;
    EXPECT_GT(prefill, 0) << run_name;
    EXPECT_LE(prefill, generate) << run_name;
    EXPECT_GE(t["decode"].get<double>(), 0) << run_name;
    EXPECT_NEAR(t["decode"].get<double>(), generate - prefill, 1e-5 * generate + 1e-6) << run_name;
  }
  EXPECT_THAT(run.log, HasSubstr("seconds of prefill / decode: plain "));
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
