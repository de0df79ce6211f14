// Looking up weight specs in the tests of the weight schemas (target, MTP module, MLA draft).
#pragma once

#include <string>
#include <vector>

#include "eagle3/deepseek_v2_weights.h"
#include "gtest/gtest.h"

namespace eagle3::testing {

// The spec named `name`, or nullptr.
inline const WeightSpec* FindSpec(const std::vector<WeightSpec>& specs, const std::string& name) {
  for (const WeightSpec& spec : specs) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

// One TP rank's slice shape of `spec`; a failed expectation (and an empty shape) when it does not
// split.
inline Shape RankShapeOf(const WeightSpec& spec, int tp) {
  absl::StatusOr<Shape> shape = spec.RankShape(tp);
  EXPECT_TRUE(shape.ok()) << shape.status();
  return shape.ok() ? *shape : Shape{};
}

}  // namespace eagle3::testing
