// The tools with the drafters that run DeepSeek layers, end to end on the golden fixtures:
// eagle3-inspect draft with an MLA EAGLE-3 draft (picked by its architectures) and with --mtp writes
// the draft logits and the tree the decode loop drafts, equal to the fixtures' (the target runs here,
// so its taps are this build's, within 1e-6 of the stored ones); eagle3-decode --draft (MLA) and
// --mtp decode greedily to the plain output, through the device step and the host loop; the flag
// combinations they refuse; eagle3-inspect accuracy with an MLA draft and with --mtp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "tool_run.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

std::string Golden(const std::string& name) { return std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + name; }

std::string Join(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

template <typename T>
std::vector<T> Values(const SafetensorsFile& file, const std::string& name) {
  auto v = file.View(name);
  EXPECT_TRUE(v.ok()) << name << ": " << v.status();
  if (!v.ok()) return {};
  return std::vector<T>(v->data_as<T>(), v->data_as<T>() + v->numel());
}

// Max |got - want| over the largest |want|, over `n` values.
double RelError(const float* got, const float* want, int64_t n) {
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return diff / scale;
}

// eagle3-inspect draft over the target fixture's prompt, tree k3_s3_n8, against `tree_file`: the
// last draft_logits row is the extend pass's root_logits, the tree that golden tree.
void ExpectInspectDraftMatches(const std::string& target, const std::string& drafter_flags,
                               const std::string& tree_file, int64_t draft_vocab) {
  auto tree = SafetensorsFile::Open(tree_file);
  ASSERT_TRUE(tree.ok()) << tree.status();
  const std::vector<int64_t> prompt = Values<int64_t>(**tree, "prompt");
  const int64_t t = static_cast<int64_t>(prompt.size());
  ScopedTempDir dir;
  const std::string out = dir.File("draft.safetensors");
  const ToolRun run = RunTool(EAGLE3_INSPECT,
                              "draft --target " + Golden(target) + " " + drafter_flags + " --tokens " + Join(prompt) +
                                  " --topk 3 --steps 3 --draft-tokens 8 --out " + out,
                              dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  auto file = SafetensorsFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status();
  auto logits = (*file)->View("draft_logits");
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->shape(), (Shape{t, draft_vocab}));
  const std::vector<float> root_logits = Values<float>(**tree, "root_logits");
  ASSERT_EQ(static_cast<int64_t>(root_logits.size()), draft_vocab);
  EXPECT_LT(RelError(logits->data_as<float>() + (t - 1) * draft_vocab, root_logits.data(), draft_vocab), 1e-4);
  EXPECT_EQ(Values<int64_t>(**file, "tree_tokens"), Values<int64_t>(**tree, "k3_s3_n8.tree_tokens"));
  EXPECT_EQ(Values<int32_t>(**file, "tree_parents"), Values<int32_t>(**tree, "k3_s3_n8.tree_parents"));
}

TEST(InspectDraftersTest, MlaDraftWritesTheGoldenExtendAndTree) {
  ExpectInspectDraftMatches("k25_int4", "--draft " + Golden("mla_draft_k25"),
                            Golden("mla_draft_k25") + "/tree.safetensors", 400);
}

TEST(InspectDraftersTest, MtpWritesTheGoldenExtendAndTree) {
  ExpectInspectDraftMatches("v3_mtp", "--mtp", Golden("v3_mtp") + "/mtp_tree.safetensors", 130);
  // Every row but the last (whose token is the root) is a row of the fixture's first step.
  auto tree = SafetensorsFile::Open(Golden("v3_mtp") + "/mtp_tree.safetensors");
  ASSERT_TRUE(tree.ok());
  const std::vector<int64_t> prompt = Values<int64_t>(**tree, "prompt");
  ScopedTempDir dir;
  const std::string out = dir.File("mtp.safetensors");
  const ToolRun run = RunTool(EAGLE3_INSPECT,
                              "draft --target " + Golden("v3_mtp") + " --mtp --tokens " + Join(prompt) +
                                  " --out " + out + " --json " + dir.File("report.json"),
                              dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, HasSubstr("after model.norm"));
  auto file = SafetensorsFile::Open(out);
  auto expected = SafetensorsFile::Open(Golden("v3_mtp") + "/mtp_expected.safetensors");
  ASSERT_TRUE(file.ok() && expected.ok());
  const std::vector<float> got = Values<float>(**file, "draft_logits");
  const std::vector<float> want = Values<float>(**expected, "logits_step0");
  const int64_t rows = static_cast<int64_t>(prompt.size()) - 1;
  ASSERT_GE(static_cast<int64_t>(got.size()), rows * 130);
  ASSERT_GE(static_cast<int64_t>(want.size()), rows * 130);
  EXPECT_LT(RelError(got.data(), want.data(), rows * 130), 1e-4);
  const nlohmann::json report = nlohmann::json::parse(ReadFile(dir.File("report.json")));
  EXPECT_TRUE(report["settings"]["mtp"].get<bool>());
  EXPECT_FALSE(report["settings"].contains("draft"));
}

TEST(InspectDraftersTest, RefusesMtpMisuse) {
  ScopedTempDir dir;
  // Two drafters.
  ToolRun run = RunTool(EAGLE3_INSPECT,
                        "draft --target " + Golden("v3_mtp") + " --mtp --draft " + Golden("mla_draft_k25") +
                            " --tokens 1,2,3 --out " + dir.File("x.safetensors"),
                        dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("--draft and --mtp name two drafters"));
  // A target without an MTP module.
  run = RunTool(EAGLE3_INSPECT,
                "draft --target " + Golden("v3_noaux") + " --mtp --tokens 1,2,3 --out " + dir.File("y.safetensors"),
                dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("num_nextn_predict_layers"));
  // --mtp on a subcommand that does not take it.
  run = RunTool(EAGLE3_INSPECT, "target --model " + Golden("v3_mtp") + " --mtp --tokens 1,2 --out " + dir.File("z"),
                dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("--mtp applies to the check, draft and accuracy subcommands only"));
  // --mtp with --aux-layers (the module reads no layer taps).
  run = RunTool(EAGLE3_INSPECT,
                "accuracy --target " + Golden("v3_mtp") + " --mtp --aux-layers 0,1 --tokens 1,2,3,4,5,6,7,8", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("--aux-layers and --mtp"));
  // Both --text-file and --tokens, or neither.
  run = RunTool(EAGLE3_INSPECT, "accuracy --target " + Golden("v3_mtp") + " --mtp", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("one of --text-file and --tokens"));
}

// The argmax of `n` values.
int64_t ArgMax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

// eagle3-inspect accuracy with a drafter that runs DeepSeek layers, against `target` and `draft`'s
// own outputs on the same tokens: depth 1 at start p is the draft row (tap p, token p + 1), which is
// row p of `draft`'s draft_logits, scored against the target's greedy token at p + 1 (the argmax of
// `target`'s logits row p + 1). The vocabularies of both fixtures are the target's (no d2t).
void ExpectAccuracyMatchesDraftRows(const std::string& target, const std::string& drafter_flags, int64_t vocab) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % vocab);
  const int64_t t = static_cast<int64_t>(tokens.size());
  ScopedTempDir dir;
  ToolRun run = RunTool(EAGLE3_INSPECT,
                        "target --model " + Golden(target) + " --tokens " + Join(tokens) + " --out " +
                            dir.File("target.safetensors"),
                        dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  run = RunTool(EAGLE3_INSPECT,
                "draft --target " + Golden(target) + " " + drafter_flags + " --tokens " + Join(tokens) + " --out " +
                    dir.File("draft.safetensors"),
                dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  run = RunTool(EAGLE3_INSPECT,
                "accuracy --target " + Golden(target) + " " + drafter_flags + " --tokens " + Join(tokens) +
                    " --depth 3 --out " + dir.File("accuracy.json"),
                dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  auto target_file = SafetensorsFile::Open(dir.File("target.safetensors"));
  auto draft_file = SafetensorsFile::Open(dir.File("draft.safetensors"));
  ASSERT_TRUE(target_file.ok() && draft_file.ok());
  const std::vector<float> target_logits = Values<float>(**target_file, "logits");
  const std::vector<float> draft_logits = Values<float>(**draft_file, "draft_logits");
  ASSERT_EQ(static_cast<int64_t>(target_logits.size()), t * vocab);
  ASSERT_EQ(static_cast<int64_t>(draft_logits.size()), t * vocab);
  int64_t agree = 0;
  for (int64_t p = 0; p + 1 < t; ++p) {
    agree += ArgMax(draft_logits.data() + p * vocab, vocab) == ArgMax(target_logits.data() + (p + 1) * vocab, vocab);
  }
  const nlohmann::json out = nlohmann::json::parse(ReadFile(dir.File("accuracy.json")));
  ASSERT_EQ(out["depths"].size(), 3u);
  EXPECT_EQ(out["depths"][0]["agree"].get<int64_t>(), agree);
  for (int d = 1; d <= 3; ++d) EXPECT_EQ(out["depths"][d - 1]["count"].get<int64_t>(), t - d);
  EXPECT_EQ(out["tokens"].get<int64_t>(), t);
}

TEST(InspectDraftersTest, AccuracyWithAnMlaDraftScoresItsDraftRows) {
  ExpectAccuracyMatchesDraftRows("k25_int4", "--draft " + Golden("mla_draft_k25"), 400);
}

TEST(InspectDraftersTest, AccuracyWithMtpScoresItsDraftRows) {
  ExpectAccuracyMatchesDraftRows("v3_mtp", "--mtp", 130);
  ScopedTempDir dir;
  const ToolRun run = RunTool(EAGLE3_INSPECT,
                              "accuracy --target " + Golden("v3_mtp") + " --mtp --tokens 3,9,27,81,113,5,15 --depth 2 "
                              "--json " + dir.File("report.json"),
                              dir);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_THAT(run.log, HasSubstr("after model.norm"));
  const nlohmann::json report = nlohmann::json::parse(ReadFile(dir.File("report.json")));
  EXPECT_TRUE(report["settings"]["mtp"].get<bool>());
  EXPECT_FALSE(report["settings"].contains("draft"));
  EXPECT_TRUE(report["mtp"].get<bool>());
}

nlohmann::json Decode(const std::string& args, const ScopedTempDir& dir) {
  const ToolRun run = RunTool(EAGLE3_DECODE, args + " --json " + dir.File("out.json"), dir);
  EXPECT_EQ(run.exit_code, 0) << args << "\n" << run.log;
  return run.exit_code == 0 ? nlohmann::json::parse(ReadFile(dir.File("out.json"))) : nlohmann::json();
}

TEST(DecodeDraftersTest, MlaDraftAndMtpDecodeTheGreedyOutput) {
  struct Case {
    std::string args;
    std::string loop;
  };
  const std::string mla = "--target " + Golden("k25_int4") + " --draft " + Golden("mla_draft_k25_eagle31");
  const std::string mtp = "--target " + Golden("v3_mtp") + " --mtp";
  for (const Case& c : {Case{mla, "device"}, Case{mla, "host"}, Case{mtp, "device"}, Case{mtp, "host"}}) {
    SCOPED_TRACE(c.args + " --loop " + c.loop);
    ScopedTempDir dir;
    const nlohmann::json out = Decode(c.args + " --tokens 5,17,99,3,42 --max-new-tokens 10 --loop " + c.loop, dir);
    ASSERT_TRUE(out.contains("plain"));
    EXPECT_TRUE(out["greedy_outputs_agree"].get<bool>());
    EXPECT_EQ(out["plain"]["tokens"], out["speculative"]["tokens"]);
    EXPECT_EQ(out["plain"]["tokens"].size(), 10u);
    EXPECT_EQ(out["mtp"].get<bool>(), c.args == mtp);
  }
}

TEST(DecodeDraftersTest, RefusesMtpMisuse) {
  ScopedTempDir dir;
  ToolRun run = RunTool(EAGLE3_DECODE,
                        "--target " + Golden("v3_mtp") + " --mtp --draft " + Golden("mla_draft_k25") + " --tokens 1,2",
                        dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("give --target and no --draft"));
  run = RunTool(EAGLE3_DECODE, "--mtp --tokens 1,2", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("give --target and no --draft"));
  run = RunTool(EAGLE3_DECODE, "--target " + Golden("v3_mtp") + " --mtp --aux-layers 0,1 --tokens 1,2", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("--aux-layers"));
  // A target without an MTP module: refused when the drafter is made, naming the key.
  run = RunTool(EAGLE3_DECODE, "--target " + Golden("v3_noaux") + " --mtp --tokens 1,2 --max-new-tokens 2", dir);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.log, HasSubstr("num_nextn_predict_layers"));
}

}  // namespace
}  // namespace eagle3
