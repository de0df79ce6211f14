// eagle3-decode --tp / --comm: the run's summary and JSON name the collectives the ranks used (the
// in-process group on the CPU), and a --comm value other than auto, nccl or staged is refused.
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

// Runs eagle3-decode; returns its exit code and (in *log) what it printed.
int RunDecode(const std::string& args, const ScopedTempDir& dir, std::string* log) {
  const std::string command = std::string(EAGLE3_DECODE) + " " + args + " > " + dir.File("log.txt") + " 2>&1";
  const int rc = std::system(command.c_str());
  std::ifstream in(dir.File("log.txt"));
  std::stringstream text;
  text << in.rdbuf();
  *log = text.str();
  return rc;
}

TEST(DecodeCommTest, TpRunNamesItsCollectives) {
  ScopedTempDir dir;
  std::string log;
  ASSERT_EQ(RunDecode("--random-pair --max-new-tokens 4 --tp 2 --comm staged --json " + dir.File("out.json"), dir, &log),
            0)
      << log;
  EXPECT_THAT(log, HasSubstr("collectives of tp 2: in-process"));
  std::ifstream in(dir.File("out.json"));
  const nlohmann::json json = nlohmann::json::parse(in);
  EXPECT_EQ(json["tp"].get<int>(), 2);
  EXPECT_EQ(json["comm"].get<std::string>(), "in-process");
}

TEST(DecodeCommTest, UnknownCommIsRefusedNamingTheFlag) {
  ScopedTempDir dir;
  std::string log;
  EXPECT_NE(RunDecode("--random-pair --comm mpi", dir, &log), 0);
  EXPECT_THAT(log, HasSubstr("--comm mpi"));
}

}  // namespace
}  // namespace eagle3
