// eagle3-inspect accuracy end to end on the committed trained pair (models/): the draft's
// teacher-forced top-1 agreement with the target's greedy token is high with the config's taps and
// clearly lower with a wiring fault (taps shifted by one layer, the embedding boundary swapped in);
// invalid --aux-layers are refused naming the flag. Also DraftModelOptions::aux_layer_ids_override,
// the option the flag sets.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

const std::string kModels = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models";
const std::string kTarget = kModels + "/tiny-v2-code";
const std::string kDraft = kModels + "/tiny-v2-code-eagle3";

// Python written for this test (not from the training corpus).
constexpr char kText[] = R"py("""Small helpers for reading and summarizing tabular text files."""

import os
import sys
from collections import defaultdict


def read_rows(path, sep=","):
    """Return the rows of the file at path as lists of strings."""
    rows = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            rows.append(line.split(sep))
    return rows


def count_by_key(rows, index=0):
    """Count how many rows share each value of the column at index."""
    counts = defaultdict(int)
    for row in rows:
        if index < len(row):
            counts[row[index]] += 1
    return dict(counts)


class Summary(object):
    def __init__(self, name, values=None):
        self.name = name
        self.values = list(values or [])

    def add(self, value):
        self.values.append(value)

    def mean(self):
        if not self.values:
            return 0.0
        return sum(self.values) / len(self.values)

    def __repr__(self):
        return "Summary(%r, n=%d)" % (self.name, len(self.values))


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    for path in argv:
        if not os.path.exists(path):
            print("missing: %s" % path)
            continue
        rows = read_rows(path)
        print(path, len(rows), count_by_key(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
)py";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ToolRun {
  int rc = -1;
  std::string log;
  nlohmann::json out;
};

ToolRun Accuracy(const ScopedTempDir& dir, const std::string& extra) {
  const std::string text = dir.File("text.py");
  if (ReadFile(text).empty()) std::ofstream(text) << kText;
  const std::string json = dir.File("accuracy.json");
  std::remove(json.c_str());
  const std::string command = std::string(EAGLE3_INSPECT) + " accuracy --target " + kTarget + " --draft " + kDraft +
                              " --text-file " + text + " --depth 3 --out " + json + " " + extra + " > " +
                              dir.File("log.txt") + " 2>&1";
  ToolRun run;
  run.rc = std::system(command.c_str());
  run.log = ReadFile(dir.File("log.txt"));
  if (run.rc == 0) run.out = nlohmann::json::parse(ReadFile(json));
  return run;
}

double DepthOne(const ToolRun& run) { return run.out["depths"][0]["agreement"].get<double>(); }

TEST(InspectAccuracyTest, TheConfigTapsAgreeAndEveryDepthIsCounted) {
  ScopedTempDir dir;
  const ToolRun run = Accuracy(dir, "");
  ASSERT_EQ(run.rc, 0) << run.log;
  EXPECT_EQ(run.out["boundaries"], nlohmann::json({2, 4, 5}));
  const int64_t t = run.out["tokens"].get<int64_t>();
  EXPECT_GT(t, 300);
  ASSERT_EQ(run.out["depths"].size(), 3u);
  for (int d = 1; d <= 3; ++d) {
    const nlohmann::json& row = run.out["depths"][d - 1];
    EXPECT_EQ(row["depth"].get<int>(), d);
    EXPECT_EQ(row["count"].get<int64_t>(), t - d);  // starts p = 0 .. T-1-d
    EXPECT_NEAR(row["agreement"].get<double>(),
                static_cast<double>(row["agree"].get<int64_t>()) / static_cast<double>(t - d), 1e-5);
    // Measured 0.72 / 0.72 / 0.73: the draft was trained with 5 unrolled steps.
    EXPECT_GT(row["agreement"].get<double>(), 0.6) << "depth " << d << "\n" << run.log;
  }
  EXPECT_GT(DepthOne(run), 0.3);
  EXPECT_THAT(run.log, HasSubstr("boundaries [2, 4, 5]"));
}

TEST(InspectAccuracyTest, AWiringFaultCostsAgreement) {
  ScopedTempDir dir;
  const ToolRun right = Accuracy(dir, "");
  ASSERT_EQ(right.rc, 0) << right.log;
  // The config's ids given explicitly, and the same boundaries in vLLM's convention: identical.
  const ToolRun same = Accuracy(dir, "--aux-layers 1,3,4");
  const ToolRun same_input = Accuracy(dir, "--aux-layers 2,4,5 --convention input");
  ASSERT_EQ(same.rc, 0) << same.log;
  ASSERT_EQ(same_input.rc, 0) << same_input.log;
  EXPECT_EQ(same.out["depths"], right.out["depths"]);
  EXPECT_EQ(same_input.out["depths"], right.out["depths"]);

  // Measured on this text: 0.724 with the right taps, 0.673 shifted by one layer, 0.651 with the
  // embedding output in place of boundary 2.
  const ToolRun shifted = Accuracy(dir, "--aux-layers 2,4,5");
  ASSERT_EQ(shifted.rc, 0) << shifted.log;
  EXPECT_EQ(shifted.out["boundaries"], nlohmann::json({3, 5, 6}));
  EXPECT_LT(DepthOne(shifted), DepthOne(right) - 0.03) << shifted.log;
  const ToolRun embedding = Accuracy(dir, "--aux-layers 0,4,5 --convention input");
  ASSERT_EQ(embedding.rc, 0) << embedding.log;
  EXPECT_EQ(embedding.out["boundaries"], nlohmann::json({0, 4, 5}));
  EXPECT_LT(DepthOne(embedding), DepthOne(right) - 0.05) << embedding.log;
}

TEST(InspectAccuracyTest, InvalidAuxLayersAreRefusedNamingTheFlag) {
  ScopedTempDir dir;
  const ToolRun out_of_range = Accuracy(dir, "--aux-layers 1,3,8");
  EXPECT_NE(out_of_range.rc, 0);
  EXPECT_THAT(out_of_range.log, HasSubstr("--aux-layers"));
  EXPECT_THAT(out_of_range.log, HasSubstr("aux layer id [2] = 8 is out of range [0, 7]"));
  const ToolRun too_few = Accuracy(dir, "--aux-layers 1,3");
  EXPECT_NE(too_few.rc, 0);
  EXPECT_THAT(too_few.log, HasSubstr("--aux-layers"));
  EXPECT_THAT(too_few.log, HasSubstr("2 x 256 = 512 does not match the draft fc input width 768"));
  const ToolRun duplicate = Accuracy(dir, "--aux-layers 1,1,3");
  EXPECT_NE(duplicate.rc, 0);
  EXPECT_THAT(duplicate.log, HasSubstr("duplicate boundaries"));
  const ToolRun not_a_number = Accuracy(dir, "--aux-layers 1,x,3");
  EXPECT_NE(not_a_number.rc, 0);
  EXPECT_THAT(not_a_number.log, HasSubstr("--aux-layers: 'x' is not an integer"));
  const ToolRun other_command = [&] {
    ToolRun r;
    const std::string command = std::string(EAGLE3_INSPECT) + " check --target " + kTarget + " --draft " + kDraft +
                                " --aux-layers 1,3,4 > " + dir.File("check.txt") + " 2>&1";
    r.rc = std::system(command.c_str());
    r.log = ReadFile(dir.File("check.txt"));
    return r;
  }();
  EXPECT_NE(other_command.rc, 0);
  EXPECT_THAT(other_command.log, HasSubstr("--aux-layers applies to the accuracy subcommand only"));
}

TEST(InspectAccuracyTest, MissingTextFileAndTooShortTextAreRefused) {
  ScopedTempDir dir;
  const std::string missing = std::string(EAGLE3_INSPECT) + " accuracy --target " + kTarget + " --draft " + kDraft +
                              " --text-file " + dir.File("none.py") + " > " + dir.File("log.txt") + " 2>&1";
  EXPECT_NE(std::system(missing.c_str()), 0);
  EXPECT_THAT(ReadFile(dir.File("log.txt")), HasSubstr("--text-file " + dir.File("none.py")));
  std::ofstream(dir.File("short.py")) << "x = 1";
  const std::string short_text = std::string(EAGLE3_INSPECT) + " accuracy --target " + kTarget + " --draft " + kDraft +
                                 " --depth 5 --text-file " + dir.File("short.py") + " > " + dir.File("log.txt") +
                                 " 2>&1";
  EXPECT_NE(std::system(short_text.c_str()), 0);
  EXPECT_THAT(ReadFile(dir.File("log.txt")), HasSubstr("depth 5 needs at least 6"));
}

// The library option behind --aux-layers.
TEST(DraftModelAuxOverrideTest, ReplacesTheConfigTapsAndIsValidated) {
  cpu::CpuBackend backend;
  DraftModelOptions options;
  options.max_tokens_per_forward = 4;
  options.max_context_len = 16;
  options.num_kv_pages = 1;
  options.page_size = 16;
  auto config_taps = DraftModel::Create(kDraft, kTarget, options, nullptr, &backend);
  ASSERT_TRUE(config_taps.ok()) << config_taps.status();
  EXPECT_EQ((*config_taps)->tap().boundaries(), (std::vector<int>{2, 4, 5}));

  options.aux_layer_ids_override = std::vector<int>{2, 4, 5};
  auto shifted = DraftModel::Create(kDraft, kTarget, options, nullptr, &backend);
  ASSERT_TRUE(shifted.ok()) << shifted.status();
  EXPECT_EQ((*shifted)->tap().boundaries(), (std::vector<int>{3, 5, 6}));

  options.convention = LayerIdConvention::kInputOfLayer;
  options.aux_layer_ids_override = std::vector<int>{0, 4, 5};
  auto embedding = DraftModel::Create(kDraft, kTarget, options, nullptr, &backend);
  ASSERT_TRUE(embedding.ok()) << embedding.status();
  EXPECT_EQ((*embedding)->tap().boundaries(), (std::vector<int>{0, 4, 5}));

  options.convention = LayerIdConvention::kOutputOfLayer;
  options.aux_layer_ids_override = std::vector<int>{1, 3, 4, 5};
  auto too_many = DraftModel::Create(kDraft, kTarget, options, nullptr, &backend);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_many.status().message()), HasSubstr("aux_layer_ids_override [1, 3, 4, 5]"));
  EXPECT_THAT(std::string(too_many.status().message()), HasSubstr("does not match the draft fc input width 768"));

  options.aux_layer_ids_override = std::vector<int>{-1, 3, 4};
  auto negative = DraftModel::Create(kDraft, kTarget, options, nullptr, &backend);
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("there is no -1 for the embedding"));
}

}  // namespace
}  // namespace eagle3
