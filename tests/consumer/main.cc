// Writes a checkpoint with the installed eagle3, reads a TP shard of it back and checks the values.
// Usage: eagle3_consumer WORK_DIR
#include <cstdio>
#include <filesystem>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"

namespace {

absl::Status Run(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::vector<float> weight(8 * 4);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = static_cast<float>(i);
  const eagle3::NamedTensor tensors[] = {
      {"proj.weight", eagle3::TensorView(weight.data(), eagle3::DType::kF32, eagle3::Shape{8, 4})}};
  EAGLE3_RETURN_IF_ERROR(eagle3::WriteSafetensors((dir / "model.safetensors").string(), tensors));
  EAGLE3_ASSIGN_OR_RETURN(auto checkpoint, eagle3::Checkpoint::Open(dir.string()));
  eagle3::ShardSpec spec;
  spec.dim = 0;
  spec.tp_size = 4;
  spec.rank = 3;
  EAGLE3_ASSIGN_OR_RETURN(eagle3::Tensor shard,
                          checkpoint->ReadShard("proj.weight", spec, eagle3::DType::kF32));
  if (shard.dim(0) != 2 || shard.dim(1) != 4 || shard.data_as<float>()[0] != 24.0f) {
    return absl::InternalError("rank 3 of 4 read the wrong rows: " + shard.view().ToString());
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s WORK_DIR\n", argv[0]);
    return 2;
  }
  const absl::Status status = Run(argv[1]);
  if (!status.ok()) {
    std::fprintf(stderr, "eagle3 consumer failed: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("eagle3 consumer: wrote, installed-package read and sharded a checkpoint: ok\n");
  return 0;
}
