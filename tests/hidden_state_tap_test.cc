#include "eagle3/hidden_state_tap.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HiddenStateTapTest, ConventionsResolveToBoundaries) {
  // SpecForge's DeepSeek-V3 draft: ids [1, 29, 57] of a 61-layer target, output-of-layer.
  const std::vector<int> ids = {1, 29, 57};
  auto output_of = HiddenStateTap::Create(ids, LayerIdConvention::kOutputOfLayer, 61, 7168, 3 * 7168);
  ASSERT_TRUE(output_of.ok()) << output_of.status();
  EXPECT_THAT(output_of->boundaries(), ElementsAre(2, 30, 58));
  EXPECT_EQ(output_of->width(), 21504);
  EXPECT_EQ(output_of->SlotOf(30), 1);
  EXPECT_EQ(output_of->SlotOf(29), -1);
  EXPECT_THAT(output_of->Describe(), HasSubstr("aux layer ids [1, 29, 57] (output-of-layer) -> boundaries [2, 30, 58]"));

  auto input_of = HiddenStateTap::Create(ids, LayerIdConvention::kInputOfLayer, 61, 7168);
  ASSERT_TRUE(input_of.ok());
  EXPECT_THAT(input_of->boundaries(), ElementsAre(1, 29, 57));

  // Config order is kept: the concatenation follows it, not sorted order.
  const std::vector<int> unordered = {10, 3};
  auto tap = HiddenStateTap::Create(unordered, LayerIdConvention::kInputOfLayer, 12, 8);
  ASSERT_TRUE(tap.ok());
  EXPECT_THAT(tap->boundaries(), ElementsAre(10, 3));
  EXPECT_EQ(tap->SlotOf(3), 1);

  // The extremes: boundary 0 (embedding output) and L (before the final norm).
  const std::vector<int> ends_in = {0, 12};
  EXPECT_TRUE(HiddenStateTap::Create(ends_in, LayerIdConvention::kInputOfLayer, 12, 8).ok());
  const std::vector<int> last_out = {11};
  auto last = HiddenStateTap::Create(last_out, LayerIdConvention::kOutputOfLayer, 12, 8);
  ASSERT_TRUE(last.ok());
  EXPECT_THAT(last->boundaries(), ElementsAre(12));
}

TEST(HiddenStateTapTest, DefaultsAreSGLangCapturePoints) {
  auto tap = HiddenStateTap::Create(std::nullopt, LayerIdConvention::kOutputOfLayer, 61, 7168);
  ASSERT_TRUE(tap.ok()) << tap.status();
  EXPECT_THAT(tap->boundaries(), ElementsAre(2, 30, 58));
  EXPECT_THAT(tap->Describe(), HasSubstr("default taps"));
  auto too_few = HiddenStateTap::Create(std::nullopt, LayerIdConvention::kOutputOfLayer, 6, 16);
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_few.status().message()), HasSubstr("6"));
}

TEST(HiddenStateTapTest, BadIdsAreExplained) {
  const std::vector<int> negative = {-1, 5};
  auto st = HiddenStateTap::Create(negative, LayerIdConvention::kOutputOfLayer, 12, 8).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("aux layer id [0] = -1"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("there is no -1 for the embedding"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("boundary k+1"));

  const std::vector<int> past_end = {3, 12};
  st = HiddenStateTap::Create(past_end, LayerIdConvention::kOutputOfLayer, 12, 8).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("aux layer id [1] = 12 is out of range [0, 11]"));
  st = HiddenStateTap::Create(past_end, LayerIdConvention::kInputOfLayer, 12, 8).status();
  EXPECT_TRUE(st.ok()) << st;  // input of "layer 12" = boundary 12, before the final norm

  const std::vector<int> duplicate = {3, 2};
  st = HiddenStateTap::Create(duplicate, LayerIdConvention::kOutputOfLayer, 12, 8).status();
  EXPECT_TRUE(st.ok());
  const std::vector<int> same = {3, 3};
  st = HiddenStateTap::Create(same, LayerIdConvention::kInputOfLayer, 12, 8).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("duplicate boundaries"));

  const std::vector<int> empty;
  st = HiddenStateTap::Create(empty, LayerIdConvention::kInputOfLayer, 12, 8).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("empty"));

  // The draft's fc expects 3 taps; two were configured.
  const std::vector<int> two = {2, 6};
  st = HiddenStateTap::Create(two, LayerIdConvention::kOutputOfLayer, 12, 8, 24).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("2 x 8 = 16 does not match the draft fc input width 24"));
}

// The final normed hidden (the MTP module's input) is boundary L + 1, beside the layer boundaries,
// which no layer id reaches.
TEST(HiddenStateTapTest, FinalNormedIsTheBoundaryAfterTheLayers) {
  auto tap = HiddenStateTap::FinalNormed(12, 8);
  ASSERT_TRUE(tap.ok()) << tap.status();
  EXPECT_EQ(tap->boundaries(), std::vector<int>{13});
  EXPECT_EQ(tap->final_norm_boundary(), 13);
  EXPECT_EQ(tap->width(), 8);
  EXPECT_EQ(tap->SlotOf(13), 0);
  EXPECT_EQ(tap->SlotOf(12), -1);  // the last layer's output before model.norm is another tensor
  EXPECT_THAT(tap->Describe(), HasSubstr("after model.norm"));
  // Layer-id taps never name it: boundary L is the last an id reaches.
  const std::vector<int> last = {12};
  auto input = HiddenStateTap::Create(last, LayerIdConvention::kInputOfLayer, 12, 8);
  ASSERT_TRUE(input.ok());
  EXPECT_EQ(input->SlotOf(input->final_norm_boundary()), -1);
  EXPECT_EQ(HiddenStateTap::FinalNormed(0, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HiddenStateTap::FinalNormed(12, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eagle3
