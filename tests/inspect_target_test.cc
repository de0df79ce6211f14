// eagle3-inspect target end to end: the file it writes for a golden fixture's prompt holds the
// golden logits and boundaries.
#include <cmath>
#include <cstdlib>
#include <string>

#include "eagle3/safetensors.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

TEST(InspectTargetTest, WritesTheGoldenOutputs) {
  const std::string model = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2_qlora_yarn";
  auto expected = SafetensorsFile::Open(model + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  auto tokens = (*expected)->View("tokens");
  ASSERT_TRUE(tokens.ok());
  std::string list;
  for (int64_t i = 0; i < tokens->numel(); ++i) {
    list += (i ? "," : "") + std::to_string(tokens->data_as<int64_t>()[i]);
  }
  ScopedTempDir dir;
  const std::string out = dir.File("dump.safetensors");
  const std::string command = std::string(EAGLE3_INSPECT) + " target --model " + model + " --tokens " + list +
                              " --tp 2 --residual sharded --out " + out + " > " + dir.File("log.txt");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto dump = SafetensorsFile::Open(out);
  ASSERT_TRUE(dump.ok()) << dump.status();
  for (const TensorInfo& info : (*expected)->tensors()) {
    if (info.name.rfind("router.", 0) == 0) continue;  // routing diagnostics are not part of the dump
    auto want = (*expected)->View(info.name);
    auto got = (*dump)->View(info.name);
    ASSERT_TRUE(want.ok() && got.ok()) << info.name << ": " << got.status();
    ASSERT_EQ(got->shape(), want->shape()) << info.name;
    if (info.dtype == DType::kI64) {
      for (int64_t i = 0; i < want->numel(); ++i) EXPECT_EQ(got->data_as<int64_t>()[i], want->data_as<int64_t>()[i]);
      continue;
    }
    double diff = 0, scale = 1e-30;
    for (int64_t i = 0; i < want->numel(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(got->data_as<float>()[i] - want->data_as<float>()[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(want->data_as<float>()[i])));
    }
    EXPECT_LT(diff / scale, 1e-4) << info.name;
  }
  const std::string bad = std::string(EAGLE3_INSPECT) + " target --model " + model + " --tokens 1,x --out " + out +
                          " 2> " + dir.File("err.txt");
  EXPECT_NE(std::system(bad.c_str()), 0);
}

}  // namespace
}  // namespace eagle3
