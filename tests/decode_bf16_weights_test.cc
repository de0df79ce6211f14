// eagle3-decode --weights: the weight dtype the run used is in its summary and JSON (the backend's
// preference without the flag: f32 on cpu), and refusals name the flag or the dtype.
#include <cstdlib>
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

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs eagle3-decode; returns its exit code and (in *log) what it printed.
int RunDecode(const std::string& args, const ScopedTempDir& dir, std::string* log) {
  const std::string command = std::string(EAGLE3_DECODE) + " " + args + " > " + dir.File("log.txt") + " 2>&1";
  const int rc = std::system(command.c_str());
  *log = ReadFile(dir.File("log.txt"));
  return rc;
}

TEST(DecodeWeightsTest, SummaryAndJsonNameTheWeightDtype) {
  ScopedTempDir dir;
  std::string log;
  for (const std::string flag : {"", " --weights f32"}) {
    ASSERT_EQ(RunDecode("--random-pair --max-new-tokens 4" + flag + " --json " + dir.File("out.json"), dir, &log), 0) << log;
    EXPECT_THAT(log, HasSubstr("on cpu, f32 weights")) << flag;
    std::ifstream in(dir.File("out.json"));
    EXPECT_EQ(nlohmann::json::parse(in)["weights"].get<std::string>(), "f32") << flag;
  }
}

TEST(DecodeWeightsTest, RefusalsNameTheFlagOrTheDtype) {
  ScopedTempDir dir;
  std::string log;
  EXPECT_NE(RunDecode("--random-pair --weights f16", dir, &log), 0);
  EXPECT_THAT(log, HasSubstr("--weights must be bf16 or f32, got 'f16'"));
  // The CPU reference takes f32 weights only: refused with the flags, before anything loads.
  EXPECT_NE(RunDecode("--random-pair --device cpu --weights bf16", dir, &log), 0);
  EXPECT_THAT(log, HasSubstr("--weights bf16 needs --device cuda: the CPU backend stores weights in f32"));
}

}  // namespace
}  // namespace eagle3
