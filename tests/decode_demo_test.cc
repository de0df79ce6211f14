// eagle3-decode end to end: the built-in random pair and the golden pair, greedy, at TP 1 and 2; the
// JSON it writes holds identical plain and speculative tokens.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

nlohmann::json RunDecode(const std::string& args, const ScopedTempDir& dir) {
  const std::string json = dir.File("out.json");
  const std::string command = std::string(EAGLE3_DECODE) + " " + args + " --json " + json + " > " + dir.File("log.txt") + " 2>&1";
  const int rc = std::system(command.c_str());
  std::ifstream log(dir.File("log.txt"));
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_EQ(rc, 0) << command << "\n" << text.str();
  std::ifstream in(json);
  return rc == 0 ? nlohmann::json::parse(in) : nlohmann::json();
}

TEST(DecodeDemoTest, BuiltInPairGreedySpeculativeEqualsPlain) {
  ScopedTempDir dir;
  const nlohmann::json out = RunDecode("--max-new-tokens 12 --topk 3 --steps 3 --draft-tokens 6", dir);
  ASSERT_TRUE(out.contains("plain"));
  EXPECT_EQ(out["plain"]["tokens"].size(), 12u);
  EXPECT_EQ(out["plain"]["tokens"], out["speculative"]["tokens"]);
  EXPECT_EQ(out["speculative"]["acceptance_by_depth"].size(), 3u);
  EXPECT_GE(out["speculative"]["mean_accepted_length"].get<double>(), 1.0);
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
  const std::string command = std::string(EAGLE3_DECODE) + " --topk 0 > " + dir.File("log.txt") + " 2>&1";
  EXPECT_NE(std::system(command.c_str()), 0);
  const std::string missing = std::string(EAGLE3_DECODE) + " --target /nonexistent > " + dir.File("log.txt") + " 2>&1";
  EXPECT_NE(std::system(missing.c_str()), 0);
}

}  // namespace
}  // namespace eagle3
