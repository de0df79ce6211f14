// Shared by the checkpoint-refusal tests: rewrite a single-file checkpoint with some tensors removed,
// replaced or added, and its config.json edited.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/checkpoint.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"

namespace eagle3 {

// Rewrites the single-file checkpoint in `dir` after `edit` changed its tensors (read in their own
// dtypes), and its config.json after `edit_config`.
inline void Rewrite(
    const std::string& dir, const std::function<void(std::map<std::string, Tensor>&)>& edit,
    const std::function<void(nlohmann::json&)>& edit_config = [](nlohmann::json&) {}) {
  std::map<std::string, Tensor> tensors;
  {
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    for (const std::string& name : (*checkpoint)->TensorNames()) {
      auto info = (*checkpoint)->Info(name);
      ASSERT_TRUE(info.ok());
      auto t = (*checkpoint)->Read(name, info->dtype);
      ASSERT_TRUE(t.ok()) << t.status();
      tensors.emplace(name, *std::move(t));
    }
  }
  edit(tensors);
  std::vector<NamedTensor> named;
  for (const auto& [name, t] : tensors) named.push_back({name, t});
  const std::string file = (std::filesystem::path(dir) / "model.safetensors").string();
  std::filesystem::remove(file);
  ASSERT_TRUE(WriteSafetensors(file, named).ok());
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  nlohmann::json config;
  std::ifstream(config_path) >> config;
  edit_config(config);
  std::ofstream(config_path, std::ios::trunc) << config.dump(2);
}

// A zero tensor of `dtype` and `shape`.
inline Tensor Filled(DType dtype, const Shape& shape) {
  auto t = Tensor::Zeros(dtype, shape);
  EXPECT_TRUE(t.ok());
  return *std::move(t);
}

}  // namespace eagle3
