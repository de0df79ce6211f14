// Uses the installed eagle3 as an engine would: writes a checkpoint, reads a TP shard of it back and
// checks the values; builds a draft tree and its FlashInfer mask; checks the version header against
// the package's version; with the cuda component, asks the CUDA backend how many GPUs it sees.
// Usage: eagle3_consumer WORK_DIR
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/draft_tree.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/tree_layouts.h"
#include "eagle3/version.h"
#ifdef EAGLE3_CONSUMER_WITH_CUDA
#include "eagle3/cuda/device_allocator.h"
#endif

namespace {

absl::Status Run(const std::filesystem::path& dir) {
  if (std::strcmp(EAGLE3_VERSION_STRING, EAGLE3_PACKAGE_VERSION) != 0) {
    return absl::InternalError(std::string("eagle3/version.h says ") + EAGLE3_VERSION_STRING +
                               ", the package " + EAGLE3_PACKAGE_VERSION);
  }
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

  // root -> {1, 2}, 1 -> {3}: 4 nodes, no prefix; FlashInfer's mask is 4 rows of 4 bits, 2 bytes.
  const int64_t tokens[] = {7, 11, 13, 17};
  const int32_t parents[] = {-1, 0, 0, 1};
  EAGLE3_ASSIGN_OR_RETURN(eagle3::DraftTree tree, eagle3::DraftTree::FromParents(tokens, parents));
  const std::vector<uint8_t> mask = eagle3::FlashInferPackedCustomMask(tree, 0);
  // Rows (column j = 1 when j is the node or an ancestor): 1000 1100 1010 1101; packed
  // least significant bit first: 0x31, 0xB5.
  if (tree.max_depth() != 2 || mask.size() != 2 || mask[0] != 0x31 || mask[1] != 0xB5) {
    return absl::InternalError("wrong draft tree or FlashInfer mask");
  }
#ifdef EAGLE3_CONSUMER_WITH_CUDA
  std::printf("eagle3 consumer: the CUDA backend sees %d GPU(s)\n", eagle3::cuda::CudaDeviceCount());
#endif
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
  std::printf("eagle3 %s consumer: wrote, installed-package read and sharded a checkpoint; built a "
              "draft tree and its mask: ok\n", EAGLE3_VERSION_STRING);
  return 0;
}
